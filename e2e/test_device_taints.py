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
from typing import Any

import pytest

from jobset_inplace import names
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, member_pods, recovery_times
from testbed.demo import one_replaced_others_in_place, training_gang
from testbed.dra import TestDRADriver, allocated_devices, claim_template, taint_device, untaint
from testbed.install import Installation
from testbed.kube import Clients, delete_jobsets, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kube_release]

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


def _gang_with_devices(
    kube: Clients, kubeconfig: Path, namespace: str, tmp_path: Path, **annotations: str
) -> tuple[dict[str, Any], str, str]:
    """A demo gang whose members each hold one device of the test driver (their own claim,
    from a template): its pods by index, and the pool (its node) and device member 1 holds."""
    training_gang(
        kube,
        kubeconfig,
        namespace,
        "gang",
        MEMBERS,
        annotations=annotations or None,
        claims={"device": claim_template(kube, namespace)},
        persistent=tmp_path / "shared",  # where a replaced member finds the step
    )
    before = member_pods(kube, namespace, "gang")
    held = allocated_devices(kube, namespace, before["1"])
    assert len(held) == 1, held
    pool, device = held[0]
    assert pool == before["1"].spec.node_name, "the driver's pool is its node"
    return before, pool, device


def _another_device(
    kube: Clients, namespace: str, pod: Any, old: tuple[str, str]
) -> list[tuple[str, str]]:
    """The devices ``pod`` (a member's new pod) holds: one, not ``old``."""
    held = allocated_devices(kube, namespace, pod)
    assert len(held) == 1, held
    assert held[0] != old, "its new claim holds another device"
    return held


def test_a_tainted_dra_device_replaces_its_member(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    dra: TestDRADriver,
    tmp_path: Path,
) -> None:
    # (asked for, and not what a device taint does: the scheduler avoids the device itself)
    before, pool, device = _gang_with_devices(
        kube, cluster_kubeconfig, namespace, tmp_path, **{names.TAINT_ON_DEVICE_FAULT: "true"}
    )
    node = pool

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
    now_held = _another_device(kube, namespace, after["1"], (pool, device))
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
    before, pool, device = _gang_with_devices(kube, cluster_kubeconfig, namespace, tmp_path)

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
    now_held = _another_device(kube, namespace, after["1"], (pool, device))
    _, opened = recovery_times(st["recovery"])
    print(
        f"\nDeviceTaintRule NoSchedule on {pool}/{device}: the gang stopped at step {planned}, "
        f"member moved to {now_held[0][0]}/{now_held[0][1]}, barrier open "
        f"{opened - tainted_at:.2f}s after the taint, 0 steps lost"
    )
