"""The gang's state machine: its phases and every transition between them, as data.

The planner (:mod:`.planner`) decides *which* transition a pass takes; :data:`TRANSITIONS` says
what each one is allowed to start from, where it leads, and whether it opens a new epoch, and
the planner refuses any transition the table does not allow. docs/architecture.md draws this
table (a unit test checks that the drawing and the table agree).

Phases:

* ``Recovering``: an epoch is open and the barrier is closed: members restart or are replaced
  and report the epoch; the barrier has a deadline.
* ``Running``: every member joined the epoch; the barrier is open at one resume step.
* ``Escalated``: recovery gave up (budget, deadline twice, no common checkpoint) and handed the
  gang to JobSet's failure policy; waits for JobSet's restart or failure.
* ``StoodDown``: the JobSet is suspended or Kueue took the gang away; nothing is recovered.
* ``Failed``: the JobSet failed after an escalation (nothing more happens unless the JobSet
  itself changes again: the table allows a restart or a stand-down from any phase).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from jobset_inplace.strenum import StrEnum


class Phase(StrEnum):
    RUNNING = "Running"
    RECOVERING = "Recovering"
    ESCALATED = "Escalated"
    STOOD_DOWN = "StoodDown"
    FAILED = "Failed"


class EscalationReason(StrEnum):
    """Why a gang was handed to JobSet's failure policy (the GangState's ``reason``)."""

    INPLACE_BUDGET = "InPlaceBudgetExhausted"
    RECREATE_BUDGET = "RecreateBudgetExhausted"
    BARRIER_TIMEOUT = "BarrierTimeout"  # the barrier deadline missed twice
    NO_COMMON_CHECKPOINT = "NoCommonCheckpoint"
    # the same failure no-progress-limit times in a row, the gang never past one step
    NO_PROGRESS = "NoProgress"


class StandDownReason(StrEnum):
    """Why a gang stood down (the GangState's ``reason``)."""

    SUSPENDED = "Suspended"  # the JobSet
    KUEUE = "Kueue"  # its Workload was evicted, deactivated or finished


class Edge(StrEnum):
    """A transition of the state machine (one per arrow of the diagram)."""

    GANG_SEEN = "GangSeen"  # first look at a gang: epoch 1 opens like any other
    BARRIER_OPENED = "BarrierOpened"  # every member reported the epoch
    MEMBER_FAILED = "MemberFailed"  # a failure while running: new epoch, in place + replaced
    MANUAL_RESTART = "ManualRestart"  # kubectl jobset-inplace restart: new epoch, no budget
    PLANNED_MOVE = "PlannedMove"  # members leave a drained node at a common step: no budget
    FAILURE_WHILE_WAITING = "FailureWhileWaiting"  # joins the open recovery, same epoch
    BARRIER_DEADLINE = "BarrierDeadline"  # laggards replaced, deadline renewed once
    ESCALATED = "Escalated"  # budget, second deadline, or no common checkpoint
    JOBSET_RESTARTED = "JobSetRestarted"  # JobSet's failure policy restarted it: budgets reset
    JOBSET_FAILED = "JobSetFailed"  # the JobSet failed after an escalation
    JOBSET_FINISHED = "JobSetFinished"  # otherwise finished: nothing more to do, phase kept
    STOOD_DOWN = "StoodDown"  # suspended, or Kueue evicted/deactivated/finished the Workload
    RESUMED = "Resumed"  # unsuspended / readmitted: new epoch


@dataclass(frozen=True)
class Transition:
    sources: frozenset[Phase]
    target: Phase | None  # None: the phase stays what it was
    new_epoch: bool = False  # opens epoch E+1 with a closed barrier
    when: str = ""  # the diagram's label


_ALL = frozenset(Phase)
_P = Phase

TRANSITIONS: Final[Mapping[Edge, Transition]] = {
    Edge.GANG_SEEN: Transition(
        frozenset({_P.RECOVERING}), _P.RECOVERING, when="GangState created (epoch 1)"
    ),
    Edge.BARRIER_OPENED: Transition(
        frozenset({_P.RECOVERING}),
        _P.RUNNING,
        when="every member reported epoch E (barrier open, resume step chosen)",
    ),
    Edge.MEMBER_FAILED: Transition(
        frozenset({_P.RUNNING}),
        _P.RECOVERING,
        new_epoch=True,
        when="member failure (epoch E+1, bad-node pods replaced, the rest restart in place)",
    ),
    Edge.MANUAL_RESTART: Transition(
        frozenset({_P.RUNNING}),
        _P.RECOVERING,
        new_epoch=True,
        when="manual restart (epoch E+1, no budget charged)",
    ),
    Edge.PLANNED_MOVE: Transition(
        frozenset({_P.RUNNING}),
        _P.RECOVERING,
        new_epoch=True,
        when="planned move (epoch E+1 from the step the gang stopped at: members on drained "
        "nodes moved, the rest in place, no budget charged)",
    ),
    Edge.FAILURE_WHILE_WAITING: Transition(
        frozenset({_P.RECOVERING}),
        _P.RECOVERING,
        when="node/device failure while waiting (that pod replaced, same epoch)",
    ),
    Edge.BARRIER_DEADLINE: Transition(
        frozenset({_P.RECOVERING}),
        _P.RECOVERING,
        when="barrier deadline (laggards replaced, deadline renewed once)",
    ),
    Edge.ESCALATED: Transition(
        frozenset({_P.RUNNING, _P.RECOVERING}),
        _P.ESCALATED,
        when="budget exhausted / deadline again / no common step / the same failure again "
        "without progress",
    ),
    Edge.JOBSET_RESTARTED: Transition(
        _ALL - {_P.STOOD_DOWN},
        _P.RECOVERING,
        new_epoch=True,
        when="JobSet restarted by its failure policy (new epoch, budgets reset)",
    ),
    Edge.JOBSET_FAILED: Transition(
        frozenset({_P.ESCALATED}), _P.FAILED, when="JobSet failed after escalation"
    ),
    Edge.JOBSET_FINISHED: Transition(
        _ALL - {_P.ESCALATED}, None, when="JobSet finished (nothing more to do)"
    ),
    Edge.STOOD_DOWN: Transition(
        _ALL - {_P.STOOD_DOWN}, _P.STOOD_DOWN, when="JobSet suspended or Kueue stand-down"
    ),
    Edge.RESUMED: Transition(
        frozenset({_P.STOOD_DOWN}), _P.RECOVERING, new_epoch=True, when="resumed (new epoch)"
    ),
}


# The edges that open an epoch restarting the gang's pods in place (the status counts them:
# ``restarts.inPlace``); JobSet's restarts and resumptions make every pod anew.
IN_PLACE_RESTART_EDGES: Final = frozenset(
    {Edge.MEMBER_FAILED, Edge.MANUAL_RESTART, Edge.PLANNED_MOVE}
)


class IllegalTransition(RuntimeError):
    """The planner tried a transition the table does not allow from the current phase (a bug)."""


def target(edge: Edge, phase: Phase) -> Phase:
    """The phase after taking ``edge`` from ``phase``; raises :class:`IllegalTransition`."""
    t = TRANSITIONS[edge]
    if phase not in t.sources:
        raise IllegalTransition(f"{edge} is not a transition from {phase}")
    return phase if t.target is None else t.target
