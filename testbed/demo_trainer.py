"""A small demo trainer: it "trains" by advancing a step counter, checkpoints through the
trainer contract, and resumes from the step the gang agreed on. Standard library only, so it
runs in the minimal Python image of the local cluster.

Failure injection for demos and tests: creating ``$JSI_STATE_DIR/inject-failure`` makes the
trainer exit with status 3 at its next step (as a crashed worker would); if the file holds a
time (seconds since the epoch), it exits at that time exactly, so that a benchmark knows when
the crash happened.

``JSI_DEMO_CRASH_AT_STEP=N`` makes every epoch's trainer exit with status 3 before step ``N``
(a step that always crashes: a bad batch), whichever step it resumed from below it.

Creating ``$JSI_STATE_DIR/inject-hang`` makes it hang at its next step, as a worker stuck in a
collective does: every process alive, no more progress, SIGTERM ignored (only SIGKILL ends it).
``JSI_DEMO_STARTUP_HANG_EPOCHS=1,3`` makes it hang before its first step in those epochs (a
rendezvous that never forms). ``$JSI_STATE_DIR/inject-slow`` holding a factor (e.g. ``4``)
makes its busy time per step that many times longer from the next step on (at most the whole
step), as a degraded device or node does to one member of a synchronous gang: it computes
longer while the others wait for it in collectives, so the step pace and step numbers stay
the gang's (a quarter of a step is busy otherwise). It reports its progress and busy time
every step (the signals of hang and straggler detection, and goodput accounting). At a planned
stop (``report_progress`` says so: a member's node is drained) it saves a checkpoint of that
step in every tier it has and parks until the gang's recovery restarts it.

Environment: ``JSI_DEMO_STEP_SECONDS`` (default 0.5), ``JSI_DEMO_CHECKPOINT_EVERY`` (default 10
steps), ``JSI_DEMO_PERSIST_EVERY`` (default 20 steps; also saved to the persistent tier),
``JSI_DEMO_STANDALONE=1``: no jobset-inplace agent (stock JobSet, upstream InPlaceRestart): the
trainer resumes from its own newest complete checkpoint, as such a trainer must.

``JSI_DEMO_TRUTH_FILE``: a file the trainer appends its own account to (goodput's ground truth,
e2e/test_goodput.py): ``resume <epoch> <step>`` when it resumes, then ``step <epoch> <step>
<start> <end>`` for every step done (seconds since the epoch: from the previous step's end, or
the loop's start, to the moment it reports the step's progress). A step's line and its progress
record are written with SIGTERM held, so a stop never leaves one without the other.

SIGTERM ends it at once (exit 143) wherever it runs, also as its container's PID 1.

``JSI_DEMO_KEEP_STEP=1``: it keeps the step a failure interrupts (``jobset_inplace.trainer.keep``,
docs/trainer-contract.md "Keeping the interrupted step"): an injected failure (raised inside the
loop, as an exception would be), a SIGTERM, or a SIGTERM while it hangs (the main thread blocks
SIGTERM there, as one stuck in native code runs no handler: the keeper's thread saves) saves the
newest step it did to every tier it has, unless a persistent checkpoint of it exists.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from jobset_inplace import names
from jobset_inplace.trainer import (
    park,
    report_progress,
    resolve_state_dir,
    save_checkpoint,
    tier_roots,
    wait_for_resume,
)
from jobset_inplace.trainer.checkpoints import available_steps
from jobset_inplace.trainer.keep import StepKeeper
from jobset_inplace.trainer.stop import read_stop

FAILURE_FILE = "inject-failure"
FAILURE_EXIT_CODE = 3
HANG_FILE = "inject-hang"
ENV_CRASH_AT_STEP = "JSI_DEMO_CRASH_AT_STEP"
SLOW_FILE = "inject-slow"
# The share of a step spent computing (busy); the rest is waiting for the other members in
# collectives. A straggler computes longer, the others wait longer: the gang keeps one pace.
BUSY_SHARE = 0.25
ENV_STARTUP_HANG_EPOCHS = "JSI_DEMO_STARTUP_HANG_EPOCHS"
ENV_KEEP_STEP = "JSI_DEMO_KEEP_STEP"
# The gang in lockstep, as data-parallel training is (each step ends in an all-reduce): a
# directory the gang shares, where each member says the newest step it has computed in its
# epoch, and the gang's size; a member commits a step only once every member computed it, so
# it waits while a peer is gone (dead, hung, on a silent node) instead of training alone.
# Unset: each member trains on its own.
ENV_LOCKSTEP_DIR = "JSI_DEMO_LOCKSTEP_DIR"
ENV_GANG_SIZE = "JSI_DEMO_GANG_SIZE"
# The trainer's own account (a file; its lines: _Truth); MEMBER_REF in its path is replaced by
# the member this trainer is (`member`)
ENV_TRUTH_FILE = "JSI_DEMO_TRUTH_FILE"
MEMBER_REF = "{member}"
LOCKSTEP_POLL_S = 0.01
# Periodic checkpoints: every CHECKPOINT_EVERY steps locally, every PERSIST_EVERY persistently
# (JSI_DEMO_CHECKPOINT_EVERY / JSI_DEMO_PERSIST_EVERY override them)
CHECKPOINT_EVERY, PERSIST_EVERY = 10, 20


class InjectedCrash(Exception):
    """An injected failure: the trainer exits FAILURE_EXIT_CODE."""


class _StopDue(Exception):
    """A planned stop at a step this member already committed, seen while it waited for its
    peers in lockstep (they parked there): it parks there too."""


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} trainer {msg}", flush=True)


def _write_step(step: int) -> object:
    def write(directory: Path) -> None:
        (directory / "state.txt").write_text(f"step={step}\n")

    return write


class _Truth:
    """The trainer's own account (``ENV_TRUTH_FILE``); each line one O_APPEND write."""

    def __init__(self, path: str | None, epoch: int) -> None:
        self.fd = None if not path else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.epoch = epoch

    def write(self, line: str) -> None:
        if self.fd is not None:
            os.write(self.fd, f"{line}\n".encode())

    def resumed(self, step: int) -> None:
        self.write(f"resume {self.epoch} {step}")

    def stepped(self, step: int, start: float, end: float) -> None:
        self.write(f"step {self.epoch} {step} {start:.6f} {end:.6f}")

    def crashed(self, at: float) -> None:
        """An injected crash ends the epoch now: the failure's moment, on the trainer's clock."""
        self.write(f"crash {self.epoch} {at:.6f}")


class _Lockstep:
    """The gang's all-reduce, through files in a shared directory (``ENV_LOCKSTEP_DIR``)."""

    def __init__(self, directory: Path, members: int, index: str, epoch: int) -> None:
        self.dir, self.members, self.index, self.epoch = directory, members, index, epoch
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, index: object) -> Path:
        return self.dir / f"epoch-{self.epoch}-member-{index}"

    def computed(self, step: int) -> None:
        partial = self.dir / f".{self._path(self.index).name}.{os.getpid()}"
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no half-made file left
        try:
            partial.write_text(str(step))
            partial.replace(self._path(self.index))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def all_computed(self, step: int) -> bool:
        for i in range(self.members):
            try:
                if int(self._path(i).read_text()) < step:
                    return False
            except (FileNotFoundError, ValueError):
                return False
        return True

    def wait(self, step: int, interrupted: Callable[[], None]) -> None:
        """Until every member computed ``step``; ``interrupted`` is called between looks (an
        injected failure raises from it, as a collective's peer failing would)."""
        self.computed(step)
        while not self.all_computed(step):
            interrupted()
            time.sleep(LOCKSTEP_POLL_S)


def member(env: Mapping[str, str]) -> str:
    """The member this trainer is: the slot its launcher gives it this epoch (``JSI_SLOT``: a
    gang with hot spares, where a spare may hold another pod's slot), else its pod's JobSet
    job index (``JOB_INDEX``, the demo JobSet's); "" where neither is set."""
    return env.get(names.ENV_SLOT) or env.get("JOB_INDEX", "")


def truth_path(env: Mapping[str, str]) -> str | None:
    """Where this trainer writes its own account (``ENV_TRUTH_FILE``, its ``MEMBER_REF``
    replaced by :func:`member`); None: nowhere."""
    path = env.get(ENV_TRUTH_FILE)
    if path and MEMBER_REF in path and not member(env).isdigit():
        raise SystemExit(f"{ENV_TRUTH_FILE} names {MEMBER_REF}: needs JSI_SLOT or JOB_INDEX")
    return path.replace(MEMBER_REF, member(env)) if path else None


def lockstep_from_env(epoch: int) -> _Lockstep | None:
    directory = os.environ.get(ENV_LOCKSTEP_DIR)
    if not directory:
        return None
    members = int(os.environ.get(ENV_GANG_SIZE) or "0")
    index = member(os.environ)
    if members < 1 or not index.isdigit():
        raise SystemExit(
            f"{ENV_LOCKSTEP_DIR} needs {ENV_GANG_SIZE} >= 1 and JSI_SLOT or JOB_INDEX (a number)"
        )
    return _Lockstep(Path(directory), members, index, epoch)


@dataclass(frozen=True)
class Step:
    epoch: int
    step: int
    start: float
    end: float


@dataclass(frozen=True)
class Truth:
    """One trainer's account (what ``_Truth`` wrote): its resumes (epoch -> step), the steps it
    did and the moments its injected crashes ended an epoch (epoch -> time)."""

    resumes: dict[int, int]
    steps: list[Step]
    crashes: dict[int, float]

    def kept_seconds(
        self, before_epoch: int, began: Mapping[int, float], epoch: int | None = None
    ) -> float:
        """Seconds of the steps done before ``before_epoch`` (in ``epoch`` only, if given)
        that the gang keeps (a resume at step R throws away every step past R done before
        it), each from when the gang began to train in its epoch at the earliest
        (``began``: :func:`gang_began`)."""
        kept = self._kept(before_epoch).values()
        return sum(_trained(s, began) for s in kept if epoch is None or s.epoch == epoch)

    def _kept(self, before_epoch: int) -> dict[int, Step]:
        kept: dict[int, Step] = {}
        for epoch in sorted(self.resumes):
            if epoch > before_epoch:
                break
            resume = self.resumes[epoch]
            kept = {s: v for s, v in kept.items() if s <= resume}
            if epoch == before_epoch:
                break
            kept |= {s.step: s for s in self.steps if s.epoch == epoch}
        return kept

    def wasted_seconds(
        self, before_epoch: int, began: Mapping[int, float], ended: Mapping[int, float]
    ) -> float:
        """Seconds of training before ``before_epoch`` that the gang threw away, as this
        trainer's steps tell it: each epoch from ``began[epoch]`` (when the gang began to
        train: :func:`gang_began`) to ``ended[epoch]`` (when the failure that ended it
        happened: the crashed trainer's own account), less the time of this trainer's steps
        the gang keeps (as :meth:`kept_seconds`). A step under way at the failure is wasted;
        steps finished after it (before the recovery stopped this trainer) are not training
        time of the epoch."""
        kept = self._kept(before_epoch)
        wasted = 0.0
        for epoch in range(min(self.resumes, default=before_epoch), before_epoch):
            if epoch not in began or epoch not in ended:
                continue
            steps = [s for s in self.steps if s.epoch == epoch and s.end <= ended[epoch]]
            wasted += (ended[epoch] - began[epoch]) - sum(
                _trained(s, began) for s in steps if kept.get(s.step) == s
            )
        return wasted

    def newest_step(self, epoch: int) -> int | None:
        return max((s.step for s in self.steps if s.epoch == epoch), default=None)


def gang_began(truths: Iterable[Truth]) -> dict[int, float]:
    """When the gang began to train in each epoch: its last member's first step. A gang in
    lockstep (``ENV_LOCKSTEP_DIR``), as data-parallel training is, trains only once every
    member is back: the members back before wait in the first step's all-reduce, restoring
    (the controller's account counts it so: docs/metrics.md). Members that train on their own
    are not a gang this account fits."""
    began: dict[int, float] = {}
    for truth in truths:
        own: dict[int, float] = {}
        for s in truth.steps:
            own[s.epoch] = min(own.get(s.epoch, s.start), s.start)
        for epoch, start in own.items():
            began[epoch] = max(began.get(epoch, start), start)
    return began


def _trained(step: Step, began: Mapping[int, float]) -> float:
    """``step``'s time as the gang's training: from its start, or from when the gang began
    to train in its epoch where that is later (a member's first step, waiting for the rest)."""
    return max(0.0, step.end - max(step.start, began.get(step.epoch, step.start)))


def parse_truth(text: str) -> Truth:
    resumes: dict[int, int] = {}
    steps: list[Step] = []
    crashes: dict[int, float] = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        if kind == "resume":
            resumes[int(fields[0])] = int(fields[1])
        elif kind == "crash":
            crashes[int(fields[0])] = float(fields[1])
        else:
            if kind != "step":
                raise ValueError(f"not a line of a trainer's account: {line!r}")
            steps.append(Step(int(fields[0]), int(fields[1]), float(fields[2]), float(fields[3])))
    return Truth(resumes, steps, crashes)


def _hang(why: str, *, keeping: bool = False) -> NoReturn:
    if keeping:  # as native code: no handler runs on this thread (the keeper's thread saves)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _log(f"hanging {why}: no more progress, SIGTERM ignored")
    while True:
        time.sleep(3600)


def _tier(local: Path | None, persistent: Path | None, *, persist: bool) -> str:
    """The tier a save of this kind goes to ("" where there is none)."""
    if persistent is not None and (persist or local is None):
        return "both" if local is not None else "persistent"
    return "local" if local is not None else ""


def _keeper(local: Path | None, persistent: Path | None, step: int) -> StepKeeper:
    tier = _tier(local, persistent, persist=True)

    def save(kept: int) -> None:
        save_checkpoint(kept, _write_step(kept), tier)  # type: ignore[arg-type]
        _log(f"step {kept}: kept ({tier})")

    return StepKeeper(save, step=step)


def _terminated(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def main() -> int:
    # SIGTERM ends the trainer at once, as any Python program's default does, also where it is
    # its container's PID 1 (the kernel drops a signal PID 1 has no handler for: a pod-level
    # restart would wait out the whole grace period, an artifact no real trainer under torchrun
    # or an init has).
    signal.signal(signal.SIGTERM, _terminated)
    step_s = float(os.environ.get("JSI_DEMO_STEP_SECONDS", "0.5"))
    state_dir = resolve_state_dir()
    local, persistent = tier_roots()
    standalone = bool(os.environ.get("JSI_DEMO_STANDALONE"))
    if standalone:
        steps = available_steps(local, persistent)
        step = steps[0] if steps else 0
        _log(f"epoch 0: resuming at step {step} (standalone: its own newest checkpoint)")
        epoch = 0
    else:
        info = wait_for_resume(timeout=600)
        step, epoch = info.resume_step or 0, info.epoch
        _log(f"epoch {info.epoch}: resuming at step {step} ({info.gang})")
        hang_epochs = os.environ.get(ENV_STARTUP_HANG_EPOCHS, "").split(",")
        if str(info.epoch) in hang_epochs:
            _hang(f"before the first step of epoch {info.epoch}")
    truth = _Truth(truth_path(os.environ), epoch)
    truth.resumed(step)
    keeper = _keeper(local, persistent, step) if os.environ.get(ENV_KEEP_STEP) == "1" else None
    try:
        with keeper or contextlib.nullcontext():
            _train(
                step,
                step_s,
                state_dir,
                truth,
                keeper,
                standalone=standalone,
                lockstep=lockstep_from_env(epoch),
            )
    except InjectedCrash as e:
        truth.crashed(time.time())
        _log(f"{e}: exiting {FAILURE_EXIT_CODE}")
        return FAILURE_EXIT_CODE


def _train(
    step: int,
    step_s: float,
    state_dir: Path,
    truth: _Truth,
    keeper: StepKeeper | None,
    *,
    standalone: bool,
    lockstep: _Lockstep | None = None,
) -> NoReturn:
    every = int(os.environ.get("JSI_DEMO_CHECKPOINT_EVERY") or CHECKPOINT_EVERY)
    persist_every = int(os.environ.get("JSI_DEMO_PERSIST_EVERY") or PERSIST_EVERY)
    local, persistent = tier_roots()
    update: Callable[[int], AbstractContextManager[None]] = (
        keeper.update if keeper is not None else lambda _step: contextlib.nullcontext()
    )
    fail, hang, slow = state_dir / FAILURE_FILE, state_dir / HANG_FILE, state_dir / SLOW_FILE
    crash_at = int(os.environ.get(ENV_CRASH_AT_STEP) or 0)
    busy_s = step_s * BUSY_SHARE
    done_at = time.time()  # the previous step's end (the first step counts from here)
    while True:
        if slow.exists():
            factor = float(slow.read_text().strip() or "1")
            slow.unlink()
            busy_s = min(step_s, busy_s * factor)
            _log(f"slowed down {factor:g}x at step {step}: busy {busy_s:g} s per step")
        time.sleep(step_s)

        def injected(step: int = step) -> None:
            if hang.exists():
                hang.unlink()
                _hang(f"at step {step}", keeping=keeper is not None)
            if fail.exists():
                at = fail.read_text().strip()
                fail.unlink()
                if at:
                    time.sleep(max(0.0, float(at) - time.time()))
                raise InjectedCrash(f"injected failure at step {step}")

        injected()
        if step + 1 == crash_at:
            raise InjectedCrash(f"step {crash_at} always crashes ({ENV_CRASH_AT_STEP})")
        if lockstep is not None:

            def waiting(step: int = step) -> None:
                injected()
                if (due := read_stop(state_dir)) is not None and due.step <= step:
                    raise _StopDue  # its peers parked at a step it committed

            try:
                lockstep.wait(step + 1, waiting)
            except _StopDue:
                _planned_stop(step, keeper)
        with update(step + 1):  # the step's state, its progress record and its truth line
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            step += 1
            start, done_at = done_at, time.time()
            # (no state directory without an agent)
            stop = not standalone and report_progress(step, busy_s=busy_s)
            truth.stepped(step, start, done_at)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if stop:  # a planned stop (a member's node is drained): checkpoint here, then wait
            _planned_stop(step, keeper)
        if step % every == 0:
            persist = step % persist_every == 0
            tier = _tier(local, persistent, persist=persist)
            if tier:
                save_checkpoint(step, _write_step(step), tier)  # type: ignore[arg-type]
                _log(f"step {step}: checkpoint saved ({tier})")
                if keeper is not None and (persist or persistent is None):
                    keeper.saved(step)  # (a local one: kept again, so a new pod has it too)


def _planned_stop(step: int, keeper: StepKeeper | None) -> NoReturn:
    """Checkpoint ``step`` (to the persistent tier too) for a planned stop, then park."""
    local, persistent = tier_roots()
    tier = _tier(local, persistent, persist=True)
    save_checkpoint(step, _write_step(step), tier)  # type: ignore[arg-type]
    if keeper is not None:
        keeper.saved(step)
    _log(f"step {step}: checkpoint saved ({tier}) for a planned stop; parked")
    park(step)


if __name__ == "__main__":
    sys.exit(main())
