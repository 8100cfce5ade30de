"""``doctor``: cluster checks for jobset-inplace, one module per area (:mod:`.platform_checks`,
:mod:`.crds`, :mod:`.access`, :mod:`.install`). Each check is a pure function of what the API
returned (unit-tested on fixed dicts); :func:`run_checks` gathers the inputs through
:class:`~jobset_inplace.kubectl_plugin.cluster.Cluster` and turns API errors into FAIL/SKIP
results with a reason."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import asdict
from email.utils import parsedate_to_datetime
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.agent_access import AGENT_BINDING, AGENT_CLUSTER_ROLE
from jobset_inplace.core.policy import Policy

from ..cluster import api_error_message
from ..render import table
from .access import (
    check_agent_access,
    check_agent_policy,
    check_controller_pod_policy,
    check_pod_security,
    controller_permissions,
    service_account_user,
)
from .crds import (
    CRD_HINT,
    GANGMEMBERS_CRD,
    GANGSTATE_CRD,
    JOBSET_CRD,
    JOBSET_NAMESPACE,
    KUEUE_CONFIG_KEY,
    KUEUE_CONFIGMAP,
    KUEUE_CRDS,
    KUEUE_NAMESPACE,
    check_gangmembers_crd,
    check_gangstate_crd,
    check_jobset_crd,
    check_kueue_crds,
    check_kueue_recovery,
)
from .install import (
    channel_port,
    check_channel,
    check_controller,
    check_leader,
    check_webhook,
    leader_pod,
    probe_jobset,
)
from .platform_checks import (
    check_declared_features,
    check_dry_run,
    check_version,
    parse_minor,
    probe_pod,
)
from .result import Check, ClusterReader, PolicyCheck, Result


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
    for line, ch in zip(lines[1:], checks):  # noqa: B905 (a row each; 3.9 has no strict=)
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
