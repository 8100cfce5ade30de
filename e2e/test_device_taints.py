"""DRA device taints end to end on the real kubelet nodes: a test DRA driver (testbed/draplugin)
gives every member one device through a ResourceClaimTemplate.

``NoExecute``: a DeviceTaintRule taints one member's device, as an administrator or a device
health monitor does; kube-controller-manager's device-taint eviction controller evicts that pod
(``DisruptionTarget``, ``DeletionByDeviceTaintManager``); the controller replaces that member
(cause ``DeviceTainted``: its new pod's new claim gets an untainted device, the node is not
tainted) and restarts the others in place, every member resuming from one step. DeviceTaintRule
-> barrier open is printed (docs/guarantees.md quotes it).

``NoSchedule`` (the device is being taken out of service; nothing evicts its pod): a planned
move, as for a drained node: the gang stops at one step, the member gets a new pod (and claim:
another device), the others restart in place, 0 steps lost."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobset_inplace import names
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, member_pods, recovery_times
from testbed.demo import one_replaced_others_in_place, training_gang
from testbed.dra import TestDRADriver, allocated_devices, claim_template, taint_device, untaint
from testbed.install import Installation
from testbed.kube import Clients, delete_jobsets, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 2
RULE = "jsi-e2e-device-taint"


@pytest.fixture
def dra(
    local_cluster: LocalCluster | None,
    kube: Clients,
    cluster_kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> Iterator[TestDRADriver]:
    """The test DRA driver, stopped only once the test's pods are gone (``namespace`` is set up
    first, so torn down after: its pods would outlive the driver, and a kubelet cannot release
    their devices without it: they stayed Terminating for good and held a later drain)."""
    if local_cluster is None:
        pytest.skip("runs a DRA driver beside the local cluster's real kubelets")
    # A run aborted before its teardown leaves its rule, which would taint (and evict) this
    # run's devices at once, and the test could not create it again.
    untaint(kube, RULE)
    with TestDRADriver(
        kube, cluster_kubeconfig, local_cluster.real_nodes(), tmp_path / "dra"
    ) as driver:
        try:
            yield driver
        finally:
            untaint(kube, RULE)
            delete_jobsets(kube, namespace)
            wait_for(
                "the test's pods gone while the DRA driver serves",
                lambda: not kube.core.list_namespaced_pod(namespace).items,
                120,
            )


def test_a_tainted_dra_device_replaces_its_member(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    dra: TestDRADriver,
    tmp_path: Path,
) -> None:
    template = claim_template(kube, namespace)
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        MEMBERS,
        # asked for, and not what a device taint does: the scheduler avoids the device itself
        annotations={names.TAINT_ON_DEVICE_FAULT: "true"},
        claims={"device": template},
        persistent=tmp_path / "shared",  # the replacement's steps, wherever it lands
    )
    before = member_pods(kube, namespace, "gang")
    victim = before["1"]
    node = victim.spec.node_name
    held = allocated_devices(kube, namespace, victim)
    assert len(held) == 1, held
    pool, device = held[0]
    assert pool == node, "the driver's pool is its node"

    taint_device(kube, RULE, pool, device, "NoExecute")
    tainted_at = time.time()
    st = barrier_open(kube, namespace, "gang", 2, 180)
    rec = st["recovery"]
    assert rec["causes"] == {"workers/1/0": "DeviceTainted"}
    assert set(rec["recreated"]) == {"workers/1/0"}
    assert rec["inPlace"] == MEMBERS - 1
    node_taints = {t.key for t in kube.core.read_node(node).spec.taints or []}
    assert names.DEVICE_UNHEALTHY_TAINT not in node_taints, "a device taint is not a node's"
    resume = st["resumeStep"]
    assert isinstance(resume, int)
    assert resume > 0
    after = one_replaced_others_in_place(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        before=before,
        replaced="1",
        epoch=2,
        resume=resume,
    )
    now_held = allocated_devices(kube, namespace, after["1"])
    assert len(now_held) == 1, now_held
    assert now_held[0] != (pool, device), "its new claim holds another device"
    started, opened = recovery_times(rec)
    print(
        f"\nDeviceTaintRule NoExecute on {pool}/{device} -> recovery started "
        f"{started - tainted_at:.2f}s, -> barrier open {opened - tainted_at:.2f}s (member now "
        f"on {now_held[0][0]}/{now_held[0][1]})"
    )


def test_a_device_tainted_noschedule_moves_its_member_with_no_step_lost(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    dra: TestDRADriver,
    tmp_path: Path,
) -> None:
    template = claim_template(kube, namespace)
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        MEMBERS,
        claims={"device": template},
        persistent=tmp_path / "shared",  # where the moved member finds the step
    )
    before = member_pods(kube, namespace, "gang")
    victim = before["1"]
    held = allocated_devices(kube, namespace, victim)
    assert len(held) == 1, held
    pool, device = held[0]

    taint_device(kube, RULE, pool, device, "NoSchedule")
    tainted_at = time.time()
    st = wait_for(
        "the planned move's recovery",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 else None,
        120,
    )
    assert st["recovery"]["causes"] == {"workers/1/0": "PlannedMove"}, st
    assert st["budgets"] == {"inPlaceUsed": 0, "recreateUsed": 0}, "no budget charged"
    events = kube.core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=gang,reason=PlannedStop"
    ).items
    (stop,) = [e.message for e in events]
    m = re.search(r"every trainer stops at step (\d+)", stop)
    assert m, stop
    planned = int(m.group(1))
    st = barrier_open(kube, namespace, "gang", 2, 180)
    assert st["resumeStep"] == planned, "every member resumes from the step it stopped at"
    assert st["recovery"]["progressStepsLost"] == 0, "no step lost"
    after = one_replaced_others_in_place(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        before=before,
        replaced="1",
        epoch=2,
        resume=planned,
    )
    now_held = allocated_devices(kube, namespace, after["1"])
    assert len(now_held) == 1, now_held
    assert now_held[0] != (pool, device), "its new claim holds another device"
    _, opened = recovery_times(st["recovery"])
    print(
        f"\nDeviceTaintRule NoSchedule on {pool}/{device}: the gang stopped at step {planned}, "
        f"member moved to {now_held[0][0]}/{now_held[0][1]}, barrier open "
        f"{opened - tainted_at:.2f}s after the taint, 0 steps lost"
    )
