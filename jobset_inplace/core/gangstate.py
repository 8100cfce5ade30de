"""The GangState custom resource: one per opted-in JobSet, owned by it, holding the
planner's memory in ``.status``. This module converts between :class:`~.model.GangStatus` and
the JSON the API stores (camelCase, RFC 3339 times), and builds new objects.

Agents watch this object, so it stays small: counts rather than member lists, and only the
failing or recreated members of the current recovery by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.model import (
    Bucket,
    Cause,
    GangStatus,
    Ledger,
    Mark,
    NotedProgress,
    PlannedStop,
    Recovery,
    Repeats,
    ReportEndpoint,
    StepRecheck,
)
from jobset_inplace.core.statemachine import Edge, Phase
from jobset_inplace.protocol.gangstate import parse_front
from jobset_inplace.times import parse_time, rfc3339
from jobset_inplace.trainer.checkpoints import is_int


def _recovery_to_dict(r: Recovery) -> dict[str, Any]:
    return {
        "epoch": r.epoch,
        "startedAt": rfc3339(r.started),
        "deadline": rfc3339(r.deadline),
        "deadlineExtended": r.deadline_extended,
        "openedAt": rfc3339(r.opened),
        "durationSeconds": None if r.duration is None else round(r.duration, 3),
        "detectionSeconds": None if r.detection is None else round(r.detection, 3),
        "causes": {member: cause.value for member, cause in r.causes.items()},
        "inPlace": r.in_place,
        "recreated": dict(r.recreated),
        "resumeStep": r.resume_step,
        "openedBy": None if r.opened_by is None else r.opened_by.value,
        "firstSignal": None if r.first_signal is None else r.first_signal.value,
        "firstSignalAt": rfc3339(r.first_signal_at),
        "signalWindowSeconds": r.signal_window,
        "progressStepsLost": r.progress_lost,
        "hangsCounted": r.hangs_counted,
    }


def _recovery_from_dict(d: dict[str, Any]) -> Recovery:
    return Recovery(
        epoch=int(d["epoch"]),
        started=parse_time(d.get("startedAt")) or 0.0,
        deadline=parse_time(d.get("deadline")) or 0.0,
        causes={member: Cause(cause) for member, cause in (d.get("causes") or {}).items()},
        in_place=int(d.get("inPlace") or 0),
        recreated=dict(d.get("recreated") or {}),
        deadline_extended=bool(d.get("deadlineExtended")),
        opened=parse_time(d.get("openedAt")),
        resume_step=d.get("resumeStep"),
        # absent from statuses written before they were recorded
        opened_by=Edge(d["openedBy"]) if d.get("openedBy") else None,
        first_signal=Cause(d["firstSignal"]) if d.get("firstSignal") else None,
        first_signal_at=parse_time(d.get("firstSignalAt")),
        signal_window=float(d.get("signalWindowSeconds") or 0.0),
        progress_lost=d.get("progressStepsLost"),
        hangs_counted=bool(d.get("hangsCounted")),
    )


def status_to_dict(s: GangStatus) -> dict[str, Any]:
    return {
        names.STATUS_PHASE: s.phase.value,
        "reason": s.reason,
        "message": s.message,
        names.STATUS_EPOCH: s.epoch,
        names.STATUS_BARRIER_OPEN: s.barrier_open,
        names.STATUS_RESUME_STEP: s.resume_step,
        "restartAttempt": s.restart_attempt,
        "members": {
            "expected": s.expected,
            "reported": s.reported,
            "ready": s.ready,
            "waiting": list(s.waiting),
            "onPod": s.on_pod,
        },
        "budgets": {"inPlaceUsed": s.inplace_used, "recreateUsed": s.recreate_used},
        "memberFailures": dict(s.member_failures),
        "recovery": None if s.recovery is None else _recovery_to_dict(s.recovery),
        "history": list(s.history),
        "restartRequest": s.restart_request,
        "kueueMarginSeconds": s.kueue_margin_s,
        "stragglers": dict(s.stragglers),
        "stragglerHoldStep": s.straggler_hold_step,
        names.STATUS_REPORT_ENDPOINT: None
        if s.report_endpoint is None
        else _endpoint_to_dict(s.report_endpoint),
        "goodput": _ledger_to_dict(s.goodput),
        names.STATUS_PLANNED_STOP: None
        if s.planned_stop is None
        else _planned_to_dict(s.planned_stop),
        names.STATUS_SLOTS: dict(s.slots),
        "repeats": None if s.repeats is None else _repeats_to_dict(s.repeats),
        names.STATUS_STEP_RECHECK: None
        if s.step_recheck is None
        else _recheck_to_dict(s.step_recheck),
        "restarts": {"inPlace": s.in_place_restarts},
    }


def _planned_to_dict(p: PlannedStop) -> dict[str, Any]:
    return {
        names.ASK_EPOCH: p.epoch,
        "members": list(p.members),
        "reason": p.reason,
        "requestedAt": rfc3339(p.requested),
        "deadline": rfc3339(p.deadline),
        names.PLANNED_STOP_STEP: p.step,
    }


def _planned_from_dict(d: Any) -> PlannedStop | None:
    if not isinstance(d, dict):
        return None
    return PlannedStop(
        epoch=int(d[names.ASK_EPOCH]),
        members=tuple(str(m) for m in d.get("members") or ()),
        reason=str(d.get("reason") or ""),
        requested=parse_time(d.get("requestedAt")) or 0.0,
        deadline=parse_time(d.get("deadline")) or 0.0,
        step=d.get(names.PLANNED_STOP_STEP),
    )


def _seconds(value: float) -> float:
    return round(value, 3)


def _ledger_to_dict(led: Ledger) -> dict[str, Any]:
    return {
        "since": rfc3339(led.since),
        "productiveSeconds": _seconds(led.productive),
        "badputSeconds": {b.value: _seconds(led.badput.get(b, 0.0)) for b in Bucket},
        "unmeasuredSeconds": _seconds(led.unmeasured),
        "stepSeconds": None if led.step_seconds is None else round(led.step_seconds, 6),
        "training": None
        if led.training_since is None
        else {
            "epoch": led.training_epoch,
            "since": rfc3339(led.training_since),
            "resumeStep": led.training_resume,
            "afterRecovery": led.restarted,
            "noted": None
            if (n := led.training_noted) is None
            else {
                "firstStep": n.first_step,
                "firstAt": rfc3339(n.first_at),
                "steps": n.steps,
                "seconds": _seconds(n.seconds),
                "lastAt": rfc3339(n.last_at) if n.last_at else None,
            },
        },
        "marks": [
            {
                "at": rfc3339(m.at),
                "productiveSeconds": _seconds(m.productive),
                "measuredSeconds": _seconds(m.measured),
            }
            for m in led.marks
        ],
    }


def _noted_from_dict(d: Any) -> NotedProgress | None:
    if not isinstance(d, dict) or (at := parse_time(d.get("firstAt"))) is None:
        return None  # none, or a status written before notes were summed
    return NotedProgress(
        int(d.get("firstStep") or 0),
        at,
        int(d.get("steps") or 0),
        float(d.get("seconds") or 0),
        parse_time(d.get("lastAt")) or 0.0,
    )


def _ledger_from_dict(d: Any) -> Ledger:
    if not isinstance(d, dict):
        return Ledger()  # a status written before goodput was accounted
    training = d.get("training") or {}
    badput = d.get("badputSeconds") or {}
    return Ledger(
        since=parse_time(d.get("since")),
        productive=float(d.get("productiveSeconds") or 0.0),
        badput={b: float(badput[b.value]) for b in Bucket if badput.get(b.value)},
        unmeasured=float(d.get("unmeasuredSeconds") or 0.0),
        step_seconds=d.get("stepSeconds"),
        training_epoch=training.get("epoch"),
        training_since=parse_time(training.get("since")),
        training_resume=training.get("resumeStep"),
        restarted=bool(training.get("afterRecovery")),
        training_noted=_noted_from_dict(training.get("noted")),
        marks=tuple(
            Mark(
                at, float(m.get("productiveSeconds") or 0.0), float(m.get("measuredSeconds") or 0.0)
            )
            for m in d.get("marks") or ()
            if isinstance(m, dict) and (at := parse_time(m.get("at"))) is not None
        ),
    )


def _endpoint_to_dict(e: ReportEndpoint) -> dict[str, Any]:
    d: dict[str, Any] = {
        names.ENDPOINT_URL: e.url,
        names.ENDPOINT_CERT_SHA256: e.cert_sha256,
        names.ENDPOINT_LEADER: e.leader,
    }
    if e.fronts:
        d[names.ENDPOINT_FRONTS] = [
            {names.ENDPOINT_URL: f.url, names.ENDPOINT_CERT_SHA256: f.cert_sha256} for f in e.fronts
        ]
    return d


def _endpoint_from_dict(d: Any) -> ReportEndpoint | None:
    if not isinstance(d, dict) or not d.get(names.ENDPOINT_URL):
        return None
    fronts = d.get(names.ENDPOINT_FRONTS)
    return ReportEndpoint(
        str(d[names.ENDPOINT_URL]),
        str(d.get(names.ENDPOINT_CERT_SHA256) or ""),
        str(d.get(names.ENDPOINT_LEADER) or ""),
        tuple(
            f for f in map(parse_front, fronts if isinstance(fronts, list) else ()) if f is not None
        ),
    )


def status_from_dict(d: dict[str, Any] | None) -> GangStatus:
    """The persisted status; a missing or empty status is a gang seen for the first time."""
    if not d or names.STATUS_EPOCH not in d:
        return GangStatus()
    members = d.get("members") or {}
    budgets = d.get("budgets") or {}
    rec = d.get("recovery")
    return GangStatus(
        phase=Phase(d.get(names.STATUS_PHASE) or Phase.RECOVERING.value),
        epoch=int(d[names.STATUS_EPOCH]),
        barrier_open=bool(d.get(names.STATUS_BARRIER_OPEN)),
        resume_step=d.get(names.STATUS_RESUME_STEP),
        restart_attempt=int(d.get("restartAttempt") or 0),
        recovery=_recovery_from_dict(rec) if rec else None,
        history=list(d.get("history") or []),
        inplace_used=int(budgets.get("inPlaceUsed") or 0),
        recreate_used=int(budgets.get("recreateUsed") or 0),
        member_failures={k: int(v) for k, v in (d.get("memberFailures") or {}).items()},
        expected=int(members.get("expected") or 0),
        reported=int(members.get("reported") or 0),
        ready=int(members.get("ready") or 0),
        waiting=[str(m) for m in members.get("waiting") or []],
        on_pod=int(members.get("onPod") or 0),
        reason=d.get("reason") or "",
        message=d.get("message") or "",
        restart_request=d.get("restartRequest") or "",
        kueue_margin_s=d.get("kueueMarginSeconds"),
        stragglers={k: float(v) for k, v in (d.get("stragglers") or {}).items()},
        straggler_hold_step=d.get("stragglerHoldStep"),
        report_endpoint=_endpoint_from_dict(d.get(names.STATUS_REPORT_ENDPOINT)),
        goodput=_ledger_from_dict(d.get("goodput")),
        planned_stop=_planned_from_dict(d.get(names.STATUS_PLANNED_STOP)),
        slots=_slots_from_dict(d.get(names.STATUS_SLOTS)),
        repeats=_repeats_from_dict(d.get("repeats")),
        step_recheck=_recheck_from_dict(d.get(names.STATUS_STEP_RECHECK)),
        in_place_restarts=int((d.get("restarts") or {}).get("inPlace") or 0),
    )


def _recheck_to_dict(r: StepRecheck) -> dict[str, Any]:
    return {
        names.ASK_EPOCH: r.epoch,
        names.STEP_RECHECK_STEPS: list(r.steps),
        "deadline": rfc3339(r.deadline),
    }


def _recheck_from_dict(d: Any) -> StepRecheck | None:
    """A pending second look; anything malformed is dropped (the barrier then opens on the
    reports it has, as before the second look existed)."""
    if not isinstance(d, dict):
        return None
    epoch, steps = d.get(names.ASK_EPOCH), d.get(names.STEP_RECHECK_STEPS)
    deadline = d.get("deadline")
    if not isinstance(epoch, int) or not isinstance(deadline, str) or not isinstance(steps, list):
        return None
    if not steps or not all(is_int(s) for s in steps):
        return None
    return StepRecheck(epoch, tuple(steps), parse_time(deadline) or 0.0)


def _repeats_to_dict(r: Repeats) -> dict[str, Any]:
    return {"signature": r.signature, "count": r.count, "furthestStep": r.furthest}


def _repeats_from_dict(d: Any) -> Repeats | None:
    """The stop rule's memory; anything malformed is forgotten (a run starts again)."""
    if not isinstance(d, dict):
        return None
    sig, count, furthest = d.get("signature"), d.get("count"), d.get("furthestStep")
    if not isinstance(sig, str) or not isinstance(count, int) or not isinstance(furthest, int):
        return None
    return Repeats(sig, count, furthest)


def _slots_from_dict(d: Any) -> dict[str, str]:
    """Slot -> position pairs of strings (anything else is dropped: the planner checks the
    rest against the gang, core.detection.slot_map)."""
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items() if isinstance(k, str) and isinstance(v, str)}


def owned_by(gangstate: dict[str, Any], jobset_uid: str) -> bool:
    """Whether ``gangstate`` belongs to the JobSet with ``jobset_uid`` (not to an earlier
    JobSet of the same name whose GangState the garbage collector has not removed yet)."""
    owners = (gangstate.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("uid") == jobset_uid for o in owners)


def jobset_owner(jobset: Mapping[str, Any], *, controller: bool = False) -> dict[str, Any]:
    """An ownerReference to ``jobset`` (garbage-collected with it); ``controller``: the one
    controlling owner, which also blocks the JobSet's foreground deletion until it is gone."""
    meta = jobset["metadata"]
    ref = {
        "apiVersion": jobset["apiVersion"],
        "kind": jobset["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    return {**ref, "controller": True, "blockOwnerDeletion": True} if controller else ref


def new_gangstate(jobset: dict[str, Any]) -> dict[str, Any]:
    """A GangState for ``jobset`` (same name and namespace), owned by it so that it goes
    away with the JobSet."""
    meta = jobset["metadata"]
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GANGSTATE_KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {names.JOBSET_NAME_LABEL: meta["name"]},
            "ownerReferences": [jobset_owner(jobset, controller=True)],
        },
        "spec": {"jobSetName": meta["name"]},
    }


# Member counts shown in the status for people (kubectl, printer columns). Each member's report
# changes them, and every agent watches the GangState, so each write is an event for all of
# them: counts alone are written at most once a second, and less often for large gangs (the
# apiserver's fan-out of one write grows with the members): every 5 s at 5000.
PROGRESS_WRITE_INTERVAL_S = 1.0
PROGRESS_WRITE_S_PER_MEMBER = 0.001


def progress_write_interval(members: int) -> float:
    """Least time between two writes of the GangState that change member counts only."""
    return max(PROGRESS_WRITE_INTERVAL_S, members * PROGRESS_WRITE_S_PER_MEMBER)


def progress_only(old: GangStatus, new: GangStatus) -> bool:
    """Whether ``new`` differs from ``old`` in the member counts (and the members waited for)
    alone (nothing the agents or the planner act on: those are recomputed from the pods on
    every pass). The first member counted as reporting on its pod is not: a channel failing
    agents is surfaced at once, its count's later changes at the counts' pace."""
    if new.on_pod and not old.on_pod:
        return False
    return old != new and new == dataclasses.replace(
        old,
        expected=new.expected,
        reported=new.reported,
        ready=new.ready,
        waiting=new.waiting,
        on_pod=new.on_pod,
    )
