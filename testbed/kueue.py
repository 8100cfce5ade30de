"""Kueue objects for e2e tests: a ResourceFlavor + ClusterQueue + LocalQueue, reading the
Workload Kueue made for a JobSet, and recording every version of it Kueue writes."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import watch

from jobset_inplace.apierrors import or_none

# The product's condition lookup, kept importable from here for the e2e tests.
from jobset_inplace.core.decode import condition as condition  # noqa: PLC0414

from .kube import Clients

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True)
class Queue:
    flavor: str
    cluster_queue: str
    local_queue: str


def new_queue_names() -> Queue:
    suffix = uuid.uuid4().hex[:6]
    return Queue(f"flavor-{suffix}", f"cq-{suffix}", f"lq-{suffix}")


def create_queue(
    kube: Clients,
    namespace: str,
    q: Queue,
    *,
    cpu: str = "4",
    memory: str = "4Gi",
    preemption: dict[str, str] | None = None,
) -> None:
    api_version = "/".join(KUEUE)
    kube.custom.create_cluster_custom_object(
        *KUEUE,
        "resourceflavors",
        {"apiVersion": api_version, "kind": "ResourceFlavor", "metadata": {"name": q.flavor}},
    )
    kube.custom.create_cluster_custom_object(
        *KUEUE,
        "clusterqueues",
        {
            "apiVersion": api_version,
            "kind": "ClusterQueue",
            "metadata": {"name": q.cluster_queue},
            "spec": {
                "preemption": preemption or {},
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": q.flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": cpu},
                                    {"name": "memory", "nominalQuota": memory},
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
            "apiVersion": api_version,
            "kind": "LocalQueue",
            "metadata": {"name": q.local_queue},
            "spec": {"clusterQueue": q.cluster_queue},
        },
    )


def delete_queue(kube: Clients, q: Queue) -> None:
    for plural, name in (("clusterqueues", q.cluster_queue), ("resourceflavors", q.flavor)):
        or_none(kube.custom.delete_cluster_custom_object, *KUEUE, plural, name)


@contextlib.contextmanager
def queue(kube: Clients, namespace: str, **options: Any) -> Iterator[Queue]:
    q = new_queue_names()
    create_queue(kube, namespace, q, **options)
    try:
        yield q
    finally:
        delete_queue(kube, q)


def workload_of(kube: Clients, namespace: str, jobset_name: str) -> dict[str, Any] | None:
    wls = kube.custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
    for wl in wls:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "JobSet" and o["name"] == jobset_name for o in owners):
            return dict(wl)
    return None


def assigned_hosts(wl: dict[str, Any]) -> set[str]:
    """The nodes of the Workload's TAS assignment (``status.admission``; v1beta2's compact
    slices, whose last level is ``kubernetes.io/hostname``); empty when not admitted."""
    hosts: set[str] = set()
    admission = (wl.get("status") or {}).get("admission") or {}
    for psa in admission.get("podSetAssignments") or []:
        for sl in (psa.get("topologyAssignment") or {}).get("slices") or []:
            last = (sl.get("valuesPerLevel") or [{}])[-1]
            if "universal" in last:
                hosts.add(last["universal"])
            ind = last.get("individual") or {}
            pre, suf = ind.get("prefix", ""), ind.get("suffix", "")
            hosts.update(f"{pre}{root}{suf}" for root in ind.get("roots") or [])
    return hosts


def replaced_then_evicted(versions: list[dict[str, Any]], dead: str, spare: str) -> bool:
    """Kueue's own record of kubernetes-sigs/kueue#15658: the Workload admitted with the spare
    in place of the dead node, then (first eviction) evicted for NodeFailures. A second
    pass queued with the Workload as it was before that admission (a status write raced it)
    retries the replacement against the new usage, finds no room and, with
    TASFailedNodeReplacementFailFast (on by default), evicts."""
    replaced = False
    for wl in versions:
        hosts = assigned_hosts(wl)
        replaced = replaced or (spare in hosts and dead not in hosts)
        evicted = condition(wl, "Evicted")
        if evicted and evicted["status"] == "True":
            return replaced and evicted["reason"] == "NodeFailures"
    return False


class WorkloadHistory:
    """Every version of the Workloads of ``namespace`` that a watch delivers, in order, kept
    by a background thread: what Kueue decided between two polls of a test (an admission
    it wrote and overwrote within a second) stays visible."""

    def __init__(self, kube: Clients, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self._versions: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload-history", daemon=True)
        self._watching = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> WorkloadHistory:
        self._thread.start()
        if not self._watching.wait(30):
            raise AssertionError("the Workload watch did not start within 30s")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def versions(self) -> list[dict[str, Any]]:
        """In the order the API server wrote them; raises if the watch failed (a gap)."""
        with self._lock:
            if self._error is not None:
                raise AssertionError(f"the Workload watch failed: {self._error!r}")
            return list(self._versions)

    def _run(self) -> None:
        try:
            self._record()
        except BaseException as e:  # reported by .versions, in the test's thread
            with self._lock:
                self._error = e
            self._watching.set()

    def _record(self) -> None:
        listed = self.kube.custom.list_namespaced_custom_object(*KUEUE, self.namespace, "workloads")
        rv = listed["metadata"]["resourceVersion"]
        with self._lock:
            self._versions.extend(listed["items"])
        self._watching.set()
        while not self._stop.is_set():
            # An ERROR event raises ApiException: the watch fails rather than leave a gap.
            for ev in watch.Watch().stream(
                self.kube.custom.list_namespaced_custom_object,
                *KUEUE,
                self.namespace,
                "workloads",
                resource_version=rv,
                timeout_seconds=2,
            ):
                obj = ev["object"]
                rv = obj["metadata"]["resourceVersion"]
                with self._lock:
                    self._versions.append(obj)
