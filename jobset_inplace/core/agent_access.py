"""What the agents of a namespace need from the API, decided: no per-namespace setup by hand.

The agent reads its GangState and patches its own pod (guarantee 9); it does so with the token
of the ServiceAccount its pod runs as: ``jobset-inplace-agent`` (the webhook's default for pods
that name none) or the JobSet's own. For every namespace with opted-in JobSets the controller
keeps two objects, both owned by those JobSets (garbage-collected with the last one):

* the ServiceAccount ``jobset-inplace-agent`` (pods that name none run as it);
* the RoleBinding ``jobset-inplace-agents`` to the ClusterRole ``jobset-inplace-agent`` (the
  install's), its subjects every ServiceAccount those JobSets' pods run as.

That RoleBinding is also the parameter of the agents' admission policy
(``manifests/rbac/agent-vap.yaml``), found by its label ``jobset-inplace.dev/agent-binding``:
whoever it names may write pods of its namespace only as an agent does (its own pod, only
``jobset-inplace.dev/`` annotations), whatever other rights it holds. By label, not by name:
Kubernetes 1.37's apiserver GETs a parameter named in the binding from the API whenever its
cache does not hold it, i.e. for every pod write in every namespace without this RoleBinding,
before the policy's conditions; under load those GETs time out and the policy (failure policy
Fail) refused the scheduler's and kubelets' pod writes (seen in the 1000-pod benchmark:
k8s.io/apiserver v0.37.2 ``generic/policy_dispatcher.go``, ``getParamDirectly``). A selector
is answered from the cache alone. So least privilege holds whatever ServiceAccount a JobSet
uses; ``default`` is refused at admission (every pod of the namespace that names none runs as
it).

Objects of those names that the controller did not make (no ``managed-by`` label) are left
alone and reported, never taken over or deleted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobset_inplace import names

AGENT_SERVICE_ACCOUNT = "jobset-inplace-agent"
AGENT_CLUSTER_ROLE = "jobset-inplace-agent"
AGENT_BINDING = "jobset-inplace-agents"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "jobset-inplace-controller"
# Marks the RoleBinding the agents' admission policy takes as its parameter (its binding's
# paramRef selects it; manifests/rbac/agent-vap.yaml)
AGENT_BINDING_LABEL = f"{names.PREFIX}agent-binding"
RBAC_GROUP = "rbac.authorization.k8s.io"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# The one ServiceAccount a JobSet may not name: every pod of its namespace that names none runs
# as it, and the binding's subjects are confined by the admission policy.
SHARED_SERVICE_ACCOUNT = "default"


def agent_cluster_role() -> dict[str, Any]:
    """The agent's rights (bound per namespace by the controller): read GangStates, patch pods
    (the admission policy narrows that to its own pod's jobset-inplace.dev/ annotations)."""
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": AGENT_CLUSTER_ROLE},
        "rules": [
            {
                "apiGroups": [names.GROUP],
                "resources": [names.GANGSTATE_PLURAL],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        ],
    }


def pod_service_account(pod_spec: Mapping[str, Any]) -> str | None:
    """The ServiceAccount a pod spec names (``serviceAccountName``, or the deprecated
    ``serviceAccount``); None when it names none."""
    return pod_spec.get("serviceAccountName") or pod_spec.get("serviceAccount") or None


def jobset_service_accounts(jobset: Mapping[str, Any]) -> frozenset[str]:
    """The ServiceAccounts an (admitted, so prepared) JobSet's pods run as."""
    out: set[str] = set()
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
        out.add(pod_service_account(pod or {}) or AGENT_SERVICE_ACCOUNT)
    return frozenset(out)


@dataclass(frozen=True, order=True)
class Owner:
    """An opted-in JobSet of the namespace, and the ServiceAccounts its pods run as."""

    name: str
    uid: str
    service_accounts: frozenset[str]

    @classmethod
    def of(cls, jobset: Mapping[str, Any]) -> Owner:
        meta = jobset.get("metadata") or {}
        return cls(str(meta.get("name")), str(meta.get("uid")), jobset_service_accounts(jobset))


@dataclass(frozen=True)
class Write:
    """One object to create, or to merge-patch (``patch``: only what must change)."""

    kind: str  # "ServiceAccount" | "RoleBinding"
    create: bool
    body: dict[str, Any]


@dataclass(frozen=True)
class AccessPlan:
    writes: tuple[Write, ...]
    conflicts: tuple[str, ...]  # objects of our names we did not make: left alone, reported


def _meta(name: str, namespace: str, owners: Sequence[Owner]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        "ownerReferences": [
            {"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "name": o.name, "uid": o.uid}
            for o in owners
        ],
    }


def desired_service_account(namespace: str, owners: Sequence[Owner]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(AGENT_SERVICE_ACCOUNT, namespace, owners),
    }


def desired_binding(namespace: str, owners: Sequence[Owner]) -> dict[str, Any]:
    accounts = sorted({AGENT_SERVICE_ACCOUNT}.union(*(o.service_accounts for o in owners)))
    meta = _meta(AGENT_BINDING, namespace, owners)
    meta["labels"][AGENT_BINDING_LABEL] = "true"
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": AGENT_CLUSTER_ROLE},
        "subjects": [
            {"kind": "ServiceAccount", "name": a, "namespace": namespace} for a in accounts
        ],
    }


def account_before_pods(namespace: str, jobset: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ServiceAccount to make while ``jobset`` is admitted, before any of its pods exist:
    ours, if some of its pods run as it (they name none). Pods whose account does not exist
    yet are refused by the apiserver ("error looking up service account") and made again only
    by the Job controller's retry, so the namespace's first JobSet would race the keeper's
    watch. It has no owner yet (the JobSet has no UID before it is stored); the keeper adds
    the JobSet as its owner as for any other, and leaves an account of that name made by hand
    as it is. A JobSet refused after this admission leaves it ownerless: it grants nothing
    (only the binding does)."""
    if AGENT_SERVICE_ACCOUNT not in jobset_service_accounts(jobset):
        return None
    return desired_service_account(namespace, ())


def _ours(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY)


def _write(
    kind: str, want: dict[str, Any], have: Mapping[str, Any] | None, fields: Iterable[str]
) -> Write | None:
    if have is None:
        return Write(kind, True, want)
    patch: dict[str, Any] = {}
    have_meta = have.get("metadata") or {}
    owners = want["metadata"]["ownerReferences"]
    if _owner_uids(have_meta.get("ownerReferences")) != _owner_uids(owners):
        patch["metadata"] = {"ownerReferences": owners}
    labels = have_meta.get("labels") or {}
    missing = {k: v for k, v in want["metadata"]["labels"].items() if labels.get(k) != v}
    if missing:  # (a binding of an earlier release has no agent-binding label)
        patch.setdefault("metadata", {})["labels"] = missing
    for f in fields:
        if have.get(f) != want[f]:
            patch[f] = want[f]
    return Write(kind, False, patch) if patch else None


def _owner_uids(refs: Any) -> list[tuple[str, str]]:
    return sorted((str(r.get("name")), str(r.get("uid"))) for r in refs or [])


def plan_access(
    namespace: str,
    owners: Iterable[Owner],
    service_account: Mapping[str, Any] | None,
    binding: Mapping[str, Any] | None,
) -> AccessPlan:
    """What to write so that the agents of ``namespace`` have what they need, from its
    opted-in JobSets (``owners``) and the two objects as read (None: absent).

    No owners: nothing (the garbage collector removes both with their last owner; writing an
    empty owner list would orphan them instead). An object of our name without our label is
    never written: a conflict to report (a binding we did not make would neither grant what
    the agents need nor name whom the policy confines)."""
    ordered = sorted(set(owners))
    if not ordered:
        return AccessPlan((), ())
    writes: list[Write] = []
    conflicts: list[str] = []
    if binding is not None and not _ours(binding):
        conflicts.append(
            f"RoleBinding {namespace}/{AGENT_BINDING} exists and was not made by the "
            f"controller (no {MANAGED_BY_LABEL}={MANAGED_BY} label): left alone; delete it "
            "and the controller makes its own"
        )
    else:
        want = desired_binding(namespace, ordered)
        if binding is not None and binding.get("roleRef") != want["roleRef"]:
            conflicts.append(
                f"RoleBinding {namespace}/{AGENT_BINDING} refers to another role "
                f"({(binding.get('roleRef') or {}).get('name')}): a roleRef cannot change; "
                "delete it and the controller makes it anew"
            )
        elif (w := _write("RoleBinding", want, binding, ("subjects",))) is not None:
            writes.append(w)
    if service_account is None or _ours(service_account):
        # an account made by hand (the manifests of earlier releases) serves as it is
        want = desired_service_account(namespace, ordered)
        if (w := _write("ServiceAccount", want, service_account, ())) is not None:
            writes.append(w)
    # the account first: pods wait for it, the binding only for their agents' first reads
    writes.sort(key=lambda w: w.kind != "ServiceAccount")
    return AccessPlan(tuple(writes), tuple(conflicts))
