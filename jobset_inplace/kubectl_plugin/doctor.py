"""``doctor``: cluster checks for jobset-inplace. Each check is a pure function of what the API
returned (unit-tested on fixed dicts); :func:`run_checks` gathers the inputs through
:class:`~.cluster.Cluster` and turns API errors into FAIL/SKIP results with a reason."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Protocol

from jobset_inplace import names
from jobset_inplace.core.decode import condition_true, kueue_recovery_timeout
from jobset_inplace.core.policy import (
    Policy,
    barrier_within_kueue,
    kueue_recovery_timeout_needed,
)
from jobset_inplace.platform import (
    DEFAULT_ON_MINOR,
    GATED_COMPONENTS,
    MIN_MINOR,
    RESTART_ALL_FEATURE,
    gates_flag,
)

from .cluster import api_error_message
from .render import fmt_duration, table

JOBSET_CRD = "jobsets.jobset.x-k8s.io"
GANGSTATE_CRD = f"{names.GANGSTATE_PLURAL}.{names.GROUP}"
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
    return Check(name, Result.PASS, f"{names.AGENT_POLICY}: an agent patches only its own pod")


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


# --- gathering -----------------------------------------------------------------------------------
def _safe(name: str, hint: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as e:
        return Check(name, Result.FAIL, f"API error: {api_error_message(e)}", hint)


def run_checks(c: ClusterReader, barrier_timeout_s: float | None = None) -> list[Check]:
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
        _safe(
            "Agent admission policy",
            "check the kubeconfig",
            lambda: check_agent_policy(
                c.admission_policy(names.AGENT_POLICY),
                c.admission_policy_binding(names.AGENT_POLICY),
            ),
        )
    )
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
