"""The pre-started trainer (``prestart-imports``): the launcher keeps the next epoch's command
started while the running one trains, the hook (jobset_inplace/prestart.py as the command's
sitecustomize) imports and holds it before any of its own code, and the epoch's word lets it
go with the epoch's resume step. Real launcher and child processes over a temporary state
directory, as tests/unit/test_launcher.py."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import launcher, prestart
from jobset_inplace.trainer import clear_resume
from tests.unit.test_launcher import Pod, alive, stop, until

# python -m torch.distributed.run, faked: it starts its worker as torchrun's SubprocessHandler
# does (``python -u worker.py``, the parent's environment plus the worker's, a session of its
# own, stopped by a signal to its group) and exits as its worker did. The worker imports torch,
# then runs the trainer (CHILD).
FAKE_TORCHRUN = """
import os, signal, subprocess, sys
d = sys.argv[1]
def note(name, value):
    with open(os.path.join(d, "." + name), "w") as f:
        f.write(value)
    os.replace(os.path.join(d, "." + name), os.path.join(d, name))
note("torchrun-ran", str(os.getpid()))
flags = os.environ.get("WORKER_FLAGS", "-u").split()
env = dict(os.environ, RANK="0", LOCAL_RANK="0")
w = subprocess.Popen([sys.executable, *flags, os.path.join(d, "worker.py"), d], env=env,
                     start_new_session=True)
note("stand-in", str(w.pid))
def stop(signum, frame):
    try:  # (the worker may have ended and been reaped already, as torchrun's checks allow for)
        os.killpg(w.pid, signum)
    except ProcessLookupError:
        pass
signal.signal(signal.SIGTERM, stop)
code = w.wait()
note("torchrun-saw", str(code))
sys.exit(code if code >= 0 else 128 - code)
"""
WORKER = """
import os, sys, torch
with open(os.path.join(sys.argv[1], "worker-env"), "w") as f:
    f.write("%s %s %s %d" % (os.environ["RANK"], os.getcwd(), __name__, os.getppid()))
exec(open(os.path.join(sys.argv[1], "child.py")).read())
"""
# A module whose import counts itself (and, as a CUDA import would, says CUDA is initialised).
COUNTED = """
import os
with open(os.path.join(os.environ["JSI_STATE_DIR"], "imported"), "a") as f:
    f.write("%d\\n" % os.getpid())
from . import autograd, cuda
"""
# torch.cuda, faked: CUDA is started where FAKE_CUDA says so; torch.cuda.random copies its
# _lazy_init at import, as PyTorch's does.
FAKE_CUDA = """
import os
def is_initialized():
    if os.environ.get("FAKE_CUDA") == "raise":
        raise RuntimeError("CUDA check broken")
    return os.environ.get("FAKE_CUDA") == "1"
def _lazy_init():
    os.environ["FAKE_CUDA"] = "1"
from . import random
"""
FAKE_CUDA_RANDOM = """
from . import _lazy_init
def get_rng_state():
    _lazy_init()
"""
FAKE_AUTOGRAD = """
def backward(*args, **kwargs):
    pass
"""
# torch.distributed, faked: a process group is a flag; init_process_group decorated with
# functools.wraps, as PyTorch's logging decorators do.
FAKE_DIST = """
import functools
made = []
def _logged(f):
    @functools.wraps(f)
    def logged(*args, **kwargs):
        return f(*args, **kwargs)
    return logged
@_logged
def init_process_group(*args, **kwargs):
    made.append(args)
def is_initialized():
    return bool(made)
"""
# A trainer whose few lines are a warm standby's (jobset_inplace.trainer.standby): it notes
# what it saw before its word, loads "checkpoints" (their newest step in the file newest, each
# step's marker ckpt-<S>), then runs as CHILD.
WARM = r"""
import json, os, sys
d = sys.argv[1]
def note(name, value):
    with open(os.path.join(d, "." + name), "w") as f:
        f.write(value)
    os.replace(os.path.join(d, "." + name), os.path.join(d, name))
import torch, torch.distributed as dist
from jobset_inplace.trainer import standby
if os.environ.get("FAKE_CUDA_AFTER_HOOK") and os.environ.get("JSI_EPOCH") == "":  # held
    os.environ["FAKE_CUDA"] = "1"  # (as a library's own cuInit: no guard sees it)
seen = {k: os.environ.get(k) for k in ("RANK", "MASTER_ADDR", "JSI_EPOCH", "JSI_PRESTART_GO")}
note("before-%d" % os.getpid(), json.dumps(seen))
def attempt(name, call):
    try:
        call()
        note(name, "made")
    except RuntimeError as e:
        note(name, str(e))
if os.environ.get("WARM_TRIES"):
    attempt("group-before", lambda: dist.init_process_group("gloo"))
    attempt("cuda-before", lambda: torch.cuda._lazy_init())
    attempt("cuda-copy-before", lambda: torch.cuda.random.get_rng_state())
    attempt("backward-before", lambda: torch.autograd.backward(None))
def load(step):
    with open(os.path.join(d, "loads"), "a") as f:
        f.write("%d %s\n" % (os.getpid(), step))
def newest():
    p = os.path.join(d, "newest")
    return int(open(p).read()) if os.path.exists(p) else None
run = standby.wait(load, newest, marker=lambda s: os.path.join(d, "ckpt-%d" % s))
after = {k: os.environ.get(k) for k in ("RANK", "MASTER_ADDR", "JSI_EPOCH")}
note("released-%d" % os.getpid(), json.dumps([run.resume_step, run.loaded_step, run.warm, after]))
if os.environ.get("WARM_TRIES"):
    attempt("group-after", lambda: dist.init_process_group("gloo"))
    attempt("backward-after", lambda: torch.autograd.backward(None))
    note("go-after", os.environ.get("JSI_PRESTART_GO", "-"))
exec(open(os.path.join(d, "child.py")).read())
"""


def install(tmp: Path) -> Path:
    """The agent's part: the hook in the state directory; a fake torch on PYTHONPATH."""
    hook = tmp / launcher.PRESTART_HOOK_DIR
    hook.mkdir()
    shutil.copyfile(prestart.__file__, hook / launcher.PRESTART_HOOK_FILE)
    pkgs = tmp / "pkgs"
    (pkgs / "torch" / "distributed").mkdir(parents=True)
    (pkgs / "torch" / "__init__.py").write_text(COUNTED)
    for module, text in (("cuda", FAKE_CUDA), ("autograd", FAKE_AUTOGRAD)):
        (pkgs / "torch" / module).mkdir()
        (pkgs / "torch" / module / "__init__.py").write_text(text)
    (pkgs / "torch" / "cuda" / "random.py").write_text(FAKE_CUDA_RANDOM)
    (pkgs / "torch" / "distributed" / "__init__.py").write_text(FAKE_DIST)
    (pkgs / "torch" / "distributed" / "run.py").write_text(FAKE_TORCHRUN)
    (tmp / "worker.py").write_text(WORKER)
    return pkgs


def prestarted(pod: Pod) -> list[int]:
    """The pids the launcher pre-started, in order."""
    return [int(p) for p in re.findall(r"pre-started .* \(pid (\d+)\)", pod.log())]


def imported(pod: Pod) -> list[int]:
    path = pod.dir / "imported"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@contextlib.contextmanager
def running(pod: Pod) -> Iterator[Pod]:
    try:
        yield pod
    finally:
        for pid in prestarted(pod):  # first: a failed test may leave what stop() cannot parse
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stop(pod)


def prestart_pod(tmp: Path, command: list[str] | None = None, **env: str) -> Pod:
    """A launcher with pre-start, its standby started as soon as an epoch runs."""
    pkgs = install(tmp)
    return Pod(
        tmp,
        command,
        JSI_PRESTART_IMPORTS="torch",
        PYTHONPATH=str(pkgs),
        JSI_PRESTART_AFTER_SECONDS="0",
        **env,
    )


def test_the_next_epoch_is_imported_and_held_while_the_last_one_runs(tmp_path: Path) -> None:
    with running(prestart_pod(tmp_path)) as pod:
        until("held", lambda: "waiting for an epoch" in pod.log())
        (held,) = prestarted(pod)
        assert imported(pod) == [held], "the import was done before the epoch"
        assert pod.starts() == [], "none of the command's own code ran"
        assert pod.state() == ("waiting", None, None)
        pod.open(1, 7)
        until("start", lambda: len(pod.starts()) == 1)
        assert pod.starts() == [("1", "7", held)], "the held process runs, with the epoch's step"
        pod.wait_state("running", 1)
        # the next one is started and held while epoch 1 runs
        until("standby", lambda: len(prestarted(pod)) == 2)
        standby = prestarted(pod)[1]
        until("standby imported", lambda: imported(pod) == [held, standby])
        clear_resume(pod.dir)  # the gang moves on: epoch 1 stopped, the standby left alone
        pod.wait_state("stopped", 1, 128 + signal.SIGTERM)
        assert not alive(held)
        assert alive(standby)
        pod.open(2, 9)
        until("second start", lambda: len(pod.starts()) == 2)
        assert pod.starts()[1] == ("2", "9", standby)


def test_a_held_process_is_released_with_its_epochs_environment(tmp_path: Path) -> None:
    """A hot spare: the slot comes with the word, before the command's own code reads it."""
    with running(prestart_pod(tmp_path)) as pod:
        until("held", lambda: "waiting for an epoch" in pod.log())
        (held,) = prestarted(pod)
        pod.open(1, 7, {"JSI_SLOT": "2", "PET_MASTER_ADDR": "js-w-5-0.js"})
        until("start", lambda: len(pod.starts()) == 1)
        assert pod.starts() == [("1", "7", held)]
        assert pod.slots() == ["2 js-w-5-0.js"]


def warm_pod(tmp: Path, **env: str) -> Pod:
    """A launcher with a warm standby (prestart-warm) of the WARM trainer, rank 3's."""
    (tmp / "warm.py").write_text(WARM)
    command = [sys.executable, str(tmp / "warm.py"), str(tmp)]
    return prestart_pod(tmp, command, JSI_PRESTART_WARM="1", RANK="3", MASTER_ADDR="m0", **env)


def loads(pod: Pod, pid: int) -> list[str]:
    path = pod.dir / "loads"
    lines = path.read_text().splitlines() if path.exists() else []
    return [step for p, step in (line.split() for line in lines) if int(p) == pid]


def saved(pod: Pod, step: int) -> None:
    """A checkpoint of ``step`` (a new marker file each time) is the newest."""
    tmp = pod.dir / f".ckpt-{step}"
    tmp.write_text(str(time.monotonic_ns()))
    os.replace(tmp, pod.dir / f"ckpt-{step}")
    (pod.dir / ".newest").write_text(str(step))
    os.replace(pod.dir / ".newest", pod.dir / "newest")


def noted(pod: Pod, name: str) -> Any:
    return json.loads((pod.dir / name).read_text())


def test_a_warm_standby_loads_before_its_word_and_again_only_when_the_step_differs(
    tmp_path: Path,
) -> None:
    with running(warm_pod(tmp_path)) as pod:
        saved(pod, 5)
        until("warm", lambda: "warm: held at step 5" in pod.log())
        (first,) = prestarted(pod)
        before = noted(pod, f"before-{first}")
        assert before == {
            "RANK": None,
            "MASTER_ADDR": None,
            "JSI_EPOCH": "",
            "JSI_PRESTART_GO": None,
        }
        assert loads(pod, first) == ["5"], "the newest step loaded before the word"
        assert pod.starts() == [], "the script's training has not begun"
        assert pod.state() == ("waiting", None, None)
        pod.open(1, 5)
        until("start", lambda: len(pod.starts()) == 1)
        assert pod.starts() == [("1", "5", first)]
        after = {"RANK": "3", "MASTER_ADDR": "m0", "JSI_EPOCH": "1"}
        assert noted(pod, f"released-{first}") == [5, 5, True, after]
        assert loads(pod, first) == ["5"], "the step held is the gang's: not loaded again"
        # the next standby holds step 5 too; the gang resumes from 7: loaded at the word
        until("second standby", lambda: pod.log().count("warm: held at step 5") == 2)
        second = saved_then_next_epoch(pod, 2, 7)
        assert noted(pod, f"released-{second}")[:3] == [7, 7, True]
        assert loads(pod, second) == ["5", "7"]
        # the third holds 7; step 7 is saved again before the word: loaded again
        until("third standby", lambda: "warm: held at step 7" in pod.log())
        third = saved_then_next_epoch(pod, 3, 7)
        assert loads(pod, third) == ["7", "7"]


def saved_then_next_epoch(pod: Pod, epoch: int, step: int) -> int:
    """``step`` saved (again), the running epoch stopped, ``epoch`` opened at ``step``; the pid
    of the standby it released."""
    standby = prestarted(pod)[epoch - 1]
    saved(pod, step)
    clear_resume(pod.dir)
    pod.wait_state("stopped", epoch - 1, 128 + signal.SIGTERM)
    pod.open(epoch, step)
    until(f"epoch {epoch} started", lambda: len(pod.starts()) == epoch)
    return standby


def test_a_warm_standby_cannot_make_a_process_group_or_start_cuda_before_its_word(
    tmp_path: Path,
) -> None:
    with running(warm_pod(tmp_path, WARM_TRIES="1")) as pod:
        until("warm", lambda: "warm: held at step None" in pod.log())
        for tried in ("group", "cuda", "cuda-copy", "backward"):
            said = (pod.dir / f"{tried}-before").read_text()
            assert "before this warm standby's epoch" in said, tried
        (held,) = prestarted(pod)
        pod.open(1, None)
        until("start", lambda: len(pod.starts()) == 1)
        assert pod.starts() == [("1", "-", held)], "the held process, not a cold one"
        assert (pod.dir / "group-after").read_text() == "made"
        assert (pod.dir / "backward-after").read_text() == "made"


def test_a_warm_standby_that_started_cuda_ends_and_the_epoch_starts_cold(tmp_path: Path) -> None:
    """A device context made before the word (here: one the guard could not see) is found and
    the standby ends; the epoch starts cold, its word never given to that process."""
    with running(warm_pod(tmp_path, FAKE_CUDA_AFTER_HOOK="1")) as pod:
        until("ended", lambda: "exited 86 before its epoch" in pod.log())
        (held,) = prestarted(pod)
        pod.open(1, None)
        until("start", lambda: len(pod.starts()) == 1)
        (start,) = pod.starts()
        assert start[:2] == ("1", "-")
        assert start[2] != held, "a cold process"


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def note(pod: Pod, name: str) -> int:
    return int((pod.dir / name).read_text())


def test_torchrun_waits_and_its_workers_are_forked_with_its_imports(tmp_path: Path) -> None:
    with running(prestart_pod(tmp_path, [*TORCHRUN, str(tmp_path)])) as pod:
        until("held", lambda: "waiting for an epoch" in pod.log())
        (agent,) = prestarted(pod)
        assert imported(pod) == [agent]
        assert not (tmp_path / "torchrun-ran").exists(), "torchrun's own code waits too"
        pod.open(3, 30)
        until("the worker's start", lambda: len(pod.starts()) == 1)
        assert note(pod, "torchrun-ran") == agent
        epoch, step, worker = pod.starts()[0]
        assert (epoch, step) == ("3", "30"), "the word reached the worker torchrun started"
        stand_in = note(pod, "stand-in")
        assert worker not in (agent, stand_in), "forked, not the process torchrun started"
        assert imported(pod)[0] == agent  # (then the next epoch's standby)
        assert {worker, stand_in}.isdisjoint(imported(pod)), "the forker had imported torch"
        rank, cwd, name, parent = (tmp_path / "worker-env").read_text().split()
        assert (rank, cwd, name) == ("0", str(Path.cwd()), "__main__")
        assert parent != str(stand_in), "the forker's child"
        assert alive(int(parent))
        assert alive(stand_in)
        comm = {p: Path(f"/proc/{p}/comm").read_text().strip() for p in (stand_in, worker)}
        assert comm[stand_in] == prestart.STAND_IN_NAME, "ps tells what it is"
        assert comm[worker] == Path(sys.executable).name[:15], "as a worker started cold"
        pod.child_exits(7)
        until("torchrun saw its worker end", (tmp_path / "torchrun-saw").exists)
        assert note(pod, "torchrun-saw") == 7, "the stand-in exits as its worker did"
        pod.wait_state("exited", 3, 7)
        until("the forker ended with its torchrun", lambda: not alive(int(parent)))


def released(pod: Pod) -> tuple[int, int]:
    """Once the held torchrun is let go for epoch 1 and its worker runs: (the forked worker's
    pid, its stand-in's)."""
    until("held", lambda: "waiting for an epoch" in pod.log())
    pod.open(1)
    until("the worker's start", lambda: len(pod.starts()) == 1)
    return pod.starts()[0][2], note(pod, "stand-in")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_forked_workers_stand_in_passes_signals_on(tmp_path: Path, signum: int) -> None:
    """torchrun stops a worker by a signal to its group (SIGTERM, then SIGKILL): the forked
    worker gets the same end, and torchrun sees it."""
    with running(prestart_pod(tmp_path, [*TORCHRUN, str(tmp_path)])) as pod:
        worker, stand_in = released(pod)
        os.killpg(stand_in, signum)
        until("torchrun saw its worker end", (tmp_path / "torchrun-saw").exists)
        assert note(pod, "torchrun-saw") == -signum
        until("the forked worker ended", lambda: not alive(worker))


def test_a_forked_worker_ends_with_its_forker(tmp_path: Path) -> None:
    """A forker killed (SIGKILL: the epoch's tree, an OOM kill) cannot report its workers'
    ends: each stand-in sees it gone, kills its worker and exits; torchrun sees a failure."""
    with running(prestart_pod(tmp_path, [*TORCHRUN, str(tmp_path)])) as pod:
        worker, _ = released(pod)
        (forker,) = map(int, re.findall(r"worker forker \(pid (\d+)\)", pod.log())[:1])
        os.kill(forker, signal.SIGKILL)
        until("torchrun saw its worker end", (tmp_path / "torchrun-saw").exists)
        assert note(pod, "torchrun-saw") == 1
        until("the forked worker ended", lambda: not alive(worker))
        assert "the worker forker ended before worker" in pod.log()


# Every signal whose default action ends a process, less the two the interpreter ignores
# (SIGPIPE, SIGXFSZ: a worker started cold ignores them as well). SIGKILL is the OOM killer's,
# SIGSEGV an extension's crash, SIGABRT NCCL's watchdog, SIGINT a KeyboardInterrupt.
ENDING_SIGNALS = sorted(
    {
        signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP,
        signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGKILL, signal.SIGUSR1,
        signal.SIGSEGV, signal.SIGUSR2, signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU,
        signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR, signal.SIGSYS,
    }
)  # fmt: skip


@pytest.fixture
def no_core_files() -> Iterator[None]:
    """The launchers started here (and their workers) dump no core into the checkout."""
    import resource  # noqa: PLC0415

    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


@pytest.fixture
def started_in_the_background() -> Iterator[None]:
    """The launchers started here inherit SIGINT and SIGQUIT ignored, as everything a
    non-interactive shell starts with `&` does (an ignored signal stays ignored across fork
    and exec): a forked worker must end by them all the same, as one started cold under
    torchrun (which handles them) does."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGQUIT)}
    for s in before:
        signal.signal(s, signal.SIG_IGN)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@pytest.mark.usefixtures("no_core_files", "started_in_the_background")
@pytest.mark.parametrize("signum", ENDING_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_forked_worker_killed_by_any_signal_is_seen_so_and_never_run_again(
    tmp_path: Path, signum: int
) -> None:
    """The signal reaches the forked worker itself (the process holding the model's memory,
    the one the OOM killer picks), not its stand-in: torchrun sees its worker end by that
    signal, the launcher reports the epoch's end, and no process runs the trainer again in
    that epoch (the stand-in once fell through to running it cold when it could not take on
    SIGKILL's disposition)."""
    with running(prestart_pod(tmp_path, [*TORCHRUN, str(tmp_path)])) as pod:
        worker, stand_in = released(pod)
        os.kill(worker, signum)
        until("torchrun saw its worker end", (tmp_path / "torchrun-saw").exists)
        assert note(pod, "torchrun-saw") == -signum, "the stand-in ended as its worker did"
        pod.wait_state("exited", 1, 128 + signum)
        assert not alive(worker)
        assert not alive(stand_in)
        assert len(pod.starts()) == 1, "the trainer was not run again in epoch 1"
        assert "Error in sitecustomize" not in pod.log()
        assert "stand-in:" not in pod.log()


@pytest.mark.parametrize("code", [0, 1, 2, 7, 255])
def test_a_forked_worker_that_exits_is_seen_with_its_code_and_never_run_again(
    tmp_path: Path, code: int
) -> None:
    with running(prestart_pod(tmp_path, [*TORCHRUN, str(tmp_path)])) as pod:
        worker, stand_in = released(pod)
        pod.child_exits(code)
        until("torchrun saw its worker end", (tmp_path / "torchrun-saw").exists)
        assert note(pod, "torchrun-saw") == code
        pod.wait_state("exited", 1, code)
        assert not alive(worker)
        assert not alive(stand_in)
        assert len(pod.starts()) == 1


# A worker forker that answers a worker's request as told (ANSWER: the bytes of its first
# line; none: it closes the connection), then stays until the stand-in ends.
FAKE_FORKER = """
import json, os, socket, struct, sys
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen(1)
open(sys.argv[1] + ".ready", "w").close()
conn, _ = server.accept()
_, fds, _, _ = socket.recv_fds(conn, 1, 3)
size = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))[0]
conn.recv(size, socket.MSG_WAITALL)
answer = os.environ.get("ANSWER")
if answer is not None:
    conn.sendall(answer.encode())
    conn.recv(1)
"""
WORKER_SCRIPT = "import os, sys; open(sys.argv[1], 'w').close()\n"


@pytest.mark.parametrize(
    ("answer", "runs_cold"),
    [
        ('{"error": "not a worker this forker can start"}\n', True),
        (None, False),  # the connection closed: it may have forked the worker first
        ("garbage\n", False),
        ('["pid", 1]\n', False),
        ('{"pid": "12"}\n', False),
        ('{"pid": 0}\n', False),
        ('{"pid": 999999999}\n{"status": "x"}\n', False),  # then no wait status
    ],
)
def test_a_worker_starts_cold_only_when_the_forker_refused_it(
    tmp_path: Path, answer: str | None, runs_cold: bool
) -> None:
    """Once a worker's request may have reached the forker, its process never runs the trainer
    itself: only the forker's plain refusal starts it cold. (The worker here is this test's
    child: the forker it names is this process, as a real one is the worker's torchrun.)"""
    import subprocess  # noqa: PLC0415

    hook = tmp_path / "hook"
    hook.mkdir()
    shutil.copyfile(prestart.__file__, hook / "sitecustomize.py")
    (tmp_path / "forker.py").write_text(FAKE_FORKER)
    (tmp_path / "worker.py").write_text(WORKER_SCRIPT)
    sock, ran = tmp_path / "f.sock", tmp_path / "ran-cold"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSI_")}
    forker_env = env if answer is None else {**env, "ANSWER": answer}
    forker = subprocess.Popen(
        [sys.executable, str(tmp_path / "forker.py"), str(sock)], env=forker_env
    )
    try:
        until("the fake forker listens", Path(f"{sock}.ready").exists)
        worker_env = {
            **env,
            "PYTHONPATH": str(hook),
            prestart.ENV_FORKER: f"{os.getpid()}:{sock}",
        }
        worker = subprocess.run(
            [sys.executable, "-u", str(tmp_path / "worker.py"), str(ran)],
            check=False,
            env=worker_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        forker.kill()
        forker.wait()
    assert "Error in sitecustomize" not in worker.stderr
    if runs_cold:
        assert worker.returncode == 0, worker.stderr
        assert ran.exists(), "refused: the process runs its worker itself"
        assert "refused" in worker.stderr
    else:
        assert worker.returncode == prestart.EXIT_STAND_IN_FAILED, worker.stderr
        assert not ran.exists(), "the trainer must not run beside a worker the forker started"


def starts_only_at_its_epoch(pod: Pod, epoch: int = 1, step: int = 3) -> None:
    """Nothing of the trainer has run; once ``epoch`` opens, it starts, with its step."""
    assert pod.starts() == [], "nothing of the trainer ran before its epoch"
    pod.open(epoch, step)
    until("start", lambda: len(pod.starts()) == 1)
    assert pod.starts()[0][:2] == (str(epoch), str(step))


def test_a_held_process_whose_image_sitecustomize_fails_still_waits_for_its_epoch(
    tmp_path: Path,
) -> None:
    """An error in the hook's work never lets a held process run the trainer before its word:
    the image's own sitecustomize raising is said, as ``site`` would, and the process waits."""
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("raise RuntimeError('the image is broken')\n")
    pkgs = install(tmp_path)
    pod = Pod(
        tmp_path,
        None,
        JSI_PRESTART_IMPORTS="torch",
        PYTHONPATH=f"{pkgs}:{image}",
        JSI_PRESTART_AFTER_SECONDS="0",
    )
    with running(pod):
        until("held", lambda: "waiting for an epoch" in pod.log())
        assert "the image is broken" in pod.log()
        starts_only_at_its_epoch(pod)


def test_a_held_process_whose_hook_fails_exits_and_the_epoch_starts_cold(tmp_path: Path) -> None:
    """The hook itself fails in a held process (here torch's CUDA check raises): the process
    exits with the hook's failure instead of running the trainer before its epoch, and the
    epoch starts cold."""
    with running(prestart_pod(tmp_path, FAKE_CUDA="raise")) as pod:
        code = prestart.EXIT_HOOK_FAILED
        until("the hook failed", lambda: f"exited {code} before its epoch" in pod.log())
        assert "CUDA check broken" in pod.log()
        starts_only_at_its_epoch(pod)


def test_a_stop_reaches_a_forked_worker_as_the_signal_torchrun_passes_on(tmp_path: Path) -> None:
    """The launcher stops an epoch by SIGTERM to torchrun's group, where the forker is too: the
    worker must get torchrun's SIGTERM (a trainer may save on it), not a kill from a stand-in
    whose forker died first. The forker ends with torchrun (it watches a pipe torchrun holds),
    well before a long stop grace would have it killed."""
    command = [*TORCHRUN, str(tmp_path)]
    with running(prestart_pod(tmp_path, command, JSI_STOP_GRACE_SECONDS="30")) as pod:
        worker, _ = released(pod)
        clear_resume(pod.dir)  # the gang moves on: epoch 1 is stopped
        pod.wait_state("stopped", 1, 128 + signal.SIGTERM)
        assert note(pod, "torchrun-saw") == -signal.SIGTERM
        assert not alive(worker)
        assert "SIGKILL" not in pod.log(), "the forker ended with its torchrun"
        assert "killing it" not in pod.log()


def test_a_worker_with_interpreter_options_a_fork_cannot_take_starts_cold(
    tmp_path: Path,
) -> None:
    command = [*TORCHRUN, str(tmp_path)]
    with running(prestart_pod(tmp_path, command, WORKER_FLAGS="-u -O")) as pod:
        until("held", lambda: "waiting for an epoch" in pod.log())
        pod.open(2, 5)
        until("the worker's start", lambda: len(pod.starts()) == 1)
        worker = pod.starts()[0][2]
        assert worker == note(pod, "stand-in"), "the process torchrun started runs it"
        assert worker in imported(pod), "cold: it imported torch itself"


def test_a_released_plain_command_has_no_worker_forker(tmp_path: Path) -> None:
    with running(prestart_pod(tmp_path)) as pod:
        until("held", lambda: "waiting for an epoch" in pod.log())
        assert "worker forker" not in pod.log()
        assert not list(tmp_path.glob(f"*{launcher.PRESTART_FORKER_SUFFIX}"))


def test_a_prestart_that_fails_is_not_retried_until_an_epoch_started(tmp_path: Path) -> None:
    with running(prestart_pod(tmp_path, FAKE_CUDA="1")) as pod:
        until("refused", lambda: "exited 86 before its epoch" in pod.log())
        assert "initialised CUDA" in pod.log()
        pod.open(1, 4)
        until("cold start", lambda: len(pod.starts()) == 1)
        assert pod.starts()[0][:2] == ("1", "4")
        assert pod.starts()[0][2] not in imported(pod), "cold: the hook imported nothing"
        until("tried again once epoch 1 ran", lambda: pod.log().count("exited 86") == 2)
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(10) == 128 + signal.SIGTERM
        assert len(prestarted(pod)) == 2, "one pre-start per epoch, not a loop"


def test_sigterm_to_the_launcher_ends_the_running_and_the_held_command(tmp_path: Path) -> None:
    with running(prestart_pod(tmp_path)) as pod:
        pod.open(1)
        until("start", lambda: len(pod.starts()) == 1)
        until("standby", lambda: len(prestarted(pod)) == 2)
        first, standby = prestarted(pod)
        until("standby held", lambda: len(imported(pod)) == 2)
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(10) == 128 + signal.SIGTERM
        assert not alive(first)
        assert not alive(standby)
        assert len(pod.starts()) == 1


def test_without_the_hook_every_epoch_starts_cold(tmp_path: Path) -> None:
    with running(Pod(tmp_path, JSI_PRESTART_IMPORTS="json")) as pod:
        pod.open(1)
        until("cold start", lambda: len(pod.starts()) == 1)
        assert "no pre-start hook" in pod.log()
        assert prestarted(pod) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["py", "-u", "-m", "torch.distributed.run", "--nnodes=2", "t.py"], ("u", "module")),
        (["py", "-um", "torch.distributed.run"], ("u", "module")),
        (["py", "-W", "ignore", "-X", "dev", "t.py"], ("", "script")),
        (["py", "-Xdev", "-Ec", "x"], ("E", "code")),
        (["py", "--check-hash-based-pycs", "always", "t.py"], ("", "script")),
        (["py"], ("", "code")),
    ],
)
def test_the_interpreters_arguments(argv: list[str], expected: tuple[str, str]) -> None:
    assert prestart.python_argv(argv)[:2] == expected


def test_which_commands_can_be_prestarted() -> None:
    assert prestart.refusal(["torchrun", "--nproc-per-node=2", "t.py"]) is None
    assert prestart.refusal(["/usr/bin/python3.11", "-u", "t.py"]) is None
    assert prestart.refusal(["python3", "-m", "torch.distributed.run", "t.py"]) is None
    assert "not Python" in (prestart.refusal(["bash", "-c", "python3 t.py"]) or "")
    assert "-I" in (prestart.refusal(["python3", "-I", "t.py"]) or "")


def test_which_commands_can_be_warm_standbys() -> None:
    assert prestart.warm_refusal(["python3", "-u", "train.py", "--lr", "1"]) is None
    assert prestart.warm_refusal(["/usr/bin/python3.11", "-m", "trainer.main"]) is None
    assert "torchrun" in (prestart.warm_refusal(["/usr/local/bin/torchrun", "t.py"]) or "")
    assert "accelerate" in (prestart.warm_refusal(["accelerate", "launch", "t.py"]) or "")
    assert "-c" in (prestart.warm_refusal(["python3", "-c", "import t"]) or "")
    assert "Python 3.10" in (prestart.warm_refusal([]) or ""), "no sys.orig_argv"


def test_the_hook_and_the_launcher_agree_on_names_and_run_on_python_3_8() -> None:
    assert launcher.ENV_PRESTART_IMPORTS == prestart.ENV_IMPORTS
    assert launcher.ENV_PRESTART_GO == prestart.ENV_GO
    assert launcher.PRESTART_HOOK_DIR == prestart.HOOK_DIR
    assert launcher.PRESTART_FORKER_SUFFIX == prestart.FORKER_SUFFIX
    assert (launcher.ENV_EPOCH, launcher.ENV_RESUME_STEP) == (
        prestart.ENV_EPOCH,
        prestart.ENV_RESUME_STEP,
    )
    ast.parse(Path(prestart.__file__).read_text(), feature_version=(3, 8))
