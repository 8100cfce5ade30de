"""What each Kubernetes minor needs for the in-place restart path (upstream facts, from
``k8s.io/kubernetes`` ``pkg/features/kube_features.go``; checked on v1.35.4 and v1.37.2).

=================================================  ==========  ==========  =========
feature gate                                       1.35        1.36        1.37
=================================================  ==========  ==========  =========
``ContainerRestartRules``                          beta, on    beta, on    beta, on
``RestartAllContainersOnContainerExits``           alpha, off  beta, on    beta, on
``NodeDeclaredFeatures``                           alpha, off  beta, on    GA (locked on)
``ResourceHealthStatus`` (device health, optional)  alpha, off  beta, on    beta, on
=================================================  ==========  ==========  =========

The gates matter on kube-apiserver (accepts and keeps the rules), kube-scheduler (places a pod
with a ``RestartAllContainers`` rule only on a node that declares the feature) and every kubelet
(runs the restart and declares the feature in ``Node.status.declaredFeatures``).
``ResourceHealthStatus`` (KEP-4680: a device plugin's or DRA driver's device health in the pod
status, ``allocatedResourcesStatus``; kube-apiserver and kubelets) is needed only to recover
from device faults (cause ``DeviceUnhealthy``).
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


def gates_flag(minor: int, *, device_health: bool = False) -> str:
    """``--feature-gates`` value for :func:`gates_needed` (and :func:`device_health_gates`;
    empty when none)."""
    gates = (*gates_needed(minor), *(device_health_gates(minor) if device_health else ()))
    return ",".join(f"{g}=true" for g in gates)
