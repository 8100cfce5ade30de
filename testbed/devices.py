"""Test devices on the local cluster's real kubelet nodes: one process of the test device plugin
(testbed/deviceplugin, the kubelet's device-plugin gRPC API) per node, advertising
``jobset-inplace.dev/test-device`` devices ``<node>-0``, ``<node>-1``, ..., with a lever to mark
one Unhealthy (as a GPU plugin does on an XID error). The kubelet then reports it in the
status of the pod holding it (``allocatedResourcesStatus``, ResourceHealthStatus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import processes
from .kube import Clients, wait_for
from .versions import ensure_binaries

RESOURCE = "jobset-inplace.dev/test-device"


class TestDevices(processes.NodeDaemons):
    """``count`` test devices on each of ``nodes``, for the life of a ``with`` block."""

    def __init__(self, kube: Clients, nodes: list[str], workdir: Path, count: int = 2) -> None:
        super().__init__(nodes, workdir)
        self.kube, self.count = kube, count

    def lever(self, node: str) -> Path:
        return self.workdir / f"{node}.unhealthy"

    def prepare(self) -> None:
        self.plugin = ensure_binaries("test_device_plugin").test_device_plugin

    def command(self, node: str) -> list[str | Path]:
        self.lever(node).write_text("")
        return [
            self.plugin,
            f"-registry={processes.kubelet_plugin_registry(node)}",
            f"-resource={RESOURCE}",
            f"-devices={self.count}",
            f"-id-prefix={node}",
            f"-unhealthy={self.lever(node)}",
        ]

    def wait_serving(self, node: str) -> None:
        wait_for(
            f"{self.count} {RESOURCE} allocatable on {node}",
            lambda: self.allocatable(node) == self.count,
            60,
        )

    def allocatable(self, node: str) -> int:
        alloc = self.kube.core.read_node(node).status.allocatable or {}
        return int(alloc.get(RESOURCE, "0"))

    def set_health(self, node: str, device: str, healthy: bool) -> None:
        """Mark ``device`` of ``node`` Unhealthy (or Healthy again); the plugin tells the
        kubelet within 0.2 s."""
        lever = self.lever(node)
        bad = {line for line in lever.read_text().splitlines() if line}
        bad = bad - {device} if healthy else bad | {device}
        tmp = lever.with_suffix(".tmp")
        tmp.write_text("".join(f"{d}\n" for d in sorted(bad)))
        tmp.replace(lever)


def pod_devices(pod: Any) -> list[tuple[str, str]]:
    """(resourceID, health) of ``pod``'s allocated test devices, as the kubelet reports them
    in its status."""
    out = []
    for c in pod.status.container_statuses or []:
        for ars in c.allocated_resources_status or []:
            if ars.name == RESOURCE:
                out += [(r.resource_id, r.health) for r in ars.resources or []]
    return out
