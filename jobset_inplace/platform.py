"""What each Kubernetes minor needs for the in-place restart path (upstream facts, from
``k8s.io/kubernetes`` ``pkg/features/kube_features.go``; checked on v1.35.4 and v1.37.2).

=================================================  ==========  ==========  =========
feature gate                                       1.35        1.36        1.37
=================================================  ==========  ==========  =========
``ContainerRestartRules``                          beta, on    beta, on    beta, on
``RestartAllContainersOnContainerExits``           alpha, off  beta, on    beta, on
``NodeDeclaredFeatures``                           alpha, off  beta, on    GA (locked on)
=================================================  ==========  ==========  =========

The gates matter on kube-apiserver (accepts and keeps the rules), kube-scheduler (places a pod
with a ``RestartAllContainers`` rule only on a node that declares the feature) and every kubelet
(runs the restart and declares the feature in ``Node.status.declaredFeatures``).
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


def gates_needed(minor: int) -> tuple[str, ...]:
    """The feature gates to switch on for the in-place path on Kubernetes ``1.<minor>``
    (empty from 1.36: on by default)."""
    if minor < MIN_MINOR:
        raise ValueError(f"Kubernetes 1.{minor} has no RestartAllContainers (needs 1.{MIN_MINOR}+)")
    if minor < DEFAULT_ON_MINOR:
        return (RESTART_ALL_FEATURE, NODE_DECLARED_FEATURES)
    return ()


def gates_flag(minor: int) -> str:
    """``--feature-gates`` value for :func:`gates_needed` (empty when none)."""
    return ",".join(f"{g}=true" for g in gates_needed(minor))
