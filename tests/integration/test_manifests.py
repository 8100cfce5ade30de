"""The install manifests apply to a real apiserver, and the controller's ServiceAccount may do
exactly what the controller does (and not more than needed)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from testbed.controlplane import ControlPlane
from testbed.kube import Clients, wait_for
from testbed.kubectl import Kubectl, kustomize
from testbed.versions import REPO_ROOT

pytestmark = pytest.mark.integration

SA = "system:serviceaccount:jobset-inplace-system:jobset-inplace-controller"

# (verb, resource[/subresource], namespace or None for cluster scope[, object name])
Access = tuple[str, str, str | None] | tuple[str, str, str | None, str]

NEEDED: list[Access] = [
    ("watch", "jobsets.jobset.x-k8s.io", None),
    ("list", "pods", None),
    ("delete", "pods", "team-a"),
    ("patch", "pods/status", "team-a"),
    ("patch", "pods", "team-a"),  # only to untrack a pod: its admission policy (below)
    ("watch", "jobs.batch", None),
    ("patch", "nodes", None),
    ("watch", "leases.coordination.k8s.io", "kube-node-lease"),
    ("create", "gangstates.jobset-inplace.dev", "team-a"),
    ("patch", "gangstates.jobset-inplace.dev/status", "team-a"),
    ("create", "events", "team-a"),
    # the agents' access (core/agent_access.py)
    ("create", "serviceaccounts", "team-a"),
    ("patch", "serviceaccounts", "team-a", "jobset-inplace-agent"),
    ("create", "rolebindings.rbac.authorization.k8s.io", "team-a"),
    ("patch", "rolebindings.rbac.authorization.k8s.io", "team-a", "jobset-inplace-agents"),
    ("bind", "clusterroles.rbac.authorization.k8s.io", "team-a", "jobset-inplace-agent"),
    ("watch", "workloads.kueue.x-k8s.io", None),
    ("create", "leases.coordination.k8s.io", "jobset-inplace-system"),
    ("update", "leases.coordination.k8s.io", "jobset-inplace-system", "jobset-inplace-controller"),
    ("get", "secrets", "jobset-inplace-system", "jobset-inplace-webhook-tls"),
    ("update", "secrets", "jobset-inplace-system", "jobset-inplace-webhook-tls"),
    (
        "update",
        "mutatingwebhookconfigurations.admissionregistration.k8s.io",
        None,
        "jobset-inplace-webhook",
    ),
    (
        "update",
        "validatingwebhookconfigurations.admissionregistration.k8s.io",
        None,
        "jobset-inplace-webhook",
    ),
]
NOT_GRANTED: list[Access] = [
    ("bind", "clusterroles.rbac.authorization.k8s.io", "team-a", "admin"),
    ("bind", "roles.rbac.authorization.k8s.io", "team-a", "any"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", None, "jobset-inplace-agent"),
    ("create", "serviceaccounts/token", "team-a", "jobset-inplace-agent"),
    ("delete", "rolebindings.rbac.authorization.k8s.io", "team-a", "jobset-inplace-agents"),
    ("update", "jobsets.jobset.x-k8s.io", "team-a"),
    ("patch", "jobsets.jobset.x-k8s.io/status", "team-a"),
    ("create", "pods", "team-a"),
    ("delete", "jobs.batch", "team-a"),
    ("get", "secrets", "team-a"),
    ("patch", "workloads.kueue.x-k8s.io/status", "team-a"),
    ("update", "leases.coordination.k8s.io", "kube-node-lease", "node-1"),
    ("update", "leases.coordination.k8s.io", "jobset-inplace-system", "another-lease"),
    ("get", "secrets", "jobset-inplace-system", "another-secret"),
    ("list", "secrets", "jobset-inplace-system"),
    ("update", "validatingwebhookconfigurations.admissionregistration.k8s.io", None, "other"),
]


def _can(
    kube: Clients, verb: str, resource: str, namespace: str | None, object_name: str = ""
) -> bool:
    """A SubjectAccessReview (works for resources whose CRD is not installed here)."""
    resource, _, sub = resource.partition("/")
    plural, _, group = resource.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": SA,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:jobset-inplace-system"],
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": plural,
                "subresource": sub,
                "namespace": namespace or "",
                "name": object_name,
            },
        },
    }
    out = client.AuthorizationV1Api(kube.api).create_subject_access_review(review)
    return bool(out.status.allowed)


def _patch_pods_only_untracks(kube: Clients, namespace: str) -> None:
    """The controller's ``patch pods`` as its admission policy narrows it: it may remove a
    pod's Job tracking finalizer and change nothing else (checked as its ServiceAccount)."""
    keep = "example.com/keep"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "member",
            "labels": {"app": "trainer"},
            "finalizers": [keep, names.JOB_TRACKING_FINALIZER],
        },
        "spec": {
            "nodeName": "node-1",
            "automountServiceAccountToken": False,
            "containers": [{"name": "trainer", "image": "trainer:local"}],
        },
    }
    kube.core.create_namespaced_pod(namespace, pod)
    api = client.ApiClient(kube.api.configuration)
    api.set_default_header("Impersonate-User", SA)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    as_controller = client.CoreV1Api(api)

    def refusal(patch: Any) -> str | None:
        """Why the controller may not make ``patch``; None if it went through."""
        try:
            as_controller.patch_namespaced_pod("member", namespace, patch)
        except client.ApiException as e:
            if e.status != 403:
                raise
            return str(e.body)
        return None

    try:
        # (the policy takes effect a moment after it is created: its first refusal is awaited)
        n = iter(range(10**6))
        why = wait_for(
            "the controller's pod policy in effect",
            lambda: refusal({"metadata": {"annotations": {"a": str(next(n))}}}),
            30,
        )
        assert "may only remove the batch.kubernetes.io/job-tracking finalizer" in why
        for patch in (
            {"metadata": {"labels": {"app": "other"}}},
            {"spec": {"containers": [{"name": "trainer", "image": "other:local"}]}},
            [{"op": "remove", "path": "/metadata/finalizers/0"}],  # another finalizer
            [{"op": "remove", "path": "/metadata/finalizers"}],  # both
        ):
            assert refusal(patch), patch
        as_controller.patch_namespaced_pod(
            "member", namespace, [{"op": "remove", "path": "/metadata/finalizers/1"}]
        )
        left = kube.core.read_namespaced_pod("member", namespace)
        assert left.metadata.finalizers == [keep]
        assert left.metadata.labels == {"app": "trainer"}
    finally:
        kube.core.patch_namespaced_pod(
            "member", namespace, [{"op": "replace", "path": "/metadata/finalizers", "value": []}]
        )


def _uninstall_but_the_crd(kubectl: Kubectl, kube: Clients) -> None:
    """Delete what the install applied, except the GangState CRD, which the other tests of this
    session's plane use (its ``gangstate_crd`` fixture applies it once). With no controller
    behind them, the webhook configurations (failurePolicy Fail) would refuse every opted-in
    JobSet later tests create, and the agent's ValidatingAdmissionPolicy judge their pods."""
    objs = [o for o in yaml.safe_load_all(kustomize(REPO_ROOT / "manifests")) if o]
    rest = [o for o in objs if o["kind"] not in ("CustomResourceDefinition", "Namespace")]
    kubectl.run(
        "delete", "-f", "-", "--ignore-not-found", "--timeout=60s", stdin=yaml.safe_dump_all(rest)
    )
    # No namespace controller here: the namespace, emptied above, is finalized as it would be
    # (else it stays Terminating for the rest of the session).
    ns = names.INSTALL_NAMESPACE
    or_none(kube.core.delete_namespace, ns)
    finalized = client.V1Namespace(
        metadata=client.V1ObjectMeta(name=ns), spec=client.V1NamespaceSpec(finalizers=[])
    )
    or_none(kube.core.replace_namespace_finalize, ns, finalized)
    wait_for(f"namespace {ns} gone", lambda: or_none(kube.core.read_namespace, ns) is None, 30)


def test_manifests_apply_and_controller_rbac_is_sufficient_and_least(
    control_plane: ControlPlane, kube: Clients, namespace: str
) -> None:
    kubectl = control_plane.kubectl()
    kubectl.run("apply", "--server-side", "-k", str(REPO_ROOT / "manifests"))
    try:
        kubectl.wait_crds_established(["gangstates.jobset-inplace.dev"])
        out = kubectl.run(
            "get", "deployment,serviceaccount", "-n", "jobset-inplace-system", "-o", "name"
        )
        assert "deployment.apps/jobset-inplace-controller" in out
        missing = [n for n in NEEDED if not _can(kube, *n)]
        assert not missing, f"controller ServiceAccount lacks {missing}"
        extra = [n for n in NOT_GRANTED if _can(kube, *n)]
        assert not extra, f"controller ServiceAccount may {extra}"
        _patch_pods_only_untracks(kube, namespace)
    finally:
        _uninstall_but_the_crd(kubectl, kube)
