"""The full cluster runs the real JobSet and Kueue controllers with their admission webhooks,
schedules onto kwok nodes, and lets a test make a node unhealthy on demand."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from testbed import workloads
from testbed.cluster import LocalCluster
from testbed.kube import Clients, create_jobset, get_jobset, node_ready_status, wait_for
from testbed.kueue import (
    QUEUE_LABEL,
    condition,
    create_queue,
    delete_queue,
    new_queue_names,
    workload_of,
)
from testbed.kwoknodes import NODE_UNHEALTHY_BOUND_SECONDS, is_kwok_node, set_heartbeat

pytestmark = [pytest.mark.e2e, pytest.mark.kube_release]

JOBSET_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "jobset.sigs.k8s.io/job-index",
    "jobset.sigs.k8s.io/job-global-index",
    "jobset.sigs.k8s.io/restart-attempt",
    "batch.kubernetes.io/job-completion-index",
)


def _pods(kube: Clients, namespace: str, selector: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def test_jobset_with_two_replicated_jobs_runs_on_kwok_nodes(
    kube: Clients, namespace: str, local_cluster: LocalCluster | None
) -> None:
    create_jobset(
        kube, namespace, workloads.jobset("two-rjobs", [("leaders", 2, 2), ("workers", 2, 2)])
    )
    selector = "jobset.sigs.k8s.io/jobset-name=two-rjobs"

    def all_running() -> list[Any] | None:
        pods = _pods(kube, namespace, selector)
        return pods if len(pods) == 8 and all(p.status.phase == "Running" for p in pods) else None

    pods = wait_for("8 Running pods of JobSet two-rjobs", all_running, timeout=120)
    for pod in pods:
        labels = pod.metadata.labels
        missing = [k for k in JOBSET_LABELS if k not in labels]
        assert not missing, f"{pod.metadata.name} lacks JobSet labels {missing}"
        if local_cluster is not None:
            assert is_kwok_node(kube, pod.spec.node_name), pod.spec.node_name
    by_rjob: dict[str, int] = {}
    for pod in pods:
        rj = pod.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"]
        by_rjob[rj] = by_rjob.get(rj, 0) + 1
    assert by_rjob == {"leaders": 4, "workers": 4}
    # JobSet's pod webhook injected its annotations too: the webhook path is live.
    assert all("jobset.sigs.k8s.io/jobset-name" in (p.metadata.annotations or {}) for p in pods)


def test_a_pod_deleted_while_running_ends_failed_and_its_job_replaces_it(
    kube: Clients, namespace: str
) -> None:
    """A running pod deleted by someone else (here the test; in the 10,000-pod bench the
    taint-eviction controller) goes as a kubelet's does since Kubernetes 1.27: Failed first,
    then gone. Its Job has a podFailurePolicy, so the Job controller keeps its tracking
    finalizer until the pod is terminal: the pod is counted failed and replaced (on the local
    cluster kwok plays the kubelet: testbed/cluster.py, KWOK_POD_TERMINATE_ON_DELETE)."""
    pod_spec = workloads.jobset("x", [("w", 1, 1)])["spec"]["replicatedJobs"][0]["template"]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "deleted-pod"},
        "spec": pod_spec["spec"]
        | {
            "backoffLimit": 2,
            "podFailurePolicy": {
                "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
            },
        },
    }
    batch = client.BatchV1Api(kube.api)
    batch.create_namespaced_job(namespace, job)
    selector = "job-name=deleted-pod"

    def running() -> list[Any]:
        return [p for p in _pods(kube, namespace, selector) if p.status.phase == "Running"]

    [first] = wait_for("the Job's pod Running", running, timeout=60)
    kube.core.delete_namespaced_pod(first.metadata.name, namespace)

    def replaced() -> list[Any]:
        pods = _pods(kube, namespace, selector)
        gone = all(p.metadata.uid != first.metadata.uid for p in pods)
        return [p for p in pods if p.status.phase == "Running"] if gone else []

    wait_for("the deleted pod gone and another Running", replaced, timeout=90)

    def counted() -> Any:
        # the Job controller counts a pod whose finalizer it removed in a later status write:
        # the replacement may be running before it
        status = batch.read_namespaced_job_status("deleted-pod", namespace).status
        return status if status.failed else None

    status = wait_for("the deleted pod counted as a failure", counted, timeout=30)
    assert status.failed == 1, f"one failure: {status}"


def test_kueue_holds_jobset_until_queue_exists(kube: Clients, namespace: str) -> None:
    q = new_queue_names()
    create_jobset(
        kube,
        namespace,
        workloads.jobset("queued", [("workers", 1, 2)], labels={QUEUE_LABEL: q.local_queue}),
    )

    # Kueue's JobSet webhook suspended it at creation, and its controller made a Workload that
    # says why it cannot be admitted.
    def inadmissible() -> dict[str, Any] | None:
        wl = workload_of(kube, namespace, "queued")
        cond = wl and condition(wl, "QuotaReserved")
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for("Workload with QuotaReserved=False", inadmissible, timeout=60)
    assert q.local_queue in cond["message"], cond
    assert get_jobset(kube, namespace, "queued")["spec"]["suspend"] is True
    assert not _pods(kube, namespace, "jobset.sigs.k8s.io/jobset-name=queued")

    try:
        create_queue(kube, namespace, q)

        def admitted_and_running() -> list[Any] | None:
            if get_jobset(kube, namespace, "queued")["spec"].get("suspend"):
                return None
            pods = _pods(kube, namespace, "jobset.sigs.k8s.io/jobset-name=queued")
            ok = len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        pods = wait_for("JobSet admitted by Kueue and 2 pods Running", admitted_and_running, 120)
        wl = workload_of(kube, namespace, "queued")
        assert wl is not None
        admitted = condition(wl, "Admitted")
        assert admitted is not None
        assert admitted["status"] == "True"
        assert wl["status"]["admission"]["clusterQueue"] == q.cluster_queue
        assert all(p.spec.node_name for p in pods)
    finally:
        delete_queue(kube, q)


def test_kwok_node_made_unhealthy_is_seen_not_ready_in_bounded_time(
    kube: Clients, healthy_kwok_nodes: list[str]
) -> None:
    assert healthy_kwok_nodes, "no kwok node"
    victim = healthy_kwok_nodes[-1]

    start = time.monotonic()
    set_heartbeat(kube, victim, alive=False)
    try:
        status = wait_for(
            f"node {victim} Ready=False/Unknown",
            lambda: (
                s
                if (s := node_ready_status(kube.core.read_node(victim))) in ("False", "Unknown")
                else None
            ),
            timeout=NODE_UNHEALTHY_BOUND_SECONDS + 30,
            interval=1,
        )
        elapsed = time.monotonic() - start
        print(
            f"\nnode {victim}: heartbeat stopped -> Ready={status} in {elapsed:.1f}s "
            f"(bound {NODE_UNHEALTHY_BOUND_SECONDS}s)"
        )
        assert elapsed <= NODE_UNHEALTHY_BOUND_SECONDS
        # The NoExecute taint comes from a separate, rate-limited tainting pass of the node
        # lifecycle controller (--node-eviction-rate, one node per 10 s by default), so it may
        # follow the condition by some seconds.
        wait_for(
            f"taint node.kubernetes.io/unreachable on {victim}",
            lambda: (
                "node.kubernetes.io/unreachable"
                in {t.key for t in kube.core.read_node(victim).spec.taints or []}
            ),
            timeout=30,
            interval=0.5,
        )
    finally:
        set_heartbeat(kube, victim, alive=True)  # healthy_kwok_nodes waits until it is back


def test_single_replica_control_plane_runs_without_leader_election(
    local_cluster: LocalCluster | None,
) -> None:
    """A candidate that misses a Lease renewal exits and kwokctl does not restart it: a 2 s
    etcd stall on the loaded CI machine once left the cluster without kube-controller-manager
    (no Job, namespace or garbage-collection controller) for the rest of the run."""
    if local_cluster is None:
        pytest.skip("reads the local cluster's control-plane processes")
    commands = local_cluster.control_plane_commands()
    for component in ("kube-controller-manager", "kube-scheduler"):
        assert component in commands, f"{component} is not running: {sorted(commands)}"
        assert "--leader-elect=false" in commands[component], commands[component]
