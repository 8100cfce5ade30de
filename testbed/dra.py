"""Test DRA devices on the local cluster's real kubelet nodes: one process of the test DRA
driver (testbed/draplugin, Dynamic Resource Allocation through the kubelet's DRA gRPC API) per
node, publishing devices ``dev-0``, ``dev-1``, ... in a ResourceSlice whose pool is the node's
name; a DeviceClass selecting them and, per namespace, a ResourceClaimTemplate asking for one.
Taint a device with a DeviceTaintRule (:func:`taint_device`) as an administrator or a device
health monitor does; kube-controller-manager's device-taint eviction controller then evicts the
pods whose claims hold it (``NoExecute``).

The DRA objects are built-in APIs (``resource.k8s.io``) addressed through the generic object
client: the Python client's generated models lag the API (DeviceTaintRule is ``v1`` from 1.37,
``v1alpha3`` on 1.35, where the local cluster turns its gates and API on: testbed/versions.py).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes.client.exceptions import ApiException

from jobset_inplace.platform import device_taint_rule_version

from . import processes
from .kube import Clients, wait_for
from .versions import cache_dir, ensure_binaries, versions

DRIVER = "test-device.jobset-inplace.dev"
DEVICE_CLASS = DRIVER
CLAIM_TEMPLATE = "test-device"
GROUP, VERSION = "resource.k8s.io", "v1"


def plugin_dirs(node: str) -> tuple[Path, Path]:
    """(plugin registration directory of real node ``node``'s kubelet, the driver's own data
    directory for its DRA socket: a short path, as a unix socket's must be, under 108 bytes)."""
    root = cache_dir() / "realnode" / node / "kubelet" / "root"
    return root / "plugins_registry", Path(tempfile.gettempdir()) / "jsi-dra" / node


def _apply(kube: Clients, plural: str, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create ``body`` unless an object of its name exists (the test objects never change)."""
    try:
        if namespace is None:
            kube.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        else:
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    except ApiException as e:
        if e.status != 409:
            raise


def claim_template(kube: Clients, namespace: str) -> str:
    """Create, in ``namespace``, the ResourceClaimTemplate for one test device (request
    ``device``); return its name for a pod's ``resourceClaims``."""
    _apply(
        kube,
        "resourceclaimtemplates",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": CLAIM_TEMPLATE},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "device", "exactly": {"deviceClassName": DEVICE_CLASS}}
                        ]
                    }
                }
            },
        },
        namespace,
    )
    return CLAIM_TEMPLATE


def allocated_devices(kube: Clients, namespace: str, pod: Any) -> list[tuple[str, str]]:
    """(pool, device) of the test devices allocated to ``pod``'s claims (a V1Pod)."""
    out = []
    for status in pod.status.resource_claim_statuses or []:
        if not status.resource_claim_name:
            continue
        claim = kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", status.resource_claim_name
        )
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            if r.get("driver") == DRIVER:
                out.append((r["pool"], r["device"]))
    return out


def _rule_version() -> str:
    return device_taint_rule_version(versions().kubernetes_minor)


def taint_device(kube: Clients, rule: str, pool: str, device: str, effect: str) -> None:
    """Taint ``device`` of ``pool`` (its node) with a DeviceTaintRule named ``rule``."""
    kube.custom.create_cluster_custom_object(
        GROUP,
        _rule_version(),
        "devicetaintrules",
        {
            "apiVersion": f"{GROUP}/{_rule_version()}",
            "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": pool, "device": device},
                "taint": {"key": f"{DRIVER}/unhealthy", "value": "test", "effect": effect},
            },
        },
    )


def untaint(kube: Clients, rule: str) -> None:
    try:
        kube.custom.delete_cluster_custom_object(GROUP, _rule_version(), "devicetaintrules", rule)
    except ApiException as e:
        if e.status != 404:
            raise


class TestDRADriver:
    """The test DRA driver on each of ``nodes`` with ``count`` devices, and its DeviceClass,
    for the life of a ``with`` block."""

    __test__ = False  # not a pytest class

    def __init__(
        self, kube: Clients, kubeconfig: Path, nodes: list[str], workdir: Path, count: int = 2
    ) -> None:
        self.kube, self.kubeconfig, self.nodes = kube, kubeconfig, nodes
        self.workdir, self.count = workdir, count
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> TestDRADriver:
        driver = ensure_binaries("test_dra_driver").test_dra_driver
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            _apply(
                self.kube,
                "deviceclasses",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "DeviceClass",
                    "metadata": {"name": DEVICE_CLASS},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                    },
                },
            )
            for node in self.nodes:
                registry, data = plugin_dirs(node)
                self.procs[node] = processes.start(
                    [
                        driver,
                        f"-driver={DRIVER}",
                        f"-node={node}",
                        f"-kubeconfig={self.kubeconfig}",
                        f"-registry={registry}",
                        f"-data={data}",
                        f"-devices={self.count}",
                    ],
                    self.workdir / f"{node}.log",
                )
            for node in self.nodes:
                wait_for(
                    f"{node}'s kubelet registering the driver",
                    lambda n=node: self.registered(n),  # type: ignore[misc]
                    60,
                )
                wait_for(
                    f"{self.count} {DRIVER} devices published for {node}",
                    lambda n=node: self.published(n) == self.count,  # type: ignore[misc]
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

    def registered(self, node: str) -> bool:
        """Whether ``node``'s kubelet took the driver's registration (the driver logs it)."""
        log = self.workdir / f"{node}.log"
        return log.exists() and "registered=true" in log.read_text()

    def published(self, node: str) -> int:
        """Devices this driver publishes for ``node`` (its ResourceSlices)."""
        slices = self.kube.custom.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=f"spec.nodeName={node}"
        )
        return sum(
            len(s["spec"].get("devices") or [])
            for s in slices["items"]
            if s["spec"].get("driver") == DRIVER
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            processes.stop(proc)
        self.procs.clear()
