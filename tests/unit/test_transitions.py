"""The state machine, one row per edge: (phase, world) -> (phase', epoch', actions).

Every edge of :data:`~jobset_inplace.core.statemachine.TRANSITIONS` has at least one row (a
test fails if one has none), and docs/architecture.md draws exactly that table."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace.core.model import (
    Action,
    Cause,
    EscalatePod,
    Event,
    GangStatus,
    NodeView,
    PlannedStop,
    Recovery,
    ReplacePod,
    Snapshot,
)
from jobset_inplace.core.planner import plan
from jobset_inplace.core.statemachine import TRANSITIONS, Edge, IllegalTransition, Phase, target

from .gangs import NOW, member, nodes, pods, running, snapshot, with_pod

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def recovering(epoch: int = 3, *, deadline: float = NOW + 300, **kw: Any) -> GangStatus:
    """A recovery into ``epoch`` under way: member 0's trainer failed, nobody joined yet."""
    rec = Recovery(epoch, NOW - 10, deadline, causes={member(0): Cause.TRAINER_EXITED}, in_place=4)
    return dataclasses.replace(
        GangStatus(phase=Phase.RECOVERING, epoch=epoch, recovery=rec, inplace_used=1), **kw
    )


def escalated(epoch: int = 3) -> GangStatus:
    return dataclasses.replace(recovering(epoch), phase=Phase.ESCALATED, reason="BarrierTimeout")


def stood_down(epoch: int = 3) -> GangStatus:
    return GangStatus(phase=Phase.STOOD_DOWN, epoch=epoch, reason="Suspended")


def dead_node(name: str) -> NodeView:
    return NodeView(name, ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 90)


def with_dead_node(i: int) -> dict[str, NodeView]:
    nm = nodes(4)
    nm[f"n{i}"] = dead_node(f"n{i}")
    return nm


@dataclass(frozen=True)
class Row:
    edge: Edge
    world: Callable[[], Snapshot]
    phase: Phase
    epoch: int
    actions: list[str]  # Event reasons, "replace <member>", "escalate"

    def __str__(self) -> str:
        return f"{self.edge}:{self.world.__doc__ or ''}"


ROWS: list[Row] = []


def add(edge: Edge, phase: Phase, epoch: int, *actions: str) -> Callable[..., Row]:
    def deco(world: Callable[[], Snapshot]) -> Row:
        r = Row(edge, world, phase, epoch, list(actions))
        ROWS.append(r)
        return r

    return deco


@add(Edge.GANG_SEEN, Phase.RECOVERING, 1)
def _first_look() -> Snapshot:
    """a new GangState, pods not reported yet"""
    return snapshot(status=GangStatus(), pod_list=pods(4, epoch=None))


@add(Edge.BARRIER_OPENED, Phase.RUNNING, 3, "BarrierOpened")
def _all_reported() -> Snapshot:
    """every member reported the recovery's epoch"""
    return snapshot(status=recovering(3), pod_list=pods(4, epoch=3))


@add(Edge.MEMBER_FAILED, Phase.RECOVERING, 3, "replace workers/1/0", "RecoveryStarted")
def _member_fails() -> Snapshot:
    """running; a trainer exits and another member's node is dead"""
    return snapshot(
        status=running(2),
        pod_list=with_pod(pods(4, epoch=2), 0, trainer_failed=True),
        node_map=with_dead_node(1),
    )


@add(Edge.MANUAL_RESTART, Phase.RECOVERING, 3, "EpochStarted")
def _manual_restart() -> Snapshot:
    """running; kubectl jobset-inplace restart"""
    return snapshot(status=running(2), restart_request="r1")


@add(Edge.PLANNED_MOVE, Phase.RECOVERING, 3, "replace workers/1/0", "RecoveryStarted")
def _planned_move() -> Snapshot:
    """running; every trainer parked at the planned stop (a member's node is drained)"""
    stop = PlannedStop(2, ("workers/1/0",), "node n1 cordoned", NOW - 30, NOW + 570, step=250)
    pl = [dataclasses.replace(p, parked_in_epoch=2) for p in pods(4, epoch=2)]
    return snapshot(status=running(2, planned_stop=stop), pod_list=pl)


@add(Edge.FAILURE_WHILE_WAITING, Phase.RECOVERING, 3, "replace workers/2/0", "RecoveryExtended")
def _node_dies_while_waiting() -> Snapshot:
    """recovering; a member's node dies before the barrier opens"""
    return snapshot(status=recovering(3), pod_list=pods(4, epoch=2), node_map=with_dead_node(2))


@add(Edge.BARRIER_DEADLINE, Phase.RECOVERING, 3, "replace workers/3/0", "BarrierTimeout")
def _deadline() -> Snapshot:
    """recovering past the deadline; one member never reported"""
    pl = with_pod(pods(4, epoch=3), 3, reported_epoch=2)
    return snapshot(status=recovering(3, deadline=NOW - 1), pod_list=pl)


@add(Edge.ESCALATED, Phase.ESCALATED, 2, "escalate", "Escalated")
def _budget_exhausted() -> Snapshot:
    """running with the in-place budget used up; a trainer exits"""
    return snapshot(
        status=running(2, inplace_used=10),
        pod_list=with_pod(pods(4, epoch=2), 0, trainer_failed=True),
    )


@add(Edge.ESCALATED, Phase.ESCALATED, 3, "escalate", "Escalated")
def _second_deadline() -> Snapshot:
    """recovering past the renewed deadline"""
    st = recovering(3, deadline=NOW - 1)
    assert st.recovery is not None
    st.recovery.deadline_extended = True
    return snapshot(status=st, pod_list=with_pod(pods(4, epoch=3), 3, reported_epoch=2))


@add(Edge.ESCALATED, Phase.ESCALATED, 3, "escalate", "Escalated")
def _no_common_step() -> Snapshot:
    """every member reported, no checkpoint step in common (after looking again)"""
    pl = with_pod(pods(4, epoch=3, steps=(100,)), 0, reported_steps=(200,))
    pl = [dataclasses.replace(p, rechecked_epoch=3) for p in pl]
    return snapshot(status=recovering(3), pod_list=pl)


@add(Edge.JOBSET_RESTARTED, Phase.RECOVERING, 4, "EpochStarted")
def _jobset_restarted() -> Snapshot:
    """escalated; JobSet's failure policy restarted it"""
    return snapshot(status=escalated(3), pod_list=pods(4, epoch=None), restart_attempt=1)


@add(Edge.JOBSET_RESTARTED, Phase.RECOVERING, 3, "EpochStarted")
def _jobset_restarted_while_running() -> Snapshot:
    """running; the JobSet restarted for a reason of its own"""
    return snapshot(status=running(2), pod_list=pods(4, epoch=None), restart_attempt=1)


@add(Edge.JOBSET_FAILED, Phase.FAILED, 3)
def _jobset_failed() -> Snapshot:
    """escalated; the JobSet failed"""
    return snapshot(status=escalated(3), finished=True)


@add(Edge.JOBSET_FINISHED, Phase.RUNNING, 2)
def _jobset_finished() -> Snapshot:
    """running; the JobSet completed"""
    return snapshot(status=running(2), finished=True)


@add(Edge.JOBSET_FINISHED, Phase.RECOVERING, 3)
def _jobset_finished_while_recovering() -> Snapshot:
    """recovering; the JobSet finished anyway"""
    return snapshot(status=recovering(3), finished=True)


@add(Edge.STOOD_DOWN, Phase.STOOD_DOWN, 2, "StoodDown")
def _suspended() -> Snapshot:
    """running; the JobSet is suspended"""
    return snapshot(status=running(2), suspended=True)


@add(Edge.STOOD_DOWN, Phase.STOOD_DOWN, 3, "StoodDown")
def _kueue_evicts_while_recovering() -> Snapshot:
    """recovering; Kueue evicted the Workload"""
    return snapshot(status=recovering(3), kueue_stand_down="Kueue evicted the Workload (Preempted)")


@add(Edge.STOOD_DOWN, Phase.STOOD_DOWN, 3, "StoodDown")
def _kueue_evicts_while_escalated() -> Snapshot:
    """escalated; Kueue deactivated the Workload"""
    return snapshot(status=escalated(3), kueue_stand_down="Kueue Workload deactivated")


@add(Edge.RESUMED, Phase.RECOVERING, 4, "EpochStarted")
def _resumed() -> Snapshot:
    """stood down; the JobSet runs again"""
    return snapshot(status=stood_down(3), pod_list=pods(4, epoch=None))


def describe(a: Action) -> str:
    if isinstance(a, Event):
        return a.reason
    if isinstance(a, ReplacePod):
        return f"replace {a.member}"
    if isinstance(a, EscalatePod):
        return "escalate"
    return type(a).__name__


@pytest.mark.parametrize("r", ROWS, ids=str)
def test_transition(r: Row) -> None:
    s = r.world()
    p = plan(s)
    assert r.edge in p.edges
    assert (p.status.phase, p.status.epoch) == (r.phase, r.epoch)
    assert [describe(a) for a in p.actions] == r.actions
    opens = TRANSITIONS[r.edge].new_epoch
    assert p.status.epoch == s.status.epoch + opens
    if opens:
        assert p.status.recovery is not None
        assert not p.status.barrier_open


def test_every_edge_has_a_row() -> None:
    assert {r.edge for r in ROWS} == set(Edge)


def test_the_edges_a_pass_took_lead_from_its_phase_to_the_next() -> None:
    for r in ROWS:
        s = r.world()
        p = plan(s)
        phase = s.status.phase
        for edge in p.edges:
            phase = target(edge, phase)  # raises IllegalTransition if not allowed
        assert phase == p.status.phase, r


def test_an_edge_the_table_does_not_allow_is_refused() -> None:
    with pytest.raises(IllegalTransition):
        target(Edge.BARRIER_OPENED, Phase.RUNNING)
    with pytest.raises(IllegalTransition):
        target(Edge.RESUMED, Phase.RUNNING)


def test_no_transition_when_nothing_happened() -> None:
    p = plan(snapshot(status=running(2)))
    assert (p.edges, p.actions, p.status) == ([], [], running(2, reported=4, ready=4, expected=4))


def mermaid() -> list[str]:
    """The state diagram the table makes (the docs draw exactly this)."""
    out = ["stateDiagram-v2"]
    for edge, t in TRANSITIONS.items():
        for src in sorted(t.sources):
            dst = src if t.target is None else t.target
            start = "[*]" if edge == Edge.GANG_SEEN else src  # the status starts Recovering
            out.append(f"    {start} --> {dst}: {edge.value}<br/>{t.when}")
    return out


def test_the_documented_diagram_is_the_table() -> None:
    text = DOC.read_text()
    m = re.search(r"```mermaid\n(stateDiagram-v2\n.*?)```", text, re.S)
    assert m is not None, "docs/architecture.md has no state diagram"
    drawn = m.group(1).rstrip("\n").split("\n")
    expected = mermaid()
    assert drawn == expected, "docs/architecture.md's state diagram should read:\n" + "\n".join(
        expected
    )
