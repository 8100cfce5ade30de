"""The process-scope launcher, run as a real process over a temporary state directory with real
child processes: it starts the command only for a new open epoch, stops it when the epoch is
withdrawn, reports what the command did, and never restarts it in an epoch it ran."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobset_inplace import launcher
from jobset_inplace.trainer import ResumeInfo, clear_resume, write_resume

# The child: records each start (epoch, resume step, pid), exits with the code written to
# `exit-now`, and optionally ignores SIGTERM and leaves a grandchild in its process group.
CHILD = r"""
import os, signal, subprocess, sys, time
d = sys.argv[1]
def note(name, value):  # atomically: the test reads these files as soon as they exist
    tmp = os.path.join(d, "." + name)
    with open(tmp, "w") as f:
        f.write(value)
    os.replace(tmp, os.path.join(d, name))
with open(os.path.join(d, "starts"), "a") as f:
    step = os.environ["JSI_RESUME_STEP"] or "-"
    f.write("%s %s %d\n" % (os.environ["JSI_EPOCH"], step, os.getpid()))
with open(os.path.join(d, "slots"), "a") as f:  # a hot spare gang's: the epoch's environment
    f.write("%s %s\n" % (os.environ.get("JSI_SLOT", "-"), os.environ.get("PET_MASTER_ADDR", "-")))
if os.environ.get("CHILD_IGNORES_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    g = subprocess.Popen([sys.executable, "-c", ignore])
    note("grandchild", str(g.pid))
if os.environ.get("CHILD_ESCAPES"):
    # as torchrun starts its workers: each in a session of its own, here ignoring SIGTERM
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    w = subprocess.Popen([sys.executable, "-c", ignore], start_new_session=True)
    note("worker", str(w.pid))
    # and a daemon: double fork, new session, its parent gone (an orphan)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            note("daemon", str(os.getpid()))
            time.sleep(600)
        os._exit(0)
while True:
    p = os.path.join(d, "exit-now")
    if os.path.exists(p):
        code = int(open(p).read()); os.unlink(p); sys.exit(code)
    time.sleep(0.01)
"""


def until(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):  # gone (reaped between the two looks)
        return False
    # A zombie (not reaped by its parent yet) counts as gone.
    return stat.split(")")[-1].split()[0] != "Z"


class Pod:
    """A state directory and a running launcher over it."""

    def __init__(self, tmp: Path, command: list[str] | None = None, **env: str) -> None:
        """``command``: the trainer's (default: CHILD over ``tmp``)."""
        self.dir = tmp
        (tmp / "child.py").write_text(CHILD)
        self.env = {**os.environ, "JSI_STATE_DIR": str(tmp), "JSI_CONTAINER_NAME": "trainer"}
        self.env.update(env)
        self.log_path = tmp / "launcher.log"
        command = command or [sys.executable, str(tmp / "child.py"), str(tmp)]
        with self.log_path.open("w") as log:  # the launcher has its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, launcher.__file__, "--", *command], env=self.env, stderr=log
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_declined(self, epoch: int) -> None:
        """Until the launcher has seen ``epoch``'s resume.json and decided not to run it (the
        positive control of a test that nothing starts)."""
        until(f"epoch {epoch} declined", lambda: f"epoch {epoch}: not run" in self.log())

    def state(self) -> tuple[str, int | None, int | None] | None:
        return launcher.read_state(launcher.state_file(self.dir, "trainer"))

    def wait_state(self, state: str, epoch: int | None, code: int | None = None) -> None:
        until(f"state {state} {epoch} {code}", lambda: self.state() == (state, epoch, code))

    def open(self, epoch: int, step: int | None = None, env: dict[str, str] | None = None) -> None:
        write_resume(ResumeInfo(epoch, step, "ns/gang", env or {}), self.dir)

    def slots(self) -> list[str]:
        """The JSI_SLOT and PET_MASTER_ADDR each start saw ("-": unset)."""
        path = self.dir / "slots"
        return path.read_text().splitlines() if path.exists() else []

    def starts(self) -> list[tuple[str, str, int]]:
        path = self.dir / "starts"
        lines = path.read_text().split("\n") if path.exists() else []
        return [(e, s, int(p)) for e, s, p in (line.split() for line in lines if line)]

    def child_exits(self, code: int) -> None:
        """Tell CHILD to exit with ``code`` (atomically: it polls for the file)."""
        tmp = self.dir / ".exit-now"
        tmp.write_text(str(code))
        tmp.replace(self.dir / "exit-now")


def stop(p: Pod) -> None:
    """End the launcher and every trainer it started (they run in their own sessions: a
    killed launcher would leave them behind outside a container)."""
    if p.proc.poll() is None:
        p.proc.kill()
        p.proc.wait()
    for _, _, pid in p.starts():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    for escaped in ("worker", "daemon"):  # left by a failed test of the stop
        path = p.dir / escaped
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(path.read_text()), signal.SIGKILL)


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    p = Pod(tmp_path)
    yield p
    stop(p)


def test_starts_only_for_a_new_open_epoch_and_stops_when_it_is_withdrawn(pod: Pod) -> None:
    pod.wait_state("waiting", None)
    assert pod.starts() == []  # no resume.json: nothing runs
    pod.open(1, None)
    pod.wait_state("running", 1)
    until("first start", lambda: len(pod.starts()) == 1)
    epoch, step, pid = pod.starts()[0]
    assert (epoch, step) == ("1", "-")
    clear_resume(pod.dir)  # the gang moved on
    pod.wait_state("stopped", 1, 128 + signal.SIGTERM)
    assert not alive(pid)
    pod.open(2, 20)
    pod.wait_state("running", 2)
    until("second start", lambda: len(pod.starts()) == 2)
    assert pod.starts()[1][:2] == ("2", "20")
    assert pod.proc.poll() is None


def test_each_epoch_starts_with_the_environment_resume_json_gives_it(pod: Pod) -> None:
    """A hot spare gang: the slot a pod holds is the epoch's, not the pod's."""
    pod.open(1, None)
    until("first start", lambda: len(pod.slots()) == 1)
    assert pod.slots() == ["- -"], "no environment: nothing added"
    clear_resume(pod.dir)
    pod.wait_state("stopped", 1, 128 + signal.SIGTERM)
    pod.open(2, 5, {"JSI_SLOT": "3", "PET_MASTER_ADDR": "js-w-4-0.js"})
    until("second start", lambda: len(pod.slots()) == 2)
    assert pod.slots()[1] == "3 js-w-4-0.js"


def test_a_crash_is_reported_and_not_restarted_in_the_same_epoch(pod: Pod) -> None:
    pod.open(3, 10)
    until("start", lambda: len(pod.starts()) == 1)
    pod.child_exits(3)
    pod.wait_state("exited", 3, 3)
    # resume.json of epoch 3 is still there: the crashed epoch is never run again
    pod.wait_declined(3)
    assert len(pod.starts()) == 1
    assert pod.state() == ("exited", 3, 3)
    pod.open(4, 10)
    until("start in epoch 4", lambda: len(pod.starts()) == 2)
    pod.child_exits(0)  # training done: the launcher ends with it
    assert pod.proc.wait(10) == 0
    assert pod.state() == ("exited", 4, 0)


def test_a_stale_epoch_is_not_run(pod: Pod) -> None:
    pod.open(5)
    until("start", lambda: len(pod.starts()) == 1)
    pod.child_exits(3)
    pod.wait_state("exited", 5, 3)
    pod.open(4)  # older than what ran: never
    pod.wait_declined(4)
    assert len(pod.starts()) == 1
    pod.open(6)  # and a newer one still runs
    until("start in epoch 6", lambda: len(pod.starts()) == 2)
    assert pod.starts()[1][0] == "6"
    assert pod.log().count("epoch 4: not run") == 1, "said once, not on every poll"


def test_a_child_ignoring_sigterm_is_killed_with_its_group_after_the_grace(tmp_path: Path) -> None:
    pod = Pod(tmp_path, JSI_STOP_GRACE_SECONDS="0.3", CHILD_IGNORES_TERM="1")
    try:
        pod.open(1)
        until("grandchild", (tmp_path / "grandchild").exists)
        grandchild = int((tmp_path / "grandchild").read_text())
        began = time.monotonic()
        clear_resume(tmp_path)
        pod.wait_state("stopped", 1, 128 + signal.SIGKILL)
        assert time.monotonic() - began >= 0.3
        until("grandchild gone", lambda: not alive(grandchild))
    finally:
        stop(pod)


def test_stopped_means_no_process_of_the_epoch_is_left(tmp_path: Path) -> None:
    """Workers in sessions of their own (torchrun's) ignoring SIGTERM and a daemonized orphan
    are gone before the launcher says ``stopped``, and after a crash before ``exited``."""
    pod = Pod(tmp_path, JSI_STOP_GRACE_SECONDS="0.3", CHILD_ESCAPES="1")
    try:
        for epoch, end in ((1, "withdrawn"), (2, "crash")):
            for name in ("worker", "daemon"):
                (tmp_path / name).unlink(missing_ok=True)
            pod.open(epoch)
            until(
                "worker and daemon",
                lambda: all((tmp_path / n).exists() for n in ("worker", "daemon")),
            )
            escaped = [int((tmp_path / n).read_text()) for n in ("worker", "daemon")]
            assert all(alive(pid) for pid in escaped)
            if end == "withdrawn":
                clear_resume(tmp_path)
                pod.wait_state("stopped", epoch, 128 + signal.SIGTERM)
            else:
                pod.child_exits(5)
                pod.wait_state("exited", epoch, 5)
            assert [pid for pid in escaped if alive(pid)] == [], f"epoch {epoch} ({end})"
    finally:
        stop(pod)


def test_sigterm_to_the_launcher_stops_the_child(pod: Pod) -> None:
    pod.open(1)
    until("start", lambda: len(pod.starts()) == 1)
    pid = pod.starts()[0][2]
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(10) == 128 + signal.SIGTERM
    assert not alive(pid)


def test_a_command_that_cannot_start_is_reported_as_exit_127(tmp_path: Path) -> None:
    env = {**os.environ, "JSI_STATE_DIR": str(tmp_path), "JSI_CONTAINER_NAME": "trainer"}
    proc = subprocess.Popen(
        [sys.executable, launcher.__file__, "--", "/no/such/trainer"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        write_resume(ResumeInfo(1, None, "ns/gang"), tmp_path)
        path = launcher.state_file(tmp_path, "trainer")
        until("exited 127", lambda: launcher.read_state(path) == ("exited", 1, 127))
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "cannot start '/no/such/trainer'" in err


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({"JSI_CONTAINER_NAME": ""}, ["--", "true"]),
        ({"JSI_CONTAINER_NAME": "t", "JSI_STOP_GRACE_SECONDS": "soon"}, ["--", "true"]),
        ({"JSI_CONTAINER_NAME": "t"}, ["--"]),
    ],
)
def test_bad_usage_exits_2_with_a_message(
    tmp_path: Path, env: dict[str, str], args: list[str]
) -> None:
    full = {**os.environ, "JSI_STATE_DIR": str(tmp_path), **env}
    done = subprocess.run(
        [sys.executable, launcher.__file__, *args],
        check=False,
        env=full,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 2
    assert "jobset-inplace launcher:" in done.stderr


def test_state_file_round_trip_and_garbage(tmp_path: Path) -> None:
    path = launcher.state_file(tmp_path, "c")
    assert launcher.read_state(path) is None
    path.write_text(json.dumps({"state": "exited", "epoch": 2, "code": 3}))
    assert launcher.read_state(path) == ("exited", 2, 3)
    path.write_text("{not json")
    assert launcher.read_state(path) is None
    path.write_text(json.dumps({"state": "dancing"}))
    assert launcher.read_state(path) is None


def test_the_launcher_parses_as_python_3_8() -> None:
    """It runs on the trainer image's interpreter, which may be older than the agent's."""
    ast.parse(Path(launcher.__file__).read_text(), feature_version=(3, 8))


def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ("T": stopped; "" gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return ""


def test_under_a_lease_a_trainer_runs_only_while_it_holds(tmp_path: Path) -> None:
    """Hot spares: no lease, no start; the lease ends, the trainer's whole tree is frozen;
    renewed, it runs on; its epoch withdrawn while frozen, it is killed without running
    again (docs/design/hot-spares.md, section 5)."""
    p = Pod(tmp_path, None, **{launcher.ENV_LEASE: "1", "CHILD_ESCAPES": "1"})
    try:
        p.open(1)
        until("waiting for the lease", lambda: "waiting for the agent's lease" in p.log())
        assert p.starts() == []
        launcher.write_lease(tmp_path, time.monotonic() + 1.0)
        until("start", lambda: len(p.starts()) == 1)
        pid = p.starts()[0][2]
        until("worker", (tmp_path / "worker").exists)
        worker = int((tmp_path / "worker").read_text())
        until("frozen", lambda: process_state(pid) == "T" and process_state(worker) == "T")
        assert "the agent's lease ended: freezing" in p.log()
        launcher.write_lease(tmp_path, time.monotonic() + 60)
        # (each process of the tree is sent SIGCONT in turn: wait for both)
        until("thawed", lambda: {process_state(pid), process_state(worker)}.isdisjoint("T"))
        assert alive(pid)
        assert alive(worker)
        assert "lease renewed: resuming after" in p.log()
        launcher.write_lease(tmp_path, time.monotonic() - 1)
        until("frozen again", lambda: process_state(pid) == "T")
        clear_resume(tmp_path)  # the gang moved on while it was frozen
        p.wait_state("stopped", 1, 128 + signal.SIGKILL)
        assert not alive(pid)
        assert not alive(worker)
        assert "stopped frozen" in p.log()
        for escaped in ("worker", "daemon"):  # the next epoch's, named before stop() runs
            (tmp_path / escaped).unlink()
        launcher.write_lease(tmp_path, None)  # no channel: no bound
        p.open(2)
        until("second start", lambda: len(p.starts()) == 2)
        # its escaped worker and daemon named: stop() kills them (a daemon not yet named when
        # the test ended was left running, orphaned, for its 600 s)
        until(
            "worker and daemon", lambda: all((tmp_path / n).exists() for n in ("worker", "daemon"))
        )
    finally:
        stop(p)


def test_a_frozen_trainer_whose_epoch_ends_is_thawed_to_stop_if_its_lease_is_renewed(
    tmp_path: Path,
) -> None:
    """The leader died: every holder's lease ended and its trainer froze. The successor ends
    the epoch and answers that this pod still holds its slot (the agent renews the lease only
    then): the trainer is thawed and stopped with SIGTERM, as any other, so it can keep its
    step, not killed frozen. Without the renewal it is killed (the test above)."""
    p = Pod(tmp_path, None, **{launcher.ENV_LEASE: "1"})
    try:
        launcher.write_lease(tmp_path, time.monotonic() + 1.0)
        p.open(1)
        until("start", lambda: len(p.starts()) == 1)
        pid = p.starts()[0][2]
        until("frozen", lambda: process_state(pid) == "T")
        clear_resume(tmp_path)  # the gang moved on while it was frozen
        until("waiting to thaw", lambda: "the gang moved on" in p.log())
        assert process_state(pid) == "T", "still frozen: no lease yet"
        launcher.write_lease(tmp_path, time.monotonic() + 3.0)  # renewed within THAW_WAIT_S
        p.wait_state("stopped", 1, 128 + signal.SIGTERM)
        assert "thawing to stop" in p.log()
        assert "stopped frozen" not in p.log()
    finally:
        stop(p)


def test_a_lease_file_that_cannot_be_read_is_no_lease(tmp_path: Path) -> None:
    now = time.monotonic()
    assert not launcher.lease_holds(tmp_path, now), "no file"
    for text in ("", "not json", "[]", '{"until": "soon"}', '{"until": true}', "{}"):
        (tmp_path / launcher.LEASE_FILE).write_text(text)
        assert not launcher.lease_holds(tmp_path, now), text
    launcher.write_lease(tmp_path, now + 1)
    assert launcher.lease_holds(tmp_path, now)
    assert not launcher.lease_holds(tmp_path, now + 1)
    assert launcher.lease_renewed(tmp_path, now)
    assert not launcher.lease_renewed(tmp_path, now + 1)
    launcher.write_lease(tmp_path, None)
    assert launcher.lease_holds(tmp_path, now + 1e9)
    assert not launcher.lease_renewed(tmp_path, now), "no bound: no leader's word on the slot"
