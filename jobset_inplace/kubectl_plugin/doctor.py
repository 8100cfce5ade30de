"""``doctor``: cluster checks for jobset-inplace. Each check is a pure function of what the API
returned (unit-tested on fixed dicts); :func:`run_checks` gathers the inputs through
:class:`~.cluster.Cluster` and turns API errors into FAIL/SKIP results with a reason."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any, Protocol

from jobset_inplace import names
from jobset_inplace.core.agent_access import (
    AGENT_BINDING,
    AGENT_BINDING_LABEL,
    AGENT_CLUSTER_ROLE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    RBAC_GROUP,
)
from jobset_inplace.core.decode import condition_true, kueue_recovery_timeout
from jobset_inplace.core.policy import (
    Policy,
    barrier_within_kueue,
    kueue_recovery_timeout_needed,
)
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.platform import (
    DEFAULT_ON_MINOR,
    GATED_COMPONENTS,
    MIN_MINOR,
    RESTART_ALL_FEATURE,
    gates_flag,
)
from jobset_inplace.times import parse_time

from .cluster import api_error_message
from .render import fmt_duration, table

JOBSET_CRD = "jobsets.jobset.x-k8s.io"
GANGSTATE_CRD = f"{names.GANGSTATE_PLURAL}.{names.GROUP}"
GANGMEMBERS_CRD = f"{names.GANGMEMBERS_PLURAL}.{names.GROUP}"
KUEUE_CRDS = (
    "clusterqueues.kueue.x-k8s.io",
    "localqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
)
KUEUE_NAMESPACE = names.KUEUE_CONFIG_NAMESPACE
KUEUE_CONFIGMAP = names.KUEUE_CONFIG_MAP
KUEUE_CONFIG_KEY = names.KUEUE_CONFIG_KEY
JOBSET_NAMESPACE = "jobset-system"
CRD_HINT = "kubectl apply --server-side -k manifests/crd  (from the jobset-inplace repository)"


class Result(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Check:
    name: str
    result: Result
    detail: str
    hint: str = ""  # one line: what to do (empty for PASS)


class ClusterReader(Protocol):
    namespace: str

    def server_version(self) -> dict[str, Any]: ...
    def crd(self, name: str) -> dict[str, Any] | None: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def dry_run_pod(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def configmap(self, namespace: str, name: str) -> dict[str, Any]: ...
    def deployment_images(self, namespace: str) -> list[str]: ...
    def admission_policy(self, name: str) -> dict[str, Any] | None: ...
    def admission_policy_binding(self, name: str) -> dict[str, Any] | None: ...
    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def lease(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]: ...
    def dry_run_jobset(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def namespace_object(self, name: str) -> dict[str, Any] | None: ...
    def cluster_role(self, name: str) -> dict[str, Any] | None: ...
    def role_binding(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def allowed(self, user: str, groups: list[str], attributes: dict[str, str]) -> bool: ...
    def pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def pod_proxy_get(self, namespace: str, pod: str, port: int, path: str) -> tuple[int, str]: ...


# --- pure checks ---------------------------------------------------------------------------------
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


def _crd_versions(crd: Mapping[str, Any]) -> list[str]:
    return [v["name"] for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")]


def check_jobset_crd(crd: Mapping[str, Any] | None, images: Sequence[str] = ()) -> Check:
    name = "JobSet CRD"
    if crd is None:
        return Check(
            name,
            Result.FAIL,
            f"{JOBSET_CRD} not found",
            "install JobSet: https://jobset.sigs.k8s.io/docs/installation/",
        )
    versions = ", ".join(_crd_versions(crd)) or "none served"
    controller = next((i for i in images if "jobset" in i), None)
    detail = f"{JOBSET_CRD} (served: {versions})"
    if controller:
        detail += f"; controller image {controller}"
    if "v1alpha2" not in _crd_versions(crd):
        return Check(name, Result.FAIL, detail, "install a JobSet release serving v1alpha2")
    return Check(name, Result.PASS, detail)


def check_gangstate_crd(crd: Mapping[str, Any] | None) -> Check:
    name = "GangState CRD"
    if crd is None:
        return Check(name, Result.FAIL, f"{GANGSTATE_CRD} not installed", CRD_HINT)
    if names.VERSION not in _crd_versions(crd):
        return Check(name, Result.FAIL, f"{names.VERSION} not served", CRD_HINT)
    if not condition_true(crd, "Established"):
        return Check(name, Result.FAIL, "not Established yet", "wait, then check the CRD status")
    return Check(name, Result.PASS, f"{GANGSTATE_CRD} ({names.VERSION}) established")


def check_gangmembers_crd(crd: Mapping[str, Any] | None) -> Check:
    """Optional: without it the controller cannot write what each member reported, and
    ``status -o wide`` shows only reports on pods."""
    name = "GangMembers CRD"
    if crd is None or names.VERSION not in _crd_versions(crd):
        detail = f"{GANGMEMBERS_CRD} ({names.VERSION}) not installed: status -o wide shows "
        return Check(name, Result.WARN, detail + "only what agents wrote on their pods", CRD_HINT)
    return Check(name, Result.PASS, f"{GANGMEMBERS_CRD} ({names.VERSION}) installed")


def check_kueue_crds(present: Mapping[str, bool]) -> Check:
    name = "Kueue CRDs"
    found = sorted(n for n, ok in present.items() if ok)
    if len(found) == len(present):
        return Check(name, Result.PASS, "Kueue installed")
    if not found:
        return Check(
            name,
            Result.WARN,
            "Kueue not installed (optional: quotas and gang admission)",
            "install Kueue if you queue JobSets: https://kueue.sigs.k8s.io/docs/installation/",
        )
    missing = sorted(n for n, ok in present.items() if not ok)
    return Check(
        name, Result.WARN, f"partial Kueue install, missing {', '.join(missing)}", "reinstall Kueue"
    )


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


# a check of an admission policy and its binding (None: not there)
PolicyCheck = Callable[[Mapping[str, Any] | None, Mapping[str, Any] | None], Check]

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


def check_kueue_recovery(config_text: str | None, barrier_timeout_s: float, why: str = "") -> Check:
    """Kueue's ``waitForPodsReady.recoveryTimeout`` (read as the controller reads it, with
    Kueue's defaults) must leave the barrier timeout whole: the controller cuts the barrier to
    fit two deadlines in 80 % of it (:func:`~jobset_inplace.core.policy.barrier_within_kueue`)."""
    name = "Kueue recoveryTimeout"
    if config_text is None:
        return Check(name, Result.SKIP, why or "Kueue configuration not readable")
    try:
        recovery_s = kueue_recovery_timeout(config_text)
    except ValueError as e:
        return Check(name, Result.SKIP, f"cannot read Kueue's configuration: {e}")
    if recovery_s is None:
        return Check(name, Result.PASS, "waitForPodsReady off: Kueue never evicts a recovery")
    used = barrier_within_kueue(barrier_timeout_s, recovery_s)
    detail = (
        f"recoveryTimeout {fmt_duration(recovery_s)} vs barrier-timeout "
        f"{fmt_duration(barrier_timeout_s)} (two deadlines must fit in 80 % of it)"
    )
    if used >= barrier_timeout_s:
        return Check(name, Result.PASS, detail)
    needed = kueue_recovery_timeout_needed(barrier_timeout_s)
    return Check(
        name,
        Result.WARN,
        f"{detail}: the controller cuts the barrier timeout to {fmt_duration(used)}",
        f"set waitForPodsReady.recoveryTimeout >= {fmt_duration(needed)} "
        "or lower jobset-inplace.dev/barrier-timeout",
    )


# --- the install: controller, leader, webhook, agent rights, Pod Security, channel -------------
def check_controller(deployment: Mapping[str, Any] | None, namespace: str) -> Check:
    name = "Controller"
    where = f"{namespace}/{names.CONTROLLER_NAME}"
    hint = f"kubectl -n {namespace} describe deployment {names.CONTROLLER_NAME}"
    if deployment is None:
        return Check(
            name,
            Result.FAIL,
            f"Deployment {where} not found",
            "install the controller (docs/operations.md#install), or pass --controller-namespace",
        )
    status = deployment.get("status") or {}
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    ready = int(status.get("readyReplicas") or 0)
    detail = f"Deployment {where}: {ready}/{wanted} replicas ready"
    if ready == 0:
        return Check(name, Result.FAIL, detail, hint)
    if ready < wanted:
        return Check(name, Result.WARN, f"{detail} (no standby for a failover)", hint)
    return Check(name, Result.PASS, detail)


def leader_pod(holder: str) -> str:
    """The pod a candidate identity names (``<pod>_<random>``, runtime.leader_election)."""
    return holder.rpartition("_")[0] or holder


def check_leader(
    lease: Mapping[str, Any] | None, server_now: float | None, namespace: str
) -> Check:
    """A live leader: the Lease has a holder renewed within its duration, by the apiserver's
    clock (``server_now``, from its ``Date`` header; None: this machine's is not used)."""
    name = "Leader"
    where = f"{namespace}/{names.CONTROLLER_NAME}"
    hint = f"kubectl -n {namespace} logs deployment/{names.CONTROLLER_NAME}"
    if lease is None:
        return Check(name, Result.FAIL, f"Lease {where} not found: no replica ever led", hint)
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    if not holder:
        return Check(name, Result.FAIL, f"Lease {where} has no holder (released)", hint)
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is None or server_now is None:
        return Check(name, Result.WARN, f"{holder} holds {where}; its age is unknown", hint)
    age = max(0.0, server_now - renewed)
    detail = f"{leader_pod(holder)} holds {where}, renewed {age:.0f}s ago (duration {duration:g}s)"
    if age > duration + 1:  # (the Date header has whole seconds)
        return Check(name, Result.FAIL, f"{detail}: expired, no live leader", hint)
    return Check(name, Result.PASS, detail)


def probe_jobset(suffix: str) -> dict[str, Any]:
    """An opted-in JobSet, for a server-side dry run of its create: the webhook must add the
    agent. Named (the webhook needs a name: no generateName), ``suffix`` keeps it apart from
    any real one."""
    pod = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "trainer", "image": "registry.k8s.io/pause:3.10", "command": ["/pause"]}
        ],
    }
    job = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": f"jobset-inplace-doctor-{suffix}",
            "annotations": {names.ENABLED: "true"},
        },
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}]},
    }


def _has_agent(jobset: Mapping[str, Any]) -> bool:
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get(
            "spec"
        ) or {}
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            if c.get("name") == AGENT_CONTAINER:
                return True
    return False


def check_webhook(created: Mapping[str, Any] | None, error: str | None, namespace: str) -> Check:
    name = "Webhook"
    what = f"server-side dry run of an opted-in JobSet in {namespace}"
    if error is not None:
        return Check(
            name,
            Result.FAIL,
            f"{what} refused: {error}",
            "check the controller's pods and the jobset-inplace-webhook Service's endpoints",
        )
    if created is not None and _has_agent(created):
        return Check(name, Result.PASS, f"{what}: the agent was added")
    return Check(
        name,
        Result.FAIL,
        f"{what}: accepted without the agent (the mutating webhook did not run)",
        "kubectl get mutatingwebhookconfiguration jobset-inplace-webhook -o yaml "
        "(namespaceSelector, objectSelector)",
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


def channel_port(pod: Mapping[str, Any] | None) -> int:
    """The leader pod's report channel port (its container port named ``reports``)."""
    for c in ((pod or {}).get("spec") or {}).get("containers") or []:
        for port in c.get("ports") or []:
            if port.get("name") == "reports":
                return int(port["containerPort"])
    return names.DEFAULT_REPORT_PORT


def check_channel(status: int, body: str, where: str) -> Check:
    """The leader's report channel answered a GET through the apiserver's pod proxy: the
    channel refuses it (405, its own JSON), which shows it listens and speaks TLS."""
    name = "Report channel"
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status == 405 and isinstance(answer, dict) and "POST" in str(answer.get("error")):
        return Check(name, Result.PASS, f"{where} answers (through the apiserver's pod proxy)")
    said = (
        str((answer or {}).get("message") or body)[:200] if isinstance(answer, dict) else body[:200]
    )
    return Check(
        name,
        Result.WARN,
        f"{where} did not answer through the apiserver's pod proxy ({status}: {said})",
        "agents then report on their pods (more API writes): check the leader's log; a "
        "NetworkPolicy that admits only agent pods blocks this probe, not agents",
    )


# --- gathering -----------------------------------------------------------------------------------
def _safe(name: str, hint: str, fn: Callable[[], Check]) -> Check:
    """``fn``'s check; an API error is a FAIL, except a refusal of the reader's own rights
    (401/403): that says nothing of the cluster, so the check is SKIPped with the reason."""
    try:
        return fn()
    except Exception as e:
        if getattr(e, "status", None) in (401, 403):
            return Check(name, Result.SKIP, f"not allowed to check: {api_error_message(e)}", hint)
        return Check(name, Result.FAIL, f"API error: {api_error_message(e)}", hint)


def run_checks(
    c: ClusterReader,
    barrier_timeout_s: float | None = None,
    controller_namespace: str = names.INSTALL_NAMESPACE,
) -> list[Check]:
    barrier = Policy().barrier_timeout_s if barrier_timeout_s is None else barrier_timeout_s
    server: dict[str, Any] = {}

    def version() -> Check:
        server.update(c.server_version())
        return check_version(server)

    checks = [_safe("Kubernetes version", "check the kubeconfig", version)]
    minor = parse_minor(server) if server else None

    def dry_run() -> Check:
        try:
            created = c.dry_run_pod(probe_pod())
        except Exception as e:
            if getattr(e, "status", None) is None:  # not an API answer: let _safe report it
                raise
            return check_dry_run(None, api_error_message(e), minor)
        return check_dry_run(created, None, minor)

    checks.append(_safe("RestartAllContainers", "check the kubeconfig", dry_run))

    def jobset() -> Check:
        crd = c.crd(JOBSET_CRD)
        images: list[str] = []
        if crd is not None:
            try:
                images = c.deployment_images(JOBSET_NAMESPACE)
            except Exception:
                images = []  # the version is a nicety; not being allowed to see it is fine
        return check_jobset_crd(crd, images)

    checks.append(_safe("JobSet CRD", "check the kubeconfig", jobset))
    checks.append(
        _safe("GangState CRD", CRD_HINT, lambda: check_gangstate_crd(c.crd(GANGSTATE_CRD)))
    )
    checks.append(
        _safe("GangMembers CRD", CRD_HINT, lambda: check_gangmembers_crd(c.crd(GANGMEMBERS_CRD))),
    )

    def policy_check(policy: str, check: PolicyCheck) -> Callable[[], Check]:
        return lambda: check(c.admission_policy(policy), c.admission_policy_binding(policy))

    for title, policy, check in (
        ("Agent admission policy", names.AGENT_POLICY, check_agent_policy),
        ("Controller pod policy", names.CONTROLLER_POD_POLICY, check_controller_pod_policy),
    ):
        checks.append(_safe(title, "check the kubeconfig", policy_check(policy, check)))
    kueue_present: dict[str, bool] = {}

    def kueue() -> Check:
        for n in KUEUE_CRDS:
            kueue_present[n] = c.crd(n) is not None
        return check_kueue_crds(kueue_present)

    kueue_check = _safe("Kueue CRDs", "check the kubeconfig", kueue)
    if kueue_check.result == Result.FAIL:  # Kueue is optional: never a FAIL
        kueue_check = Check(kueue_check.name, Result.WARN, kueue_check.detail, kueue_check.hint)
    checks.append(kueue_check)
    checks.append(
        _safe(
            "Node declared features",
            "check the kubeconfig",
            lambda: check_declared_features(c.nodes()),
        )
    )

    def recovery() -> Check:
        if not any(kueue_present.values()):
            return check_kueue_recovery(None, barrier, "Kueue not installed")
        try:
            cm = c.configmap(KUEUE_NAMESPACE, KUEUE_CONFIGMAP)
        except Exception as e:
            where = f"ConfigMap {KUEUE_NAMESPACE}/{KUEUE_CONFIGMAP}"
            return check_kueue_recovery(
                None, barrier, f"cannot read {where}: {api_error_message(e)}"
            )
        text = (cm.get("data") or {}).get(KUEUE_CONFIG_KEY)
        why = f"ConfigMap {KUEUE_NAMESPACE}/{KUEUE_CONFIGMAP} has no {KUEUE_CONFIG_KEY}"
        return check_kueue_recovery(text, barrier, why)

    checks.append(_safe("Kueue recoveryTimeout", "check the kubeconfig", recovery))
    checks += install_checks(c, controller_namespace)
    return checks


def install_checks(c: ClusterReader, controller_namespace: str) -> list[Check]:
    """The install itself, live: the controller and its leader, the webhook, the agent's rights
    and the Pod Security level in ``c.namespace``, the leader's report channel."""
    ns = c.namespace
    hint = "check the kubeconfig (these checks read the controller's namespace)"
    checks = [
        _safe(
            "Controller",
            hint,
            lambda: check_controller(
                c.deployment(controller_namespace, names.CONTROLLER_NAME), controller_namespace
            ),
        )
    ]
    holder: list[str] = []

    def leader() -> Check:
        lease, date = c.lease(controller_namespace, names.CONTROLLER_NAME)
        if lease is not None:
            holder.append(str((lease.get("spec") or {}).get("holderIdentity") or ""))
        server_now = parsedate_to_datetime(date).timestamp() if date else None
        return check_leader(lease, server_now, controller_namespace)

    checks.append(_safe("Leader", hint, leader))

    def webhook() -> Check:
        try:
            created = c.dry_run_jobset(probe_jobset(secrets.token_hex(4)))
        except Exception as e:
            if getattr(e, "status", None) is None:
                raise
            return check_webhook(None, api_error_message(e), ns)
        return check_webhook(created, None, ns)

    checks.append(_safe("Webhook", "check the kubeconfig (-n: a namespace for JobSets)", webhook))

    def agent() -> Check:
        controller = service_account_user(controller_namespace, names.CONTROLLER_NAME)
        denied = [a for a in controller_permissions(ns) if not c.allowed(*controller, a)]
        return check_agent_access(
            ns,
            c.cluster_role(AGENT_CLUSTER_ROLE),
            denied,
            c.role_binding(ns, AGENT_BINDING),
            controller[0],
        )

    checks.append(_safe("Agent permissions", "SubjectAccessReviews need create on them", agent))
    checks.append(
        _safe("Pod Security", hint, lambda: check_pod_security(ns, c.namespace_object(ns)))
    )

    def channel() -> Check:
        pod_name = leader_pod(holder[0]) if holder and holder[0] else ""
        if not pod_name:
            return Check("Report channel", Result.SKIP, "no leader to ask")
        pod = c.pod(controller_namespace, pod_name)
        if pod is None:
            return Check(
                "Report channel",
                Result.SKIP,
                f"the leader {pod_name} is not a pod in {controller_namespace} (run elsewhere?)",
            )
        port = channel_port(pod)
        status, body = c.pod_proxy_get(controller_namespace, pod_name, port, names.REPORT_PATH)
        return check_channel(status, body, f"{pod_name}:{port}")

    checks.append(_safe("Report channel", hint, channel))
    return checks


def failed(checks: Sequence[Check]) -> bool:
    return any(ch.result == Result.FAIL for ch in checks)


def render_checks(checks: Sequence[Check]) -> str:
    rows = [["CHECK", "RESULT", "DETAIL"]]
    for ch in checks:
        rows.append([ch.name, ch.result.value, ch.detail])
    lines = table(rows).splitlines()
    out = [lines[0]]
    for line, ch in zip(lines[1:], checks, strict=True):
        out.append(line)
        if ch.hint and ch.result != Result.PASS:
            out.append(f"    fix: {ch.hint}")
    n_fail = sum(ch.result == Result.FAIL for ch in checks)
    n_warn = sum(ch.result == Result.WARN for ch in checks)
    out.append("")
    out.append(f"{n_fail} failed, {n_warn} warnings, {len(checks)} checks")
    return "\n".join(out) + "\n"


def checks_document(checks: Sequence[Check]) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "DoctorReport",
        "checks": [{**asdict(ch), "result": ch.result.value} for ch in checks],
        "failed": failed(checks),
    }
