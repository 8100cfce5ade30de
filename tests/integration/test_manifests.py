"""The install manifests apply to a real apiserver, and the controller's ServiceAccount may do
exactly what the controller does (and not more than needed)."""

from __future__ import annotations

import pytest

from e2e.harness.controlplane import ControlPlane
from e2e.harness.versions import REPO_ROOT

pytestmark = pytest.mark.integration

SA = "system:serviceaccount:jobset-inplace-system:jobset-inplace-controller"

NEEDED = [
    ("watch", "jobsets.jobset.x-k8s.io", None),
    ("list", "pods", None),
    ("delete", "pods", "team-a"),
    ("patch", "pods/status", "team-a"),
    ("patch", "nodes", None),
    ("watch", "leases.coordination.k8s.io", "kube-node-lease"),
    ("create", "gangstates.jobset-inplace.dev", "team-a"),
    ("patch", "gangstates.jobset-inplace.dev/status", "team-a"),
    ("create", "events", "team-a"),
    ("watch", "workloads.kueue.x-k8s.io", None),
]
NOT_GRANTED = [
    ("update", "jobsets.jobset.x-k8s.io", "team-a"),
    ("patch", "jobsets.jobset.x-k8s.io/status", "team-a"),
    ("create", "pods", "team-a"),
    ("get", "secrets", "team-a"),
    ("patch", "workloads.kueue.x-k8s.io/status", "team-a"),
]


def _can(cp: ControlPlane, verb: str, resource: str, namespace: str | None) -> bool:
    resource, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, resource, "--as", SA]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    return cp.kubectl().run(*args, check=False).strip() == "yes"


def test_manifests_apply_and_controller_rbac_is_sufficient_and_least(
    control_plane: ControlPlane,
) -> None:
    kubectl = control_plane.kubectl()
    kubectl.run("apply", "--server-side", "-k", str(REPO_ROOT / "manifests"))
    kubectl.wait_crds_established(["gangstates.jobset-inplace.dev"])
    out = kubectl.run(
        "get", "deployment,serviceaccount", "-n", "jobset-inplace-system", "-o", "name"
    )
    assert "deployment.apps/jobset-inplace-controller" in out
    missing = [n for n in NEEDED if not _can(control_plane, *n)]
    assert not missing, f"controller ServiceAccount lacks {missing}"
    extra = [n for n in NOT_GRANTED if _can(control_plane, *n)]
    assert not extra, f"controller ServiceAccount may {extra}"
