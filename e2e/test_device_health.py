"""Device health end to end on the real kubelet nodes: a test device plugin (the kubelet's
device-plugin gRPC API) gives every member one device; one device turns Unhealthy; the real
kubelet reports it in that pod's status (``allocatedResourcesStatus``); the controller replaces
that member on another node (its node tainted: ``taint-on-device-fault``) and restarts the
others in place, every member resuming from one step. Device Unhealthy -> barrier open is
printed (docs/guarantees.md quotes it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, job_failures, member_pods, recovery_times
from testbed.demo import one_replaced_others_in_place, training_gang
from testbed.devices import RESOURCE, TestDevices, pod_devices
from testbed.install import Installation
from testbed.kube import Clients, remove_taint, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kube_release]

MEMBERS = 2


@pytest.fixture
def devices(local_cluster: LocalCluster | None, kube: Clients, tmp_path: Path) -> Any:
    if local_cluster is None:
        pytest.skip("runs a device plugin beside the local cluster's real kubelets")
    nodes = local_cluster.real_nodes()
    with TestDevices(kube, nodes, tmp_path / "devices") as d:
        try:
            yield d
        finally:
            for node in nodes:  # removed by people after the repair, never by the controller
                remove_taint(kube, node, names.DEVICE_UNHEALTHY_TAINT)


def test_an_unhealthy_device_replaces_its_member_elsewhere(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    devices: TestDevices,
    tmp_path: Path,
) -> None:
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        MEMBERS,
        annotations={names.TAINT_ON_DEVICE_FAULT: "true"},
        limits={RESOURCE: "1"},
        persistent=tmp_path / "shared",  # the replacement's steps
    )
    before = member_pods(kube, namespace, "gang")
    victim = before["1"]
    node = victim.spec.node_name
    held = wait_for(
        f"the kubelet reports {victim.metadata.name}'s device",
        lambda: pod_devices(kube.core.read_namespaced_pod(victim.metadata.name, namespace)),
        30,
    )
    assert len(held) == 1
    assert held[0][1] == "Healthy"
    device = held[0][0]

    devices.set_health(node, device, healthy=False)
    failed_at = time.time()
    try:
        st = barrier_open(kube, namespace, "gang", 2, 180)
    finally:
        devices.set_health(node, device, healthy=True)
    rec = st["recovery"]
    assert rec["causes"] == {"workers/1/0": "DeviceUnhealthy"}
    assert set(rec["recreated"]) == {"workers/1/0"}
    assert rec["inPlace"] == MEMBERS - 1
    taints = {t.key: t.effect for t in kube.core.read_node(node).spec.taints or []}
    assert taints.get(names.DEVICE_UNHEALTHY_TAINT) == "NoSchedule"
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
    assert after["1"].spec.node_name != node, "on another node"
    failures = job_failures(kube, namespace, "gang")
    assert set(failures.values()) == {0}, (
        f"a replaced pod is not its Job's failure (it would hold the next one back): {failures}"
    )
    started, opened = recovery_times(rec)
    print(
        f"\ndevice {device} Unhealthy -> recovery started {started - failed_at:.2f}s, "
        f"-> barrier open {opened - failed_at:.2f}s (member replaced on "
        f"{after['1'].spec.node_name}, {node} tainted)"
    )
