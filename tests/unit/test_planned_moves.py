"""Planned moves (core/planned_moves.py and the planner's planned_move): a member on a node
being drained is moved once the gang stopped at one step, with no budget charged."""

from __future__ import annotations

import dataclasses
import math

import pytest

from jobset_inplace.core.decode import node_view
from jobset_inplace.core.model import Cause, Event, NodeView, Plan, PlannedStop, ReplacePod
from jobset_inplace.core.planned_moves import ANSWER_WAIT_S, leaving_members, stop_step
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Edge, Phase
from jobset_inplace.trainer.progress import ProgressSpan

from .gangs import NOW, member, nodes, pods, running, snapshot, with_pod

SPAN = ProgressSpan(101, NOW - 60.0, 400, NOW - 0.2)  # 0.2 s per step, at 400 now


def cordoned(n: int = 4, which: int = 1) -> dict[str, NodeView]:
    out = nodes(n)
    out[f"n{which}"] = dataclasses.replace(out[f"n{which}"], leaving="cordoned")
    return out


def events(p: Plan) -> dict[str, str]:
    return {a.reason: a.message for a in p.actions if isinstance(a, Event)}


def answered(epoch: int = 2, span: ProgressSpan | None = SPAN) -> list:  # type: ignore[type-arg]
    return [dataclasses.replace(p, progress_now=(epoch, span)) for p in pods(4, epoch=epoch)]


def asked(step: int | None = None, deadline: float = NOW + 600) -> PlannedStop:
    return PlannedStop(2, (member(1),), "node n1 cordoned", NOW - 1, deadline, step)


def test_a_member_on_a_cordoned_node_starts_a_planned_stop() -> None:
    p = plan(snapshot(node_map=cordoned()))
    ps = p.status.planned_stop
    assert ps == PlannedStop(2, (member(1),), "node n1 cordoned", NOW, NOW + 600, None)
    assert p.status.phase == Phase.RUNNING, "nothing restarts yet"
    assert not [a for a in p.actions if isinstance(a, ReplacePod)]
    assert "the gang stops at one step first" in events(p)["PlannedMove"]
    assert p.requeue_after == pytest.approx(ANSWER_WAIT_S)
    off = plan(snapshot(node_map=cordoned(), policy=Policy(planned_moves=False)))
    assert off.status.planned_stop is None, "planned-moves: false"


def test_every_answer_sets_the_step_a_few_seconds_ahead() -> None:
    st = running(2, planned_stop=asked())
    some = with_pod(answered(), 3, progress_now=None)
    p = plan(snapshot(status=st, pod_list=some, node_map=cordoned()))
    assert p.status.planned_stop == asked(), "waits for every member's answer"
    p = plan(snapshot(status=st, pod_list=answered(), node_map=cordoned()))
    assert p.status.planned_stop == asked(step=426)  # 400 (0.2 s ago) + 5.2 s at 0.2 s per step
    assert events(p)["PlannedStop"] == "epoch 2: every trainer stops at step 426"
    stale = answered(epoch=1)  # answers to an older epoch's stop are not answers
    assert plan(snapshot(status=st, pod_list=stale, node_map=cordoned())).status.planned_stop == (
        asked()
    )


def test_once_every_trainer_parked_the_leaving_member_moves_and_the_rest_restart_in_place() -> None:
    st = running(2, planned_stop=asked(step=425), inplace_used=1, recreate_used=1)
    parked = [dataclasses.replace(p, parked_in_epoch=2) for p in pods(4, epoch=2)]
    p = plan(snapshot(status=st, pod_list=with_pod(parked, 2, parked_in_epoch=None)))
    assert p.status.phase == Phase.RUNNING, "one trainer still on its way"
    p = plan(snapshot(status=st, pod_list=parked, node_map=cordoned()))
    assert p.edges == [Edge.PLANNED_MOVE]
    assert (p.status.phase, p.status.epoch, p.status.planned_stop) == (Phase.RECOVERING, 3, None)
    [replace] = [a for a in p.actions if isinstance(a, ReplacePod)]
    assert (replace.member, replace.cause, replace.taint_node) == (
        member(1),
        Cause.PLANNED_MOVE,
        None,
    ), "a drained node is not tainted: its cordon already keeps new pods away"
    rec = p.status.recovery
    assert rec is not None
    assert (rec.in_place, list(rec.recreated)) == (3, [member(1)])
    assert (p.status.inplace_used, p.status.recreate_used) == (1, 1), "no budget charged"
    assert "every trainer stopped at step 425" in events(p)["RecoveryStarted"]


def test_the_move_happens_anyway_past_the_deadline_or_without_answers() -> None:
    late = running(2, planned_stop=asked(step=425, deadline=NOW - 1))
    p = plan(snapshot(status=late, node_map=cordoned()))
    assert p.edges == [Edge.PLANNED_MOVE]
    assert (
        "planned-move-timeout: 0 of 4 member(s) stopped at step 425" in events(p)["RecoveryStarted"]
    )
    unanswered = PlannedStop(2, (member(1),), "r", NOW - ANSWER_WAIT_S, NOW + 600)
    p = plan(snapshot(status=running(2, planned_stop=unanswered), node_map=cordoned()))
    assert p.edges == [Edge.PLANNED_MOVE], "agents that cannot answer do not hold a drain"
    nothing = answered(span=None)  # trainers that report no progress: move at once
    p = plan(snapshot(status=running(2, planned_stop=asked()), pod_list=nothing))
    assert p.edges == [Edge.PLANNED_MOVE]
    assert "no trainer reports progress" in events(p)["RecoveryStarted"]


def test_a_failure_meanwhile_ends_the_planned_stop() -> None:
    st = running(2, planned_stop=asked(step=425))
    failed = with_pod(pods(4, epoch=2), 3, trainer_failed=True)
    p = plan(snapshot(status=st, pod_list=failed, node_map=cordoned()))
    assert p.edges == [Edge.MEMBER_FAILED]
    assert p.status.planned_stop is None, "the next running epoch asks again if still needed"


def test_stop_step_and_leaving_members() -> None:
    assert stop_step([], NOW) is None
    assert stop_step([ProgressSpan(7, 1.0, 7, 1.0)], NOW) == 8, "no pace: the next step"
    slow = ProgressSpan(1, 0.0, 10, 90.0)  # 10 s per step: one step is past the margin
    assert stop_step([slow], 90.0) == 11
    pace = 60.0 / (402 - 101)  # earliest first step to the newest step, over all members
    two = [SPAN, ProgressSpan(101, NOW - 60.0, 402, NOW)]
    assert stop_step(two, NOW) == 402 + math.ceil(5 / pace)
    # an answer 10 s old (re-sent to a new leader): the trainers went on meanwhile
    assert stop_step(two, NOW + 10) == 402 + math.ceil(15 / pace)
    pl = with_pod(pods(4, epoch=2), 2, node="n1")
    pl = with_pod(pl, 0, phase="Pending", node="n1")
    got = leaving_members(cordoned(), {p.member: p for p in pl})
    assert got == {member(1): "node n1 cordoned", member(2): "node n1 cordoned"}


def test_a_node_is_left_when_cordoned_or_marked_for_maintenance() -> None:
    base = {"metadata": {"name": "n1"}, "status": {"conditions": []}}
    assert node_view(base, None, NOW).leaving == ""
    assert node_view(base | {"spec": {"unschedulable": True}}, None, NOW).leaving == "cordoned"
    marked = base | {"status": {"conditions": [{"type": "MaintenancePlanned", "status": "True"}]}}
    assert node_view(marked, None, NOW).leaving == "condition MaintenancePlanned=True"
    unmarked = base | {
        "status": {"conditions": [{"type": "MaintenancePlanned", "status": "False"}]}
    }
    assert node_view(unmarked, None, NOW).leaving == ""
