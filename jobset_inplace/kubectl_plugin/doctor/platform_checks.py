"""The cluster itself: its Kubernetes version and in-place restart gates, whether the apiserver
takes a pod's ``RestartAllContainers`` rule (a dry run), what the kubelets declare."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jobset_inplace.platform import (
    DEFAULT_ON_MINOR,
    GATED_COMPONENTS,
    MIN_MINOR,
    RESTART_ALL_FEATURE,
    gates_flag,
)

from .result import Check, Result


def parse_minor(version: Mapping[str, Any]) -> int | None:
    """The minor of a ``/version`` answer (``"37"``, ``"37+"``) when the major is 1."""
    try:
        major = int(re.sub(r"\D.*", "", str(version.get("major") or "")))
        minor = int(re.sub(r"\D.*", "", str(version.get("minor") or "")))
    except ValueError:
        return None
    return minor if major == 1 else None


def _gates_advice(minor: int | None, where: str) -> str:
    """What to do when the in-place path is off, for a cluster at ``1.<minor>``."""
    if minor is not None and MIN_MINOR <= minor < DEFAULT_ON_MINOR:
        return f"1.{minor} needs --feature-gates={gates_flag(minor)} on {where}"
    if minor is not None and minor >= DEFAULT_ON_MINOR:
        return (
            f"{RESTART_ALL_FEATURE} is on by default since 1.{DEFAULT_ON_MINOR}: remove the"
            f" --feature-gates entry that turns it off on {where}"
        )
    return (
        f"enable the {RESTART_ALL_FEATURE} feature gate on {where}"
        f" (on by default from 1.{DEFAULT_ON_MINOR})"
    )


def check_version(version: Mapping[str, Any]) -> Check:
    name = "Kubernetes version"
    git = str(version.get("gitVersion") or "?")
    minor = parse_minor(version)
    if minor is None:
        return Check(name, Result.WARN, f"cannot parse server version {git}", "check by hand")
    if minor < MIN_MINOR:
        return Check(
            name,
            Result.FAIL,
            f"{git} is older than 1.{MIN_MINOR}",
            f"upgrade to Kubernetes 1.{DEFAULT_ON_MINOR}+ (RestartAllContainers is on by default"
            f" there; 1.{MIN_MINOR} has it as alpha)",
        )
    if minor < DEFAULT_ON_MINOR:
        return Check(
            name,
            Result.PASS,
            f"{git}: RestartAllContainers is alpha here; {', '.join(GATED_COMPONENTS)} need"
            f" --feature-gates={gates_flag(minor)} (on by default from 1.{DEFAULT_ON_MINOR})",
        )
    return Check(
        name, Result.PASS, f"{git}: RestartAllContainers on by default (1.{DEFAULT_ON_MINOR}+)"
    )


RESTART_RULE = {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}


def probe_pod() -> dict[str, Any]:
    """A pod with a ``RestartAllContainers`` rule, as the transform injects it (dry-run only)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "jobset-inplace-doctor-"},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "restartPolicy": "Never",
                    "restartPolicyRules": [RESTART_RULE],
                }
            ],
        },
    }


def check_dry_run(
    created: Mapping[str, Any] | None, error: str | None, minor: int | None = None
) -> Check:
    name = "RestartAllContainers"
    gate_hint = _gates_advice(minor, "kube-apiserver")
    if error is not None:
        if re.search(r"restartPolicyRules|RestartAllContainers|restartPolicy", error):
            return Check(name, Result.FAIL, f"rejected by the apiserver: {error}", gate_hint)
        return Check(
            name,
            Result.WARN,
            f"dry-run create failed for another reason: {error}",
            "retry with -n on a namespace where you may create pods",
        )
    containers = ((created or {}).get("spec") or {}).get("containers") or [{}]
    if containers[0].get("restartPolicyRules") == [RESTART_RULE]:
        return Check(name, Result.PASS, "server-side dry-run of a pod with the rule accepted")
    return Check(name, Result.FAIL, "the apiserver dropped restartPolicyRules", gate_hint)


def _kubelet_minor(node: Mapping[str, Any]) -> int | None:
    kubelet = str(((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or "")
    m = re.match(r"v?1\.(\d+)", kubelet)
    return int(m.group(1)) if m else None


def check_declared_features(nodes: Sequence[Mapping[str, Any]]) -> Check:
    """Every node should declare the feature: the scheduler places a pod with a
    ``RestartAllContainers`` rule only on a node that does (``NodeDeclaredFeatures``)."""
    name = "Node declared features"
    missing = [
        n
        for n in nodes
        if RESTART_ALL_FEATURE not in ((n.get("status") or {}).get("declaredFeatures") or [])
    ]
    detail = f"{len(nodes) - len(missing)}/{len(nodes)} nodes declare {RESTART_ALL_FEATURE}"
    if not missing:
        return Check(name, Result.PASS, detail)
    shown = ", ".join(
        f"{(n.get('metadata') or {}).get('name', '?')} (kubelet "
        f"{((n.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion') or '?'})"
        for n in missing[:3]
    )
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    advice: list[str] = []
    for m in sorted({_kubelet_minor(n) for n in missing}, key=lambda m: -1 if m is None else m):
        if m is not None and m < MIN_MINOR:
            line = f"upgrade kubelets older than 1.{MIN_MINOR}"
        else:
            line = _gates_advice(m, "those kubelets")
        if line not in advice:
            advice.append(line)
    if len(missing) == len(nodes):
        return Check(
            name,
            Result.FAIL,
            f"{detail}: pods with the rule cannot be scheduled anywhere ({shown}{more})",
            "; ".join(advice),
        )
    return Check(
        name,
        Result.WARN,
        f"{detail}: opted-in pods only go to the others; not declaring: {shown}{more}",
        "; ".join(advice),
    )
