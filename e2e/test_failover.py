"""HA on the in-cluster install: two controller replicas (the Deployment) with leader election.
The leader's pod is deleted in the middle of a recovery (as a drain, an upgrade or an operator
does); a new leader takes the Lease and completes that recovery exactly once: one new
epoch, one barrier opening, one charge of the in-place budget, every member in place. (A
leader that dies without releasing its Lease is replaced once the Lease expires:
tests/integration/test_leader.py.)

The new leader is the standby replica or the Deployment's replacement pod, whichever tries
first after the release (both are candidates; the replacement can start and win within the
standby's retry period): either is a correct takeover. A leader that dies with a node (and
its members) is followed by the standby, which watched the node Leases while it waited and
dates that node's silence from its last renewal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from e2e.marks import KUBE_RELEASE
from jobset_inplace import names
from jobset_inplace.core.detection import LEASE_RENEW_INTERVAL_S
from jobset_inplace.runtime.leader_election import DEFAULT_LEASE
from jobset_inplace.times import parse_time
from testbed.cluster import LocalCluster
from testbed.controller import gang_state, member_pods
from testbed.demo import barrier_opened, inject_failure, trainers_running, training_gang
from testbed.install import Installation
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 2


def _lease(kube: Clients) -> Any:
    return kube.coordination.read_namespaced_lease(DEFAULT_LEASE, names.INSTALL_NAMESPACE).spec


def _barrier_openings(kube: Clients, namespace: str, name: str) -> list[str]:
    events = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return [e.message for e in events if e.reason == "BarrierOpened"]


@KUBE_RELEASE
def test_leader_pod_deleted_mid_recovery_a_new_leader_completes_it_exactly_once(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    # The pod restart scope: its recovery takes seconds (the kubelet restarts every container),
    # a window the leader is deleted in; the process scope's is over in ~0.2 s.
    training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, scope="pod")
    before = {i: p.metadata.uid for i, p in member_pods(kube, namespace, "gang").items()}
    leader, others = controller.wait_settled(2)
    replicas = {leader, *others}
    with controller.following(leader) as leader_log:
        try:
            _fail_over(cluster_kubeconfig, controller, kube, namespace, leader, replicas, before)
        except AssertionError:
            print(f"--- log of the deleted leader {leader}:\n{leader_log()}")
            raise
        finally:
            controller.scale(2)  # the Deployment's replacement pod: two replicas for what follows


def _fail_over(  # noqa: PLR0917 (the test's fixtures and findings)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    leader: str,
    replicas: set[str],
    before: dict[str, str],
) -> None:
    victim = member_pods(kube, namespace, "gang")["1"]
    inject_failure(cluster_kubeconfig, namespace, victim.metadata.name)
    st = wait_for(
        "the leader opens epoch 2",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 else None,
        60,
        0.05,
    )
    old_channel = (st.get("reportEndpoint") or {}).get("leader")
    assert old_channel, f"the leader names its report channel: {st}"
    controller.kubectl.run("delete", "pod", leader, "-n", names.INSTALL_NAMESPACE, "--wait=false")
    deleted = time.monotonic()
    assert not st["barrierOpen"], "the recovery must still be running when the leader goes"

    successor = wait_for(
        "a new leader takes the Lease",
        lambda: holder if (holder := controller.leader()) not in {"", leader} else None,
        60,
        0.1,
    )
    took_over = time.monotonic() - deleted
    acquired = _lease(kube).acquire_time.timestamp()
    st = wait_for(
        "barrier of epoch 2, opened by the new leader",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("barrierOpen") else None,
        120,
    )
    opened = time.monotonic() - deleted
    # the new leader named its own channel; agents that had reported to the old one sent their
    # reports again there, those that reported in between wrote them on their pods
    assert (st.get("reportEndpoint") or {}).get("leader") not in (None, old_channel), st
    on_pods = sum(
        1
        for p in member_pods(kube, namespace, "gang").values()
        if (p.metadata.annotations or {}).get(names.REPORT_EPOCH) == "2"
    )
    print(
        f"\nleader pod deleted mid-recovery: {successor}"
        f" ({'the standby' if successor in replicas else 'the replacement pod'})"
        f" leads after {took_over:.1f}s,"
        f" barrier of epoch 2 open {opened:.1f}s after the delete;"
        f" {on_pods} of {MEMBERS} members reported epoch 2 on their pods (channel down meanwhile)"
    )
    opened_at = parse_time(st["recovery"]["openedAt"])
    assert opened_at is not None
    # same clock (one machine): the new leader opened it, not the old one on its way out
    assert opened_at >= acquired, (opened_at, acquired)
    assert st["epoch"] == 2, "one new epoch, not two"
    assert st["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}, "charged once"
    assert st["recovery"]["causes"] == {"workers/1/0": "TrainerExited"}
    assert [h["epoch"] for h in st["history"]] == [2], "one recovery record"
    wait_for(
        "BarrierOpened events of epochs 1 and 2",
        lambda: len(_barrier_openings(kube, namespace, "gang")) >= 2,
        30,
    )
    wait_for(
        "every trainer running again",
        lambda: trainers_running(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, epoch=2),
        120,
    )
    # Once training runs again, still that one recovery: no epoch 3, no second opening.
    final = gang_state(kube, namespace, "gang")
    assert (final["epoch"], final["budgets"]["inPlaceUsed"]) == (2, 1), final
    openings = _barrier_openings(kube, namespace, "gang")
    assert len(openings) == 2, openings
    after = {i: p.metadata.uid for i, p in member_pods(kube, namespace, "gang").items()}
    assert after == before, "every member kept its pod (in place)"


def test_a_leader_that_dies_with_a_node_is_followed_by_one_that_watched_the_leases(
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    local_cluster: LocalCluster | None,
) -> None:
    """The leader's pod and both members on one real node, which loses power. The standby,
    which watched the node Leases while it waited (controller/lease_observer.py), takes the
    Lease and dates the node's silence from its Lease's last renewal, not from its own
    takeover: the recovery's first signal is that renewal plus the renew interval. (One that
    began watching at its takeover could only count from then: 25-28 s after the gang stopped
    in the lockstep soak, where this was found.)"""
    if local_cluster is None:
        pytest.skip("powers a real node off: the local cluster's real kubelet nodes")
    leader, others = controller.wait_settled(2)
    home = _node_of(controller, leader)
    rest = [n for n in local_cluster.real_nodes() if n != home]
    assert rest, "a second real node for the standby and the recreated members"
    with _cordoned(kube, [home]):  # the standby elsewhere: a new one, if it shared the node
        for standby in others:
            if _node_of(controller, standby) == home:
                controller.kubectl.run("delete", "pod", standby, "-n", names.INSTALL_NAMESPACE)
        leader, others = controller.wait_settled(2)
    assert _node_of(controller, leader) == home, "the leader kept the Lease"
    with _cordoned(kube, rest):  # both members with the leader
        training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS)
    pods = member_pods(kube, namespace, "gang")
    assert {p.spec.node_name for p in pods.values()} == {home}
    local_cluster.power_off(home)
    try:
        successor = wait_for(
            "the standby takes the Lease",
            lambda: holder if (holder := controller.leader()) not in {"", leader} else None,
            90,
            0.2,
        )
        st = barrier_opened(kube, namespace, "gang", 2, 180)
        # the kubelet's last renewal before the power-off (it renews again once powered on)
        lease = kube.coordination.read_namespaced_lease(home, names.NODE_LEASE_NAMESPACE)
    finally:
        local_cluster.power_on(home)
    last = lease.spec.renew_time.timestamp()
    first = parse_time(st["recovery"]["firstSignalAt"])
    assert first is not None
    print(
        f"\nleader {leader} died with {home}; {successor} leads;"
        f" first signal {st['recovery']['firstSignal']} at the last Lease renewal"
        f" + {first - last:.2f} s"
    )
    assert successor in others, (successor, others)
    assert st["recovery"]["firstSignal"] == "NodeUnhealthy", st["recovery"]
    assert st["recovery"]["signalWindowSeconds"] == LEASE_RENEW_INTERVAL_S, st["recovery"]
    assert abs(first - (last + LEASE_RENEW_INTERVAL_S)) < 0.5, (first, last, st["recovery"])
    controller.wait_settled(2)  # the old leader's pod runs again, as a candidate


def _node_of(controller: Installation, pod: str) -> str:
    return next(
        str(p["spec"]["nodeName"]) for p in controller.pods() if p["metadata"]["name"] == pod
    )


@contextmanager
def _cordoned(kube: Clients, nodes: list[str]) -> Iterator[None]:
    for node in nodes:
        kube.core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        for node in nodes:
            kube.core.patch_node(node, {"spec": {"unschedulable": False}})
