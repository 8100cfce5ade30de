"""The demo trainer ends on SIGTERM also as PID 1 of its own PID namespace, as in a container:
there the kernel drops a signal from outside that PID 1 has no handler for, and a pod-level
restart would wait out the grace period (the artifact bench.realnode once measured)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobset_inplace import names
from jobset_inplace.launcher import ENV_STATE_DIR
from jobset_inplace.trainer.stop import StopAt, write_stop
from testbed.demo_trainer import (
    ENV_TRUTH_FILE,
    MEMBER_REF,
    gang_began,
    member,
    parse_truth,
    truth_path,
)

TRAINER = Path(__file__).resolve().parents[2] / "testbed" / "demo_trainer.py"
EXIT_ON_SIGTERM = 128 + signal.SIGTERM


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _wait(what: str, probe: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.05)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace needs root and unshare (CI has both)",
)
def test_the_demo_trainer_ends_on_sigterm_as_pid_1(tmp_path: Path) -> None:
    truth = tmp_path / "truth.log"
    env = {
        **os.environ,
        "JSI_DEMO_STANDALONE": "1",  # no agent: it trains from its own checkpoints
        "JSI_DEMO_STEP_SECONDS": "0.05",
        "JSI_DEMO_TRUTH_FILE": str(truth),
        ENV_STATE_DIR: str(tmp_path / "state"),
        "PYTHONPATH": str(TRAINER.parents[1]),
    }
    (tmp_path / "state").mkdir()
    outer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, str(TRAINER)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait("the trainer's first steps", lambda: truth.exists() and "step" in truth.read_text())
        (trainer,) = _children(outer.pid)  # PID 1 inside its namespace
        (nspid,) = [
            line.split()[1:]
            for line in Path(f"/proc/{trainer}/status").read_text().splitlines()
            if line.startswith("NSpid:")
        ]
        assert nspid[-1] == "1", f"not PID 1 of its own namespace: NSpid {nspid}"
        os.kill(trainer, signal.SIGTERM)  # from outside its namespace, as the kubelet's runtime
        assert outer.wait(timeout=30) == EXIT_ON_SIGTERM
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()


def _crashing_run(env: dict[str, str]) -> str:
    """What the trainer says in a run that ends by an injected crash (exit 3)."""
    done = subprocess.run(
        [sys.executable, str(TRAINER)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_step_that_always_crashes_ends_every_run_before_it(tmp_path: Path) -> None:
    """JSI_DEMO_CRASH_AT_STEP (the stop rule's e2e): the trainer exits 3 before that step,
    whichever step below it it starts from (standalone: from its own newest checkpoint)."""
    env = {
        **os.environ,
        "JSI_DEMO_STANDALONE": "1",
        "JSI_DEMO_STEP_SECONDS": "0.01",
        "JSI_DEMO_CRASH_AT_STEP": "7",
        "JSI_DEMO_CHECKPOINT_EVERY": "5",
        "JSI_CHECKPOINT_LOCAL_DIR": str(tmp_path / "ckpt"),
        ENV_STATE_DIR: str(tmp_path / "state"),
        "PYTHONPATH": str(TRAINER.parents[1]),
    }
    (tmp_path / "state").mkdir()
    for resumed in (0, 5):  # the second run resumes from the first's checkpoint of step 5
        said = _crashing_run(env)
        assert f"resuming at step {resumed}" in said
        assert "step 7 always crashes" in said


def _last_step(truth: Path) -> int:
    steps = [int(line.split()[2]) for line in truth.read_text().splitlines() if line[:4] == "step"]
    return steps[-1]


@pytest.mark.parametrize("failure", ["injected", "sigterm", "hang", "no keeper"])
def test_the_demo_trainer_keeps_the_step_a_failure_interrupts(tmp_path: Path, failure: str) -> None:
    """JSI_DEMO_KEEP_STEP=1, no periodic checkpoint within reach: an injected failure (exit 3),
    a SIGTERM (143), or a SIGTERM while it hangs (the keeper's thread saves; SIGKILL ends it)
    leaves the newest step it did saved in both tiers, and the next run resumes there. Without
    the keeper nothing is saved."""
    state, truth, log = tmp_path / "state", tmp_path / "truth.log", tmp_path / "out.log"
    state.mkdir()
    env = {
        **os.environ,
        "JSI_DEMO_STANDALONE": "1",
        "JSI_DEMO_STEP_SECONDS": "0.02",
        "JSI_DEMO_CHECKPOINT_EVERY": "100000",
        "JSI_DEMO_TRUTH_FILE": str(truth),
        "JSI_CHECKPOINT_LOCAL_DIR": str(tmp_path / "local"),
        "JSI_CHECKPOINT_PERSISTENT_DIR": str(tmp_path / "persistent"),
        ENV_STATE_DIR: str(state),
        "PYTHONPATH": str(TRAINER.parents[1]),
    }
    if failure != "no keeper":
        env["JSI_DEMO_KEEP_STEP"] = "1"
    with log.open("w") as out:
        trainer = subprocess.Popen([sys.executable, str(TRAINER)], env=env, stdout=out, stderr=out)
    try:
        _wait("ten steps", lambda: truth.exists() and truth.read_text().count("step ") >= 10)
        if failure == "sigterm":
            trainer.send_signal(signal.SIGTERM)
            assert trainer.wait(timeout=30) == EXIT_ON_SIGTERM
        elif failure == "hang":
            (state / "inject-hang").touch()
            _wait("the hang", lambda: "hanging" in log.read_text())
            trainer.send_signal(signal.SIGTERM)
            _wait("the kept step", lambda: "kept" in log.read_text())
            assert trainer.poll() is None, "still hung: only the keeper's thread ran"
            trainer.kill()
            trainer.wait(timeout=30)
        else:
            (state / "inject-failure").touch()
            assert trainer.wait(timeout=30) == 3, log.read_text()
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    last = _last_step(truth)
    kept = sorted(p.name for p in (tmp_path / "persistent").glob("step-*"))
    assert kept == ([] if failure == "no keeper" else [f"step-{last}"]), log.read_text()
    (state / "inject-failure").write_text("")  # the next run ends at its first step
    resumed = 0 if failure == "no keeper" else last
    assert f"resuming at step {resumed} " in _crashing_run(env)


def test_the_trainers_account_of_kept_and_wasted_training() -> None:
    """Epoch 1: steps 1-4 (1 s each from t=100), a crash at 104.5 (half of step 5 under way);
    epoch 2 resumes at 2 (steps 3-4 redone), its steps 3-5 from t=110. Kept before epoch 2:
    steps 1-2 (2 s); wasted: the epoch's 4.5 s of training less them. A step finished after
    the crash (the survivor's, before the recovery stopped it) is neither."""
    lines = ["resume 1 0"]
    lines += [f"step 1 {s} {99 + s:.6f} {100 + s:.6f}" for s in range(1, 5)]
    lines += ["crash 1 104.500000", "step 1 5 104.000000 105.000000", "resume 2 2"]
    lines += [f"step 2 {s} {107 + s:.6f} {108 + s:.6f}" for s in range(3, 6)]
    truth = parse_truth("\n".join(lines))
    assert truth.crashes == {1: 104.5}
    began = gang_began([truth])
    assert began == {1: 100.0, 2: 110.0}
    assert truth.kept_seconds(2, began) == pytest.approx(2.0)
    assert truth.wasted_seconds(2, began, truth.crashes) == pytest.approx(4.5 - 2.0)
    assert truth.newest_step(2) == 5
    with pytest.raises(ValueError, match="not a line"):
        parse_truth("resume 1 0\nnonsense")


def test_in_lockstep_every_members_account_starts_when_the_last_member_began() -> None:
    """A gang in lockstep whose member 1 came back 0.6 s after member 0 (its pod restarted
    later): member 0's first step waited for it in the all-reduce, so both first steps end
    at 101. The gang trained from 100.6, member 1's start; member 0's wait before is not
    training (the controller counts it as restore), so both accounts agree."""
    early = ["resume 1 0", "step 1 1 99.400000 101.000000", "step 1 2 101.000000 102.000000"]
    late = ["resume 1 0", "step 1 1 100.600000 101.000000", "step 1 2 101.000000 102.000000"]
    resumed = ["resume 2 2", "crash 1 102.500000"]
    truths = [parse_truth("\n".join(lines + resumed)) for lines in (early, late)]
    began = gang_began(truths)
    assert began == {1: pytest.approx(100.6)}
    for truth in truths:
        assert truth.kept_seconds(2, began) == pytest.approx(1.4)
        assert truth.wasted_seconds(2, began, truth.crashes) == pytest.approx(0.5)


def test_in_lockstep_a_member_commits_a_step_only_once_every_member_computed_it(
    tmp_path: Path,
) -> None:
    """JSI_DEMO_LOCKSTEP_DIR (the soak's gang, as data-parallel training is): member 0 of two
    computes step 1 and waits; it commits step 1 when member 1 says it computed it too, and
    no step after it while member 1 is gone."""
    truth, lockstep = tmp_path / "truth.log", tmp_path / "lockstep"
    env = {
        **os.environ,
        "JSI_DEMO_STANDALONE": "1",
        "JSI_DEMO_STEP_SECONDS": "0.01",
        "JSI_DEMO_TRUTH_FILE": str(truth),
        "JSI_DEMO_LOCKSTEP_DIR": str(lockstep),
        "JSI_DEMO_GANG_SIZE": "2",
        "JOB_INDEX": "0",
        ENV_STATE_DIR: str(tmp_path / "state"),
        "PYTHONPATH": str(TRAINER.parents[1]),
    }
    (tmp_path / "state").mkdir()
    mine, peer = lockstep / "epoch-0-member-0", lockstep / "epoch-0-member-1"
    trainer = subprocess.Popen([sys.executable, str(TRAINER)], env=env, stdout=subprocess.DEVNULL)
    try:
        _wait("member 0 computed step 1", lambda: mine.exists() and mine.read_text() == "1")
        assert "step" not in truth.read_text(), "committed without its peer"
        peer.write_text("1")
        _wait("member 0 computed step 2", lambda: mine.read_text() == "2")
        assert _last_step(truth) == 1, "step 1 committed, step 2 waits for the peer"
    finally:
        trainer.kill()
        trainer.wait()


def test_in_lockstep_a_planned_stop_at_a_committed_step_parks_the_waiting_member(
    tmp_path: Path,
) -> None:
    """Its peers parked at a step it committed (the stop reached it late, while it waited for
    them at the next): it parks at that step too, its checkpoint saved, instead of waiting."""
    lockstep, state = tmp_path / "lockstep", tmp_path / "state"
    state.mkdir()
    env = {
        **os.environ,
        "JSI_DEMO_STANDALONE": "1",
        "JSI_DEMO_STEP_SECONDS": "0.01",
        "JSI_DEMO_LOCKSTEP_DIR": str(lockstep),
        "JSI_DEMO_GANG_SIZE": "2",
        "JOB_INDEX": "0",
        "JSI_CHECKPOINT_LOCAL_DIR": str(tmp_path / "ckpt"),
        ENV_STATE_DIR: str(state),
        "PYTHONPATH": str(TRAINER.parents[1]),
    }
    mine = lockstep / "epoch-0-member-0"
    trainer = subprocess.Popen(
        [sys.executable, str(TRAINER)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        _wait("member 0 computed step 1", lambda: mine.exists() and mine.read_text() == "1")
        (lockstep / "epoch-0-member-1").write_text("1")
        _wait("member 0 computed step 2", lambda: mine.read_text() == "2")
        write_stop(StopAt(1, 1), state)
        _wait("its checkpoint of step 1", (tmp_path / "ckpt" / "step-1").is_dir)
    finally:
        trainer.kill()
        said, _ = trainer.communicate()
    assert "step 1: checkpoint saved (local) for a planned stop; parked" in said, said


def test_the_trainer_is_the_member_its_slot_says_where_a_launcher_gives_one() -> None:
    """With hot spares the launcher gives each epoch's trainer its slot (JSI_SLOT): a spare's
    pod index is not its member's, so its account and lockstep files are the slot's."""
    assert member({"JOB_INDEX": "2"}) == "2"
    assert member({"JOB_INDEX": "2", names.ENV_SLOT: "1"}) == "1"
    assert member({}) == ""
    path = f"/shared/truth-{MEMBER_REF}.log"
    assert truth_path({ENV_TRUTH_FILE: path, names.ENV_SLOT: "1"}) == "/shared/truth-1.log"
    assert truth_path({ENV_TRUTH_FILE: path, "JOB_INDEX": "0"}) == "/shared/truth-0.log"
    assert truth_path({ENV_TRUTH_FILE: "/a/b.log"}) == "/a/b.log"
    assert truth_path({}) is None
    with pytest.raises(SystemExit, match="JSI_SLOT or JOB_INDEX"):
        truth_path({ENV_TRUTH_FILE: path})
