"""The recovery planner, one guarantee at a time (design brief guarantees 1-6 and 8)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobset_inplace.core.detection import (
    LEASE_RENEW_INTERVAL_S,
    may_untaint,
    observation_restarts,
    unconfirmed_lease_nodes,
)
from jobset_inplace.core.model import (
    Cause,
    EscalatePod,
    Event,
    GangStatus,
    NodeView,
    Plan,
    PodView,
    ReadLeases,
    Recovery,
    ReplacePod,
    Snapshot,
    StepRecheck,
    UntaintNode,
)
from jobset_inplace.core.planner import (
    ESCALATION_RECHECK_S,
    REPORT_AGAIN_S,
    STEP_RECHECK_LIMIT,
    STEP_RECHECK_S,
    plan,
    plan_node,
    refuse_policy,
)
from jobset_inplace.core.planner import base as planner_base
from jobset_inplace.core.policy import ForceDelete, NoCommonCheckpoint, Policy
from jobset_inplace.core.statemachine import Phase
from jobset_inplace.names import DEVICE_UNHEALTHY_TAINT, UNHEALTHY_TAINT

from .gangs import NOW, member, nodes, pods, running, snapshot, with_pod


def events(p: Plan) -> list[str]:
    return [a.reason for a in p.actions if isinstance(a, Event)]


def replaced(p: Plan) -> list[ReplacePod]:
    return [a for a in p.actions if isinstance(a, ReplacePod)]


def recovering(epoch: int = 3, **kw: object) -> GangStatus:
    """Status right after a recovery into ``epoch`` started (from a Running epoch-1)."""
    first = plan(
        snapshot(
            pod_list=with_pod(pods(4, epoch=epoch - 1), 0, trainer_failed=True),
            status=running(epoch - 1),
        )
    )
    st = first.status
    assert st.phase == Phase.RECOVERING
    assert st.epoch == epoch
    return dataclasses.replace(st, **kw)  # type: ignore[arg-type]


# --- guarantee 1: barrier -----------------------------------------------------------------------
def test_first_epoch_opens_when_every_member_reports_it() -> None:
    p = plan(snapshot(status=GangStatus(), pod_list=pods(4, epoch=1)))
    assert p.status.phase == Phase.RUNNING
    assert p.status.barrier_open
    assert p.status.resume_step == 200
    assert events(p) == ["BarrierOpened"]
    assert p.status.history == []  # opening epoch 1 is not a recovery


def test_barrier_stays_closed_while_a_member_is_behind() -> None:
    pl = with_pod(pods(4, epoch=3), 2, reported_epoch=2)
    no_leases = {f"n{i}": NodeView(f"n{i}") for i in range(4)}
    p = plan(snapshot(status=recovering(3), pod_list=pl, node_map=no_leases))
    assert not p.status.barrier_open
    assert p.status.phase == Phase.RECOVERING
    assert p.status.reported == 3
    assert p.requeue_after == pytest.approx(Policy().barrier_timeout_s)


def test_barrier_waits_for_a_missing_member() -> None:
    p = plan(snapshot(status=recovering(3), pod_list=pods(4, epoch=3)[:3]))
    assert not p.status.barrier_open


# --- guarantee 2: hybrid recovery ---------------------------------------------------------------
def test_trainer_crash_restarts_everyone_in_place_in_a_new_epoch() -> None:
    pl = with_pod(pods(4, epoch=2), 1, trainer_failed=True)
    p = plan(snapshot(pod_list=pl))
    st = p.status
    assert (st.phase, st.epoch, st.barrier_open) == (Phase.RECOVERING, 3, False)
    assert st.recovery is not None
    assert st.recovery.in_place == 4
    assert st.recovery.causes == {member(1): Cause.TRAINER_EXITED.value}
    assert replaced(p) == []
    assert (st.inplace_used, st.recreate_used) == (1, 0)
    assert events(p) == ["RecoveryStarted"]


def test_member_on_unhealthy_node_is_replaced_others_in_place() -> None:
    nm = nodes(4)
    nm["n2"] = NodeView("n2", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 100)
    p = plan(snapshot(node_map=nm))
    # failed since its first unhealthy signal: the Lease, stale 10 s after its last renewal
    assert replaced(p) == [
        ReplacePod(
            "p2",
            "uid-2",
            member(2),
            Cause.NODE_UNHEALTHY,
            True,
            taint_node="n2",
            failed_since=NOW - 90,
        )
    ]
    rec = p.status.recovery
    assert rec is not None
    assert rec.in_place == 3
    assert rec.recreated == {member(2): "uid-2"}
    assert p.status.recreate_used == 1


def test_a_pod_being_deleted_on_a_dead_node_is_force_deleted() -> None:
    """Evicted (the taint manager, a drain, a person) while its node is silent: its deletion
    never ends there (no kubelet) and its Job makes no replacement meanwhile, so the pod is
    replaced as a live one on that node would be. Also when its recovery already began with
    the deletion (PodDeleted), as after a new leader took over."""
    nm = nodes(4)
    nm["n2"] = NodeView("n2", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 100)
    evicted = with_pod(pods(4, epoch=2), 2, deleting=True)
    p = plan(snapshot(node_map=nm, pod_list=evicted))
    (r,) = replaced(p)
    assert (r.pod, r.cause, r.fail_first, r.taint_node) == ("p2", Cause.NODE_UNHEALTHY, True, "n2")
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(2): Cause.NODE_UNHEALTHY.value}
    # the recovery began when the deletion was seen, before the node counted as dead
    healthy = plan(snapshot(pod_list=evicted))
    assert healthy.status.recovery is not None
    assert healthy.status.recovery.causes == {member(2): Cause.POD_DELETED.value}
    assert replaced(healthy) == [], "a pod being deleted on a live node: its Job replaces it"
    later = plan(snapshot(status=healthy.status, node_map=nm, pod_list=evicted))
    (r,) = replaced(later)
    assert (r.pod, r.cause, r.fail_first) == ("p2", Cause.NODE_UNHEALTHY, True)


def test_a_pass_with_no_pod_at_stake_counts_no_silent_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disruption check walks every node of the cluster: a pass in which no member fails
    and no pod is being deleted must not make it (at 10,000 nodes it was a fifth of every
    pass); one with a pod stuck deleting still does."""
    counted: list[int] = []

    def disruption(s: Snapshot) -> None:
        counted.append(len(s.cluster_nodes))

    monkeypatch.setattr(planner_base, "disruption", disruption)
    quiet = plan(snapshot(status=running(2)))
    assert quiet.status.phase == Phase.RUNNING
    assert counted == []
    stuck = with_pod(pods(4, epoch=2), 2, deleting=True)
    old = dataclasses.replace(stuck[2], name="old-p2", uid="old-2")
    plan(snapshot(status=running(2), pod_list=[old, *pods(4, epoch=2)]))
    assert counted == [4], "a pod stuck deleting: the disruption is looked at"


def test_an_earlier_attempts_pod_stuck_deleting_on_a_dead_node_is_force_deleted() -> None:
    """After a JobSet restart, an old pod on a dead node never finishes its deletion, and
    JobSet's restart (its Jobs deleted in the foreground) waits for it."""
    nm = nodes(4)
    nm["n2"] = NodeView("n2", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 100)
    old = dataclasses.replace(pods(4, epoch=2)[2], name="old-p2", uid="old-2", deleting=True)
    current = [dataclasses.replace(p, restart_attempt=1) for p in pods(4, epoch=2)]
    current[2] = dataclasses.replace(current[2], node="n3")
    gang: dict[str, Any] = {"restart_attempt": 1}
    st = running(2, restart_attempt=1)
    p = plan(snapshot(status=st, node_map=nm, pod_list=[old, *current], **gang))
    stuck = [r for r in replaced(p) if r.uid == "old-2"]
    assert [(r.cause, r.fail_first) for r in stuck] == [(Cause.NODE_UNHEALTHY, True)]
    assert "StuckPodDeleted" in events(p)
    assert p.status.recovery == st.recovery, "no recovery for it: not a member's current pod"
    live = plan(snapshot(status=st, pod_list=[old, *current], **gang))
    assert not [r for r in replaced(live) if r.uid == "old-2"], "its node is alive: it ends"
    off = Policy(force_delete=ForceDelete.NEVER)
    never = plan(snapshot(status=st, node_map=nm, pod_list=[old, *current], policy=off, **gang))
    assert not [r for r in replaced(never) if r.uid == "old-2"], "force-delete: never"


def test_force_delete_never_deletes_gracefully() -> None:
    nm = nodes(4)
    nm["n2"] = NodeView("n2", ready="False", ready_since=NOW - 60, lease_renewed=NOW)
    p = plan(snapshot(node_map=nm, policy=Policy(force_delete=ForceDelete.NEVER)))
    assert [r.fail_first for r in replaced(p)] == [False]


@pytest.mark.parametrize(
    ("cause", "change"),
    [
        (Cause.POD_FAILED, {"phase": "Failed"}),
        (Cause.POD_DELETED, {"deleting": True}),
        (Cause.RESTARTING, {"restarting": True}),
        (Cause.DEVICE_UNHEALTHY, {"devices_unhealthy": True}),
        (Cause.DEVICE_TAINTED, {"device_taint_evicted": True}),
        (Cause.DEVICE_TAINTED, {"device_taint_evicted": True, "deleting": True}),
    ],
)
def test_each_pod_signal_starts_one_recovery(cause: Cause, change: dict[str, object]) -> None:
    p = plan(snapshot(pod_list=with_pod(pods(4, epoch=2), 3, **change)))
    assert p.status.epoch == 3
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(3): cause.value}
    # Only a device fault needs us to delete the pod (a device-taint eviction's pod: unless
    # kube-controller-manager deletes it already); the Job controller replaces failed and
    # deleted pods itself, and in-place causes restart through the agents.
    ours = cause == Cause.DEVICE_UNHEALTHY or (
        cause == Cause.DEVICE_TAINTED and not change.get("deleting")
    )
    assert [r.cause for r in replaced(p)] == ([cause] if ours else [])
    in_place = cause == Cause.RESTARTING
    assert set(p.status.recovery.recreated) == (set() if in_place else {member(3)})


def test_vanished_pod_counts_as_recreated() -> None:
    p = plan(snapshot(pod_list=pods(4, epoch=2)[1:]))
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(0): Cause.POD_DELETED.value}
    assert p.status.recreate_used == 1


def test_healthy_gang_does_nothing_but_watches_its_leases() -> None:
    p = plan(snapshot())
    assert p.actions == []
    # nodes renewed 1 s ago: stale after 10 s, unhealthy 15 s later
    assert p.requeue_after == pytest.approx(24)
    assert p.status == dataclasses.replace(running(), expected=4, reported=4, ready=4)


def test_completed_member_is_not_a_failure() -> None:
    p = plan(snapshot(pod_list=with_pod(pods(4, epoch=2), 0, phase="Succeeded")))
    assert p.status.epoch == 2
    assert p.actions == []


# --- guarantee 3: fast detection, flaps ignored -------------------------------------------------
def test_node_flap_under_threshold_does_nothing_and_looks_again_when_due() -> None:
    nm = nodes(4)
    nm["n1"] = NodeView("n1", ready="False", ready_since=NOW - 5, lease_renewed=NOW)
    p = plan(snapshot(node_map=nm))
    assert p.actions == []
    assert p.status.epoch == 2
    assert p.requeue_after == pytest.approx(Policy().node_unhealthy_after_s - 5)


def test_stale_lease_is_a_signal_before_ready_changes_once_read_afresh() -> None:
    nm = nodes(4)
    nm["n1"] = NodeView("n1", ready="True", lease_renewed=NOW - 26)  # stale for 16 s > 15 s
    first = plan(snapshot(node_map=nm))
    assert first.actions == [ReadLeases(("n1",))], "the watch may lag: read it first"
    assert (first.status, first.requeue_after) == (running(), 0.0)
    # The fresh read (just now) confirmed the old renewal: now it counts.
    nm["n1"] = dataclasses.replace(nm["n1"], lease_read_at=NOW)
    p = plan(snapshot(node_map=nm))
    assert [r.member for r in replaced(p)] == [member(1)]
    # Its first signal: the missed renewal, a renew interval after the last one, in which the
    # node died (the window goodput splits, core/goodput.py)
    rec = p.status.recovery
    assert rec is not None
    assert (rec.first_signal, rec.first_signal_at) == (Cause.NODE_UNHEALTHY, NOW - 16)
    assert rec.signal_window == LEASE_RENEW_INTERVAL_S


def test_a_renewal_from_before_the_controller_watched_widens_the_window() -> None:
    """The last renewal came before the controller could watch (its start, an outage): the
    signal counts from then, and the node may have died any time since its renewal."""
    nm = nodes(4)
    nm["n1"] = NodeView("n1", ready="True", lease_renewed=NOW - 100, lease_read_at=NOW)
    s = dataclasses.replace(snapshot(node_map=nm), leases_observed_since=NOW - 30)
    rec = plan(s).status.recovery
    assert rec is not None
    assert (rec.first_signal_at, rec.signal_window) == (NOW - 20, 80.0)


def test_a_node_that_says_it_is_not_ready_shows_its_failure_itself() -> None:
    nm = nodes(4)
    nm["n1"] = NodeView("n1", ready="False", ready_since=NOW - 20, lease_renewed=NOW - 1)
    rec = plan(snapshot(node_map=nm)).status.recovery
    assert rec is not None
    assert (rec.first_signal_at, rec.signal_window) == (NOW - 20, 0.0)


def test_a_lease_read_before_it_went_stale_confirms_nothing() -> None:
    nm = nodes(4)
    nm["n1"] = NodeView("n1", ready="True", lease_renewed=NOW - 26, lease_read_at=NOW - 20)
    assert plan(snapshot(node_map=nm)).actions == [ReadLeases(("n1",))]


XID = "gpu.example.com/xid"
XID_TAINT = {"taints": ((XID, NOW - 30),)}
DEADLOCK = {"conditions": (("KernelDeadlock", NOW - 30),)}
OUT_OF_SERVICE = {"taints": (("node.kubernetes.io/out-of-service", NOW - 30),)}


@pytest.mark.parametrize(
    ("taints", "conditions", "node", "expect"),
    [
        (frozenset({XID}), frozenset(), XID_TAINT, True),
        (frozenset(), frozenset(), XID_TAINT, False),
        (frozenset(), frozenset({"KernelDeadlock"}), DEADLOCK, True),
        (frozenset(), frozenset(), DEADLOCK, False),
        (frozenset(), frozenset(), OUT_OF_SERVICE, True),
    ],
)
def test_configured_taints_and_conditions(
    taints: frozenset[str], conditions: frozenset[str], node: dict[str, object], expect: bool
) -> None:
    nm = nodes(4)
    nm["n0"] = dataclasses.replace(nm["n0"], **node)  # type: ignore[arg-type]
    policy = Policy(unhealthy_taints=taints, unhealthy_conditions=conditions)
    p = plan(snapshot(node_map=nm, policy=policy))
    assert bool(replaced(p)) is expect


# --- failures during the barrier wait converge --------------------------------------------------
def test_in_place_failure_during_barrier_joins_the_same_epoch() -> None:
    st = recovering(3)
    pl = with_pod(pods(4, epoch=2), 2, restarting=True)  # still coming back from epoch 2
    p = plan(snapshot(status=st, pod_list=pl))
    assert p.status.epoch == 3
    assert p.status.inplace_used == st.inplace_used
    assert events(p) == []


def test_node_failure_during_barrier_replaces_that_pod_in_the_same_epoch() -> None:
    st = recovering(3)
    nm = nodes(4)
    nm["n3"] = NodeView("n3", ready="Unknown", ready_since=NOW - 40, lease_renewed=NOW - 60)
    p = plan(snapshot(status=st, pod_list=pods(4, epoch=3), node_map=nm))
    assert p.status.epoch == 3
    assert not p.status.barrier_open  # the replaced member has not joined yet
    assert [r.member for r in replaced(p)] == [member(3)]
    assert "RecoveryExtended" in events(p)
    assert p.status.recovery is not None
    assert p.status.recovery.in_place == 3


def test_member_without_a_pod_during_a_recovery_is_awaited_not_charged() -> None:
    """A gang still being created (its Jobs not all made yet) when a member fails: the
    members whose pods do not exist yet are not failures (found by the 1000-pod bench,
    where they used up the recreate budget and escalated)."""
    st = recovering(3)
    p = plan(snapshot(status=st, pod_list=pods(4, epoch=3)[:2]))
    assert p.status.recreate_used == st.recreate_used
    assert p.status.recovery is not None
    assert p.status.recovery.causes == st.recovery.causes  # type: ignore[union-attr]
    assert p.actions == []
    assert not p.status.barrier_open


def test_replacement_that_joins_opens_the_barrier() -> None:
    st = recovering(3)
    assert st.recovery is not None
    st.recovery.recreated[member(3)] = "uid-3"
    pl = with_pod(pods(4, epoch=3), 3, uid="uid-3b", name="p3b")
    p = plan(snapshot(status=st, pod_list=pl))
    assert p.status.barrier_open
    assert p.status.phase == Phase.RUNNING
    assert events(p) == ["BarrierOpened"]
    assert len(p.status.history) == 1


# --- guarantee 4: consistent checkpoint ---------------------------------------------------------
def looked_again(pl: list[PodView], i: int, epoch: int = 3, **changes: Any) -> list[PodView]:
    """Member ``i``'s agent answered the second look at the steps (with ``changes``)."""
    return with_pod(pl, i, rechecked_epoch=epoch, **changes)


def every_member_looked_again(pl: list[PodView], epoch: int = 3) -> list[PodView]:
    for i in range(len(pl)):
        pl = looked_again(pl, i, epoch)
    return pl


def test_replacement_with_only_persistent_tier_sets_the_common_step() -> None:
    pl = pods(4, epoch=3, steps=(100, 200, 300))
    pl = with_pod(pl, 1, reported_steps=(100, 200))  # recreated: only the persistent tier
    asked = plan(snapshot(status=recovering(3), pod_list=pl))
    assert not asked.status.barrier_open
    assert asked.status.step_recheck == StepRecheck(3, (300,), NOW + STEP_RECHECK_S)
    assert asked.requeue_after == STEP_RECHECK_S
    p = plan(snapshot(status=asked.status, pod_list=looked_again(pl, 1)))
    assert p.status.resume_step == 200
    assert p.status.step_recheck is None


def test_a_stale_report_of_a_shared_root_is_looked_at_again_before_the_barrier_opens() -> None:
    """Members 1..3 share a root with member 0, whose trainer was killed: its agent reported
    at once what the root held then (100, 200); the others' trainers kept step 317 on their
    stop, and reported it. Asked, member 0 looks again and finds 317."""
    pl = with_pod(pods(4, epoch=3, steps=(100, 200, 317)), 0, reported_steps=(100, 200))
    asked = plan(snapshot(status=recovering(3), pod_list=pl))
    assert (asked.status.barrier_open, asked.status.step_recheck) == (
        False,
        StepRecheck(3, (317,), NOW + STEP_RECHECK_S),
    )
    assert events(asked) == []
    # asked again with nothing new: still waiting, the same ask
    again = plan(snapshot(status=asked.status, pod_list=pl, now=NOW + 1))
    assert not again.status.barrier_open
    assert again.status.step_recheck == asked.status.step_recheck
    assert again.requeue_after == pytest.approx(STEP_RECHECK_S - 1)
    pl = looked_again(pl, 0, reported_steps=(100, 200, 317))
    p = plan(snapshot(status=asked.status, pod_list=pl, now=NOW + 1))
    assert p.status.barrier_open
    assert p.status.resume_step == 317
    assert events(p) == ["BarrierOpened"]


def test_each_member_is_asked_for_the_step_it_lacks_not_only_for_the_newest() -> None:
    """(Seen in CI on the real nodes.) Member 1's trainer was killed one step past its local
    checkpoint 30, which the others never reached; their trainers kept step 29 in the root
    they share after member 1 reported. The newest step (30) is member 1's own: asking only
    for it would ask the others alone, and the barrier would open at 20. All are asked;
    member 1 finds 29."""
    pl = pods(4, epoch=3, steps=(10, 20, 29))
    pl = with_pod(pl, 1, reported_steps=(10, 20, 30))
    asked = plan(snapshot(status=recovering(3), pod_list=pl))
    assert asked.status.step_recheck == StepRecheck(3, (30, 29), NOW + STEP_RECHECK_S)
    # the others look again, the same steps: 30 is in member 1's own local tier
    pl = [*every_member_looked_again(pl[:1]), pl[1], *every_member_looked_again(pl[2:])]
    still = plan(snapshot(status=asked.status, pod_list=pl, now=NOW + 1))
    assert not still.status.barrier_open, "member 1 has not looked again"
    pl = looked_again(pl, 1, reported_steps=(10, 20, 29, 30))
    p = plan(snapshot(status=asked.status, pod_list=pl, now=NOW + 1))
    assert p.status.barrier_open
    assert p.status.resume_step == 29


def test_a_second_look_names_at_most_one_reports_worth_of_steps() -> None:
    pl = with_pod(pods(4, epoch=3, steps=(10,)), 0, reported_steps=(10, *range(100, 120)))
    pl = with_pod(pl, 1, reported_steps=(10, *range(200, 220)))
    asked = plan(snapshot(status=recovering(3), pod_list=pl))
    ask = asked.status.step_recheck
    assert ask is not None
    assert ask.steps == tuple(range(219, 219 - STEP_RECHECK_LIMIT, -1))


def test_reports_that_agree_open_the_barrier_without_a_second_look() -> None:
    p = plan(snapshot(status=recovering(3), pod_list=pods(4, epoch=3, steps=(100, 317))))
    assert p.status.barrier_open
    assert p.status.step_recheck is None


def test_a_member_that_never_looks_again_holds_the_barrier_until_the_deadline() -> None:
    """An agent older than the second look never answers: the barrier opens on its first
    report at the ask's deadline, with a warning."""
    pl = with_pod(pods(4, epoch=3, steps=(100, 200, 317)), 2, reported_steps=(100, 200))
    asked = plan(snapshot(status=recovering(3), pod_list=pl))
    late = plan(snapshot(status=asked.status, pod_list=pl, now=NOW + STEP_RECHECK_S))
    assert late.status.barrier_open
    assert late.status.resume_step == 200
    assert events(late) == ["StepRecheckTimeout", "BarrierOpened"]
    timeout = next(a for a in late.actions if isinstance(a, Event))
    assert timeout.warning
    assert "1 member(s) did not look again for steps [317]" in timeout.message


def test_an_ask_of_an_earlier_epoch_is_not_an_answer() -> None:
    """A new epoch asks again: answers and asks carry their epoch."""
    pl = with_pod(pods(4, epoch=4, steps=(100, 200, 317)), 0, reported_steps=(100, 200))
    pl = looked_again(pl, 0, epoch=3)
    st = recovering(4, step_recheck=StepRecheck(3, (317,), NOW - 60))
    p = plan(snapshot(status=st, pod_list=pl))
    assert not p.status.barrier_open
    assert p.status.step_recheck == StepRecheck(4, (317,), NOW + STEP_RECHECK_S)


def test_no_common_step_escalates_by_default() -> None:
    pl = with_pod(pods(4, epoch=3, steps=(300,)), 0, reported_steps=(100,))
    asked = plan(snapshot(status=recovering(3), pod_list=pl))
    assert asked.status.phase == Phase.RECOVERING, "every member lacks a step: all look again"
    assert asked.status.step_recheck == StepRecheck(3, (300, 100), NOW + STEP_RECHECK_S)
    p = plan(snapshot(status=asked.status, pod_list=every_member_looked_again(pl)))
    assert p.status.phase == Phase.ESCALATED
    assert p.status.reason == "NoCommonCheckpoint"
    assert not p.status.barrier_open


def test_no_common_step_starts_from_scratch_when_configured() -> None:
    pl = with_pod(pods(4, epoch=3, steps=(300,)), 0, reported_steps=(100,))
    policy = Policy(no_common_checkpoint=NoCommonCheckpoint.SCRATCH)
    asked = plan(snapshot(status=recovering(3), pod_list=pl, policy=policy))
    p = plan(snapshot(status=asked.status, pod_list=every_member_looked_again(pl), policy=policy))
    assert p.status.barrier_open
    assert p.status.resume_step is None


def test_no_checkpoints_at_all_starts_from_scratch() -> None:
    p = plan(snapshot(status=GangStatus(), pod_list=pods(4, epoch=1, steps=())))
    assert p.status.barrier_open
    assert p.status.resume_step is None


# --- guarantee 5: budgets and escalation --------------------------------------------------------
def test_inplace_budget_exhausted_escalates_through_a_pod() -> None:
    pl = with_pod(pods(4, epoch=2), 1, trainer_failed=True)
    p = plan(snapshot(pod_list=pl, status=running(inplace_used=10)))
    assert p.status.phase == Phase.ESCALATED
    assert p.status.reason == "InPlaceBudgetExhausted"
    assert next(a for a in p.actions if isinstance(a, EscalatePod)).pod == "p0"
    assert "Escalated" in events(p)


def test_an_escalation_not_seen_on_any_pod_is_marked_again() -> None:
    """The status (Escalated) is written before the actions: an EscalatePod lost after that
    write (a crash, an API error) or impossible then (no live pod) is planned again, without a
    second Escalated Event, and looked at again until a pod carries the condition."""
    st = running(inplace_used=10)
    escalated = plan(
        snapshot(pod_list=with_pod(pods(4, epoch=2), 1, trainer_failed=True), status=st)
    )
    assert escalated.status.phase == Phase.ESCALATED
    again = plan(snapshot(pod_list=pods(4, epoch=2), status=escalated.status))
    [mark] = [a for a in again.actions if isinstance(a, EscalatePod)]
    assert (mark.pod, mark.message) == ("p0", f"InPlaceBudgetExhausted: {escalated.status.message}")
    assert events(again) == []
    assert again.status == escalated.status
    assert again.requeue_after == pytest.approx(ESCALATION_RECHECK_S)
    # no live pod: nothing to mark yet, but it is looked at again
    gone = [dataclasses.replace(p, phase="Failed") for p in pods(4, epoch=2)]
    none_live = plan(snapshot(pod_list=gone, status=escalated.status))
    assert [a for a in none_live.actions if isinstance(a, EscalatePod)] == []
    assert none_live.requeue_after == pytest.approx(ESCALATION_RECHECK_S)
    # seen on a pod of this JobSet attempt: nothing more to do; one of an earlier attempt's is not
    failed = with_pod(pods(4, epoch=2), 2, escalated=True, phase="Failed")
    seen = plan(snapshot(pod_list=failed, status=escalated.status))
    assert (seen.actions, seen.requeue_after) == ([], None)
    # the condition kept but the phase written back to Running (its kubelet's reconcile): the
    # Job controller may never have counted it, so a live pod is marked again
    reverted = with_pod(pods(4, epoch=2), 0, escalated=True)
    redo = plan(snapshot(pod_list=reverted, status=escalated.status))
    assert [a.pod for a in redo.actions if isinstance(a, EscalatePod)] == ["p0"]
    assert redo.requeue_after == pytest.approx(ESCALATION_RECHECK_S)
    attempt_1 = [dataclasses.replace(p, restart_attempt=1) for p in pods(4, epoch=2)]
    old = with_pod(attempt_1, 2, escalated=True, phase="Failed", restart_attempt=0)
    st_1 = dataclasses.replace(escalated.status, restart_attempt=1)
    later = plan(snapshot(pod_list=old, status=st_1, restart_attempt=1))
    assert [a.pod for a in later.actions if isinstance(a, EscalatePod)] == ["p0"]


def test_recreate_budget_exhausted_escalates() -> None:
    nm = nodes(4)
    nm["n0"] = NodeView("n0", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 90)
    p = plan(snapshot(node_map=nm, status=running(recreate_used=5)))
    assert p.status.reason == "RecreateBudgetExhausted"
    assert replaced(p) == []


def test_member_failing_in_place_repeatedly_is_recreated() -> None:
    pl = with_pod(pods(4, epoch=2), 1, trainer_failed=True)
    p = plan(snapshot(pod_list=pl, status=running(member_failures={member(1): 2})))
    assert [(r.member, r.cause) for r in replaced(p)] == [(member(1), Cause.REPEATED_FAILURE)]


def test_a_hang_while_a_peers_node_is_silent_is_not_counted_against_the_hung_member() -> None:
    """Member 3's node stopped renewing its Lease (silent, not yet unhealthy); member 1's
    trainer hung, waiting for it in a collective: restarted in place, its count of failures
    in a row left as it was (at the limit it would have been recreated). A hang with every
    node heard is counted as before."""
    pl = with_pod(pods(4, epoch=2), 1, hung_in_epoch=2)
    nm = nodes(4)
    nm["n3"] = NodeView("n3", ready="True", ready_since=NOW - 600, lease_renewed=NOW - 12)
    st = running(member_failures={member(1): 2})
    p = plan(snapshot(pod_list=pl, status=st, node_map=nm))
    assert replaced(p) == []
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(1): Cause.TRAINER_HUNG}
    assert p.status.member_failures == {member(1): 2}
    heard = plan(snapshot(pod_list=pl, status=st, node_map=nodes(4)))
    assert [(r.member, r.cause) for r in replaced(heard)] == [(member(1), Cause.REPEATED_FAILURE)]


def test_a_hang_in_the_pass_where_a_peer_failed_otherwise_is_not_counted() -> None:
    """A short hang-timeout runs out while a peer's crash (or its silence) is reported: in the
    same pass, the hung member was waiting on the crashed one. The crash is counted, the hang
    is not; the recovery says its hangs were not counted."""
    pl = with_pod(with_pod(pods(4, epoch=2), 1, hung_in_epoch=2), 3, trainer_failed=True)
    p = plan(snapshot(pod_list=pl, status=running(member_failures={member(1): 2})))
    assert replaced(p) == [], "at the limit, a counted hang would have been recreated"
    assert p.status.member_failures == {member(1): 2, member(3): 1}
    assert p.status.recovery is not None
    assert not p.status.recovery.hangs_counted


def waiting_recovery(causes: dict[str, Cause], *, counted: bool) -> GangStatus:
    """Recovering into epoch 3 with ``causes``; member 1's hang counted at the start or not."""
    st = recovering(3, member_failures={member(1): 2})
    assert st.recovery is not None
    rec = dataclasses.replace(st.recovery, causes=causes, hangs_counted=counted)
    return dataclasses.replace(st, recovery=rec)


@pytest.mark.parametrize(
    ("other", "counted", "left"),
    [
        (Cause.NODE_UNHEALTHY, True, {member(1): 1}),  # its node declared after: taken back
        (Cause.AGENT_SILENT, True, {member(1): 1}),  # its agent silent (a spare took it)
        (None, True, {member(1): 2}),  # the hang alone: it stays counted
        (Cause.NODE_UNHEALTHY, False, {member(1): 2}),  # never counted: nothing to take back
    ],
)
def test_a_counted_hang_is_taken_back_at_the_barrier_where_a_peer_failed_otherwise(
    other: Cause | None, counted: bool, left: dict[str, int]
) -> None:
    """Member 1's hang ran out before any sign of member 3's end (a node's Lease is stale only
    10 s after its last renewal) and was counted; member 3's failure showed later in the same
    recovery. When the barrier opens the hang is read as the gang waiting on member 3."""
    causes = {member(1): Cause.TRAINER_HUNG} | ({member(3): other} if other else {})
    st = waiting_recovery(causes, counted=counted)
    p = plan(snapshot(status=st, pod_list=pods(4, epoch=3)))
    assert p.status.barrier_open
    assert p.status.member_failures == left
    assert p.status.recovery is not None
    assert not p.status.recovery.hangs_counted or other is None


def test_a_hang_alone_is_counted_and_said_so() -> None:
    pl = with_pod(pods(4, epoch=2), 1, hung_in_epoch=2)
    p = plan(snapshot(pod_list=pl, status=running()))
    assert p.status.member_failures == {member(1): 1}
    assert p.status.recovery is not None
    assert p.status.recovery.hangs_counted


def test_consecutive_failures_are_counted_per_member() -> None:
    pl = with_pod(pods(4, epoch=2), 1, trainer_failed=True)
    p = plan(snapshot(pod_list=pl, status=running(member_failures={member(2): 2})))
    assert p.status.member_failures == {member(1): 1}


def test_barrier_deadline_recreates_laggards_then_escalates() -> None:
    st = recovering(3)
    assert st.recovery is not None
    pl = with_pod(pods(4, epoch=3), 2, reported_epoch=2)
    late = st.recovery.deadline + 1
    p1 = plan(snapshot(status=st, pod_list=pl, now=late))
    assert [(r.member, r.cause) for r in replaced(p1)] == [(member(2), Cause.BARRIER_TIMEOUT)]
    assert "BarrierTimeout" in events(p1)
    rec = p1.status.recovery
    assert rec is not None
    assert rec.deadline_extended
    pl2 = with_pod(pl, 2, uid="uid-2b", name="p2b", reported_epoch=None)
    p2 = plan(snapshot(status=p1.status, pod_list=pl2, now=rec.deadline + 1))
    assert p2.status.phase == Phase.ESCALATED
    assert p2.status.reason == "BarrierTimeout"


def test_a_new_leader_recreates_nobody_for_not_having_reported_to_it_yet() -> None:
    """Past the barrier deadline, a leader that has just started has heard nothing over its
    channel yet (the reports went to the one before): it waits REPORT_AGAIN_S for the agents
    to send them again, then acts as any leader would (guarantee 6)."""
    st = recovering(3)
    assert st.recovery is not None
    pl = [dataclasses.replace(p, reported_epoch=2) for p in pods(4, epoch=3)]
    late = st.recovery.deadline + 1
    started = late - 1
    p = plan(dataclasses.replace(snapshot(status=st, pod_list=pl, now=late), reports_since=started))
    assert replaced(p) == []
    assert p.requeue_after == started + REPORT_AGAIN_S - late
    reported = [dataclasses.replace(x, reported_epoch=3) for x in pl]
    s = snapshot(status=st, pod_list=reported, now=late + 1)
    assert plan(dataclasses.replace(s, reports_since=started)).status.barrier_open
    after = snapshot(status=st, pod_list=pl, now=started + REPORT_AGAIN_S)
    p = plan(dataclasses.replace(after, reports_since=started))
    assert len(replaced(p)) == 4, "nobody sent anything in time: the deadline acts"


def test_escalated_gang_waits_for_jobset_restart_then_starts_fresh() -> None:
    st = running(inplace_used=10, phase=Phase.ESCALATED)
    marked = with_pod(pods(4, epoch=2), 0, escalated=True, phase="Failed")
    assert plan(snapshot(status=st, pod_list=marked)).actions == []
    fresh = [
        dataclasses.replace(pod, restart_attempt=1, reported_epoch=None)
        for pod in pods(4, epoch=None)
    ]
    p = plan(snapshot(status=st, pod_list=fresh, restart_attempt=1))
    assert (p.status.phase, p.status.epoch, p.status.inplace_used) == (Phase.RECOVERING, 3, 0)
    assert p.status.restart_attempt == 1


def test_finished_jobset_after_escalation_is_failed() -> None:
    st = running(phase=Phase.ESCALATED)
    assert plan(snapshot(status=st, finished=True)).status.phase == Phase.FAILED


# --- guarantee 6: crash safety ------------------------------------------------------------------
def test_replanning_the_same_world_starts_no_second_recovery() -> None:
    nm = nodes(4)
    nm["n2"] = NodeView("n2", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 100)
    pl = with_pod(pods(4, epoch=2), 0, trainer_failed=True)
    first = plan(snapshot(pod_list=pl, node_map=nm))
    # The controller died after saving the status, before deleting anything: same world again.
    again = plan(snapshot(pod_list=pl, node_map=nm, status=first.status, now=NOW + 1))
    assert again.status.epoch == first.status.epoch
    assert again.status.inplace_used == first.status.inplace_used
    assert again.status.recreate_used == first.status.recreate_used
    assert replaced(again) == replaced(first)  # the lost delete is repeated, not recharged
    assert "RecoveryStarted" not in events(again)


def test_plan_does_not_mutate_its_input() -> None:
    s = snapshot(pod_list=with_pod(pods(4, epoch=2), 1, trainer_failed=True))
    before = dataclasses.replace(s.status)
    plan(s)
    assert s.status == before


# --- good citizen / bad input -------------------------------------------------------------------
def test_suspended_jobset_stands_down_and_resumes_in_a_new_epoch() -> None:
    down = plan(snapshot(suspended=True))
    assert down.status.phase == Phase.STOOD_DOWN
    assert events(down) == ["StoodDown"]
    assert replaced(down) == []
    back = plan(snapshot(status=down.status))
    assert (back.status.phase, back.status.epoch) == (Phase.RECOVERING, 3)


def test_malformed_report_is_an_event_and_never_counts() -> None:
    pl = with_pod(
        pods(4, epoch=3), 1, reported_epoch=None, report_error="epoch 'x' is not an integer"
    )
    p = plan(snapshot(status=recovering(3), pod_list=pl))
    assert "MalformedReport" in events(p)
    assert not p.status.barrier_open


def test_pods_of_an_older_jobset_restart_attempt_are_ignored() -> None:
    old = [
        dataclasses.replace(pod, restart_attempt=0, trainer_failed=True) for pod in pods(4, epoch=2)
    ]
    new = [
        dataclasses.replace(pod, uid=pod.uid + "n", restart_attempt=1) for pod in pods(4, epoch=2)
    ]
    st = running(restart_attempt=1)
    p = plan(
        Snapshot(NOW, snapshot(restart_attempt=1).gang, Policy(), tuple(old + new), nodes(4), st)
    )
    assert p.actions == []


def test_replaced_pod_gone_before_its_replacement_is_not_charged_twice() -> None:
    nm = nodes(4)
    nm["n2"] = NodeView("n2", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 100)
    first = plan(snapshot(node_map=nm))
    gone = [pod for pod in pods(4, epoch=2) if pod.member != member(2)]
    again = plan(snapshot(pod_list=gone, node_map=nm, status=first.status, now=NOW + 1))
    assert again.status.recreate_used == first.status.recreate_used == 1
    assert replaced(again) == []


def test_manual_restart_request_starts_one_new_epoch_without_charging() -> None:
    p = plan(snapshot(restart_request="r1"))
    assert (p.status.phase, p.status.epoch, p.status.inplace_used) == (Phase.RECOVERING, 3, 0)
    assert p.status.reason == Cause.MANUAL_RESTART.value
    assert p.status.restart_request == "r1"
    done = plan(snapshot(restart_request="r1", status=running(3, restart_request="r1")))
    assert done.status.epoch == 3  # the same request is not acted on twice


def test_unhealthy_taint_comes_off_only_when_the_node_is_back() -> None:
    tainted = NodeView("n", taints=((UNHEALTHY_TAINT, NOW - 60),), lease_renewed=NOW - 1)
    assert may_untaint(tainted, NOW)
    assert plan_node(tainted, NOW) == [UntaintNode("n")]
    stale = dataclasses.replace(tainted, lease_renewed=NOW - 30)
    assert not may_untaint(stale, NOW), "a stale renewal is not a comeback"
    assert not may_untaint(dataclasses.replace(tainted, ready="Unknown"), NOW)
    assert not may_untaint(NodeView("n", lease_renewed=NOW - 1), NOW), "nothing to remove"
    assert plan_node(stale, NOW) == plan_node(None, NOW) == []


def test_invalid_policy_is_said_once() -> None:
    (e,) = refuse_policy("bad annotation", frozenset())
    assert isinstance(e, Event)
    assert (e.reason, e.warning) == ("InvalidPolicy", True)
    assert e.once_key is not None
    assert refuse_policy("bad annotation", frozenset({e.once_key})) == []


def test_only_ready_nodes_stale_by_their_lease_alone_are_read_again() -> None:
    nm = nodes(4)  # renewed 1 s ago
    nm["n1"] = dataclasses.replace(nm["n1"], lease_renewed=NOW - 26)  # 10 + 15 s: stale
    nm["n2"] = dataclasses.replace(nm["n2"], lease_renewed=NOW - 24)  # not yet
    nm["n3"] = NodeView("n3", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 60)
    assert unconfirmed_lease_nodes(snapshot(node_map=nm)) == ["n1"]


def test_device_fault_replaces_without_tainting_by_default() -> None:
    p = plan(snapshot(pod_list=with_pod(pods(4, epoch=2), 1, devices_unhealthy=True)))
    assert [(r.member, r.taint_node) for r in replaced(p)] == [(member(1), None)]


def test_device_fault_taints_the_ready_node_when_asked() -> None:
    """For Kueue TAS: an untolerated taint on the (still Ready) node makes Kueue's failed-node
    replacement move the member; a taint of its own that the controller never removes."""
    p = plan(
        snapshot(
            pod_list=with_pod(pods(4, epoch=2), 1, devices_unhealthy=True),
            policy=Policy(taint_on_device_fault=True),
        )
    )
    (r,) = replaced(p)
    assert (r.member, r.taint_node, r.taint_key) == (member(1), "n1", DEVICE_UNHEALTHY_TAINT)
    assert r.failed_since is None


def test_a_device_taint_eviction_never_taints_the_node() -> None:
    """The scheduler keeps the new claim off the tainted device itself (the node's other
    devices stay usable), so even ``taint-on-device-fault`` leaves the node alone."""
    p = plan(
        snapshot(
            pod_list=with_pod(pods(4, epoch=2), 1, device_taint_evicted=True),
            policy=Policy(taint_on_device_fault=True),
        )
    )
    assert [(r.member, r.cause, r.taint_node) for r in replaced(p)] == [
        (member(1), Cause.DEVICE_TAINTED, None)
    ]


def test_a_member_waiting_for_the_next_epoch_is_a_failure_even_unseen() -> None:
    """Its pod restarted in place while the controller was away: nothing in the pod status
    shows it, but its agent reported into the open barrier and waits for a new epoch."""
    pl = with_pod(pods(4, epoch=2), 2, late_for_epoch=2)
    p = plan(snapshot(pod_list=pl))
    assert p.status.phase == Phase.RECOVERING
    assert p.status.epoch == 3
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(2): Cause.AGENT_WAITING}
    assert replaced(p) == [], "restarted in place like any other member"
    assert p.status.member_failures == {member(2): 1}


def test_a_late_mark_of_an_older_epoch_or_while_recovering_is_no_failure() -> None:
    stale = with_pod(pods(4, epoch=2), 2, late_for_epoch=1)
    assert plan(snapshot(pod_list=stale)).status.epoch == 2
    st = recovering(3)
    waiting = with_pod(pods(4, epoch=3), 2, late_for_epoch=3)
    p = plan(snapshot(status=st, pod_list=waiting))
    assert p.status.recovery is not None
    assert member(2) not in p.status.recovery.causes


def test_a_trainer_process_exit_reported_by_its_agent_starts_a_recovery() -> None:
    """Process scope: the launcher keeps the container up, so only the agent's report shows
    the crash; it counts for the running epoch only."""
    pl = with_pod(pods(4, epoch=2), 1, exited_in_epoch=2)
    p = plan(snapshot(pod_list=pl))
    assert p.status.epoch == 3
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(1): Cause.TRAINER_EXITED}
    assert replaced(p) == []
    stale = with_pod(pods(4, epoch=2), 1, exited_in_epoch=1)
    assert plan(snapshot(pod_list=stale)).status.epoch == 2
    waiting = with_pod(pods(4, epoch=3), 1, exited_in_epoch=3)
    p = plan(snapshot(status=recovering(3), pod_list=waiting))
    assert p.status.recovery is not None
    assert member(1) not in p.status.recovery.causes


def test_a_hang_reported_by_its_agent_starts_an_in_place_recovery() -> None:
    """Every process lives, the trainer stopped advancing: the agent says so for the running
    epoch; the gang restarts in place, the member charged as for a crash."""
    pl = with_pod(pods(4, epoch=2), 3, hung_in_epoch=2)
    p = plan(snapshot(pod_list=pl))
    assert p.status.epoch == 3
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(3): Cause.TRAINER_HUNG}
    assert p.status.recovery.in_place == 4
    assert replaced(p) == []
    stale = with_pod(pods(4, epoch=2), 3, hung_in_epoch=1)
    assert plan(snapshot(pod_list=stale)).status.epoch == 2, "a hang of an older epoch"


def silent(name: str, since: float, *, read: bool = True) -> NodeView:
    """A Ready node whose Lease was last renewed at ``since`` (read afresh just now)."""
    return NodeView(name, lease_renewed=since, lease_read_at=NOW if read else None)


def test_a_silence_counts_only_from_when_the_controller_could_watch() -> None:
    """After an apiserver outage every Lease is as old as the outage: a node is silent only
    for the time since the Lease watch works again, not for the outage."""
    nm = nodes(4)
    nm["n1"] = silent("n1", NOW - 40)
    st = snapshot(node_map=nm)
    assert [r.member for r in replaced(plan(st))] == [member(1)], "watched all along"
    after_outage = dataclasses.replace(st, leases_observed_since=NOW - 5)
    p = plan(after_outage)
    assert (replaced(p), p.status.epoch) == ([], 2), "its kubelet could not renew either"
    assert p.requeue_after == pytest.approx(-5 + 10 + 15), "look again when it would count"
    fresh = nodes(4, now=NOW + 21)  # the others renewed since
    fresh["n1"] = nm["n1"]  # 26 s watched, no renewal: now it counts
    later = dataclasses.replace(after_outage, now=NOW + 21, nodes=fresh, cluster_nodes=fresh)
    assert [r.member for r in replaced(plan(later))] == [member(1)]


def test_many_nodes_silent_at_once_replace_nothing() -> None:
    """More than two nodes and at least 55 % of them unhealthy: a disruption (as Kubernetes'
    node lifecycle controller decides), not node failures."""
    nm = {f"n{i}": silent(f"n{i}", NOW - 60) for i in range(4)}
    nm["n3"] = NodeView("n3", lease_renewed=NOW - 1)
    p = plan(snapshot(node_map=nm))
    assert (replaced(p), p.status.epoch, p.status.phase) == ([], 2, Phase.RUNNING)
    assert events(p) == ["NodeDisruption"]
    assert p.requeue_after == pytest.approx(10)
    assert plan(snapshot(node_map={k: silent(k, NOW - 60, read=False) for k in nm})).actions == [
        Event(
            "NodeDisruption",
            "4 of 4 nodes unhealthy at once: no pod is replaced for its node until they recover "
            "(a control-plane or network outage looks like this)",
            warning=True,
            once_key="NodeDisruption/2",
        )
    ], "no Lease read either"


def test_one_dead_node_among_many_is_replaced() -> None:
    nm = nodes(6)
    nm["n1"] = silent("n1", NOW - 60)
    nm["n2"] = silent("n2", NOW - 60)  # 2 of 6: no disruption
    p = plan(snapshot(n=6, node_map=nm))
    assert sorted(r.member for r in replaced(p)) == [member(1), member(2)]


def test_a_member_not_ready_for_a_barrier_timeout_while_running_is_recovered() -> None:
    """Every wait is bounded: a member that restarted after the barrier opened (its agent
    started since) and stays not Ready, e.g. its agent cannot report (403), is recovered a
    barrier timeout after it restarted."""
    st = running(2)
    st.recovery = Recovery(2, NOW - 400, NOW - 100, opened=NOW - 200)
    stuck = with_pod(pods(4, epoch=2), 3, not_ready_since=NOW - 1000, agent_started=NOW - 150)
    no_leases = {f"n{i}": NodeView(f"n{i}") for i in range(4)}  # no other wake-up
    p = plan(snapshot(status=st, pod_list=stuck, node_map=no_leases))
    assert p.status.epoch == 2, "150 s since it restarted: not yet"
    assert p.requeue_after == pytest.approx(150)
    later = plan(snapshot(status=st, pod_list=stuck, node_map=no_leases, now=NOW + 150))
    assert later.status.recovery is not None
    assert later.status.recovery.causes == {member(3): Cause.NOT_READY}
    assert replaced(later) == [], "in place first (member-repeat-limit recreates it)"


def test_a_cold_start_or_a_slow_image_pull_is_no_failure() -> None:
    """The trainer starts (and its image is pulled) only once the barrier opened: a member not
    Ready long after that, whose agent has not restarted, is left alone."""
    st = running(2)
    st.recovery = Recovery(2, NOW - 4000, NOW - 3700, opened=NOW - 3600)
    slow = with_pod(pods(4, epoch=2), 3, not_ready_since=NOW - 3600, agent_started=NOW - 3700)
    p = plan(snapshot(status=st, pod_list=slow))
    assert (p.status.epoch, p.actions) == (2, [])


def test_a_fresh_epoch_nobody_reports_to_is_said_not_silent() -> None:
    """Nothing failed (a start): no deadline to act on, but past the barrier timeout the
    controller says who has not reported (e.g. agents whose ServiceAccount may not report)."""
    silent_pods = pods(4, epoch=None)
    p = plan(snapshot(status=GangStatus(), pod_list=silent_pods))  # a gang seen for the first time
    assert events(p) == []
    later = plan(snapshot(status=p.status, pod_list=silent_pods, now=NOW + 301))
    assert events(later) == ["MembersNotReporting"]
    (said,) = later.actions
    assert isinstance(said, Event)
    assert "4 member(s) have not reported after 300s" in said.message
    assert "MembersNotReporting" in later.status.message, "constant: no write per report"
    assert (later.status.phase, later.status.epoch, replaced(later)) == (Phase.RECOVERING, 1, [])
    assert said.once_key is not None
    quiet = snapshot(status=later.status, pod_list=silent_pods, now=NOW + 400)
    assert events(plan(dataclasses.replace(quiet, posted=frozenset({said.once_key})))) == []


def test_disruption_counts_the_whole_cluster_and_spares_what_an_operator_declares() -> None:
    """All four nodes of the gang dead among 100: node failures, replaced. Every node silent:
    a disruption, but a node an operator marked out-of-service is still replaced."""
    gang_nodes = {f"n{i}": silent(f"n{i}", NOW - 60) for i in range(4)}
    cluster = gang_nodes | {f"m{i}": NodeView(f"m{i}", lease_renewed=NOW - 1) for i in range(96)}
    s = dataclasses.replace(snapshot(node_map=gang_nodes), cluster_nodes=cluster)
    assert len(replaced(plan(s))) == 4
    oos = dataclasses.replace(
        gang_nodes["n2"], taints=(("node.kubernetes.io/out-of-service", NOW - 30),)
    )
    declared = gang_nodes | {"n2": oos}
    p = plan(snapshot(node_map=declared))  # the gang's four nodes are the whole cluster
    assert events(p) == ["NodeDisruption", "RecoveryStarted"]
    assert [r.member for r in replaced(p)] == [member(2)]


def test_no_barrier_deadline_acts_during_a_disruption() -> None:
    """Laggards on silent nodes are not replaced when the deadline passes in a disruption."""
    st = GangStatus(
        phase=Phase.RECOVERING,
        epoch=3,
        recovery=Recovery(3, NOW - 400, NOW - 1, causes={member(0): Cause.TRAINER_EXITED}),
    )
    nm = {f"n{i}": silent(f"n{i}", NOW - 60) for i in range(4)}
    p = plan(snapshot(status=st, pod_list=pods(4, epoch=2), node_map=nm))
    assert (replaced(p), p.status.phase) == ([], Phase.RECOVERING)
    assert p.requeue_after == pytest.approx(10)


def test_the_observation_window_restarts_only_after_an_outage() -> None:
    """A Lease watch down for less than a renew interval lost no renewal (it resumes from its
    resourceVersion): the window stays; after a longer gap it restarts when watching again."""
    assert observation_restarts(100.0, down_since=500.0, up_at=505.0) == 100.0
    assert observation_restarts(100.0, down_since=500.0, up_at=540.0) == 540.0
