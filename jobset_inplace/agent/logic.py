"""The agent's decisions, free of I/O: what to do given the GangState status it just saw and
what it has done so far (reported, joined, opened).

The runner (`jobset_inplace.agent.runner`) feeds every status it observes to
`AgentLogic.step`, performs the returned action, and confirms success with
`AgentLogic.reported` or `AgentLogic.opened_barrier`. A failed action is not confirmed: the
next observation asks for it again.

Rules (see the package docstring for why):

* The first status seen sets the agent's epoch; the agent reports it (pod annotations).
* The barrier opens for this agent iff the status says ``barrierOpen`` for the agent's epoch
  *and* the agent took part: its report was made, or was still in place, while that epoch's
  barrier was closed. An agent that first sees its epoch's barrier already open waits.
* Asked to look at the checkpoint steps again (``status.stepRecheck`` names this agent's
  epoch and steps its report lacks one of) while its barrier is closed: report again, once, saying
  so (another member kept that step in a root they may share after this agent scanned).
* A different epoch before this agent's barrier opened: adopt it in place (report again).
  A different epoch after it opened: restart. Pod scope: exit with the restart exit code (the
  pod restarts every container in place; the next agent process joins the new epoch). Process
  scope: the runner stops the trainers through their launchers and starts a fresh
  `AgentLogic`, which joins the new epoch as a new agent process would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from jobset_inplace import names
from jobset_inplace.protocol.gangstate import GangView
from jobset_inplace.trainer.checkpoints import parse_canonical_int

__all__ = [
    "Action",
    "AgentLogic",
    "Open",
    "Position",
    "Report",
    "Restart",
    "Standby",
    "Wait",
    "failed_exit",
    "trainers_stopped",
]


@dataclass(frozen=True)
class Position:
    """This pod's place in a gang with hot spares (docs/design/hot-spares.md): the slots of its
    replicatedJob are ranks 0..members-1; its pod is position ``job_index``, which holds the
    slot of its own index unless the status gave it away, or another slot the status gives
    it. Pods are named by JobSet and the Job controller: ``<jobset>-<rjob>-<index>-0`` in
    ``domain``."""

    jobset: str
    replicated_job: str
    members: int
    job_index: int
    domain: str

    def name(self, index: int) -> str:
        """The name of slot (or position) ``index``: ``<rjob>/<index>/0``."""
        return names.member_name(self.replicated_job, index, 0)

    def _index(self, key: str) -> int | None:
        job, _, rest = key.partition("/")
        index, _, completion = rest.partition("/")
        value = parse_canonical_int(index)
        return value if job == self.replicated_job and completion == "0" else None

    def slot(self, slots: Mapping[str, str]) -> int | None:
        """The slot (rank) this pod holds under ``slots``; None: none (a spare)."""
        me = self.name(self.job_index)
        for slot, position in slots.items():
            if position == me:
                return self._index(slot)
        if me in slots:
            return None  # its own slot is held by another position
        return self.job_index if self.job_index < self.members else None

    def env(self, slots: Mapping[str, str], slot: int) -> dict[str, str]:
        """The environment of a trainer holding ``slot``: its rank, and rank 0's host."""
        first = self.name(0)
        holder = self._index(slots.get(first, first))
        if holder is None:  # a status the planner did not write: slot 0's own position
            holder = 0
        host = f"{self.jobset}-{self.replicated_job}-{holder}-0.{self.domain}"
        return {
            names.ENV_SLOT: str(slot),
            names.ENV_TORCHRUN_NODE_RANK: str(slot),
            names.ENV_TORCHRUN_MASTER_ADDR: host,
            names.ENV_COORDINATOR: host,
        }


@dataclass(frozen=True)
class Report:
    """Adopt `epoch` (if not already this agent's) and write the pod annotations.

    `barrier_closed`: the status this report answers had the barrier closed; confirm it with
    `AgentLogic.reported_epoch`. `recheck`: it answers the status's ask to look at the
    checkpoint steps again (its scan is made after the ask)."""

    epoch: int
    barrier_closed: bool
    recheck: bool = False


@dataclass(frozen=True)
class Open:
    """Write ``resume.json`` for `epoch` (after retiring newer steps), then pass the probe;
    ``env``: the trainer's environment for the epoch (a hot spare gang's slot)."""

    epoch: int
    resume_step: int | None
    slot: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Standby:
    """The barrier of `epoch` is open and this pod holds no slot: a hot spare. No trainer
    runs; it waits for an epoch in which the status gives it one."""

    epoch: int


@dataclass(frozen=True)
class Restart:
    """This agent's trainer ran `old_epoch`; the gang moved to `new_epoch`: stop the trainers
    (process scope) or exit with the restart exit code (pod scope)."""

    old_epoch: int
    new_epoch: int


@dataclass(frozen=True)
class Wait:
    """Nothing to do until the status changes; `reason` is what the probe and logs say."""

    reason: str


Action = Report | Open | Restart | Standby | Wait


class AgentLogic:
    """What this agent process has done, and the decision rule over it."""

    def __init__(self, position: Position | None = None) -> None:
        self.position = position  # None: no hot spares, the pod is always its own member
        self.epoch: int | None = None  # the epoch this agent adopted (and reports)
        self.reported = False  # the annotations for `epoch` were written
        self.joined = False  # the report stood while `epoch`'s barrier was closed
        self.opened = False  # resume.json written and the probe passes: the trainer may run
        self.slot: int | None = None  # the slot its trainer runs as (hot spares)
        self.steps: frozenset[int] = frozenset()  # the checkpoint steps its report lists
        self.rechecked: int | None = None  # the epoch whose steps it looked at again

    def step(self, view: GangView) -> Action:
        """The action for the status `view` just observed."""
        if self.reported and view.epoch == self.epoch and not view.barrier_open and not self.opened:
            self.joined = True  # our report is in place while the barrier is still closed
        slot = None if self.position is None else self.position.slot(view.slots)
        if self.opened:
            assert self.epoch is not None
            if view.epoch != self.epoch or slot != self.slot:
                # a new epoch, or (hot spares) its slot given to another pod: stop the trainer
                return Restart(self.epoch, view.epoch)
            return Wait(f"open: epoch {self.epoch}, trainer running")
        if self.epoch is None or view.epoch != self.epoch or not self.reported:
            asked = view.step_recheck is not None and view.step_recheck[0] == view.epoch
            return Report(view.epoch, barrier_closed=not view.barrier_open, recheck=asked)
        if not view.barrier_open and self._asked_to_recheck(view):
            return Report(view.epoch, barrier_closed=True, recheck=True)
        if not view.barrier_open:
            return Wait(
                f"barrier of epoch {view.epoch} closed: reported, waiting for the gang "
                "and the controller"
            )
        return self._open(view, slot)

    def _asked_to_recheck(self, view: GangView) -> bool:
        ask = view.step_recheck
        return (
            ask is not None
            and ask[0] == self.epoch
            and not ask[1] <= self.steps
            and self.rechecked != self.epoch
        )

    def _open(self, view: GangView, slot: int | None) -> Action:
        """The barrier of this agent's epoch is open."""
        if self.position is not None and slot is None:
            return Standby(view.epoch)  # a hot spare, whether it took part or not
        if not self.joined:
            return Wait(
                f"barrier of epoch {view.epoch} was already open when this agent reported: "
                "it did not take part, waiting for the next epoch"
            )
        if self.position is not None and slot is not None:
            return Open(view.epoch, view.resume_step, slot, self.position.env(view.slots, slot))
        return Open(view.epoch, view.resume_step)

    def reported_epoch(
        self,
        epoch: int,
        barrier_closed: bool,
        steps: Iterable[int] = (),
        *,
        rechecked: bool = False,
    ) -> None:
        """Confirm a `Report`: the annotations now say `epoch` and checkpoint `steps` (and,
        with `rechecked`, that they answer the ask to look again)."""
        if self.opened:
            raise RuntimeError("an agent whose barrier opened never reports another epoch")
        if epoch != self.epoch:
            self.joined = False
        self.epoch = epoch
        self.reported = True
        self.joined = self.joined or barrier_closed
        self.steps = frozenset(steps)
        if rechecked:
            self.rechecked = epoch

    def opened_barrier(self, epoch: int, slot: int | None = None) -> None:
        """Confirm an `Open` (as ``slot``, with hot spares): resume.json is written; the probe
        passes from now on."""
        if epoch != self.epoch or not self.joined:
            raise RuntimeError(f"cannot open epoch {epoch}: not joined (agent epoch {self.epoch})")
        self.opened = True
        self.slot = slot


# --- process restart scope: the launchers' states (jobset_inplace.launcher) -----------------

LauncherState = tuple[str, int | None, int | None] | None  # (state, epoch, code); None: no file


def trainers_stopped(states: Mapping[str, LauncherState]) -> bool:
    """No launcher runs a trainer: the agent may report a new epoch (a launcher that has not
    written its state yet runs nothing: it writes "running" before it starts one)."""
    return all(s is None or s[0] != "running" for s in states.values())


def failed_exit(states: Mapping[str, LauncherState], epoch: int | None) -> tuple[str, int] | None:
    """(container, code) of a trainer that exited non-zero in ``epoch`` (the epoch this agent
    opened): the failure to report. None if there is none."""
    if epoch is None:
        return None
    for name, s in sorted(states.items()):
        if s is not None and s[0] == "exited" and s[1] == epoch and s[2] not in (None, 0):
            return name, s[2]
    return None
