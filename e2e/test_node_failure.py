"""A node dies under a gang of kwok members: its pod is replaced on another node, the other
members stay in place, the barrier opens once everyone is back.

Real: the controller, JobSet and the Job controller, the scheduler, the node lifecycle
controller, the kwok controller. Simulated: the kwok nodes themselves (no containers run on
them) and therefore the agents of the kwok pods (testbed/simagents.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.core.transform import AgentSettings, transform
from testbed import workloads
from testbed.cluster import LocalCluster
from testbed.controller import gang_state, member_pods, prepare
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.kwoknodes import set_heartbeat
from testbed.simagents import SimulatedAgents

pytestmark = [pytest.mark.e2e, pytest.mark.kube_release]
NAME = "kwokgang"
MEMBERS = 3


@pytest.fixture
def agents(kube: Clients, namespace: str) -> Iterator[SimulatedAgents]:
    sim = SimulatedAgents(kube, namespace, NAME)
    sim.start()
    yield sim
    sim.stop()


def _jobset() -> dict[str, Any]:
    js = workloads.jobset(
        NAME,
        [("workers", MEMBERS, 1)],
        annotations={names.ENABLED: "true", names.NODE_UNHEALTHY_AFTER: "5s"},
        node_selector={"type": "kwok"},
        pod={
            # one member per node: a dead node takes one member
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {names.JOBSET_NAME_LABEL: NAME}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            }
        },
    )
    return transform(js, AgentSettings(image="agent:sim"))


def _pods(kube: Clients, namespace: str) -> dict[str, Any]:
    return member_pods(kube, namespace, NAME, include_failed=False)


def _state(kube: Clients, namespace: str) -> dict[str, Any]:
    return gang_state(kube, namespace, NAME)


def _taints(kube: Clients, node: str) -> set[str]:
    return {t.key for t in kube.core.read_node(node).spec.taints or []}


def _gone_or_failed(kube: Clients, namespace: str, pod: Any) -> bool:
    """Whether ``pod`` (that very pod, by UID) is deleted, being deleted or Failed."""
    try:
        now = kube.core.read_namespaced_pod(pod.metadata.name, namespace)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    if now.metadata.uid != pod.metadata.uid:
        return True
    return bool(now.metadata.deletion_timestamp) or now.status.phase == "Failed"


@pytest.mark.usefixtures("healthy_kwok_nodes")  # the dead node back and untainted, pass or fail
def test_dead_kwok_node_pod_replaced_elsewhere_others_in_place(
    kwok_cluster: LocalCluster,
    controller: Installation,
    kube: Clients,
    namespace: str,
    agents: SimulatedAgents,
) -> None:
    prepare(kube, kwok_cluster.kubeconfig, namespace)
    create_jobset(kube, namespace, _jobset())
    wait_for("barrier of epoch 1", lambda: _state(kube, namespace).get("barrierOpen"), 120, 0.5)
    before = _pods(kube, namespace)
    victim = before["0"]
    dead = victim.spec.node_name

    t0 = time.monotonic()
    set_heartbeat(kube, dead, alive=False)
    try:
        st = wait_for(
            "recovery into epoch 2",
            lambda: s if (s := _state(kube, namespace)).get("epoch") == 2 else None,
            90,
            0.2,
        )
        detected = time.monotonic() - t0
        assert st["recovery"]["causes"] == {"workers/0/0": "NodeUnhealthy"}
        assert st["recovery"]["recreated"] == {"workers/0/0": victim.metadata.uid}
        # The controller writes the status before it acts (taint, then pod replacement): the
        # epoch is an intermediate write; wait for the actions themselves.
        wait_for(
            f"{names.UNHEALTHY_TAINT} taint on dead node {dead}",
            lambda: names.UNHEALTHY_TAINT in _taints(kube, dead),
            30,
            0.2,
        )
        wait_for(
            f"pod {victim.metadata.name} on the dead node replaced (failed or deleted)",
            lambda: _gone_or_failed(kube, namespace, victim),
            30,
            0.2,
        )

        st = wait_for(
            "barrier of epoch 2",
            lambda: (
                s if (s := _state(kube, namespace)).get("barrierOpen") and s["epoch"] == 2 else None
            ),
            120,
            0.2,
        )
        total = time.monotonic() - t0
        after = _pods(kube, namespace)
        assert after["0"].metadata.uid != victim.metadata.uid
        assert after["0"].spec.node_name != dead
        for i in ("1", "2"):
            assert after[i].metadata.uid == before[i].metadata.uid, f"member {i} kept its pod"
        assert st["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 1}
        print(
            f"\nkwok node {dead} silenced: detected (epoch 2) after {detected:.1f}s, "
            f"gang back (barrier open) after {total:.1f}s"
        )
    finally:
        set_heartbeat(kube, dead, alive=True)
    wait_for(
        f"{names.UNHEALTHY_TAINT} taint removed from revived node {dead}",
        lambda: names.UNHEALTHY_TAINT not in _taints(kube, dead),
        60,
        1,
    )
