"""Test devices on the local cluster's real kubelet nodes: one process of the test device plugin
(testbed/deviceplugin, the kubelet's device-plugin gRPC API) per node, advertising
``jobset-inplace.dev/test-device`` devices ``<node>-0``, ``<node>-1``, ..., with a lever to mark
one Unhealthy (as a GPU plugin does on an XID error). The kubelet then reports it in the
status of the pod holding it (``allocatedResourcesStatus``, ResourceHealthStatus)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType

from . import processes
from .kube import Clients, wait_for
from .versions import cache_dir, ensure_binaries

RESOURCE = "jobset-inplace.dev/test-device"


def registry_dir(node: str) -> Path:
    """The plugin registration directory of real node ``node``'s kubelet (``--root-dir`` in
    realnode/kubelet.sh, plus ``plugins_registry``). Its device-plugins directory is no use:
    the kubelet compiles that one in (/var/lib/kubelet/device-plugins), shared by every kubelet
    on this host."""
    return cache_dir() / "realnode" / node / "kubelet" / "root" / "plugins_registry"


class TestDevices:
    """``count`` test devices on each of ``nodes``, for the life of a ``with`` block."""

    __test__ = False  # not a pytest class

    def __init__(self, kube: Clients, nodes: list[str], workdir: Path, count: int = 2) -> None:
        self.kube, self.nodes, self.workdir, self.count = kube, nodes, workdir, count
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def lever(self, node: str) -> Path:
        return self.workdir / f"{node}.unhealthy"

    def __enter__(self) -> TestDevices:
        plugin = ensure_binaries("test_device_plugin").test_device_plugin
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.nodes:
                self.lever(node).write_text("")
                self.procs[node] = processes.start(
                    [
                        plugin,
                        f"-registry={registry_dir(node)}",
                        f"-resource={RESOURCE}",
                        f"-devices={self.count}",
                        f"-id-prefix={node}",
                        f"-unhealthy={self.lever(node)}",
                    ],
                    self.workdir / f"{node}.log",
                )
            for node in self.nodes:
                wait_for(
                    f"{self.count} {RESOURCE} allocatable on {node}",
                    lambda n=node: self.allocatable(n) == self.count,  # type: ignore[misc]
                    60,
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

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

    def stop(self) -> None:
        for proc in self.procs.values():
            processes.stop(proc)
        self.procs.clear()
