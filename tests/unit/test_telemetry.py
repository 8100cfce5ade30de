"""What a pass did, as the metrics see it (:func:`~jobset_inplace.core.telemetry.observe`), over
real planner passes: a gang trains in epoch 1, fails, recovers, escalates, stands down.
Each test builds the status before a pass by planning the passes that lead to it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobset_inplace.core.goodput import checkpoint_steps_lost, progress_steps_lost
from jobset_inplace.core.model import (
    Cause,
    Event,
    GangStatus,
    NodeView,
    Plan,
    PodView,
    Recovery,
    Snapshot,
)
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Edge, Phase
from jobset_inplace.core.telemetry import (
    UNKNOWN_CAUSE,
    Escalated,
    FailureDetected,
    MembersRestarted,
    ProgressLost,
    RecoveryEnded,
    RecoveryStarted,
    RecoveryTimed,
    StepsLost,
    StoodDown,
    budgets_left,
    observe,
)

from .gangs import NOW, member, nodes, pods, snapshot, with_pod

OPENED = NOW - 600  # the gang's first barrier opened (it has trained since)


def step(status: GangStatus, pod_list: list[PodView], **kw: Any) -> tuple[Snapshot, Plan]:
    s = snapshot(status=status, pod_list=pod_list, **kw)
    return s, plan(s)


def trained(**kw: Any) -> GangStatus:
    """The gang training in epoch 1: its first barrier opened at OPENED."""
    _, p = step(GangStatus(), pods(4, epoch=1), now=OPENED)
    assert (p.status.phase, p.status.epoch) == (Phase.RUNNING, 1)
    return dataclasses.replace(p.status, **kw)


def crashed(member_i: int = 2, not_ready_since: float | None = NOW - 2.5) -> GangStatus:
    """Recovering into epoch 2 since NOW: member ``member_i``'s trainer exited, its pod not
    Ready since ``not_ready_since``."""
    failed = with_pod(pods(4, epoch=1), member_i, trainer_failed=True)
    failed = with_pod(failed, member_i, not_ready_since=not_ready_since)
    _, p = step(trained(), failed)
    assert (p.status.phase, p.status.epoch) == (Phase.RECOVERING, 2)
    return p.status


def rejoined(
    *, starts: tuple[float, ...] | None = (5, 6, 7, 8), steps_of_2: tuple[int, ...] = (200, 100)
) -> list[PodView]:
    """Every member back in epoch 2, agents started ``starts`` seconds after NOW (None:
    unknown); members 0, 1, 3 kept a newer checkpoint (300) than member 2 (which looked
    again: the barrier's second look at the steps)."""
    out = pods(4, epoch=2, steps=(300, 200, 100))
    out = with_pod(out, 2, reported_steps=steps_of_2, rechecked_epoch=2)
    for i in range(4):
        out = with_pod(out, i, agent_started=None if starts is None else NOW + starts[i])
    return out


# --- a recovery starts --------------------------------------------------------------------------
def test_nothing_happened_is_nothing_observed() -> None:
    st = trained()
    assert observe(*step(st, pods(4, epoch=1), now=NOW)) == []


def test_the_gangs_first_epoch_is_a_start_not_a_recovery() -> None:
    s, p = step(GangStatus(), pods(4, epoch=1))
    assert p.edges == [Edge.GANG_SEEN, Edge.BARRIER_OPENED]
    assert observe(s, p) == []


def test_a_trainer_crash_starts_a_recovery_detected_from_its_ready_condition() -> None:
    failed = with_pod(pods(4, epoch=1), 2, trainer_failed=True, not_ready_since=NOW - 2.5)
    s, p = step(trained(), failed)
    rec = p.status.recovery
    assert rec is not None
    assert (rec.opened_by, rec.first_signal, rec.first_signal_at) == (
        Edge.MEMBER_FAILED,
        Cause.TRAINER_EXITED,
        NOW - 2.5,
    )
    assert observe(s, p) == [
        RecoveryStarted("TrainerExited"),
        FailureDetected(2.5),
        MembersRestarted(in_place=4, recreated=0),
    ]


@pytest.mark.parametrize(
    "not_ready_since",
    [None, OPENED - 30, NOW + 5],
    ids=["no time", "before the epoch opened", "after now (clock skew)"],
)
def test_a_pod_signal_without_a_time_of_this_failure_counts_from_the_pass(
    not_ready_since: float | None,
) -> None:
    failed = with_pod(pods(4, epoch=1), 2, trainer_failed=True, not_ready_since=not_ready_since)
    s, p = step(trained(), failed)
    assert FailureDetected(0.0) in observe(s, p)


def test_a_dead_node_is_detected_from_its_first_unhealthy_signal_before_a_later_crash() -> None:
    nm = nodes(4)
    # Ready Unknown 20 s ago, but its Lease missed a renewal 30 s ago (renewed 40 s ago)
    nm["n1"] = NodeView("n1", ready="Unknown", ready_since=NOW - 20, lease_renewed=NOW - 40)
    failed = with_pod(pods(4, epoch=1), 3, trainer_failed=True, not_ready_since=NOW - 1)
    s, p = step(trained(), failed, node_map=nm)
    assert observe(s, p) == [
        RecoveryStarted("NodeUnhealthy"),
        FailureDetected(30.0),  # the node-unhealthy-after threshold is part of detection
        MembersRestarted(in_place=3, recreated=1),
    ]


def test_a_stuck_member_is_detected_from_its_agents_restart() -> None:
    st = trained()
    stuck = with_pod(pods(4, epoch=1), 3, not_ready_since=OPENED - 100, agent_started=NOW - 300)
    s, p = step(st, stuck)
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(3): Cause.NOT_READY}
    assert observe(s, p)[:2] == [RecoveryStarted("NotReady"), FailureDetected(300.0)]


def test_a_manual_restart_restarts_every_member_in_place() -> None:
    s, p = step(trained(), pods(4, epoch=1), restart_request="now")
    assert observe(s, p) == [
        RecoveryStarted("ManualRestart"),
        MembersRestarted(in_place=4, recreated=0),
    ]


def test_a_failure_with_the_budget_used_up_escalates_without_a_recovery() -> None:
    failed = with_pod(pods(4, epoch=1), 0, trainer_failed=True)
    s, p = step(trained(inplace_used=Policy().inplace_budget), failed)
    assert observe(s, p) == [Escalated("InPlaceBudgetExhausted")]


# --- while the barrier waits ---------------------------------------------------------------------
def test_a_node_dying_while_the_barrier_waits_recreates_one_more_member() -> None:
    nm = nodes(4, NOW + 30)
    nm["n0"] = NodeView("n0", ready="False", ready_since=NOW, lease_renewed=NOW + 29)
    s, p = step(crashed(), pods(4, epoch=1), node_map=nm, now=NOW + 30)
    assert p.edges == [Edge.FAILURE_WHILE_WAITING]
    assert observe(s, p) == [MembersRestarted(in_place=0, recreated=1)]


def test_the_barrier_deadline_recreates_the_laggards() -> None:
    st = crashed()
    assert st.recovery is not None
    late = st.recovery.deadline + 1
    laggard = with_pod(pods(4, epoch=2), 3, reported_epoch=1)
    s, p = step(st, laggard, now=late)
    assert p.edges == [Edge.BARRIER_DEADLINE]
    assert observe(s, p) == [MembersRestarted(in_place=0, recreated=1)]


# --- a recovery ends -----------------------------------------------------------------------------
def test_the_barrier_opening_times_each_phase_and_counts_the_checkpoint_steps_lost() -> None:
    s, p = step(crashed(), rejoined(), now=NOW + 10)
    assert p.status.resume_step == 200
    ended, lost, timed = observe(s, p)
    assert ended == RecoveryEnded("TrainerExited", Edge.BARRIER_OPENED)
    assert lost == StepsLost(100)  # members 0, 1, 3 had step 300; member 2 only 200
    # signal NOW-2.5 | epoch opened NOW | last agent started NOW+8 | barrier opened NOW+10
    assert timed == RecoveryTimed(restart=8.0, barrier=2.0, total=12.5)


def test_without_the_agents_start_times_only_the_total_is_timed() -> None:
    s, p = step(crashed(), rejoined(starts=None), now=NOW + 10)
    assert observe(s, p)[-1] == RecoveryTimed(restart=None, barrier=None, total=12.5)


def test_an_agent_start_older_than_the_epoch_gives_the_whole_wait_to_the_barrier() -> None:
    s, p = step(crashed(), rejoined(starts=(-5, -5, -5, -5)), now=NOW + 10)
    assert observe(s, p)[-1] == RecoveryTimed(restart=0.0, barrier=10.0, total=12.5)


def test_an_agent_start_after_the_barrier_opened_is_clock_skew_capped_at_the_opening() -> None:
    s, p = step(crashed(), rejoined(starts=(5, 6, 7, 12)), now=NOW + 10)
    assert observe(s, p)[-1] == RecoveryTimed(restart=10.0, barrier=0.0, total=12.5)


def test_a_manual_restart_that_completes_is_counted_but_not_timed() -> None:
    _, started = step(trained(), pods(4, epoch=1), restart_request="now")
    s, p = step(started.status, pods(4, epoch=2), restart_request="now", now=NOW + 4)
    assert observe(s, p) == [RecoveryEnded("ManualRestart", Edge.BARRIER_OPENED), StepsLost(0)]


def test_a_second_missed_deadline_ends_the_recovery_escalated() -> None:
    st = crashed()
    assert st.recovery is not None
    st.recovery.deadline_extended = True
    laggard = with_pod(pods(4, epoch=2), 3, reported_epoch=1)
    s, p = step(st, laggard, now=st.recovery.deadline + 1)
    assert observe(s, p) == [
        RecoveryEnded("TrainerExited", Edge.ESCALATED),
        Escalated("BarrierTimeout"),
    ]


def test_suspending_ends_the_recovery_stood_down_and_resuming_starts_one() -> None:
    s, p = step(crashed(), pods(4, epoch=1), suspended=True, now=NOW + 5)
    assert observe(s, p) == [
        RecoveryEnded("TrainerExited", Edge.STOOD_DOWN),
        StoodDown("Suspended"),
    ]
    s, p = step(p.status, pods(4, epoch=None), now=NOW + 60)
    assert observe(s, p) == [RecoveryStarted("Resumed")]


def test_jobsets_restart_supersedes_the_recovery_and_starts_a_fresh_one() -> None:
    nm = nodes(4)
    nm["n1"] = NodeView("n1", ready="Unknown", ready_since=NOW - 20, lease_renewed=NOW - 40)
    _, p = step(trained(), pods(4, epoch=1), node_map=nm)
    assert p.status.recreate_used == 1
    s, p = step(p.status, [], restart_attempt=1, now=NOW + 5)
    assert observe(s, p) == [
        RecoveryEnded("NodeUnhealthy", Edge.JOBSET_RESTARTED),
        RecoveryStarted("JobSetRestarted"),  # budgets reset: nothing recreated by the controller
    ]


def test_a_recovery_recorded_by_an_older_controller_ends_with_an_unknown_cause() -> None:
    rec = Recovery(3, NOW - 10, NOW + 300, causes={member(0): Cause.TRAINER_EXITED}, in_place=4)
    old = GangStatus(phase=Phase.RECOVERING, epoch=3, recovery=rec, inplace_used=1)
    s, p = step(old, pods(4, epoch=3))
    assert observe(s, p) == [RecoveryEnded(UNKNOWN_CAUSE, Edge.BARRIER_OPENED), StepsLost(0)]
    first = GangStatus(recovery=Recovery(1, NOW - 10, NOW + 300))  # its gang's first epoch
    assert observe(*step(first, pods(4, epoch=1))) == []


# --- the parts -----------------------------------------------------------------------------------
def test_steps_lost_from_scratch_and_with_no_checkpoint_at_all() -> None:
    some = pods(2, epoch=2, steps=(50, 40))
    assert checkpoint_steps_lost(some, None) == 50  # no common step, policy scratch: all of it
    assert checkpoint_steps_lost(pods(2, epoch=2, steps=()), None) == 0
    assert checkpoint_steps_lost(some, 50) == 0


def test_budgets_left_never_go_below_zero() -> None:
    policy = Policy(inplace_budget=3, recreate_budget=2)
    assert budgets_left(policy, GangStatus(inplace_used=1, recreate_used=2)) == {
        "in_place": 2,
        "recreate": 0,
    }
    lowered = Policy(inplace_budget=0, recreate_budget=0)  # a budget lowered after use
    assert budgets_left(lowered, GangStatus(inplace_used=1, recreate_used=2)) == {
        "in_place": 0,
        "recreate": 0,
    }


def test_the_training_to_redo_is_the_newest_progress_any_member_reported_past_the_resume() -> None:
    """core/goodput.py: members report how far their trainers got with their new epoch's
    report; the recovery records the steps the gang redoes (history, Event, metric)."""
    back = rejoined()
    for i, reached in enumerate((317, 318, None, 316)):  # member 2's pod kept no records
        back = with_pod(back, i, progress_step=reached)
    s, p = step(crashed(), back, now=NOW + 10)
    rec = p.status.recovery
    assert rec is not None
    assert (rec.resume_step, rec.progress_lost) == (200, 118)
    assert p.status.history[-1]["progressStepsLost"] == 118
    assert ProgressLost(118) in observe(s, p)
    [opened] = [a for a in p.actions if isinstance(a, Event) and a.reason == "BarrierOpened"]
    assert "118 step(s) to redo" in opened.message
    s, p = step(crashed(), rejoined(), now=NOW + 10)  # nobody reports progress: not known
    assert p.status.recovery is not None
    assert p.status.recovery.progress_lost is None
    assert not [o for o in observe(s, p) if isinstance(o, ProgressLost)]
    assert progress_steps_lost(with_pod(back, 0, progress_step=150), 200) == 118
    assert progress_steps_lost([dataclasses.replace(back[0], progress_step=150)], 200) == 0
    assert progress_steps_lost(back, None) == 318, "from scratch: all of it"
