"""Kueue objects for e2e tests: a ResourceFlavor + ClusterQueue + LocalQueue, and reading the
Workload Kueue made for a JobSet."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
