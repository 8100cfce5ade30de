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

import tempfile
from pathlib import Path
from typing import Any

from jobset_inplace.apierrors import or_none
from jobset_inplace.platform import device_taint_rule_version

from . import processes
from .kube import Clients, create_unless_exists, wait_for
from .versions import ensure_binaries, versions

DRIVER = "test-device.jobset-inplace.dev"
DEVICE_CLASS = DRIVER
CLAIM_TEMPLATE = "test-device"
GROUP, VERSION = "resource.k8s.io", "v1"


def data_dir(node: str) -> Path:
    """The driver's own directory for its DRA socket on ``node``: a short path, as a unix
    socket's must be (under 108 bytes)."""
    return Path(tempfile.gettempdir()) / "jsi-dra" / node


def _apply(kube: Clients, plural: str, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create ``body`` unless an object of its name exists (the test objects never change)."""
    if namespace is None:
        create_unless_exists(kube.custom.create_cluster_custom_object, GROUP, VERSION, plural, body)
    else:
        create_unless_exists(
            kube.custom.create_namespaced_custom_object, GROUP, VERSION, namespace, plural, body
        )


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
    or_none(
        kube.custom.delete_cluster_custom_object, GROUP, _rule_version(), "devicetaintrules", rule
    )


class TestDRADriver(processes.NodeDaemons):
    """The test DRA driver on each of ``nodes`` with ``count`` devices, and its DeviceClass,
    for the life of a ``with`` block."""

    def __init__(
        self, kube: Clients, kubeconfig: Path, nodes: list[str], workdir: Path, count: int = 2
    ) -> None:
        super().__init__(nodes, workdir)
        self.kube, self.kubeconfig, self.count = kube, kubeconfig, count

    def prepare(self) -> None:
        self.driver = ensure_binaries("test_dra_driver").test_dra_driver
        _apply(
            self.kube,
            "deviceclasses",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "DeviceClass",
                "metadata": {"name": DEVICE_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )

    def command(self, node: str) -> list[str | Path]:
        return [
            self.driver,
            f"-driver={DRIVER}",
            f"-node={node}",
            f"-kubeconfig={self.kubeconfig}",
            f"-registry={processes.kubelet_plugin_registry(node)}",
            f"-data={data_dir(node)}",
            f"-devices={self.count}",
        ]

    def wait_serving(self, node: str) -> None:
        wait_for(f"{node}'s kubelet registering the driver", lambda: self.registered(node), 60)
        wait_for(
            f"{self.count} {DRIVER} devices published for {node}",
            lambda: self.published(node) == self.count,
            60,
        )

    def registered(self, node: str) -> bool:
        """Whether ``node``'s kubelet took the driver's registration (the driver logs it)."""
        log = self.log(node)
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
