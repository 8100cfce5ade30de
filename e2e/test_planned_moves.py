"""A planned disruption end to end on the real kubelet nodes: ``kubectl drain`` of the node
under a member of a training gang. The gang's PodDisruptionBudget holds the drain's eviction;
the controller asks the agents how far their trainers are and picks a step a few seconds ahead;
every trainer checkpoints that step and parks; then the member is moved to another node (its
node is cordoned) while the others restart in place, every member resuming from that step: no
step lost. The drain then completes."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e.marks import KUBE_RELEASE
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.disruption_budget import budget_name
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, job_failures, member_pods
from testbed.demo import (
    assert_resumed,
    started_trainer_log,
    trainers_running,
    training_gang,
)
from testbed.install import Installation
from testbed.kube import Clients, wait_for
from testbed.kueue import QUEUE_LABEL, condition, queue, workload_of
from testbed.versions import binaries

pytestmark = pytest.mark.e2e

NAME, MEMBERS = "gang", 2
DRAIN_TIMEOUT_S = 300


@pytest.fixture
def uncordoned(local_cluster: LocalCluster | None, kube: Clients) -> Iterator[None]:
    """The drained node takes pods again afterwards (the next tests need both nodes)."""
    if local_cluster is None:
        pytest.skip("drains one of the local cluster's real nodes")
    yield
    for node in local_cluster.real_nodes():
        kube.core.patch_node(node, {"spec": {"unschedulable": None}})


def _events(kube: Clients, namespace: str, reason: str) -> list[str]:
    found = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={NAME},reason={reason}"
    ).items
    return [e.message for e in found]


@pytest.mark.parametrize(
    "kueue", [pytest.param(False, marks=KUBE_RELEASE), True], ids=["plain", "kueue"]
)
def test_a_drained_node_moves_its_member_with_no_step_lost(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    uncordoned: None,
    tmp_path: Path,
    kueue: bool,
) -> None:
    """``kueue``: the gang is admitted by Kueue (real Kueue, waitForPodsReady on): the move
    keeps the admission and the Workload is not evicted."""
    with contextlib.ExitStack() as stack:
        labels = None
        if kueue:
            q = stack.enter_context(queue(kube, namespace))
            labels = {QUEUE_LABEL: q.local_queue}
        _drain_and_check(cluster_kubeconfig, kube, namespace, tmp_path, labels)
        if kueue:
            wl = workload_of(kube, namespace, NAME)
            assert wl is not None
            admitted, evicted = condition(wl, "Admitted"), condition(wl, "Evicted")
            assert admitted is not None
            assert admitted["status"] == "True", "the Workload stayed admitted"
            assert evicted is None or evicted["status"] == "False", evicted


def _drain_and_check(
    cluster_kubeconfig: Path,
    kube: Clients,
    namespace: str,
    tmp_path: Path,
    labels: dict[str, str] | None,
) -> None:
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        NAME,
        MEMBERS,
        persistent=tmp_path / "shared",  # where a moved member finds the step
        labels=labels,
    )
    policy = client.PolicyV1Api(kube.api)
    pdb = wait_for(
        "the gang's PodDisruptionBudget",
        lambda: or_none(policy.read_namespaced_pod_disruption_budget, budget_name(NAME), namespace),
        30,
    )
    assert (pdb.spec.min_available, pdb.spec.unhealthy_pod_eviction_policy) == (
        MEMBERS,
        "AlwaysAllow",
    )
    before = member_pods(kube, namespace, NAME)
    # (a gang Kueue admitted is in epoch 2 already: it stood down until its admission)
    epoch = gang_state(kube, namespace, NAME)["epoch"] + 1
    node = before["0"].spec.node_name
    moving = {i for i, p in before.items() if p.spec.node_name == node}
    drain = [
        str(binaries().kubectl),
        "--kubeconfig",
        str(cluster_kubeconfig),
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={DRAIN_TIMEOUT_S}s",
    ]
    started = time.monotonic()
    proc = subprocess.Popen(drain, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        st = wait_for(
            "the planned move's recovery",
            lambda: s if (s := gang_state(kube, namespace, NAME)).get("epoch") == epoch else None,
            180,
        )
        members = {f"workers/{i}/0" for i in moving}
        assert st["recovery"]["causes"] == dict.fromkeys(members, "PlannedMove"), st
        assert set(st["recovery"]["recreated"]) == members
        assert st["budgets"] == {"inPlaceUsed": 0, "recreateUsed": 0}, "no budget charged"
        (asked,) = _events(kube, namespace, "PlannedMove")
        assert f"node {node} cordoned" in asked
        (stop,) = _events(kube, namespace, "PlannedStop")
        m = re.search(r"every trainer stops at step (\d+)", stop)
        assert m, stop
        planned = int(m.group(1))
        st = barrier_open(kube, namespace, NAME, epoch, 180)
        for pod in member_pods(kube, namespace, NAME).values():  # (evidence in the log)
            log = started_trainer_log(cluster_kubeconfig, namespace, pod.metadata.name)
            print(f"--- {pod.metadata.name} on {pod.spec.node_name}:\n{log[-1500:]}")
        assert st["resumeStep"] == planned, "every member resumes from the step it stopped at"
        assert st["recovery"]["progressStepsLost"] == 0, "no step lost"
        wait_for(
            f"every trainer running in epoch {epoch}",
            lambda: trainers_running(
                kube, cluster_kubeconfig, namespace, NAME, MEMBERS, epoch=epoch
            ),
            120,
        )
        out, _ = proc.communicate(timeout=DRAIN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    drained = time.monotonic() - started
    assert proc.returncode == 0, out
    assert f"node/{node} drained" in out, out
    after = member_pods(kube, namespace, NAME, include_failed=False)
    for i, pod in before.items():
        if i in moving:
            assert after[i].metadata.uid != pod.metadata.uid, f"member {i} moved"
            assert after[i].spec.node_name != node, f"member {i} off the drained node"
        else:
            assert after[i].metadata.uid == pod.metadata.uid, f"member {i} in place"
    assert_resumed(cluster_kubeconfig, namespace, after.values(), epoch, planned)
    failures = job_failures(kube, namespace, NAME)
    assert set(failures.values()) == {0}, f"a moved pod is not its Job's failure: {failures}"
    print(
        f"\ndrain of {node} ({len(moving)} of {MEMBERS} members on it): the gang stopped at "
        f"step {planned}, resumed there with 0 steps lost; drain completed in {drained:.1f}s"
    )
