"""Pure conversions from API objects (plain dicts as the API returns them) to the planner's
views. No I/O; the controller calls these from its watch caches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from jobset_inplace import names
from jobset_inplace.core.model import GangSpec, NodeView, PodView
from jobset_inplace.core.policy import PolicyError, parse_duration
from jobset_inplace.core.spares import spare_spec
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.names import member_name
from jobset_inplace.protocol.report import AHEAD, EMPTY, AgentReport, decode_report, report_rank
from jobset_inplace.times import parse_time
from jobset_inplace.trainer.checkpoints import parse_canonical_int
from jobset_inplace.trainer.progress import decode_busy

Obj = Mapping[str, Any]

# Pod conditions Kueue sets when it terminates pods itself (TAS node replacement, failure
# recovery of pods stuck on unreachable nodes): not worker failures.
KUEUE_POD_CONDITIONS = ("TerminatedByKueue", "KueueFailureRecovery")

# The DisruptionTarget reason of kube-controller-manager's device-taint eviction controller
# (pkg/controller/devicetainteviction): a DRA device the pod holds has a NoExecute taint it does
# not tolerate; the pod is deleted right after the condition is written.
DEVICE_TAINT_EVICTION = "DeletionByDeviceTaintManager"


def _device_taint_evicted(pod: Obj) -> bool:
    target = condition(pod, "DisruptionTarget") or {}
    return target.get("status") == "True" and target.get("reason") == DEVICE_TAINT_EVICTION


def _ts(value: str | None, default: float = 0.0) -> float:
    t = parse_time(value)
    return default if t is None else t


# The pod labels JobSet sets that name a member: replicated Job, Job index, completion index.
MEMBER_LABELS = (names.REPLICATED_JOB_LABEL, names.JOB_INDEX_LABEL, names.COMPLETION_INDEX_LABEL)


def member_key(labels: Mapping[str, str]) -> str | None:
    """The :func:`member_name` of a pod from its labels (None for pods JobSet did not label)."""
    try:
        return member_name(*(labels[k] for k in MEMBER_LABELS))
    except KeyError:
        return None


def positions(jobset: Obj) -> frozenset[str]:
    """Every pod the JobSet makes, by :func:`member_name`: its members and its hot spares."""
    out: set[str] = set()
    for rj in jobset["spec"].get("replicatedJobs") or []:
        job = rj["template"]["spec"]
        pods = int(job.get("parallelism", 1))
        out.update(
            member_name(rj["name"], j, c)
            for j in range(int(rj.get("replicas", 1)))
            for c in range(pods)
        )
    return frozenset(out)


def spare_positions(jobset: Obj) -> frozenset[str]:
    """The positions that are hot spares when the gang starts (core/spares.py): the highest
    job indexes of the spares' replicatedJob. Raises PolicyError for a malformed declaration."""
    spec = spare_spec(jobset)
    if spec is None:
        return frozenset()
    total = spec.members + spec.spares
    return frozenset(member_name(spec.replicated_job, j, 0) for j in range(spec.members, total))


def expected_members(jobset: Obj) -> frozenset[str]:
    """The gang's members (its slots): every position but the spares."""
    return positions(jobset) - spare_positions(jobset)


def condition(obj: Obj, ctype: str) -> dict[str, Any] | None:
    """The condition of type ``ctype`` in ``obj``'s ``status.conditions`` (a copy), or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def condition_true(obj: Obj, ctype: str) -> bool:
    """Whether ``obj`` has the condition ``ctype`` with status ``"True"``."""
    return (condition(obj, ctype) or {}).get("status") == "True"


def jobset_finished(jobset: Obj) -> bool:
    status = jobset.get("status") or {}
    if status.get("terminalState"):
        return True
    return any(condition_true(jobset, t) for t in ("Completed", "Failed"))


def gang_spec(jobset: Obj, *, spares: bool = True) -> GangSpec:
    """The gang of ``jobset``; raises PolicyError when its spares are malformed (``spares``
    False: read none)."""
    meta = jobset["metadata"]
    spare = spare_positions(jobset) if spares else frozenset()
    return GangSpec(
        namespace=meta["namespace"],
        name=meta["name"],
        members=positions(jobset) - spare,
        spares=spare,
        restart_attempt=int((jobset.get("status") or {}).get("restarts") or 0),
        suspended=bool(jobset["spec"].get("suspend")),
        finished=jobset_finished(jobset),
        restart_request=(meta.get("annotations") or {}).get(names.RESTART_REQUEST, ""),
    )


def _resources_unhealthy(statuses: list[Mapping[str, Any]]) -> bool:
    return any(
        res.get("health") == "Unhealthy"
        for s in statuses
        for ars in s.get("allocatedResourcesStatus") or []
        for res in ars.get("resources") or []
    )


def _agent_started(status: Obj) -> float | None:
    """When the pod's running agent (a sidecar: an init container) started; None if it is not
    running."""
    for c in status.get("initContainerStatuses") or []:
        if c.get("name") == AGENT_CONTAINER:
            started = ((c.get("state") or {}).get("running") or {}).get("startedAt")
            return _ts(started) if started else None
    return None


def _not_ready_since(pod: Obj) -> float | None:
    """When the pod's Ready condition stopped being True (None: Ready, or not known yet)."""
    ready = condition(pod, "Ready")
    if ready is None or ready.get("status") == "True":
        return None
    return _ts(ready.get("lastTransitionTime"))


def member_view(on_pod: PodView, channel: AgentReport | None, gang_epoch: int | None) -> PodView:
    """What the planner sees of a member pod: the view of its pod (``on_pod``) with its agent's
    newest report over the channel (None: none) merged in, at the gang's epoch ``gang_epoch``
    (None: not known). A report on the pod that names an epoch beyond the gang's is malformed
    (:meth:`AgentReport.rank`): it sets nothing and says why."""
    view = on_pod
    if gang_epoch is not None and on_pod.report_error is None:
        epoch = on_pod.report_order()[0]
        if epoch > gang_epoch:
            error = (
                f"its report is about epoch {epoch}, beyond the gang's {gang_epoch} (an "
                "agent reports only epochs the GangState named)"
            )
            view = replace(on_pod.with_report(EMPTY), report_error=error, pod_report_epoch=None)
    return view if channel is None else with_channel_report(view, channel, gang_epoch)


def with_channel_report(view: PodView, report: AgentReport, gang_epoch: int | None) -> PodView:
    """``view`` (its pod's annotations) with its agent's ``report`` over the channel: whichever
    of the two is newer wins, wherever it came from (an agent whose channel fails writes its
    next report on the pod instead), a report ahead of ``gang_epoch`` never
    (:meth:`AgentReport.rank`). A newer report that names no epoch is an exit or hang added to
    the older one's epoch report, not a new one."""
    channel = report.rank(gang_epoch)
    if report_rank(view.report_order(), gang_epoch) <= channel:
        return view.with_report(report, well_formed=True)
    if view.reported_epoch is not None or channel == AHEAD:
        return view
    return view.with_report(report.merged(view.report))  # what the pod says wins


def pod_view(pod: Obj) -> PodView | None:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    member = member_key(labels)
    if member is None:
        return None
    annotations = meta.get("annotations") or {}
    report, error = decode_report(annotations)
    # advisory (straggler detection): a malformed one is ignored, never makes the report bad
    busy = decode_busy(annotations.get(names.REPORT_BUSY) or "") or ()
    newest = parse_canonical_int(annotations.get(names.REPORT_NEWEST_STEP) or "")
    busy_epoch = parse_canonical_int(annotations.get(names.REPORT_BUSY_EPOCH) or "")
    containers = status.get("containerStatuses") or []
    on_pod = (report or EMPTY).epoch
    view = PodView(
        name=meta["name"],
        uid=meta["uid"],
        member=member,
        node=pod.get("spec", {}).get("nodeName"),
        phase=status.get("phase") or "Pending",
        created=_ts(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        restart_attempt=int(labels.get(names.RESTART_ATTEMPT_LABEL) or 0),
        report_error=error,
        pod_report_epoch=None if on_pod < 0 else on_pod,
        busy_ms=() if error else busy,
        newest_step=None if error else newest,
        busy_epoch=busy_epoch,
        trainer_failed=any(
            (c.get("state") or {}).get("terminated", {}).get("exitCode", 0) != 0 for c in containers
        ),
        restarting=condition_true(pod, "AllContainersRestarting"),
        not_ready_since=_not_ready_since(pod),
        agent_started=_agent_started(status),
        devices_unhealthy=_resources_unhealthy(containers),
        device_taint_evicted=_device_taint_evicted(pod),
        escalated=condition_true(pod, names.ESCALATION_CONDITION),
        by_kueue=any(condition_true(pod, t) for t in KUEUE_POD_CONDITIONS),
    )
    return view.with_report(report or EMPTY)


def node_view(node: Obj, lease: Obj | None, now: float) -> NodeView:
    ready = condition(node, "Ready")
    conditions = tuple(
        (c["type"], _ts(c.get("lastTransitionTime"), now))
        for c in node.get("status", {}).get("conditions") or []
        if c.get("type") != "Ready" and c.get("status") == "True"
    )
    taints = tuple(
        (t["key"], _ts(t.get("timeAdded"), now))
        for t in node.get("spec", {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
    renewed = lease_renewal(lease)[1] if lease else None
    status = (ready or {}).get("status", "Unknown")
    ready_since = _ts((ready or {}).get("lastTransitionTime"), now)
    meta = node["metadata"]
    created = _ts(meta.get("creationTimestamp"))
    return NodeView(
        name=meta["name"],
        ready=status,
        ready_since=ready_since,
        lease_renewed=renewed or None,
        taints=taints,
        conditions=conditions,
        leaving=_leaving(node, conditions),
        opened_at=max(created, ready_since) if status == "True" else created,
        labels=tuple(sorted((meta.get("labels") or {}).items())),
    )


def carry_opening(old: NodeView | None, new: NodeView, now: float) -> NodeView:
    """``new`` (a node's next view) with what ``old`` (its view before, None: none) knew of
    when it opened, moved to ``now`` where this change opened it: its cordon lifted (or
    maintenance condition gone), or a NoSchedule/NoExecute taint removed. Neither change
    carries a time of its own in the API."""
    if old is None:
        return new
    opened = max(old.opened_at, new.opened_at)
    if (old.leaving and not new.leaving) or {k for k, _ in old.taints} - {k for k, _ in new.taints}:
        opened = max(opened, now)
    return new if opened == new.opened_at else replace(new, opened_at=opened)


# Node conditions an admin sets (Kubernetes 1.37: core/v1 types) that announce a drain
MAINTENANCE_CONDITIONS = ("DrainInProgress", "MaintenancePlanned", "MaintenanceInProgress")


def _leaving(node: Obj, conditions: tuple[tuple[str, float], ...]) -> str:
    """Why the node's pods should move before it goes away ("": they need not): cordoned
    (``spec.unschedulable``, what ``kubectl cordon`` and ``drain`` set), or a maintenance
    condition True."""
    if (node.get("spec") or {}).get("unschedulable") is True:
        return "cordoned"
    held = sorted({ctype for ctype, _ in conditions} & set(MAINTENANCE_CONDITIONS))
    return f"condition {held[0]}=True" if held else ""


def lease_renewal(lease: Obj) -> tuple[str, float | None]:
    """A node Lease's node name and last renewal (None: never renewed)."""
    renew = (lease.get("spec") or {}).get("renewTime")
    return str(lease["metadata"]["name"]), parse_time(renew) if isinstance(renew, str) else None


def kueue_stand_down(workload: Obj) -> str:
    """Why the gang must stand down because of its Kueue Workload ('' if it need not):
    evicted (any reason: preemption, PodsReadyTimeout, NodeFailures, ...), deactivated, or
    finished. Kueue then suspends the JobSet itself; reacting to the Workload is earlier."""
    if (workload.get("spec") or {}).get("active") is False:
        return "Kueue Workload deactivated"
    evicted = condition(workload, "Evicted")
    admitted = condition(workload, "Admitted")
    if evicted is not None and evicted.get("status") == "True":
        # An eviction older than the current admission is history (re-admitted since).
        readmitted = (
            admitted is not None
            and admitted.get("status") == "True"
            and _ts(admitted.get("lastTransitionTime")) > _ts(evicted.get("lastTransitionTime"))
        )
        if not readmitted:
            return f"Kueue evicted the Workload ({evicted.get('reason', 'unknown')})"
    if condition_true(workload, "Finished"):
        return "Kueue Workload finished"
    return ""


def controller_uid(meta: Obj, kind: str, group: str) -> str:
    """The UID of the object's controlling owner if it is a ``kind`` of API ``group`` ("" for
    the core group), else "". Membership goes by these UIDs, not by labels anyone can set."""
    for ref in meta.get("ownerReferences") or []:
        version = str(ref.get("apiVersion", ""))
        ref_group = version.rpartition("/")[0]
        if ref.get("controller") and ref.get("kind") == kind and ref_group == group:
            return str(ref.get("uid") or "")
    return ""


def workload_owner(workload: Obj) -> tuple[str, str] | None:
    """(namespace, JobSet name) of the JobSet owning this Workload."""
    meta = workload["metadata"]
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "JobSet" and ref.get("apiVersion", "").startswith("jobset.x-k8s.io/"):
            return meta["namespace"], ref["name"]
    return None


# Kueue v0.19's waitForPodsReady.timeout defaults (apis/config/v1beta{1,2}/defaults.go)
KUEUE_V1BETA1_PODS_READY_TIMEOUT_S = 300.0
KUEUE_V1BETA2_PODS_READY_TIMEOUT_S = 1800.0


def kueue_recovery_timeout(config_yaml: str) -> float | None:
    """The ``waitForPodsReady.recoveryTimeout`` Kueue applies, in seconds, from its
    Configuration YAML, with Kueue v0.19's defaults: in ``config.kueue.x-k8s.io/v1beta2``
    waitForPodsReady is always on (``timeout`` 30m, ``recoveryTimeout`` = ``timeout``); in
    ``v1beta1`` only with ``enable: true`` (``timeout`` 5m). None: Kueue never evicts a gang
    that is recovering. Raises ValueError when the configuration cannot be read."""
    try:
        cfg = yaml.safe_load(config_yaml) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"Kueue's configuration is not YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError("Kueue's configuration is not a mapping")
    wfpr = cfg.get("waitForPodsReady") or {}
    if not isinstance(wfpr, dict):
        raise ValueError("waitForPodsReady is not a mapping")
    if str(cfg.get("apiVersion", "")).endswith("/v1beta1"):
        if not wfpr.get("enable"):
            return None
        default = KUEUE_V1BETA1_PODS_READY_TIMEOUT_S
    else:
        default = KUEUE_V1BETA2_PODS_READY_TIMEOUT_S
    raw = wfpr.get("recoveryTimeout") or wfpr.get("timeout")
    if raw is None:
        return default
    try:
        return parse_duration("waitForPodsReady.recoveryTimeout", str(raw))
    except PolicyError as e:
        raise ValueError(str(e)) from None
