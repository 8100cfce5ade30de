"""What a planning pass did, as facts for the controller's metrics (docs/metrics.md).

:func:`observe` compares the persisted status before a pass with the plan the pass made (its
status and edges) and says what happened: a recovery started (its cause, the detection time,
members restarted in place or recreated), ended (its outcome and, when the barrier opened, how
long each phase took and how many checkpoint steps were lost), an escalation, a stand-down.
Pure, like the rest of the core: the times are the snapshot's; the adapter
(:mod:`jobset_inplace.controller.metrics`) maps the observations to Prometheus instruments.

A *recovery* is an epoch opened after the gang's first one (that one is a start): by a member
failure, a manual restart, JobSet's restart, or a resume after standing down. Its **cause** is
the first failure signal of a member failure's recovery (a :class:`~.model.Cause` value, e.g.
``TrainerExited``, ``NodeUnhealthy``), otherwise the edge that opened it (``ManualRestart``,
``JobSetRestarted``, ``Resumed``). Its **outcome** is the edge that ended it:
``BarrierOpened`` (completed), ``Escalated``, ``StoodDown``, or ``JobSetRestarted`` (superseded
by JobSet's restart of the whole gang)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobset_inplace.core.detection import current_pods
from jobset_inplace.core.goodput import checkpoint_steps_lost
from jobset_inplace.core.model import (
    Cause,
    Event,
    GangStatus,
    Plan,
    PodView,
    Recovery,
    Snapshot,
)
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.spares import SPARE_SHORTFALL, SPARE_SWAPPED
from jobset_inplace.core.statemachine import TRANSITIONS, Edge, Phase

# The cause of a recovery opened by a controller that did not record how (an older version).
UNKNOWN_CAUSE = "Unknown"
# The edges that end a recovery under way, i.e. its possible outcomes.
OUTCOMES = frozenset({Edge.BARRIER_OPENED, Edge.ESCALATED, Edge.STOOD_DOWN, Edge.JOBSET_RESTARTED})
# Every value the ``cause`` of a recovery can take: a member's first failure signal, or the edge
# that opened the recovery without one (label values known in advance: the metrics start them at 0).
RECOVERY_CAUSES: tuple[str, ...] = tuple(
    dict.fromkeys(
        [c.value for c in Cause]
        + [e.value for e, t in TRANSITIONS.items() if t.new_epoch and e != Edge.GANG_SEEN]
        + [UNKNOWN_CAUSE]
    )
)
# The budgets of a gang (policy.py): recoveries restarted in place, pods recreated.
IN_PLACE_BUDGET = "in_place"
RECREATE_BUDGET = "recreate"


@dataclass(frozen=True)
class RecoveryStarted:
    cause: str


@dataclass(frozen=True)
class FailureDetected:
    """Seconds from a member failure's first signal to the pass that opened its recovery."""

    seconds: float


@dataclass(frozen=True)
class MembersRestarted:
    """Members the controller made restart in place, or get a new pod, in this pass."""

    in_place: int
    recreated: int


@dataclass(frozen=True)
class RecoveryEnded:
    cause: str
    outcome: Edge


@dataclass(frozen=True)
class RecoveryTimed:
    """The phases of a member failure's recovery that opened its barrier, in seconds:
    ``restart`` (epoch opened -> the last member's agent started again) and ``barrier`` (that
    start -> barrier opened) are None when an agent's start time is unknown; ``total`` (first
    signal -> barrier opened) when the first signal's time is."""

    restart: float | None
    barrier: float | None
    total: float | None


@dataclass(frozen=True)
class StepsLost:
    """Newest checkpoint step any member reported for the epoch minus the resume step."""

    steps: int


@dataclass(frozen=True)
class ProgressLost:
    """Training steps the recovery makes the gang redo (core/goodput.py)."""

    steps: int


@dataclass(frozen=True)
class SparesSwapped:
    """Slots given to hot spares in this pass."""

    count: int


@dataclass(frozen=True)
class SpareShortfall:
    """A recovery in which members that wanted a hot spare found none ready (once per epoch)."""


@dataclass(frozen=True)
class Escalated:
    reason: str


@dataclass(frozen=True)
class StoodDown:
    reason: str


Observation = (
    RecoveryStarted
    | FailureDetected
    | MembersRestarted
    | RecoveryEnded
    | RecoveryTimed
    | StepsLost
    | ProgressLost
    | Escalated
    | StoodDown
    | SparesSwapped
    | SpareShortfall
)


def recovery_cause(rec: Recovery) -> str | None:
    """The cause of the recovery ``rec`` records; None for the gang's first epoch."""
    if rec.opened_by == Edge.GANG_SEEN or (rec.opened_by is None and rec.epoch == 1):
        return None
    if rec.first_signal is not None:
        return rec.first_signal.value
    return UNKNOWN_CAUSE if rec.opened_by is None else rec.opened_by.value


def observe(s: Snapshot, p: Plan) -> list[Observation]:
    """What the pass that planned ``p`` from ``s`` did (to be recorded once its status is
    written). O(1) unless a barrier opened (then O(members), once per recovery)."""
    out: list[Observation] = _spares(p)
    if not p.edges:
        return out
    before, after = s.status, p.status
    old, new = before.recovery, after.recovery
    ended = [e for e in p.edges if e in OUTCOMES]
    if ended and before.phase == Phase.RECOVERING and old is not None and old.opened is None:
        cause = recovery_cause(old)
        if cause is not None:
            out.append(RecoveryEnded(cause, ended[-1]))
            if ended[-1] == Edge.BARRIER_OPENED and new is not None:
                out += _completed(s, new)
    in_place = 0
    if new is not None and any(TRANSITIONS[e].new_epoch for e in p.edges):
        out += _started(new)
        if new.opened_by == Edge.MEMBER_FAILED:
            in_place = new.in_place
        elif new.opened_by == Edge.MANUAL_RESTART:  # every member restarts in place
            in_place = len(s.gang.members)
    # each recreation is charged to the recreate budget in the pass that decides it (JobSet's
    # restart resets the budgets: no recreation of the controller's then)
    recreated = max(0, after.recreate_used - before.recreate_used)
    if in_place or recreated:
        out.append(MembersRestarted(in_place, recreated))
    if Edge.ESCALATED in p.edges:
        out.append(Escalated(after.reason))
    if Edge.STOOD_DOWN in p.edges:
        out.append(StoodDown(after.reason))
    return out


def _spares(p: Plan) -> list[Observation]:
    """Swaps and shortfalls of hot spares: the planner's Events of them (O(actions))."""
    events = [a.reason for a in p.actions if isinstance(a, Event)]
    out: list[Observation] = []
    if swapped := events.count(SPARE_SWAPPED):
        out.append(SparesSwapped(swapped))
    if SPARE_SHORTFALL in events:
        out.append(SpareShortfall())
    return out


def _started(rec: Recovery) -> list[Observation]:
    cause = recovery_cause(rec)
    out: list[Observation] = [] if cause is None else [RecoveryStarted(cause)]
    if rec.detection is not None:
        out.append(FailureDetected(rec.detection))
    return out


def _completed(s: Snapshot, rec: Recovery) -> list[Observation]:
    joined = [pod for pod in current_pods(s).values() if pod.reported_epoch == rec.epoch]
    out: list[Observation] = [StepsLost(checkpoint_steps_lost(joined, rec.resume_step))]
    if rec.progress_lost is not None:
        out.append(ProgressLost(rec.progress_lost))
    if rec.opened_by == Edge.MEMBER_FAILED and rec.opened is not None:
        took = rec.opened - rec.started
        last = last_agent_start(joined)
        restart = None if last is None else min(max(0.0, last - rec.started), took)
        total = None if rec.first_signal_at is None else rec.duration
        out.append(RecoveryTimed(restart, None if restart is None else took - restart, total))
    return out


def last_agent_start(joined: Sequence[PodView]) -> float | None:
    """When the last of the members' agents started (None: a start time is unknown)."""
    starts = [pod.agent_started for pod in joined]
    if not starts or None in starts:
        return None
    return max(s for s in starts if s is not None)


def budgets_left(policy: Policy, status: GangStatus) -> dict[str, int]:
    """What is left of each of a gang's budgets (never below 0: a budget lowered after use)."""
    return {
        IN_PLACE_BUDGET: max(0, policy.inplace_budget - status.inplace_used),
        RECREATE_BUDGET: max(0, policy.recreate_budget - status.recreate_used),
    }
