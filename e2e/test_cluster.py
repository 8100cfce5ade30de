"""The full cluster runs the real JobSet and Kueue controllers with their admission webhooks,
schedules onto kwok nodes, and lets a test make a node unhealthy on demand."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from e2e.harness import workloads
from e2e.harness.cluster import LocalCluster
from e2e.harness.kube import Clients, create_jobset, get_jobset, node_ready_status, wait_for
from e2e.harness.kwoknodes import NODE_UNHEALTHY_BOUND_SECONDS, is_kwok_node, set_heartbeat

pytestmark = pytest.mark.e2e

JOBSET_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "jobset.sigs.k8s.io/job-index",
    "jobset.sigs.k8s.io/job-global-index",
    "jobset.sigs.k8s.io/restart-attempt",
    "batch.kubernetes.io/job-completion-index",
)
KUEUE = ("kueue.x-k8s.io", "v1beta2")


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


@pytest.fixture
def kueue_names() -> dict[str, str]:
    suffix = uuid.uuid4().hex[:6]
    return {"flavor": f"flavor-{suffix}", "cq": f"cq-{suffix}", "lq": f"lq-{suffix}"}


def _workload_of(kube: Clients, namespace: str, jobset_name: str) -> dict[str, Any] | None:
    wls = kube.custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
    for wl in wls:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "JobSet" and o["name"] == jobset_name for o in owners):
            return dict(wl)
    return None


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return None


def test_kueue_holds_jobset_until_queue_exists(
    kube: Clients, namespace: str, kueue_names: dict[str, str]
) -> None:
    n = kueue_names
    create_jobset(
        kube,
        namespace,
        workloads.jobset(
            "queued", [("workers", 1, 2)], labels={"kueue.x-k8s.io/queue-name": n["lq"]}
        ),
    )

    # Kueue's JobSet webhook suspended it at creation, and its controller made a Workload that
    # says why it cannot be admitted.
    def inadmissible() -> dict[str, Any] | None:
        wl = _workload_of(kube, namespace, "queued")
        cond = wl and _condition(wl, "QuotaReserved")
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for("Workload with QuotaReserved=False", inadmissible, timeout=60)
    assert n["lq"] in cond["message"], cond
    assert get_jobset(kube, namespace, "queued")["spec"]["suspend"] is True
    assert not _pods(kube, namespace, "jobset.sigs.k8s.io/jobset-name=queued")

    try:
        kube.custom.create_cluster_custom_object(
            *KUEUE,
            "resourceflavors",
            {
                "apiVersion": "/".join(KUEUE),
                "kind": "ResourceFlavor",
                "metadata": {"name": n["flavor"]},
            },
        )
        kube.custom.create_cluster_custom_object(
            *KUEUE,
            "clusterqueues",
            {
                "apiVersion": "/".join(KUEUE),
                "kind": "ClusterQueue",
                "metadata": {"name": n["cq"]},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory"],
                            "flavors": [
                                {
                                    "name": n["flavor"],
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "4"},
                                        {"name": "memory", "nominalQuota": "4Gi"},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        )
        kube.custom.create_namespaced_custom_object(
            *KUEUE,
            namespace,
            "localqueues",
            {
                "apiVersion": "/".join(KUEUE),
                "kind": "LocalQueue",
                "metadata": {"name": n["lq"]},
                "spec": {"clusterQueue": n["cq"]},
            },
        )

        def admitted_and_running() -> list[Any] | None:
            if get_jobset(kube, namespace, "queued")["spec"].get("suspend"):
                return None
            pods = _pods(kube, namespace, "jobset.sigs.k8s.io/jobset-name=queued")
            ok = len(pods) == 2 and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        pods = wait_for("JobSet admitted by Kueue and 2 pods Running", admitted_and_running, 120)
        wl = _workload_of(kube, namespace, "queued")
        assert wl is not None
        admitted = _condition(wl, "Admitted")
        assert admitted is not None
        assert admitted["status"] == "True"
        assert wl["status"]["admission"]["clusterQueue"] == n["cq"]
        # Kueue merged its flavor's scheduling into the pods it admitted.
        assert all(p.spec.node_name for p in pods)
    finally:
        for plural, name in (("clusterqueues", n["cq"]), ("resourceflavors", n["flavor"])):
            try:
                kube.custom.delete_cluster_custom_object(*KUEUE, plural, name)
            except ApiException as e:
                if e.status != 404:
                    raise


def test_kwok_node_made_unhealthy_is_seen_not_ready_in_bounded_time(
    kube: Clients, local_cluster: LocalCluster | None
) -> None:
    if local_cluster is None:
        pytest.skip("needs the local cluster's kwok nodes (JSI_KUBECONFIG points elsewhere)")
    nodes = [n.metadata.name for n in kube.core.list_node(label_selector="type=kwok").items]
    ready = [n for n in nodes if node_ready_status(kube.core.read_node(n)) == "True"]
    assert ready, f"no Ready kwok node among {nodes}"
    victim = ready[-1]

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
        node = kube.core.read_node(victim)
        taints = {t.key for t in node.spec.taints or []}
        assert "node.kubernetes.io/unreachable" in taints
    finally:
        set_heartbeat(kube, victim, alive=True)
    wait_for(
        f"node {victim} Ready again",
        lambda: node_ready_status(kube.core.read_node(victim)) == "True",
        60,
        interval=1,
    )
