"""Who may do what: the agents' admission policy and permissions, the controller's pod policy, the
Pod Security level of the namespace."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.agent_access import (
    AGENT_BINDING,
    AGENT_BINDING_LABEL,
    AGENT_CLUSTER_ROLE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    RBAC_GROUP,
)

from .result import Check, Result

AGENT_POLICY_HINT = "kubectl apply --server-side -f manifests/rbac/agent-vap.yaml"


def check_agent_policy(
    policy: Mapping[str, Any] | None, binding: Mapping[str, Any] | None
) -> Check:
    """Guarantee 9 needs the apiserver's ValidatingAdmissionPolicy: RBAC alone lets an agent
    patch every pod of its namespace."""
    name = "Agent admission policy"
    unenforced = "an agent may patch any pod its namespace's RBAC allows (least privilege off)"
    if policy is None:
        detail = f"ValidatingAdmissionPolicy {names.AGENT_POLICY} not installed: {unenforced}"
        return Check(name, Result.WARN, detail, AGENT_POLICY_HINT)
    if binding is None:
        detail = f"{names.AGENT_POLICY} installed but not bound: {unenforced}"
        return Check(name, Result.WARN, detail, AGENT_POLICY_HINT)
    actions = (binding.get("spec") or {}).get("validationActions") or []
    if "Deny" not in actions:
        detail = f"{names.AGENT_POLICY} bound with {actions}, not Deny: {unenforced}"
        return Check(name, Result.WARN, detail, AGENT_POLICY_HINT)
    kind = ((policy.get("spec") or {}).get("paramKind") or {}).get("kind")
    ref = (binding.get("spec") or {}).get("paramRef") or {}
    selected = (ref.get("selector") or {}).get("matchLabels") == {AGENT_BINDING_LABEL: "true"}
    if kind != "RoleBinding" or not (selected or ref.get("name") == AGENT_BINDING):
        detail = (
            f"{names.AGENT_POLICY} is an earlier release's: it does not confine the "
            f"ServiceAccounts RoleBinding {AGENT_BINDING} names (JobSets' own accounts)"
        )
        return Check(name, Result.WARN, detail, AGENT_POLICY_HINT)
    if not selected:
        detail = (
            f"{names.AGENT_POLICY} finds its parameter by name (an earlier release): on "
            f"Kubernetes 1.37 the apiserver then fetches RoleBinding {AGENT_BINDING} from the "
            "API for every pod write of every namespace without one, and refuses the write "
            "when that fetch times out"
        )
        return Check(name, Result.WARN, detail, AGENT_POLICY_HINT)
    return Check(
        name,
        Result.PASS,
        f"{names.AGENT_POLICY}: an agent's ServiceAccount patches only its own pod's reports",
    )


CONTROLLER_RBAC_HINT = "kubectl apply --server-side -f manifests/controller/rbac.yaml"


def check_controller_pod_policy(
    policy: Mapping[str, Any] | None, binding: Mapping[str, Any] | None
) -> Check:
    """This release's controller RBAC comes with the policy that confines its ``patch pods``
    to untracking a pod it replaces; without both (an earlier release's RBAC), replacements
    wait for their Job's pod-failure backoff."""
    name = "Controller pod policy"
    slow = (
        "a pod the controller replaces counts as its Job's failure, and the replacement waits "
        "for the Job's backoff (10 s, doubling per replacement)"
    )
    if policy is None or binding is None:
        what = "not installed" if policy is None else "installed but not bound"
        detail = f"ValidatingAdmissionPolicy {names.CONTROLLER_POD_POLICY} {what}: {slow}"
        return Check(name, Result.WARN, detail, CONTROLLER_RBAC_HINT)
    actions = (binding.get("spec") or {}).get("validationActions") or []
    if "Deny" not in actions:
        detail = (
            f"{names.CONTROLLER_POD_POLICY} bound with {actions}, not Deny: the controller's "
            "patch pods is not confined to removing the Job tracking finalizer"
        )
        return Check(name, Result.WARN, detail, CONTROLLER_RBAC_HINT)
    return Check(
        name,
        Result.PASS,
        f"{names.CONTROLLER_POD_POLICY}: the controller untracks the pods it replaces, "
        "nothing else",
    )


def controller_permissions(namespace: str) -> list[dict[str, str]]:
    """What the controller needs in ``namespace`` to give agents their rights there
    (core.agent_access; the same as manifests/controller/rbac.yaml), as SubjectAccessReview
    resourceAttributes."""
    rbac = RBAC_GROUP
    return [
        {"namespace": namespace, "group": "", "resource": "serviceaccounts", "verb": "create"},
        {"namespace": namespace, "group": "", "resource": "serviceaccounts", "verb": "patch"},
        {"namespace": namespace, "group": rbac, "resource": "rolebindings", "verb": "create"},
        {"namespace": namespace, "group": rbac, "resource": "rolebindings", "verb": "patch"},
        {
            "namespace": namespace,
            "group": rbac,
            "resource": "clusterroles",
            "verb": "bind",
            "name": AGENT_CLUSTER_ROLE,
        },
    ]


def service_account_user(namespace: str, name: str) -> tuple[str, list[str]]:
    """A ServiceAccount as the authorizer sees it: user and groups."""
    user = f"system:serviceaccount:{namespace}:{name}"
    return user, [
        "system:serviceaccounts",
        f"system:serviceaccounts:{namespace}",
        "system:authenticated",
    ]


def check_agent_access(
    namespace: str,
    role: Mapping[str, Any] | None,
    denied: Sequence[Mapping[str, str]],
    binding: Mapping[str, Any] | None,
    controller: str,
) -> Check:
    """The agents' rights in ``namespace``: the install's ClusterRole, the controller's right to
    bind it there (``denied``: what ``controller`` may not do), the RoleBinding it keeps."""
    name = "Agent permissions"
    if role is None:
        return Check(
            name,
            Result.FAIL,
            f"no ClusterRole {AGENT_CLUSTER_ROLE}: agents would have no rights to bind",
            "kubectl apply --server-side -f manifests/rbac/agent.yaml",
        )
    if denied:
        what = ", ".join(
            f"{a['verb']} {a['resource']}{'.' + a['group'] if a['group'] else ''}" for a in denied
        )
        return Check(
            name,
            Result.FAIL,
            f"{controller} may not {what} in {namespace}: it cannot give agents their rights",
            "kubectl apply --server-side -f manifests/controller/rbac.yaml",
        )
    if binding is None:
        return Check(
            name,
            Result.PASS,
            f"the controller binds {AGENT_CLUSTER_ROLE} in {namespace} with its first opted-in "
            f"JobSet (RoleBinding {AGENT_BINDING})",
        )
    labels = (binding.get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return Check(
            name,
            Result.FAIL,
            f"RoleBinding {namespace}/{AGENT_BINDING} was not made by the controller: it "
            "leaves it alone, so agents get neither their rights nor their confinement",
            f"kubectl -n {namespace} delete rolebinding {AGENT_BINDING} (the controller makes "
            "its own)",
        )
    accounts = ", ".join(sorted(str(s.get("name")) for s in binding.get("subjects") or []))
    return Check(
        name,
        Result.PASS,
        f"RoleBinding {AGENT_BINDING} gives {AGENT_CLUSTER_ROLE} to {accounts}, their pod "
        "writes confined to their own pods' reports",
    )


PSS_ENFORCE = "pod-security.kubernetes.io/enforce"


def check_pod_security(namespace: str, ns: Mapping[str, Any] | None) -> Check:
    """Informational: the injected agent holds to ``restricted``; under it the trainer must
    too."""
    name = "Pod Security"
    if ns is None:
        return Check(name, Result.FAIL, f"namespace {namespace} not found", "pass -n <namespace>")
    level = ((ns.get("metadata") or {}).get("labels") or {}).get(PSS_ENFORCE, "")
    if level == "restricted":
        return Check(
            name,
            Result.PASS,
            f"{namespace} enforces restricted: the agent complies; trainers must too "
            "(docs/operations.md, A hardened cluster)",
        )
    shown = level or "none (privileged)"
    return Check(name, Result.PASS, f"{namespace} enforces {shown}: the agent complies")
