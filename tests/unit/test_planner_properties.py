"""Invariants of the planner over generated gangs (hypothesis)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace.core.model import GangStatus, Phase, Plan, PodView, Recovery, Snapshot
from jobset_inplace.core.planner import current_pods, plan
from jobset_inplace.core.policy import NoCommonCheckpoint, Policy

from .gangs import NOW, pods, snapshot

STEPS = st.frozensets(st.sampled_from([100, 200, 300, 400]), max_size=4)


@st.composite
def gangs(draw: st.DrawFn) -> tuple[int, GangStatus, list[PodView], Policy]:
    n = draw(st.integers(1, 6))
    epoch = draw(st.integers(1, 5))
    phase = draw(st.sampled_from([Phase.RECOVERING, Phase.RUNNING]))
    status = GangStatus(
        phase=phase,
        epoch=epoch,
        barrier_open=phase == Phase.RUNNING,
        recovery=Recovery(epoch, NOW - 10, NOW + 290),
    )
    pod_list = []
    for pod in pods(n, epoch=epoch):
        pod_list.append(
            dataclasses.replace(
                pod,
                reported_epoch=draw(st.sampled_from([None, epoch - 1, epoch, epoch])),
                reported_steps=tuple(sorted(draw(STEPS))),
                phase=draw(st.sampled_from(["Running", "Running", "Pending", "Failed"])),
                deleting=draw(st.booleans()) and draw(st.booleans()),
                trainer_failed=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    if draw(st.booleans()) and pod_list:
        pod_list.pop(draw(st.integers(0, len(pod_list) - 1)))
    scratch = draw(st.booleans())
    policy = Policy(
        no_common_checkpoint=NoCommonCheckpoint.SCRATCH if scratch else NoCommonCheckpoint.ESCALATE
    )
    return n, status, pod_list, policy


Gang = tuple[int, GangStatus, list[PodView], Policy]


def planned(g: Gang) -> tuple[Snapshot, Plan]:
    n, status, pod_list, policy = g
    s = snapshot(n, status=status, pod_list=pod_list, policy=policy)
    return s, plan(s)


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_barrier_never_opens_with_a_member_behind(
    g: Gang,
) -> None:
    s, p = planned(g)
    if p.status.barrier_open and not s.status.barrier_open:
        current = current_pods(s)
        assert set(current) == set(s.gang.members)
        for pod in current.values():
            assert pod.reported_epoch == p.status.epoch
            assert not pod.deleting
            assert pod.phase in ("Pending", "Running")


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_resume_step_is_available_to_every_member(
    g: Gang,
) -> None:
    s, p = planned(g)
    if p.status.barrier_open and not s.status.barrier_open:
        step = p.status.resume_step
        current = current_pods(s)
        if step is not None:
            assert all(step in (pod.reported_steps or ()) for pod in current.values())
            # ... and it is the newest such step.
            common = set.intersection(*(set(pod.reported_steps or ()) for pod in current.values()))
            assert step == max(common)


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_epoch_moves_forward_by_at_most_one(
    g: Gang,
) -> None:
    s, p = planned(g)
    assert s.status.epoch <= p.status.epoch <= s.status.epoch + 1
    assert p.status.inplace_used >= s.status.inplace_used
    assert p.status.recreate_used >= s.status.recreate_used


@settings(max_examples=200, deadline=None)
@given(gangs())
def test_planning_twice_is_stable(g: tuple[int, GangStatus, list[PodView], Policy]) -> None:
    """Re-planning the unchanged world from the new status starts nothing new (crash safety)."""
    n, status, pod_list, policy = g
    first = plan(snapshot(n, status=status, pod_list=pod_list, policy=policy))
    again = plan(snapshot(n, status=first.status, pod_list=pod_list, policy=policy))
    assert again.status.epoch == first.status.epoch
    assert again.status.inplace_used == first.status.inplace_used
    assert again.status.recreate_used == first.status.recreate_used
