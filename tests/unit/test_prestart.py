"""The pre-started trainer (``prestart-imports``): the launcher starts the next epoch's command
while the barrier is closed, the hook (jobset_inplace/prestart.py as the command's
sitecustomize) imports and holds it before any of its own code, and the epoch's word lets it
go with the epoch's resume step. Real launcher and child processes over a temporary state
directory, as tests/unit/test_launcher.py."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobset_inplace import launcher, prestart
from jobset_inplace.core import torchrun
from jobset_inplace.trainer import clear_resume
from tests.unit.test_launcher import Pod, alive, stop, until

# python -m torch.distributed.run, faked: it runs on before the barrier and starts the trainer
# (CHILD) as its worker, as torchrun does.
FAKE_TORCHRUN = """
import os, subprocess, sys
d = sys.argv[1]
with open(os.path.join(d, "torchrun-ran"), "a") as f:
    f.write("%d\\n" % os.getpid())
sys.exit(subprocess.call([sys.executable, os.path.join(d, "child.py"), d]))
"""
# A module whose import counts itself (and, as a CUDA import would, says CUDA is initialised).
COUNTED = """
import os
with open(os.path.join(os.environ["JSI_STATE_DIR"], "imported"), "a") as f:
    f.write("%d\\n" % os.getpid())
class cuda:
    @staticmethod
    def is_initialized():
        return os.environ.get("FAKE_CUDA") == "1"
"""


def install(tmp: Path) -> Path:
    """The agent's part: the hook in the state directory; a fake torch on PYTHONPATH."""
    hook = tmp / launcher.PRESTART_HOOK_DIR
    hook.mkdir()
    shutil.copyfile(prestart.__file__, hook / launcher.PRESTART_HOOK_FILE)
    pkgs = tmp / "pkgs"
    (pkgs / "torch" / "distributed").mkdir(parents=True)
    (pkgs / "torch" / "__init__.py").write_text(COUNTED)
    (pkgs / "torch" / "distributed" / "__init__.py").write_text("")
    (pkgs / "torch" / "distributed" / "run.py").write_text(FAKE_TORCHRUN)
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


def test_the_next_epoch_is_imported_and_held_until_its_barrier_opens(tmp_path: Path) -> None:
    pkgs = install(tmp_path)
    with running(Pod(tmp_path, JSI_PRESTART_IMPORTS="torch", PYTHONPATH=str(pkgs))) as pod:
        until("held", lambda: "waiting for the barrier" in pod.log())
        (held,) = prestarted(pod)
        assert imported(pod) == [held], "the import was done before the barrier"
        assert pod.starts() == [], "none of the trainer's own code ran"
        assert pod.state() == ("waiting", None, None)
        pod.open(1, 7)
        until("start", lambda: len(pod.starts()) == 1)
        assert pod.starts() == [("1", "7", held)], "the held process runs, with the epoch's step"
        pod.wait_state("running", 1)
        clear_resume(pod.dir)  # the gang moves on: stopped, and the next one pre-started
        pod.wait_state("stopped", 1, 128 + signal.SIGTERM)
        until("pre-started again", lambda: len(prestarted(pod)) == 2)
        again = prestarted(pod)[1]
        assert not alive(held)
        until("held again", lambda: imported(pod) == [held, again])
        pod.open(2, 9)
        until("second start", lambda: len(pod.starts()) == 2)
        assert pod.starts()[1] == ("2", "9", again)


def test_torchrun_runs_on_and_its_workers_wait(tmp_path: Path) -> None:
    pkgs = install(tmp_path)
    command = [sys.executable, "-m", "torch.distributed.run", str(tmp_path)]
    with running(Pod(tmp_path, command, JSI_PRESTART_IMPORTS="torch", PYTHONPATH=str(pkgs))) as pod:
        until("the worker held", lambda: "waiting for the barrier" in pod.log())
        agent = int((tmp_path / "torchrun-ran").read_text())
        assert agent == prestarted(pod)[0], "torchrun's own code ran before the barrier"
        assert "runs on" in pod.log()
        assert pod.starts() == [], "its worker's did not"
        assert len(imported(pod)) == 2, "both imported torch: torchrun and its worker"
        pod.open(3, 30)
        until("the worker's start", lambda: len(pod.starts()) == 1)
        epoch, step, worker = pod.starts()[0]
        assert (epoch, step) == ("3", "30")
        assert worker != agent
        assert worker in imported(pod), "the worker that imported before the barrier is the one"


def test_a_prestart_that_fails_is_not_retried_and_its_epoch_starts_cold(tmp_path: Path) -> None:
    pkgs = install(tmp_path)
    pod = Pod(tmp_path, JSI_PRESTART_IMPORTS="torch", PYTHONPATH=str(pkgs), FAKE_CUDA="1")
    with running(pod):
        until("refused", lambda: "exited 86 before its epoch" in pod.log())
        assert "initialised CUDA" in pod.log()
        pod.open(1, 4)
        until("cold start", lambda: len(pod.starts()) == 1)
        assert pod.starts()[0][:2] == ("1", "4")
        assert len(prestarted(pod)) == 1, "no second pre-start before an epoch ran"
        assert pod.starts()[0][2] not in imported(pod), "cold: the hook imported nothing"


def test_sigterm_to_the_launcher_ends_a_held_command(tmp_path: Path) -> None:
    pkgs = install(tmp_path)
    with running(Pod(tmp_path, JSI_PRESTART_IMPORTS="torch", PYTHONPATH=str(pkgs))) as pod:
        until("held", lambda: "waiting for the barrier" in pod.log())
        (held,) = prestarted(pod)
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(10) == 128 + signal.SIGTERM
        assert not alive(held)
        assert pod.starts() == []


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


def test_which_commands_pass_through_and_which_can_be_prestarted() -> None:
    assert prestart.passes_through(["/usr/bin/python3", "/usr/local/bin/torchrun", "t.py"])
    assert prestart.passes_through(["python3", "-m", "torch.distributed.launch", "t.py"])
    assert not prestart.passes_through(["python3", "t.py"])
    assert not prestart.passes_through(["python3", "-m", "torch.distributed.elastic"])
    assert prestart.refusal(["torchrun", "--nproc-per-node=2", "t.py"]) is None
    assert prestart.refusal(["/usr/bin/python3.11", "-u", "t.py"]) is None
    assert "not Python" in (prestart.refusal(["bash", "-c", "python3 t.py"]) or "")
    assert "-I" in (prestart.refusal(["python3", "-I", "t.py"]) or "")


def test_the_hook_and_the_launcher_agree_on_names_and_run_on_python_3_8() -> None:
    assert launcher.ENV_PRESTART_IMPORTS == prestart.ENV_IMPORTS
    assert launcher.ENV_PRESTART_GO == prestart.ENV_GO
    assert launcher.PRESTART_HOOK_DIR == prestart.HOOK_DIR
    assert (launcher.ENV_EPOCH, launcher.ENV_RESUME_STEP) == (
        prestart.ENV_EPOCH,
        prestart.ENV_RESUME_STEP,
    )
    assert set(prestart.PASS_THROUGH_MODULES) == torchrun.MODULES
    ast.parse(Path(prestart.__file__).read_text(), feature_version=(3, 8))
