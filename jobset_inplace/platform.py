"""What each Kubernetes minor needs for the in-place restart path (upstream facts, from
``k8s.io/kubernetes`` ``pkg/features/kube_features.go``; checked on v1.35.4, v1.36.3 and v1.37.2).

=================================================  ==========  ==========  =========
feature gate                                       1.35        1.36        1.37
=================================================  ==========  ==========  =========
``ContainerRestartRules``                          beta, on    beta, on    beta, on
``RestartAllContainersOnContainerExits``           alpha, off  beta, on    beta, on
``NodeDeclaredFeatures``                           alpha, off  beta, on    GA (locked on)
``ResourceHealthStatus`` (device health, optional)  alpha, off  beta, on    beta, on
``DRADeviceTaints`` (DRA device taints, optional)   alpha, off  beta, on    GA, on
``DRADeviceTaintRules`` (``DeviceTaintRule``)       alpha, off  beta, off   GA, on
=================================================  ==========  ==========  =========

The gates matter on kube-apiserver (accepts and keeps the rules), kube-scheduler (places a pod
with a ``RestartAllContainers`` rule only on a node that declares the feature) and every kubelet
(runs the restart and declares the feature in ``Node.status.declaredFeatures``).
``ResourceHealthStatus`` (KEP-4680: a device plugin's or DRA driver's device health in the pod
status, ``allocatedResourcesStatus``; kube-apiserver and kubelets) is needed only to recover
from device faults (cause ``DeviceUnhealthy``). The DRA device-taint gates (KEP-5055; on
kube-apiserver, kube-scheduler and kube-controller-manager, whose device-taint eviction
controller evicts pods for ``NoExecute`` taints: cause ``DeviceTainted``) need nothing from
jobset-inplace but the pod condition that eviction writes; before 1.37 the ``DeviceTaintRule``
API is also off (``--runtime-config``).
"""

from __future__ import annotations

from typing import Final

MIN_MINOR: Final = 35
"""The first minor with ``RestartAllContainers``."""

DEFAULT_ON_MINOR: Final = 36
"""The first minor where every gate the path needs is on by default."""

RESTART_ALL_FEATURE: Final = "RestartAllContainersOnContainerExits"
"""The feature gate, and the name a kubelet declares in ``Node.status.declaredFeatures``."""

NODE_DECLARED_FEATURES: Final = "NodeDeclaredFeatures"

GATED_COMPONENTS: Final = ("kube-apiserver", "kube-scheduler", "kubelet")

DEVICE_HEALTH_FEATURE: Final = "ResourceHealthStatus"
DEVICE_HEALTH_DEFAULT_ON_MINOR: Final = 36


def gates_needed(minor: int) -> tuple[str, ...]:
    """The feature gates to switch on for the in-place path on Kubernetes ``1.<minor>``
    (empty from 1.36: on by default)."""
    if minor < MIN_MINOR:
        raise ValueError(f"Kubernetes 1.{minor} has no RestartAllContainers (needs 1.{MIN_MINOR}+)")
    if minor < DEFAULT_ON_MINOR:
        return (RESTART_ALL_FEATURE, NODE_DECLARED_FEATURES)
    return ()


def device_health_gates(minor: int) -> tuple[str, ...]:
    """The feature gates to switch on for device-health signals on Kubernetes ``1.<minor>``
    (empty from 1.36: on by default)."""
    return (DEVICE_HEALTH_FEATURE,) if minor < DEVICE_HEALTH_DEFAULT_ON_MINOR else ()


DEVICE_TAINT_FEATURES: Final = ("DRADeviceTaints", "DRADeviceTaintRules")
DEVICE_TAINTS_DEFAULT_ON_MINOR: Final = 37


def device_taint_gates(minor: int) -> tuple[str, ...]:
    """The feature gates to switch on for DRA device taints and ``DeviceTaintRule`` on
    Kubernetes ``1.<minor>`` (empty from 1.37: GA)."""
    return DEVICE_TAINT_FEATURES if minor < DEVICE_TAINTS_DEFAULT_ON_MINOR else ()


def device_taint_rule_version(minor: int) -> str:
    """The ``resource.k8s.io`` version that serves ``DeviceTaintRule`` on ``1.<minor>``."""
    if minor < 36:
        return "v1alpha3"
    return "v1beta2" if minor < DEVICE_TAINTS_DEFAULT_ON_MINOR else "v1"


def device_taint_runtime_config(minor: int) -> str:
    """``--runtime-config`` value that serves ``DeviceTaintRule`` on ``1.<minor>`` (empty from
    1.37: on by default)."""
    if minor >= DEVICE_TAINTS_DEFAULT_ON_MINOR:
        return ""
    return f"resource.k8s.io/{device_taint_rule_version(minor)}=true"


def gates_flag(minor: int, *, device_health: bool = False, device_taints: bool = False) -> str:
    """``--feature-gates`` value for :func:`gates_needed` (and :func:`device_health_gates`,
    :func:`device_taint_gates`; empty when none)."""
    gates = (
        *gates_needed(minor),
        *(device_health_gates(minor) if device_health else ()),
        *(device_taint_gates(minor) if device_taints else ()),
    )
    return ",".join(f"{g}=true" for g in gates)
