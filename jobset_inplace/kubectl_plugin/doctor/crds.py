"""The APIs the install needs: JobSet's, the GangState and GangMembers CRDs, Kueue's (optional),
and whether Kueue's recovery timeout leaves a barrier its time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.decode import condition_true, kueue_recovery_timeout
from jobset_inplace.core.policy import barrier_within_kueue, kueue_recovery_timeout_needed

from ..render import fmt_duration
from .result import Check, Result

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
