"""How a dead node's pods are freed in a node-death run: what a platform with node remediation
does, so that stock JobSet and upstream InPlaceRestart are measured where they can recover.

Kubernetes never finishes deleting a pod whose kubelet is gone. A platform that detects dead
nodes (a machine health check, a cluster autoscaler's remediation, a person) applies
``node.kubernetes.io/out-of-service:NoExecute`` once the node is declared dead: the taint
manager evicts the pods that do not tolerate it and kube-controller-manager's pod garbage
collector then deletes the node's terminating pods without grace (k8s.io/kubernetes
pkg/controller/podgc, ``gcTerminating``: not-ready nodes with that taint). jobset-inplace does
the same on its own by default (``force-delete: unreachable``); with ``force-delete: never`` it
waits for this like the others.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from jobset_inplace.apierrors import or_none
from testbed.kube import Clients

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_TAINT = {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}
NONE, REMEDIATED = "none", "out-of-service"  # a node-death run's remediation


@dataclass(frozen=True)
class NodeDeath:
    """One node-death run of a path: ``remediation`` (NONE: the node stays as it is;
    REMEDIATED: tainted out-of-service once declared dead) and, for jobset-inplace's gangs,
    their ``force-delete`` policy."""

    remediation: str = NONE
    force_delete: str | None = None

    @property
    def label(self) -> str:
        policy = f"force-delete {self.force_delete}, " if self.force_delete else ""
        done = "out-of-service taint" if self.remediation == REMEDIATED else "no remediation"
        return policy + done


def _not_ready(node: Any) -> bool:
    conditions = (node.status.conditions or []) if node.status else []
    return any(c.type == "Ready" and c.status != "True" for c in conditions)


class OutOfService:
    """While entered: once the node lifecycle controller declares ``node`` not ready, taint it
    out-of-service (times kept, monotonic); on exit the taint goes again. One GET of the node
    every ``every`` seconds (a platform's health check would watch it)."""

    def __init__(self, kube: Clients, node: str, every: float = 0.5) -> None:
        self.kube, self.node, self.every = kube, node, every
        self.declared_dead_at: float | None = None
        self.tainted_at: float | None = None
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"oos-{node}")

    def __enter__(self) -> OutOfService:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._halt.set()
        self._thread.join(10)
        self.untaint()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                node = self.kube.core.read_node(self.node)
                if _not_ready(node):
                    self.declared_dead_at = time.monotonic()
                    self._taint(node)
                    self.tainted_at = time.monotonic()
                    return
            except Exception as e:  # a bench thread must not die silently
                self.errors.append(f"{type(e).__name__}: {e}")
            self._halt.wait(self.every)

    def _taint(self, node: Any) -> None:
        taints = [t for t in self._taints(node) if t["key"] != OUT_OF_SERVICE]
        body = {
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": [*taints, OUT_OF_SERVICE_TAINT]},
        }
        self.kube.core.patch_node(self.node, body)

    def _taints(self, node: Any) -> list[dict[str, Any]]:
        """The node's taints as the API writes them (camelCase, no empty fields)."""
        out: list[dict[str, Any]] = self.kube.api.sanitize_for_serialization(node.spec.taints or [])
        return out

    def untaint(self) -> None:
        for _ in range(5):  # optimistic concurrency: read again on a conflict
            node = self.kube.core.read_node(self.node)
            taints = self._taints(node)
            kept = [t for t in taints if t["key"] != OUT_OF_SERVICE]
            if len(kept) == len(taints):
                return
            body = {
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": kept},
            }
            try:
                self.kube.core.patch_node(self.node, body)
                return
            except Exception as e:  # 409: a concurrent node write; read again
                self.errors.append(f"untaint: {type(e).__name__}: {e}")
        raise RuntimeError(f"{self.node}: out-of-service taint not removed: {self.errors[-1:]}")


def free_after_cap(kube: Clients, namespace: str, terminating: list[str]) -> None:
    """After a capped run, its figure taken, with the node alive again: finish the deletion of
    its pods still Terminating as kwok's own pod-delete stage does (their finalizers dropped,
    then deleted without grace), so that the gang can be whole for the next run. kwok does not
    finish a deletion that began while it was not managing the node (2026-11-28: a stock pod
    evicted from the dead node stayed Terminating after the node came back and its gang never
    ran again); a grace-0 delete alone leaves it to the Job's tracking finalizer, which the Job
    controller keeps on a pod that never turns terminal."""
    for name in terminating:
        drop = {"metadata": {"finalizers": None}}
        if or_none(kube.core.patch_namespaced_pod, name, namespace, drop) is not None:
            or_none(kube.core.delete_namespaced_pod, name, namespace, grace_period_seconds=0)
