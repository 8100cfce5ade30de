"""Hot spares (core/spares.py, the planner's swaps): declared, mapped to slots, swapped in
only once the old holder is fenced, and never two pods holding one slot."""

from __future__ import annotations

import copy
import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from jobset_inplace import launcher, names
from jobset_inplace.agent.channel import ChannelError, ReportChannel
from jobset_inplace.agent.config import ConfigError, load_config
from jobset_inplace.agent.heartbeat import Heartbeat
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.logic import AgentLogic, Open, Position, Report, Restart, Standby, Wait
from jobset_inplace.controller.metrics import Metrics
from jobset_inplace.core.admission import mutate, validate, warnings
from jobset_inplace.core.decode import gang_spec
from jobset_inplace.core.detection import LEASE_RENEW_INTERVAL_S, current_pods, current_spares
from jobset_inplace.core.disruption_budget import desired_budget
from jobset_inplace.core.gangstate import status_from_dict, status_to_dict
from jobset_inplace.core.model import (
    Cause,
    Event,
    GangStatus,
    NodeView,
    Plan,
    PlannedStop,
    PodView,
    Recovery,
    ReplacePod,
    ReportEndpoint,
    Snapshot,
)
from jobset_inplace.core.planner import plan
from jobset_inplace.core.planner.hot_spares import CROWDED_HOLD_S
from jobset_inplace.core.policy import ForceDelete, Policy, PolicyError
from jobset_inplace.core.spares import (
    SPARE_SWAPPED,
    fenced,
    moved_positions,
    plan_swaps,
    spare_spec,
    spares,
    spares_to_spread,
    swapped,
    valid_slots,
)
from jobset_inplace.core.statemachine import Phase
from jobset_inplace.core.telemetry import SpareShortfall, SparesSwapped, observe
from jobset_inplace.core.transform import AGENT_CONTAINER, AgentSettings, transform
from jobset_inplace.names import member_name
from jobset_inplace.protocol.envelope import Message, message_values
from jobset_inplace.protocol.gangstate import Endpoint, GangView, MalformedStatus, parse_gangstate

from .gangs import NOW, member, nodes, pods, running, snapshot, with_pod

MEMBERS, SPARES = 4, 2
POSITIONS = frozenset(member(i) for i in range(MEMBERS + SPARES))
SLOTS = frozenset(member(i) for i in range(MEMBERS))


def events(p: Plan) -> list[str]:
    return [a.reason for a in p.actions if isinstance(a, Event)]


def replaced(p: Plan) -> list[ReplacePod]:
    return [a for a in p.actions if isinstance(a, ReplacePod)]


def gang(**kw: Any) -> Snapshot:
    """4 members (p0..p3 on n0..n3) and 2 hot spares (p4, p5 on n4, n5)."""
    return snapshot(MEMBERS, hot_spares=SPARES, **kw)


def dead(node_map: dict[str, NodeView], name: str) -> dict[str, NodeView]:
    """``name`` silent for a minute (its Lease stale, Ready Unknown)."""
    out = dict(node_map)
    out[name] = NodeView(name, ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 100)
    return out


def jobset(replicas: int, annotations: dict[str, str], jobs: tuple[str, ...] = ("w",)) -> Any:
    return {
        "metadata": {"name": "js", "namespace": "ns", "annotations": annotations},
        "spec": {
            "replicatedJobs": [
                {"name": job, "replicas": replicas, "template": {"spec": {"template": {}}}}
                for job in jobs
            ]
        },
    }


# --- declaring spares -------------------------------------------------------------------------
def test_spares_are_the_highest_job_indexes_beyond_the_members() -> None:
    js = jobset(6, {names.HOT_SPARES: "2"})
    spec = spare_spec(js)
    assert spec is not None
    assert (spec.replicated_job, spec.members, spec.spares) == ("w", 4, 2)
    g = gang_spec(js)
    assert g.members == {f"w/{i}/0" for i in range(4)}
    assert g.spares == {"w/4/0", "w/5/0"}
    assert spare_spec(jobset(6, {names.HOT_SPARES: "0"})) is None
    assert spare_spec(jobset(6, {})) is None


@pytest.mark.parametrize(
    ("annotations", "jobs", "named"),
    [
        ({names.HOT_SPARES: "6"}, ("w",), names.HOT_SPARES),  # no member left
        ({names.HOT_SPARES: "-1"}, ("w",), names.HOT_SPARES),
        ({names.HOT_SPARES: "01"}, ("w",), names.HOT_SPARES),
        ({names.HOT_SPARES: "two"}, ("w",), names.HOT_SPARES),
        ({names.HOT_SPARES: "1"}, ("w", "d"), names.HOT_SPARES_JOB),  # which one?
        ({names.HOT_SPARES: "1", names.HOT_SPARES_JOB: "x"}, ("w", "d"), names.HOT_SPARES_JOB),
    ],
)
def test_a_malformed_declaration_is_refused_naming_the_annotation(
    annotations: dict[str, str], jobs: tuple[str, ...], named: str
) -> None:
    with pytest.raises(PolicyError) as e:
        spare_spec(jobset(6, annotations, jobs))
    assert e.value.key == named
    assert "expected" in str(e.value)


def test_the_spares_of_one_replicated_job_among_several() -> None:
    js = jobset(3, {names.HOT_SPARES: "1", names.HOT_SPARES_JOB: "d"}, ("w", "d"))
    g = gang_spec(js)
    assert g.spares == {"d/2/0"}
    assert g.members == {"w/0/0", "w/1/0", "w/2/0", "d/0/0", "d/1/0"}


# --- the slot mapping -------------------------------------------------------------------------
def test_a_swap_moves_one_slot_and_frees_the_old_position() -> None:
    slots = swapped({}, member(2), member(4))
    assert slots == {member(2): member(4)}
    assert moved_positions(slots) == {member(2): None, member(4): member(2)}
    assert spares(slots, SLOTS, POSITIONS) == {member(2), member(5)}
    back = swapped(slots, member(2), member(2))  # the slot back to its own position: no entry
    assert back == {}
    assert spares(back, SLOTS, POSITIONS) == {member(4), member(5)}
    assert valid_slots(slots, SLOTS, POSITIONS)


@pytest.mark.parametrize(
    "slots",
    [
        {member(2): member(4), member(3): member(4)},  # two slots, one pod
        {member(2): member(3)},  # slot 3 still held by its own position too
        {member(2): member(9)},  # no such position
        {member(4): member(5)},  # not a slot
        {member(2): member(2)},  # (never written: the identity has no entry)
    ],
)
def test_slots_that_do_not_fit_the_gang_are_not_valid(slots: dict[str, str]) -> None:
    assert not valid_slots(slots, SLOTS, POSITIONS)


def test_slots_that_do_not_fit_are_ignored_each_slot_held_by_its_own_position() -> None:
    s = gang(status=running(slots={member(2): member(4), member(3): member(4)}))
    assert {m: p.name for m, p in current_pods(s).items()} == {member(i): f"p{i}" for i in range(4)}
    assert set(current_spares(s)) == {member(4), member(5)}


def test_fenced_only_when_the_old_pod_cannot_be_training() -> None:
    assert fenced(None, force_deleted=False), "gone from the API"
    assert fenced("Failed", force_deleted=False)
    assert fenced("Succeeded", force_deleted=False)
    assert not fenced("Running", force_deleted=False), "running, or being deleted (its kubelet "
    "has not stopped it yet)"
    assert not fenced("Pending", force_deleted=False)
    assert fenced("Running", force_deleted=True), (
        "force-deleted on a silent node (the policy's fence)"
    )


def test_spares_are_given_lowest_position_first_never_on_an_avoided_node() -> None:
    ready = pods(6, epoch=2)[4:]
    swaps, short = plan_swaps([member(1), member(2)], list(reversed(ready)), frozenset({"n4"}))
    assert [(slot, pod.name) for slot, pod in swaps] == [(member(1), "p5")]
    assert short == [member(2)]


# --- the planner's swaps ----------------------------------------------------------------------
def test_a_dead_nodes_member_continues_on_a_ready_spare_at_once() -> None:
    nm = dead(nodes(6), "n2")
    p = plan(gang(node_map=nm))
    assert (p.status.phase, p.status.epoch) == (Phase.RECOVERING, 3)
    (r,) = replaced(p)
    assert (r.pod, r.fail_first) == ("p2", True), "the old pod is still force-deleted"
    assert p.status.slots == {member(2): member(4)}
    assert "SpareSwapped" in events(p)
    assert p.status.recovery is not None
    assert p.status.recovery.recreated == {member(2): "uid-2"}
    # the next pass: p4 is member 2's pod; once it and the others report epoch 3, the barrier
    # opens without waiting for any new pod
    later = with_pod(pods(6, epoch=3), 2, phase="Failed")
    s = gang(status=p.status, pod_list=later, node_map=nm, now=NOW + 2)
    assert current_pods(s)[member(2)].name == "p4"
    assert set(current_spares(s)) == {member(2), member(5)}
    opened = plan(s)
    assert (opened.status.barrier_open, opened.status.phase) == (True, Phase.RUNNING)
    assert opened.status.slots == {member(2): member(4)}


def test_a_member_of_another_replicated_job_is_not_given_a_spare() -> None:
    """A spare is a pod of its own replicatedJob's template: a member of another one (a
    driver beside the workers) dead with its node gets its Job's new pod, as without spares,
    and no shortfall is said for it."""
    driver = "driver/0/0"
    s = gang(node_map=dead(nodes(6), "n2"), pod_list=with_pod(pods(6, epoch=2), 2, member=driver))
    members = (s.gang.members - {member(2)}) | {driver}
    p = plan(dataclasses.replace(s, gang=dataclasses.replace(s.gang, members=members)))
    assert p.status.phase == Phase.RECOVERING
    assert p.status.recovery is not None
    assert p.status.recovery.recreated == {driver: "uid-2"}
    assert p.status.slots == {}
    assert [r.pod for r in replaced(p)] == ["p2"]
    assert not {"SpareSwapped", "SpareShortfall"} & set(events(p))


def test_without_spares_ready_the_member_waits_for_its_jobs_new_pod() -> None:
    nm = dead(nodes(6), "n2")
    not_ready = with_pod(with_pod(pods(6, epoch=2), 4, phase="Pending"), 5, not_ready_since=NOW)
    p = plan(gang(node_map=nm, pod_list=not_ready))
    assert p.status.slots == {}
    assert "SpareShortfall" in events(p)
    assert "SpareSwapped" not in events(p)
    assert [r.pod for r in replaced(p)] == ["p2"]


def test_a_spare_on_the_dead_node_is_not_used() -> None:
    nm = dead(nodes(6), "n2")
    same_node = with_pod(pods(6, epoch=2), 4, node="n2")
    p = plan(gang(node_map=nm, pod_list=same_node))
    assert p.status.slots == {member(2): member(5)}


def test_a_live_pods_slot_moves_only_once_its_kubelet_stopped_it() -> None:
    """A member replaced while its node lives (here: repeated failures in place) is deleted
    with its grace: the spare takes the slot only once the old pod is gone or terminal."""
    policy = Policy(member_repeat_limit=1)
    exited = with_pod(pods(6, epoch=2), 1, exited_in_epoch=2)
    p = plan(gang(pod_list=exited, policy=policy))
    assert [r.pod for r in replaced(p)] == ["p1"]
    assert p.status.slots == {}, "p1 may still be training while its deletion runs"
    deleting = with_pod(pods(6, epoch=3), 1, deleting=True)
    again = plan(gang(status=p.status, pod_list=deleting, policy=policy, now=NOW + 1))
    assert again.status.slots == {}
    gone = [pod for pod in pods(6, epoch=3) if pod.name != "p1"]
    moved = plan(gang(status=again.status, pod_list=gone, policy=policy, now=NOW + 2))
    assert moved.status.slots == {member(1): member(4)}


@pytest.mark.parametrize(
    ("new_node", "spare_nodes", "slots"),
    [
        ("n2", ("n4", "n5"), {member(1): member(4)}),  # beside member 2: a spare takes the slot
        ("n6", ("n4", "n5"), {}),  # a node of its own: it keeps its Job's new pod
        ("n4", ("n4", "n5"), {}),  # beside a spare only: kept (the spare then moves)
        ("n2", ("n0", "n3"), {}),  # every spare beside a holder: no better place, kept
    ],
    ids=["beside-a-holder", "own-node", "beside-a-spare", "no-spare-elsewhere"],
)
def test_a_members_new_pod_beside_another_holder_gives_its_slot_to_a_spare_elsewhere(
    new_node: str, spare_nodes: tuple[str, str], slots: dict[str, str]
) -> None:
    """A member replaced while its node lives (a drain, a device fault, repeated failures) is
    fenced only once its kubelet stopped it, and its Job's new pod may be Ready by then, on a
    node the scheduler scored like a spare's: one beside another member's, whose death would
    take both. Once the old pod is fenced the slot goes to a ready spare on a node that holds
    no member instead, and the new pod is a spare; elsewhere the new pod keeps it."""
    policy = Policy(member_repeat_limit=1)
    p = plan(gang(pod_list=with_pod(pods(6, epoch=2), 1, exited_in_epoch=2), policy=policy))
    assert [r.pod for r in replaced(p)] == ["p1"]
    new = dataclasses.replace(
        pods(2, epoch=3)[1], name="p1b", uid="uid-1b", node=new_node, created=NOW + 4
    )
    now = [pod for pod in pods(6, epoch=3) if pod.name != "p1"]
    now = with_pod(with_pod(now, 3, node=spare_nodes[0]), 4, node=spare_nodes[1])
    nm = {**nodes(6), "n6": NodeView("n6", lease_renewed=NOW - 1)}
    q = plan(gang(status=p.status, pod_list=[*now, new], node_map=nm, policy=policy, now=NOW + 6))
    assert q.status.slots == slots
    assert "SpareShortfall" not in events(q), "a member on a pod of its own is not short"
    assert (q.status.phase, q.status.barrier_open) == (Phase.RUNNING, True)
    s = gang(status=q.status, pod_list=[*now, new], node_map=nm, policy=policy, now=NOW + 7)
    if slots:
        (swap,) = [
            a.message for a in q.actions if isinstance(a, Event) and a.reason == SPARE_SWAPPED
        ]
        assert "its pod p1b, which shares node n2 with another member, is a spare" in swap
        assert (current_pods(s)[member(1)].name, current_spares(s)[member(1)].name) == ("p4", "p1b")
    else:
        assert current_pods(s)[member(1)].name == "p1b"


@pytest.mark.parametrize("phase", ["Running", "Pending"])
@pytest.mark.parametrize("old_gone_after", [2.0, None], ids=["fenced-in-time", "never-fenced"])
def test_a_crowded_new_pod_is_held_out_of_the_barrier_until_its_old_pod_is_fenced(
    old_gone_after: float | None, phase: str
) -> None:
    """The Job's new pod is made as soon as the old one is deleting, and its agent (an init
    container) reports before the old pod is gone, Ready or still starting (``Pending``): it
    does not open the barrier beside another member while a spare elsewhere waits for the
    old pod's fence, but only for ``CROWDED_HOLD_S`` after it was made (a deletion that
    hangs does not hold the gang)."""
    policy = Policy(member_repeat_limit=1)
    p = plan(gang(pod_list=with_pod(pods(6, epoch=2), 1, exited_in_epoch=2), policy=policy))
    made = NOW + 1
    new = dataclasses.replace(
        pods(2, epoch=3)[1], name="p1b", uid="uid-1b", node="n2", created=made, phase=phase
    )
    others = [pod for pod in pods(6, epoch=3) if pod.name != "p1"]
    old = dataclasses.replace(pods(2, epoch=2)[1], deleting=True)

    def at(t: float, *, gone: bool) -> Plan:
        pod_list = [*others, new] if gone else [*others, new, old]
        return plan(gang(status=p.status, pod_list=pod_list, policy=policy, now=t))

    held = at(made + 1, gone=False)
    assert (held.status.barrier_open, held.status.slots) == (False, {})
    assert held.status.waiting == [member(1)]
    assert held.requeue_after == pytest.approx(NOW + CROWDED_HOLD_S - (made + 1)), "hold's end"
    if old_gone_after is not None:
        q = at(made + old_gone_after, gone=True)
        assert (q.status.barrier_open, q.status.slots) == (True, {member(1): member(4)})
    else:
        q = at(made + CROWDED_HOLD_S, gone=False)
        assert (q.status.barrier_open, q.status.slots) == (True, {}), "held no longer"


def crowded_after_repeats(**new_pod: Any) -> tuple[GangStatus, list[PodView], PodView]:
    """Member 1 replaced after repeated failures (recovery to epoch 3); its old pod is gone and
    its Job's new pod p1b runs beside member 2 on n2 (``new_pod``: other fields): the
    recovery's status, the other pods (spares p4 on n4, p5 on n5), and p1b."""
    p = plan(gang(pod_list=with_pod(pods(6, epoch=2), 1, exited_in_epoch=2), policy=REPEATS))
    new = dataclasses.replace(
        pods(2, epoch=3)[1], name="p1b", uid="uid-1b", node="n2", created=NOW + 1, **new_pod
    )
    return p.status, [pod for pod in pods(6, epoch=3) if pod.name != "p1"], new


REPEATS = Policy(member_repeat_limit=1)


def test_a_crowded_pod_still_starting_takes_any_ready_spare_spares_elsewhere_first() -> None:
    """A new pod beside another member that is not Ready yet is no pod of its own to keep: the
    member takes a ready spare as any member waiting for one does, one on a node that holds
    no member first, and one beside a member where there is no other (rather than wait)."""
    status, others, new = crowded_after_repeats(phase="Pending")
    beside_3 = with_pod(others, 3, node="n3")  # spare p4 beside member 3; p5 alone on n5
    q = plan(gang(status=status, pod_list=[*beside_3, new], policy=REPEATS, now=NOW + 3))
    assert q.status.slots == {member(1): member(5)}, "the spare on a node of its own first"
    only_beside = with_pod(with_pod(others, 3, node="n3"), 4, phase="Pending")
    q = plan(gang(status=status, pod_list=[*only_beside, new], policy=REPEATS, now=NOW + 3))
    assert q.status.slots == {member(1): member(4)}, "a warm spare, even beside a member"


def test_no_hold_where_every_ready_spare_shares_a_node_with_a_member() -> None:
    status, others, new = crowded_after_repeats()
    old = dataclasses.replace(pods(2, epoch=2)[1], deleting=True)
    beside = with_pod(with_pod(others, 3, node="n0"), 4, node="n3")
    q = plan(gang(status=status, pod_list=[*beside, new, old], policy=REPEATS, now=NOW + 2))
    assert (q.status.barrier_open, q.status.slots) == (True, {}), "nothing better to wait for"


def test_a_slot_on_a_spare_whose_new_pod_lands_beside_a_member_goes_to_another_spare() -> None:
    """Slot 1 was given to spare position 4 in an earlier recovery; position 4's pod is
    replaced (repeated failures) and its Job's new pod lands beside member 2: the slot goes to
    a spare on a node of its own once the old pod is gone, the lowest position first: here
    position 1's own pod p1, a spare since the earlier swap (the slot is its own again)."""
    policy = REPEATS
    slots = {member(1): member(4)}
    before = with_pod(pods(6, epoch=2), 4, exited_in_epoch=2)
    p = plan(gang(status=running(slots=slots), pod_list=before, policy=policy))
    assert p.status.recovery is not None
    assert p.status.recovery.recreated == {member(1): "uid-4"}
    new = dataclasses.replace(
        pods(5, epoch=3)[4], name="p4b", uid="uid-4b", node="n2", created=NOW + 1
    )
    now = [*(pod for pod in pods(6, epoch=3) if pod.name != "p4"), new]
    s = gang(status=p.status, pod_list=now, policy=policy, now=NOW + 3)
    assert current_pods(s)[member(1)].name == "p4b"
    q = plan(s)
    assert (q.status.slots, q.status.barrier_open) == ({}, True)
    later = gang(status=q.status, pod_list=now, policy=policy, now=NOW + 4)
    assert (current_pods(later)[member(1)].name, current_spares(later)[member(4)].name) == (
        "p1",
        "p4b",
    )


def test_a_held_member_is_not_a_laggard_at_the_barrier_deadline() -> None:
    """A member whose new pod is held (a spare may take its slot once its old pod is fenced)
    is not replaced again when the barrier's deadline passes meanwhile."""
    status, others, new = crowded_after_repeats()
    assert status.recovery is not None
    late = dataclasses.replace(status, recovery=dataclasses.replace(status.recovery, deadline=NOW))
    old = dataclasses.replace(pods(2, epoch=2)[1], deleting=True)
    q = plan(gang(status=late, pod_list=[*others, new, old], policy=REPEATS, now=NOW + 2))
    assert replaced(q) == []
    assert (q.status.barrier_open, q.status.waiting) == (False, [member(1)])


def test_with_the_report_channel_a_crowded_pod_is_held_until_the_old_agents_lease_ended() -> None:
    """The old pod's agent is not heard from the decision on (its lease is revoked): the
    member's crowded new pod is held until that lease surely ended, however long the pod's
    deletion takes, and then the slot goes to the spare."""
    status, others, new = crowded_after_repeats()
    old = dataclasses.replace(pods(2, epoch=2)[1], deleting=True)
    lease_end = names.LEASE_S + names.FENCE_MARGIN_S
    for quiet, slots in ((lease_end - 0.5, {}), (lease_end, {member(1): member(4)})):
        s = gang(status=status, pod_list=[*others, new, old], policy=REPEATS, now=NOW + 30)
        q = plan(dataclasses.replace(s, report_endpoint=ENDPOINT, silent={"uid-1": quiet}))
        assert (q.status.slots, q.status.barrier_open) == (slots, bool(slots)), quiet


def test_a_dead_node_is_not_fenced_when_force_delete_is_off() -> None:
    nm = dead(nodes(6), "n2")
    p = plan(gang(node_map=nm, policy=Policy(force_delete=ForceDelete.NEVER)))
    assert p.status.slots == {}


def test_two_members_dead_one_spare_ready_one_swap_one_replacement() -> None:
    nm = dead(dead(nodes(6), "n1"), "n2")
    one_ready = with_pod(pods(6, epoch=2), 5, phase="Pending")
    p = plan(gang(node_map=nm, pod_list=one_ready))
    assert p.status.slots == {member(1): member(4)}
    assert sorted(r.pod for r in replaced(p)) == ["p1", "p2"]
    assert "SpareShortfall" in events(p)


def test_a_swapped_in_spare_that_dies_gives_the_slot_to_the_next_spare() -> None:
    nm = dead(nodes(6), "n2")
    p = plan(gang(node_map=nm))
    assert p.status.slots == {member(2): member(4)}
    nm4 = dead(nm, "n4")  # the spare's node dies during the swap
    later = with_pod(pods(6, epoch=3), 2, phase="Failed")
    q = plan(gang(status=p.status, pod_list=later, node_map=nm4, now=NOW + 2))
    assert q.status.slots == {member(2): member(5)}
    assert [r.pod for r in replaced(q)] == ["p4"]


def test_the_old_positions_new_pod_is_a_spare() -> None:
    nm = dead(nodes(6), "n2")
    p = plan(gang(node_map=nm))
    new = PodView("p2b", "uid-2b", member(2), "n6", "Running", NOW + 5)
    later = [*with_pod(pods(6, epoch=3), 2, phase="Failed"), new]
    s = gang(status=p.status, pod_list=later, node_map={**nm, "n6": NodeView("n6")}, now=NOW + 6)
    assert current_pods(s)[member(2)].name == "p4"
    assert current_spares(s)[member(2)].name == "p2b"


def test_a_jobset_restart_gives_every_slot_back_to_its_own_position() -> None:
    restarted = running(slots={member(2): member(4)}, restart_attempt=0)
    s = gang(status=restarted)
    s = dataclasses.replace(s, gang=dataclasses.replace(s.gang, restart_attempt=1))
    s = dataclasses.replace(
        s, pods=tuple(dataclasses.replace(p, restart_attempt=1) for p in s.pods)
    )
    assert plan(s).status.slots == {}


def test_the_slots_round_trip_and_a_malformed_entry_is_dropped() -> None:
    st = running(slots={member(2): member(4)})
    assert status_from_dict(status_to_dict(st)).slots == {member(2): member(4)}
    raw = status_to_dict(st) | {"slots": {member(1): 5, member(2): member(4)}}
    assert status_from_dict(raw).slots == {member(2): member(4)}
    assert status_from_dict(status_to_dict(st) | {"slots": ["x"]}).slots == {}


# --- properties -------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    deaths=st.lists(st.integers(0, MEMBERS + SPARES - 1), min_size=1, max_size=6),
    force=st.booleans(),
)
def test_never_two_pods_hold_one_slot_and_no_slot_moves_from_an_unfenced_pod(
    deaths: list[int], force: bool
) -> None:
    """Nodes die one after another (a node's pods are then force-deleted or not); every pass:
    the slots stay a one-to-one map of slots to positions, and a slot is given to another
    position only when the pod that held it is fenced (gone, terminal, or force-deleted on its
    silent node)."""
    policy = Policy(
        force_delete=ForceDelete.UNREACHABLE if force else ForceDelete.NEVER, recreate_budget=50
    )
    nm = nodes(MEMBERS + SPARES)
    pod_list = pods(MEMBERS + SPARES, epoch=2)
    status = running()
    now = NOW
    for node in deaths:
        nm = dead(nm, f"n{node}")
        s = gang(status=status, pod_list=pod_list, node_map=nm, policy=policy, now=now)
        before = current_pods(s)
        p = plan(s)
        assert valid_slots(p.status.slots, SLOTS, POSITIONS)
        after = gang(status=p.status, pod_list=pod_list, node_map=nm, policy=policy, now=now)
        forced = {r.uid for r in replaced(p) if r.fail_first}
        for slot, pod in current_pods(after).items():
            old = before.get(slot)
            if old is not None and old.uid != pod.uid:
                assert fenced(old.phase, force_deleted=old.uid in forced)
        # the force-deleted pods are gone by the next pass
        pod_list = [pod for pod in pod_list if pod.uid not in forced]
        status, now = p.status, now + 30


# --- the webhook's declaration ----------------------------------------------------------------
SETTINGS = AgentSettings(image="example.test/agent:1")
TORCHRUN_CMD = ["torchrun", "--nnodes=4", "--nproc-per-node=8", "--max-restarts=0", "train.py"]


def user_jobset(annotations: dict[str, str] | None = None, **changes: Any) -> dict[str, Any]:
    """A JobSet as its owner writes it: 4 workers of one pod each running torchrun."""
    container: dict[str, Any] = {"name": "trainer", "image": "t", "command": list(TORCHRUN_CMD)}
    container.update(changes.pop("container", {}))
    job: dict[str, Any] = {
        "parallelism": 1,
        "completions": 1,
        "template": {"spec": {"containers": [container]}},
    }
    job.update(changes.pop("job", {}))
    out: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "annotations": {names.ENABLED: "true", names.HOT_SPARES: "2", **(annotations or {})},
        },
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 4, "template": {"spec": job}}]},
    }
    out["spec"].update(changes)
    return out


def agent_env(js: dict[str, Any]) -> dict[str, Any]:
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (agent,) = (c for c in pod["initContainers"] if c["name"] == AGENT_CONTAINER)
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in agent["env"]}


def test_the_webhook_adds_the_spares_to_the_replicas_once_and_tells_the_agents() -> None:
    out = transform(user_jobset(), SETTINGS)
    assert out["spec"]["replicatedJobs"][0]["replicas"] == 6
    env = agent_env(out)
    assert env[names.ENV_SLOTS] == "4"
    assert env[names.ENV_REPLICATED_JOB] == "w"
    assert env[names.ENV_PEER_DOMAIN] == "train"
    index = f"metadata.labels['{names.JOB_INDEX_LABEL}']"
    assert env[names.ENV_JOB_INDEX] == {"fieldRef": {"fieldPath": index}}
    assert transform(out, SETTINGS) == out, "idempotent: the replicas are raised once"
    assert mutate(out, SETTINGS) == []
    assert validate(out) == (True, "")
    g = gang_spec({**out, "metadata": {**out["metadata"], "uid": "u"}})
    assert g.members == {f"w/{i}/0" for i in range(4)}
    assert g.spares == {"w/4/0", "w/5/0"}
    other = transform(user_jobset(network={"subdomain": "peers"}), SETTINGS)
    assert agent_env(other)[names.ENV_PEER_DOMAIN] == "peers"


def test_without_spares_the_agent_is_told_nothing_of_slots() -> None:
    out = transform(user_jobset({names.HOT_SPARES: "0"}), SETTINGS)
    assert out["spec"]["replicatedJobs"][0]["replicas"] == 4
    assert names.ENV_SLOTS not in agent_env(out)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"job": {"parallelism": 2, "completions": 2}}, "parallelism must be 1"),
        (
            {"container": {"command": [*TORCHRUN_CMD[:1], "--node-rank=0", *TORCHRUN_CMD[1:]]}},
            "--node-rank",
        ),
        (
            {
                "container": {
                    "command": [*TORCHRUN_CMD[:1], "--master_addr", "h", *TORCHRUN_CMD[1:]]
                }
            },
            "--master-addr",
        ),
        (
            {
                "container": {
                    "command": [*TORCHRUN_CMD[:1], "--rdzv-backend=c10d", *TORCHRUN_CMD[1:]]
                }
            },
            "--rdzv-backend c10d",
        ),
        (
            {
                "container": {
                    "env": [
                        {
                            "name": "RANK",
                            "valueFrom": {
                                "fieldRef": {
                                    "fieldPath": f"metadata.labels['{names.JOB_INDEX_LABEL}']"
                                }
                            },
                        }
                    ]
                }
            },
            "env RANK",
        ),
        ({"network": {"enableDNSHostnames": False}}, "enableDNSHostnames"),
    ],
)
def test_a_gang_whose_pods_cannot_take_any_members_place_is_refused(
    changes: dict[str, Any], named: str
) -> None:
    allowed, message = validate(user_jobset(**changes))
    assert not allowed
    assert named in message
    assert names.HOT_SPARES in message


def test_spares_need_the_process_scope_and_at_most_one_spare_a_member() -> None:
    allowed, message = validate(user_jobset({names.RESTART_SCOPE: "pod"}))
    assert not allowed
    assert names.RESTART_SCOPE in message
    allowed, message = validate(user_jobset({names.HOT_SPARES: "5"}))
    assert not allowed
    assert f"annotation {names.HOT_SPARES}='5' is invalid" in message


def test_a_warm_standby_is_not_taken_with_spares_yet() -> None:
    warm = {names.PRESTART_IMPORTS: "torch", names.PRESTART_WARM: "true"}
    allowed, message = validate(user_jobset(warm))
    assert not allowed
    assert f"{names.PRESTART_WARM} is not supported with {names.HOT_SPARES}" in message


def test_the_spares_cannot_be_changed_once_the_jobset_exists() -> None:
    old = transform(user_jobset(), SETTINGS)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][names.HOT_SPARES] = "1"
    allowed, message = validate(new, old)
    assert not allowed
    assert f"annotation {names.HOT_SPARES} cannot be changed" in message
    del new["metadata"]["annotations"][names.HOT_SPARES]
    assert not validate(new, old)[0], "nor removed"
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][names.INPLACE_BUDGET] = "3"
    assert validate(new, old) == (True, "")


# --- the agent: which slot its pod holds, and the trainer's environment ----------------------
def position(job_index: int) -> Position:
    return Position("train", "w", 4, job_index, "train")


def view(epoch: int, *, open_: bool, slots: dict[str, str] | None = None) -> GangView:
    return GangView(epoch, open_, 100 if open_ else None, slots=slots or {})


def settle(logic: AgentLogic, v: GangView) -> Any:
    """The runner's loop over one view when every action succeeds: the last action."""
    for _ in range(4):
        action = logic.step(v)
        if isinstance(action, Report):
            logic.reported_epoch(action.epoch, action.barrier_closed)
        elif isinstance(action, Open):
            logic.opened_barrier(action.epoch, action.slot)
            return action
        else:
            return action
    raise AssertionError("no settled decision")


def test_a_pod_holds_its_own_slot_until_the_status_gives_it_away() -> None:
    assert position(2).slot({}) == 2
    assert position(4).slot({}) is None, "beyond the members: a spare"
    moved = {member_name("w", 2, 0): member_name("w", 4, 0)}
    assert position(2).slot(moved) is None
    assert position(4).slot(moved) == 2
    assert position(4).env(moved, 2) == {
        names.ENV_SLOT: "2",
        names.ENV_TORCHRUN_NODE_RANK: "2",
        names.ENV_TORCHRUN_MASTER_ADDR: "train-w-0-0.train",
        names.ENV_COORDINATOR: "train-w-0-0.train",
    }
    first = {member_name("w", 0, 0): member_name("w", 5, 0)}
    assert position(1).env(first, 1)[names.ENV_TORCHRUN_MASTER_ADDR] == "train-w-5-0.train"


def test_a_spare_reports_stands_by_and_trains_once_the_status_gives_it_a_slot() -> None:
    logic = AgentLogic(position(4))
    assert isinstance(settle(logic, view(2, open_=False)), Wait)
    assert settle(logic, view(2, open_=True)) == Standby(2), "no trainer for a spare"
    moved = {member_name("w", 1, 0): member_name("w", 4, 0)}
    assert isinstance(settle(logic, view(3, open_=False, slots=moved)), Wait)
    opened = settle(logic, view(3, open_=True, slots=moved))
    assert isinstance(opened, Open)
    assert (opened.epoch, opened.slot) == (3, 1)
    assert opened.env[names.ENV_TORCHRUN_NODE_RANK] == "1"


def test_a_holder_whose_slot_is_given_away_stops_its_trainer() -> None:
    """Its pod was fenced and the slot moved (a partition that healed): whatever the epoch,
    its trainer stops; it comes back as a spare."""
    logic = AgentLogic(position(1))
    settle(logic, view(2, open_=False))
    assert isinstance(settle(logic, view(2, open_=True)), Open)
    moved = {member_name("w", 1, 0): member_name("w", 4, 0)}
    assert logic.step(view(2, open_=True, slots=moved)) == Restart(2, 2)
    fresh = AgentLogic(position(1))
    assert settle(fresh, view(3, open_=True, slots=moved)) == Standby(3)


def test_without_spares_the_agent_opens_as_before() -> None:
    logic = AgentLogic()
    settle(logic, view(2, open_=False))
    assert settle(logic, view(2, open_=True)) == Open(2, 100)


def test_malformed_slots_are_named() -> None:
    status = {"epoch": 2, "slots": {"w/1/0": 4}}
    with pytest.raises(MalformedStatus, match=r"status\.slots"):
        parse_gangstate({"status": status})
    parsed = parse_gangstate({"status": {"epoch": 2, "slots": {"w/1/0": "w/4/0"}}})
    assert parsed is not None
    assert parsed.slots == {"w/1/0": "w/4/0"}


def test_the_agent_reads_its_position_from_the_environment(tmp_path: Path) -> None:
    env = {
        "POD_NAME": "train-w-4-0-abc",
        "POD_NAMESPACE": "ml",
        "JSI_GANGSTATE": "train",
        "JSI_LAUNCHED_CONTAINERS": "trainer",  # process scope, the default
        "JSI_API_SERVER": "http://127.0.0.1:1",
        "JSI_TOKEN_FILE": "",
        "JSI_STATE_DIR": str(tmp_path),
    }
    assert load_config(env).position is None
    spares = {
        **env,
        names.ENV_SLOTS: "4",
        names.ENV_REPLICATED_JOB: "w",
        names.ENV_JOB_INDEX: "5",
        names.ENV_PEER_DOMAIN: "train",
    }
    assert load_config(spares).position == Position("train", "w", 4, 5, "train")
    with pytest.raises(ConfigError, match=names.ENV_JOB_INDEX):
        load_config({**spares, names.ENV_JOB_INDEX: ""})


# --- what the metrics count -------------------------------------------------------------------
def test_swaps_and_shortfalls_are_observed_for_the_metrics() -> None:
    nm = dead(dead(nodes(6), "n1"), "n2")
    one_ready = with_pod(pods(6, epoch=2), 5, phase="Pending")
    s = gang(node_map=nm, pod_list=one_ready)
    p = plan(s)
    observed = observe(s, p)
    assert SparesSwapped(1) in observed
    assert SpareShortfall() in observed
    m = Metrics(CollectorRegistry())
    m.record(observed)
    body = m.exposition()[0].decode()
    assert "jobset_inplace_spare_swaps_total 1.0" in body
    assert "jobset_inplace_spare_shortfalls_total 1.0" in body
    quiet = gang()
    assert not [o for o in observe(quiet, plan(quiet)) if isinstance(o, SparesSwapped)]


# --- heartbeats and the lease (section 5) -----------------------------------------------------
ENDPOINT = ReportEndpoint("https://10.0.0.1:9444/v1/reports", "0" * 64, "leader-1")


def beating(silent: dict[int, float], **kw: Any) -> Snapshot:
    """The gang with a report channel served: pod i's agent last heard ``silent[i]`` s ago."""
    s = gang(**kw)
    return dataclasses.replace(
        s, report_endpoint=ENDPOINT, silent={f"uid-{i}": t for i, t in silent.items()}
    )


def test_a_silent_holder_is_suspected_and_its_slot_moves_only_once_its_lease_ended() -> None:
    fresh = plan(beating({1: 1.5}))
    assert fresh.status.epoch == 2, "under SILENT_AFTER_S: nothing"
    assert fresh.requeue_after == pytest.approx(names.SILENT_AFTER_S - 1.5), "looks again then"
    suspected = plan(beating({1: names.SILENT_AFTER_S}))
    assert suspected.status.epoch == 3
    assert suspected.status.recovery is not None
    assert suspected.status.recovery.causes == {member(1): Cause.AGENT_SILENT}
    assert [(r.pod, r.fail_first) for r in replaced(suspected)] == [("p1", False)]
    assert suspected.status.slots == {}, "its lease may still hold: its trainer may be training"
    lease_end = names.LEASE_S + names.FENCE_MARGIN_S
    assert suspected.requeue_after == pytest.approx(lease_end - names.SILENT_AFTER_S)
    later = beating({1: lease_end - 0.01}, status=suspected.status, now=NOW + 1.99)
    assert plan(later).status.slots == {}
    ended = plan(beating({1: lease_end}, status=suspected.status, now=NOW + 2))
    assert ended.status.slots == {member(1): member(4)}
    assert SPARE_SWAPPED in events(ended)


def test_the_pass_that_gives_a_slot_to_a_ready_spare_opens_the_barrier() -> None:
    """Once the silent holder is fenced, its slot is on the spare's pod: where the spare and
    every other member reported the epoch already (they did while the fence ran), the same
    pass opens the barrier; nothing else would wake the planner for it (the spare has nothing
    new to report), so a pass later cost up to a second."""
    suspected = plan(beating({1: names.SILENT_AFTER_S}))
    assert suspected.status.epoch == 3
    reported = with_pod(pods(6, epoch=3), 1, reported_epoch=2)  # the silent one did not
    lease_end = names.LEASE_S + names.FENCE_MARGIN_S
    s = beating({1: lease_end}, status=suspected.status, pod_list=reported, now=NOW + 2)
    ended = plan(s)
    assert ended.status.slots == {member(1): member(4)}
    assert (ended.status.barrier_open, ended.status.phase) == (True, Phase.RUNNING)
    early = beating({1: lease_end - 0.01}, status=suspected.status, pod_list=reported)
    assert not plan(early).status.barrier_open, "fenced first: the slot is still p1's"


def test_a_silent_spare_is_not_given_a_slot() -> None:
    p = plan(beating({1: 5.0, 4: 5.0}))
    assert p.status.slots == {member(1): member(5)}


def test_when_most_agents_fall_silent_at_once_nothing_is_given_away() -> None:
    """The channel or the leader is at fault then, not the pods: their leases stop their
    trainers, and no slot moves on a guess."""
    p = plan(beating({0: 9.0, 1: 9.0, 2: 9.0}))
    assert p.status.epoch == 2
    assert p.status.slots == {}
    assert "AgentsSilent" in events(p)
    one = plan(beating({0: 9.0}))
    assert one.status.slots == {member(0): member(4)}


def test_a_silent_agent_with_no_spare_ready_is_left_to_its_nodes_signals() -> None:
    """A slow agent looks dead for its first seconds: without a spare to take its slot, acting
    on it gains nothing and would cost a healthy member its pod and the recreate budget."""
    p = plan(beating({1: 5.0, 4: 5.0, 5: 5.0}))  # both spares silent: none ready
    assert p.status.epoch == 2
    assert not replaced(p)
    assert "SilentWithoutSpare" in events(p)
    assert p.requeue_after is not None
    assert p.requeue_after <= names.HEARTBEAT_S, "looks again soon: a spare may be ready"
    # its node's signals still recreate it, as without spares
    dead_node = plan(beating({1: 60.0, 4: 60.0, 5: 60.0}, node_map=dead(nodes(6), "n1")))
    assert dead_node.status.recovery is not None
    assert dead_node.status.recovery.causes == {member(1): Cause.NODE_UNHEALTHY}


def test_two_silent_one_spare_ready_only_the_longest_silent_is_acted_on() -> None:
    p = plan(beating({1: 3.0, 2: 5.0, 5: 5.0}))
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(2): Cause.AGENT_SILENT}
    assert [r.pod for r in replaced(p)] == ["p2"]
    assert p.status.slots == {member(2): member(4)}
    # the other waits: the one spare is taken
    again = plan(beating({1: 4.0, 2: 6.0, 5: 6.0}, status=p.status, now=NOW + 1))
    assert again.status.recovery is not None
    assert member(1) not in again.status.recovery.recreated


def test_silence_in_a_fresh_epoch_starts_nothing() -> None:
    """The gang starting (or restarted by JobSet): every agent starts at once and nothing
    trains yet that a swap would bring back sooner."""
    fresh = running(
        epoch=2,
        phase=Phase.RECOVERING,
        barrier_open=False,
        recovery=Recovery(2, NOW - 10, NOW + 290),
    )
    p = plan(beating({1: 5.0}, status=fresh))
    assert not replaced(p)
    (said,) = [a for a in p.actions if isinstance(a, Event) and a.reason == "SilentWithoutSpare"]
    assert "the gang is starting" in said.message
    assert p.status.slots == {}
    assert p.status.recovery is not None
    assert not p.status.recovery.recreated


def test_without_a_channel_silence_means_nothing() -> None:
    s = dataclasses.replace(gang(), silent={"uid-1": 60.0})
    assert plan(s).status.epoch == 2


class FakeChannel(ReportChannel):
    """Answers (or fails) a heartbeat without a network."""

    def __init__(self) -> None:
        super().__init__("ml", "train", "p", "u", Path("/nonexistent"))
        self.sent: list[dict[str, str]] = []
        self.fail = False
        self.holds: str | None = None

    def send(self, endpoint: Endpoint, message: Message) -> dict[str, object]:
        if self.fail:
            raise ChannelError("timed out")
        self.sent.append(message_values(message))  # as it goes on the wire
        return {"accepted": True, "holds": self.holds}


def test_an_answered_heartbeat_earns_a_lease_from_when_it_was_sent(tmp_path: Path) -> None:
    ch, clock = FakeChannel(), [100.0]
    endpoint: list[Endpoint | None] = [None]
    seen = [False]
    beat = Heartbeat(
        ch,
        lambda: (seen[0], endpoint[0]),
        lambda: None,
        tmp_path,
        Log(io.StringIO()),
        clock=lambda: clock[0],
    )
    beat.beat()
    assert not (tmp_path / launcher.LEASE_FILE).exists(), "no status read yet: no lease"
    seen[0] = True
    beat.beat()
    assert ch.sent == [], "no channel named: nothing to send to"
    assert launcher.lease_holds(tmp_path, 1e12), "and no bound on the trainers"
    endpoint[0] = Endpoint("https://10.0.0.1:9444/v1/reports", "0" * 64, "l")
    beat.beat()
    assert ch.sent == [{}], "a heartbeat is an empty report"
    assert launcher.lease_holds(tmp_path, 100.0 + names.LEASE_S - 0.001)
    assert not launcher.lease_holds(tmp_path, 100.0 + names.LEASE_S)
    ch.fail, clock[0] = True, 101.0
    beat.beat()  # not answered: the lease is not renewed
    assert not launcher.lease_holds(tmp_path, 100.0 + names.LEASE_S)
    ch.fail, clock[0] = False, 102.0
    beat.beat()
    assert launcher.lease_holds(tmp_path, 102.0 + names.LEASE_S - 0.001)


def test_a_trainer_whose_slot_the_leader_took_away_gets_no_new_lease(tmp_path: Path) -> None:
    """The answer says which slot the pod holds: a trainer running as another (or none) is
    not covered any more, whether the slot moved or the planner only decided to move it."""
    ch, clock = FakeChannel(), [100.0]
    running: list[str | None] = [member(1)]
    endpoint = Endpoint("https://10.0.0.1:9444/v1/reports", "0" * 64, "l")
    log = io.StringIO()
    beat = Heartbeat(
        ch,
        lambda: (True, endpoint),
        lambda: running[0],
        tmp_path,
        Log(log),
        clock=lambda: clock[0],
    )
    ch.holds = member(1)
    beat.beat()
    assert launcher.lease_holds(tmp_path, 100.0 + names.LEASE_S - 0.001)
    ch.holds, clock[0] = None, 101.0  # revoked
    beat.beat()
    assert not launcher.lease_holds(tmp_path, 100.0 + names.LEASE_S)
    assert f"holds no slot, not {member(1)}" in log.getvalue()
    ch.holds, running[0], clock[0] = member(2), None, 102.0  # stopped, then a spare's slot
    beat.beat()
    assert launcher.lease_holds(tmp_path, 102.0 + names.LEASE_S - 0.001)


def test_a_dead_nodes_holder_still_heard_keeps_its_slot_until_its_lease_ended() -> None:
    """Its node's kubelet is silent but its agent answered lately (the pod network is not the
    kubelet's): force deletion alone is no fence; the slot moves LEASE_S + FENCE_MARGIN_S after
    the last answer that renewed the lease."""
    nm = dead(nodes(6), "n2")
    p = plan(beating({2: 0.5}, node_map=nm))
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(2): Cause.NODE_UNHEALTHY}
    assert [(r.pod, r.fail_first) for r in replaced(p)] == [("p2", True)]
    assert p.status.slots == {}
    lease_end = names.LEASE_S + names.FENCE_MARGIN_S
    assert p.requeue_after is not None
    assert p.requeue_after <= lease_end - 0.5, "looks again by the time its lease ended"
    gone = [pod for pod in pods(6, epoch=3) if pod.name != "p2"]  # force-deleted meanwhile
    later = plan(beating({2: lease_end}, status=p.status, pod_list=gone, node_map=nm, now=NOW + 4))
    assert later.status.slots == {member(2): member(4)}


# --- what becomes of spares (item 4) ----------------------------------------------------------
def test_a_spare_that_dies_while_it_waits_starts_no_recovery() -> None:
    """A spare is no member: its death costs the gang nothing but a spare (its Job makes a new
    one); a later swap finds the other spare."""
    dead_spare = with_pod(pods(6, epoch=2), 4, phase="Failed", trainer_failed=True)
    p = plan(gang(pod_list=dead_spare))
    assert (p.status.epoch, p.status.phase) == (2, Phase.RUNNING)
    assert replaced(p) == []
    swap = plan(gang(pod_list=dead_spare, node_map=dead(nodes(6), "n1")))
    assert swap.status.slots == {member(1): member(5)}


def test_kueue_taking_the_gang_away_spares_included_stands_it_down_and_resets_the_slots() -> None:
    """Kueue preempts Workloads, not pods: the JobSet is suspended, every pod goes, spares too;
    the slots start over with the pods made anew."""
    s = gang(status=running(slots={member(1): member(4)}))
    down = plan(dataclasses.replace(s, gang=dataclasses.replace(s.gang, kueue_stand_down="x")))
    assert down.status.phase == Phase.STOOD_DOWN
    assert down.status.slots == {}


def test_spares_without_a_persistent_tier_are_admitted_with_a_warning() -> None:
    (warning,) = [w for w in warnings(user_jobset()) if names.HOT_SPARES in w]
    assert "persistent checkpoint tier" in warning
    shared = user_jobset({names.CHECKPOINT_DIRS: "persistent=/shared/ckpt"})
    assert not [w for w in warnings(shared) if names.HOT_SPARES in w]


def test_a_spare_on_a_node_being_drained_or_dead_is_replaced_at_once() -> None:
    """The disruption budget counts every pod of the gang, spares too: a drain waits for the
    planner, which replaces a spare there at once (its Job makes a new one elsewhere), as it
    force-deletes one on a dead node, never while the cluster looks disrupted."""
    nm = nodes(6)
    nm["n4"] = dataclasses.replace(nm["n4"], leaving="cordoned")
    p = plan(gang(node_map=nm))
    assert [(r.pod, r.cause, r.fail_first) for r in replaced(p)] == [
        ("p4", Cause.PLANNED_MOVE, False)
    ]
    assert (p.status.epoch, p.status.slots) == (2, {}), "the gang goes on training"
    assert "SpareMoved" in events(p)
    gone = plan(gang(node_map=dead(nodes(6), "n5")))
    assert [(r.pod, r.cause, r.fail_first) for r in replaced(gone)] == [
        ("p5", Cause.NODE_UNHEALTHY, True)
    ]
    assert gone.status.epoch == 2


def test_the_disruption_budget_counts_the_spares() -> None:
    js = transform(user_jobset(), SETTINGS)
    budget = desired_budget({**js, "metadata": {**js["metadata"], "uid": "u"}}, Policy())
    assert budget is not None
    assert budget["spec"]["minAvailable"] == 6


def test_a_dead_nodes_failure_is_dated_by_its_members_last_heartbeat() -> None:
    """The node's Lease went stale (renewed 26 s ago, its signal 16 s ago: the node died in the
    10 s between) but member 1's agent was heard until 19 s ago: the node died just after
    that, as a silent agent's failure is dated (goodput ends the epoch there, not in the middle
    of the renew interval: core/goodput.py)."""
    nm = gang().nodes | {"n1": NodeView("n1", ready="True", lease_renewed=NOW - 26)}
    nm["n1"] = dataclasses.replace(nm["n1"], lease_read_at=NOW)
    spares_busy = {4: 60.0, 5: 60.0}  # no spare ready: the node's signal, not the silence
    rec = plan(beating({1: 19.0} | spares_busy, node_map=nm)).status.recovery
    assert rec is not None
    assert rec.causes == {member(1): Cause.NODE_UNHEALTHY}
    assert (rec.first_signal_at, rec.signal_window) == (NOW - 19, 0.0)
    heard_before = plan(beating({1: 40.0} | spares_busy, node_map=nm)).status.recovery
    assert heard_before is not None
    assert (heard_before.first_signal_at, heard_before.signal_window) == (
        NOW - 16,
        LEASE_RENEW_INTERVAL_S,
    ), "heard before the renewal: the renewal's window"


# --- keeping spares off the holders' nodes ----------------------------------------------------
def beside_holder(**pod_changes: Any) -> list[PodView]:
    """Spare p4 placed on holder p1's node n1 (n4 is left free), both made an hour ago."""
    return with_pod(pods(MEMBERS + SPARES, epoch=2), 4, node="n1", **pod_changes)


def opened(node_map: dict[str, NodeView], name: str, at: float) -> dict[str, NodeView]:
    out = dict(node_map)
    out[name] = dataclasses.replace(out[name], opened_at=at)
    return out


def test_a_spare_beside_a_holder_moves_when_a_node_opened_after_it_was_placed() -> None:
    """A spare on a holder's node cannot take that holder's place: when a free node opened
    after the spare was placed (the scheduler could not choose it then), the spare is replaced
    (its Job makes it anew, and the scheduler scores the empty node first). Where every free
    node was open when the spare was placed, the scheduler chose the shared node knowing them,
    and would again: the spare stays."""
    placed = NOW - 3600
    knew = plan(gang(pod_list=beside_holder(), node_map=opened(nodes(6), "n4", placed - 60)))
    assert replaced(knew) == []
    assert "SpareMoved" not in events(knew)
    p = plan(gang(pod_list=beside_holder(), node_map=opened(nodes(6), "n4", placed + 60)))
    assert [(r.pod, r.cause, r.fail_first) for r in replaced(p)] == [
        ("p4", Cause.PLANNED_MOVE, False)
    ]
    (moved,) = [a for a in p.actions if isinstance(a, Event) and a.reason == "SpareMoved"]
    assert f"shares node n1 with {member(1)}'s pod p1" in moved.message
    assert (p.status.epoch, p.status.slots) == (2, {}), "the gang goes on training"


def test_spares_spread_with_the_report_channel_whose_agents_are_heard() -> None:
    """With the report channel every agent heard in the last minutes has an entry in the
    snapshot's ``silent`` (near 0 while it heartbeats): only one quiet for a heartbeat or more
    holds the spreading back."""
    placed = NOW - 3600
    s = gang(pod_list=beside_holder(), node_map=opened(nodes(6), "n4", placed + 60))
    heard = {f"uid-{i}": 0.3 for i in range(MEMBERS + SPARES)}
    p = plan(dataclasses.replace(s, report_endpoint=ENDPOINT, silent=heard))
    assert [r.pod for r in replaced(p)] == ["p4"]
    quiet = dataclasses.replace(s, report_endpoint=ENDPOINT, silent={**heard, "uid-2": 1.5})
    assert replaced(plan(quiet)) == []


def test_a_spare_given_a_slot_in_a_pass_is_not_spread_in_that_pass() -> None:
    """The pass that gives a slot to a spare and opens the barrier reads the spares of the
    slots before it: the spare just swapped in is a holder, not a spare beside itself."""
    suspected = plan(beating({1: names.SILENT_AFTER_S}))
    reported = with_pod(pods(6, epoch=3), 1, reported_epoch=2)
    lease_end = names.LEASE_S + names.FENCE_MARGIN_S
    nm = {**opened(nodes(6), "n1", NOW), "n6": NodeView("n6", lease_renewed=NOW, opened_at=NOW)}
    s = beating({1: lease_end}, status=suspected.status, pod_list=reported, now=NOW + 2)
    ended = plan(dataclasses.replace(s, nodes=nm, cluster_nodes=nm))
    assert ended.status.slots == {member(1): member(4)}
    assert ended.status.barrier_open
    assert "p4" not in [r.pod for r in replaced(ended)], "p4 holds slot 1 now: not moved"


def test_a_spare_moves_when_a_holder_came_to_its_node_after_it() -> None:
    """A drain or a recreation brings a holder beside the spare: the spare moves to the free
    node, whenever that node opened; the spare's replacement (younger than the holder) that
    lands beside it again is not moved again, so one change makes at most one move."""
    came = with_pod(beside_holder(), 1, created=NOW - 60)
    p = plan(gang(pod_list=came))
    assert [r.pod for r in replaced(p)] == ["p4"]
    again = with_pod(came, 4, name="p4b", uid="uid-4b", created=NOW - 5)
    assert replaced(plan(gang(pod_list=again))) == []


@pytest.mark.parametrize(
    "why",
    [
        "none free",
        "cordoned",
        "not ready",
        "taint",
        "other pool",
        "recovering",
        "planned stop",
        "holder leaving",
        "disrupted",
    ],
)
def test_a_spare_beside_a_holder_stays_where_no_node_is_free_or_the_gang_is_busy(
    why: str,
) -> None:
    """No node like the gang's is free (each way a node can fail to be one), or the gang is
    not training with its barrier open: the spare stays where it is."""
    pool = (("pool", "a"),)
    nm = {
        name: dataclasses.replace(node, labels=(("kubernetes.io/hostname", name), *pool))
        for name, node in nodes(6).items()
    }
    free = nm["n4"]
    changes: dict[str, dict[str, Any]] = {
        "none free": {},  # (below: a member's pod on it)
        "cordoned": {"leaving": "cordoned"},
        "not ready": {"ready": "False", "ready_since": NOW - 5},
        "taint": {"taints": (("example.com/reserved", NOW - 99),)},
        "other pool": {"labels": (("pool", "b"),)},
    }
    nm["n4"] = dataclasses.replace(free, **changes.get(why, {}))
    came = with_pod(beside_holder(), 1, created=NOW - 60)
    status = running()
    if why == "none free":
        came = [*came, dataclasses.replace(came[0], name="x", uid="x", member="w/9/0", node="n4")]
    if why == "recovering":
        status = running(barrier_open=False)
    if why == "planned stop":
        stop = PlannedStop(2, (member(3),), "node n3 cordoned", NOW - 1, NOW + 600)
        status = running(planned_stop=stop)
    if why == "holder leaving":  # (its planned stop starts in this pass)
        nm["n3"] = dataclasses.replace(nm["n3"], leaving="cordoned")
    if why == "disrupted":  # most of the cluster silent: no one moves
        for name in ("n0", "n2", "n3", "n5"):
            nm = dead(nm, name)
    p = plan(gang(pod_list=came, node_map=nm, status=status))
    assert [r.pod for r in replaced(p) if r.cause == Cause.PLANNED_MOVE] == []
    assert "SpareMoved" not in events(p)
    control = dict(nm, n4=free)
    if why in ("cordoned", "not ready", "taint", "other pool"):
        assert [r.pod for r in replaced(plan(gang(pod_list=came, node_map=control)))] == ["p4"]


def test_spares_beside_holders_move_at_most_one_per_free_node() -> None:
    both = with_pod(with_pod(beside_holder(), 5, node="n2"), 1, created=NOW - 60)
    both = with_pod(both, 2, created=NOW - 60)  # n4 and n5 free; n4 opened after the spares
    p = plan(gang(pod_list=both))
    assert sorted(r.pod for r in replaced(p)) == ["p4", "p5"]
    nm = {name: node for name, node in nodes(6).items() if name != "n5"}
    one = plan(gang(pod_list=both, node_map=nm))
    assert [r.pod for r in replaced(one)] == ["p4"]


def test_a_spare_beside_a_holder_waits_while_a_holder_may_yet_need_it() -> None:
    """A holder's node with an unhealthy signal not yet old enough to act on (Ready Unknown
    for 3 s), or a holder's agent gone quiet: the spare may be about to take that holder's
    slot, so it stays where it is."""
    came = with_pod(beside_holder(), 1, created=NOW - 60)
    nm = nodes(6)
    nm["n2"] = NodeView("n2", ready="Unknown", ready_since=NOW - 3, lease_renewed=NOW - 1)
    assert replaced(plan(gang(pod_list=came, node_map=nm))) == []
    quiet = dataclasses.replace(gang(pod_list=came), silent={"uid-2": 1.0})
    assert replaced(plan(quiet)) == []
    assert [r.pod for r in replaced(plan(gang(pod_list=came)))] == ["p4"], "positive control"


def test_a_new_spare_waits_30_s_and_an_opening_must_be_clearly_after_it() -> None:
    """At most one move of a spare position every 30 s (a flapping node cannot delete it
    again and again): a spare made 20 s ago is looked at again when 30 s old. A node
    that opened within the creation time's resolution (whole seconds) is not after it."""
    young = beside_holder(created=NOW - 20)
    p = plan(gang(pod_list=young, node_map=opened(nodes(6), "n4", NOW - 10)))
    assert replaced(p) == []
    assert p.requeue_after is not None
    assert p.requeue_after <= 10.0
    spare, holder = young[4], young[1]
    _, wake = spares_to_spread({member(4): spare}, {member(1): holder}, {"n4": NOW - 10}, NOW)
    assert wake == NOW + 10
    tie = beside_holder(created=NOW - 100)
    assert replaced(plan(gang(pod_list=tie, node_map=opened(nodes(6), "n4", NOW - 99)))) == []
    later = plan(gang(pod_list=tie, node_map=opened(nodes(6), "n4", NOW - 90)))
    assert [r.pod for r in replaced(later)] == ["p4"]


def test_a_spare_on_a_leaving_node_beside_a_holder_is_replaced_once() -> None:
    """Planned moves off: the holder stays on its cordoned node, and the spare there is
    replaced for the node's leaving, once, not again as a spare beside a holder."""
    came = with_pod(beside_holder(), 1, created=NOW - 60)
    nm = nodes(6)
    nm["n1"] = dataclasses.replace(nm["n1"], leaving="cordoned")
    p = plan(gang(pod_list=came, node_map=nm, policy=Policy(planned_moves=False)))
    assert [r.pod for r in replaced(p)] == ["p4"]
    assert events(p).count("SpareMoved") == 1


def test_kubernetes_own_and_this_controllers_taints_never_make_a_node_like_the_gangs() -> None:
    """A taint of trouble on a node the gang runs on (memory pressure) does not make a node
    with that taint look like the gang's kind of node."""
    came = with_pod(beside_holder(), 1, created=NOW - 60)
    pressure = (("node.kubernetes.io/memory-pressure", NOW - 5),)
    nm = {n: dataclasses.replace(v, taints=pressure) for n, v in nodes(6).items() if n != "n4"}
    nm["n4"] = dataclasses.replace(nodes(6)["n4"], taints=pressure)
    assert replaced(plan(gang(pod_list=came, node_map=nm))) == []
