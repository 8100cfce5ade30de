"""Pure rendering for ``status`` and ``history``: plain API dicts in, a stable document and
text out. No API access here; every input (GangState, JobSet, pods, nodes, the time) is a
parameter, so the output is fully determined by it."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from jobset_inplace import names
from jobset_inplace.core import goodput
from jobset_inplace.core.decode import (
    MEMBER_LABELS,
    condition,
    condition_true,
    expected_members,
    pod_view,
)
from jobset_inplace.core.decode import spare_positions as spare_positions_of
from jobset_inplace.core.gangmembers import inplace_restarts, member_rows, rows_by_pod
from jobset_inplace.core.gangstate import status_from_dict
from jobset_inplace.core.model import GangStatus, PlannedStop, Recovery
from jobset_inplace.core.policy import Policy, PolicyError, parse_policy
from jobset_inplace.core.spares import moved_positions, spares
from jobset_inplace.names import member_name
from jobset_inplace.times import parse_time, rfc3339

REPORT_KIND = "GangStatusReport"
LIST_KIND = "GangList"
HISTORY_KIND = "GangRecoveryHistory"
POD_STATES = ("running", "restarting", "pending", "failed", "succeeded")

Obj = Mapping[str, Any]


class MalformedStatus(ValueError):
    """The GangState's status cannot be read (a field of the wrong type or value)."""


# --- small formatting helpers ----------------------------------------------------------------
def fmt_duration(seconds: float | None) -> str:
    """``4.0s``, ``2m05s``, ``1h02m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_value(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def fmt_causes(causes: Mapping[str, int]) -> str:
    """``TrainerExited, NodeUnhealthy x2`` (by count, then name)."""
    if not causes:
        return "-"
    items = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in items)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by three spaces, as kubectl prints them."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    # (no zip strict= on 3.9, the plugin's oldest Python: a row's cells are its widths' length)
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]  # noqa: B905
    return "\n".join(lines)


class _PlainDumper(yaml.SafeDumper):
    """YAML as kubectl prints it: an object that appears twice is written twice, never as an
    anchor (``&id001``) and alias (``*id001``) that readers of a manifest trip over."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def yaml_all(docs: Sequence[Any]) -> str:
    out: str = yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)
    return out


def dump(doc: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2, sort_keys=False) + "\n"
    return yaml_all([doc])


# --- pods and nodes ----------------------------------------------------------------------------
def member_id(pod: Obj) -> str:
    """The stable member slot, :func:`~jobset_inplace.core.decode.member_name` (``?`` for a
    missing label)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return member_name(*(labels.get(k, "?") for k in MEMBER_LABELS))


def pod_state(pod: Obj) -> str:
    """running / restarting / pending / failed / succeeded.

    ``restarting``: the pod is being restarted in place (``AllContainersRestarting``), a main
    container has stopped, or the main containers wait for the barrier."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase == "Failed":
        return "failed"
    if phase == "Succeeded":
        return "succeeded"
    if condition_true(pod, "AllContainersRestarting"):
        return "restarting"
    if phase != "Running":
        return "pending"
    statuses = status.get("containerStatuses") or []
    if statuses and all("running" in (cs.get("state") or {}) for cs in statuses):
        return "running"
    return "restarting"


def node_problems(node: Obj | None) -> list[str]:
    """Why a node counts as unhealthy (empty: healthy); ``None`` is a node that is gone."""
    if node is None:
        return ["NotFound"]
    out = []
    ready = (condition(node, "Ready") or {}).get("status")
    if ready != "True":
        out.append(f"Ready={ready or 'Missing'}")
    for t in (node.get("spec") or {}).get("taints") or []:
        if t.get("key") == names.UNHEALTHY_TAINT:
            out.append(f"taint {names.UNHEALTHY_TAINT}:{t.get('effect', '')}")
    return out


def _container_restarts(pod: Obj) -> int:
    """The kubelet's restart counts of the pod's containers (an in-place restart recreates
    them: see ``restartsInPlace``)."""
    status = pod.get("status") or {}
    return sum(
        int(cs.get("restartCount") or 0)
        for cs in (status.get("containerStatuses") or [])
        + (status.get("initContainerStatuses") or [])
    )


# --- status ------------------------------------------------------------------------------------
def _budget(used: int, limit: int | None) -> dict[str, Any]:
    left = None if limit is None else max(0, limit - used)
    return {"used": used, "limit": limit, "left": left}


def gang_status(gangstate: Obj) -> GangStatus | None:
    """The GangState's status as the controller reads it
    (:func:`~jobset_inplace.core.gangstate.status_from_dict`); None while the controller has
    not initialised it (no epoch yet). Raises :class:`MalformedStatus`."""
    st = gangstate.get("status") or {}
    if "epoch" not in st:
        return None
    try:
        return status_from_dict(dict(st))
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedStatus(f"cannot read the status of the GangState: {e!r}") from e


def _last_recovery(rec: Recovery | None, now: float) -> dict[str, Any] | None:
    if rec is None:
        return None
    in_progress = rec.opened is None
    causes = {member: str(cause) for member, cause in rec.causes.items()}
    return {
        "epoch": rec.epoch,
        "causes": dict(sorted(Counter(causes.values()).items())),
        "failedMembers": dict(sorted(causes.items())),
        "inPlace": rec.in_place,
        "recreated": len(rec.recreated),
        "recreatedMembers": sorted(rec.recreated),
        "startedAt": rfc3339(rec.started),
        "openedAt": rfc3339(rec.opened),
        "durationSeconds": None if rec.duration is None else round(rec.duration, 3),
        "detectionSeconds": None if rec.detection is None else round(rec.detection, 3),
        "inProgress": in_progress,
        "elapsedSeconds": round(max(0.0, now - rec.began), 3) if in_progress else None,
        "resumeStep": rec.resume_step,
        "progressStepsLost": rec.progress_lost,
    }


def status_document(
    gangstate: Obj,
    jobset: Obj | None,
    pods: Sequence[Obj],
    nodes: Mapping[str, Obj | None] | None,
    now: float,
    *,
    members: Obj | None = None,
) -> dict[str, Any]:
    """The stable machine document of ``status -o json|yaml`` (and the input of the table).

    ``nodes`` maps node name -> node (``None``: the node is gone); ``nodes=None`` means nodes
    could not be read, which the document says instead of guessing. ``members``: the gang's
    GangMembers object (what each member reported over the channel; None: not readable)."""
    meta = gangstate.get("metadata") or {}
    status = gang_status(gangstate)
    s = status or GangStatus()  # counts of a status not initialised yet: zero
    rec = s.recovery

    policy: Policy | None = None
    policy_error = None
    annotations = ((jobset or {}).get("metadata") or {}).get("annotations") or {}
    try:
        policy = parse_policy(annotations)
    except PolicyError as e:
        policy_error = str(e)

    counts = Counter(pod_state(p) for p in pods)
    causes = {member: str(cause) for member, cause in rec.causes.items()} if rec else {}
    recreated = rec.recreated if rec else {}
    member_pods: list[dict[str, Any]] = []
    rows = rows_by_pod(members)
    spare_doc, spare_positions, moved = _spares(jobset, s)
    for p in sorted(pods, key=lambda p: (member_id(p), (p.get("metadata") or {}).get("name"))):
        pm = p.get("metadata") or {}
        ann = pm.get("annotations") or {}
        node = (p.get("spec") or {}).get("nodeName")
        position = member_id(p)
        spare = position in spare_positions
        member = None if spare else moved.get(position) or position
        # what the controller last wrote of its reports (GangMembers: over the channel or on
        # the pod); else what its pod holds (an agent whose channel failed reports there)
        row = rows.get(str(pm.get("name")))
        if row is None and pm.get("uid") and (view := pod_view(p)) is not None:
            row = next(iter(member_rows([view])), None)
        created = parse_time(pm.get("creationTimestamp"))
        restarts = None if created is None or status is None else inplace_restarts(created, status)
        member_pods.append(
            {
                # the member (slot) the pod serves; null for a hot spare (holding none)
                "member": member,
                "position": position,  # the pod's place in its JobSet (JobSet's labels)
                "spare": spare,
                "pod": pm.get("name"),
                "node": node,
                "state": pod_state(p),
                "deleting": pm.get("deletionTimestamp") is not None,
                # as the document had them before GangMembers (keys are only ever added):
                # the pod's own report annotations, and its containers' restart counts
                "reportedEpoch": ann.get(names.REPORT_EPOCH)
                or ("(channel)" if s.report_endpoint is not None else None),
                "checkpointSteps": ann.get(names.REPORT_STEPS),
                "restarts": _container_restarts(p),
                # what it reported (wherever it went), and its restarts in place
                "epoch": None if row is None else row.epoch,
                "newestStep": None if row is None else row.step,
                "restartsInPlace": None if restarts is None else restarts[0],
                "restartsAtLeast": bool(restarts and restarts[1]),
                "cause": None if member is None else causes.get(member),
                "recreated": member in recreated,
            }
        )
        if spare and spare_doc is not None and pod_state(p) == "running":
            spare_doc["running"] += 1

    unhealthy: list[dict[str, Any]] | None = None
    if nodes is not None:
        unhealthy = []
        for name in sorted({m["node"] for m in member_pods if m["node"]}):
            problems = node_problems(nodes.get(name))
            if problems:
                pods_on = sorted(m["pod"] for m in member_pods if m["node"] == name)
                unhealthy.append({"name": name, "problems": problems, "pods": pods_on})

    return {
        "apiVersion": names.API_VERSION,
        "kind": REPORT_KIND,
        "jobSet": meta.get("name"),
        "namespace": meta.get("namespace"),
        "jobSetFound": jobset is not None,
        "phase": status.phase.value if status else None,
        "reason": s.reason or None,
        "message": s.message or None,
        "epoch": status.epoch if status else None,
        "barrierOpen": s.barrier_open,
        "resumeStep": s.resume_step,
        "members": {
            "expected": s.expected,
            "reported": s.reported,
            "ready": s.ready,
            "waiting": list(s.waiting),
            "onPod": s.on_pod,
        },
        "pods": {k: counts.get(k, 0) for k in POD_STATES},
        "unhealthyNodes": unhealthy,
        "budgets": {
            "inPlace": _budget(s.inplace_used, policy.inplace_budget if policy else None),
            "recreate": _budget(s.recreate_used, policy.recreate_budget if policy else None),
        },
        # over the gang's life (JobSet's restart counter counts none of them)
        "inPlaceRestarts": s.in_place_restarts,
        # the stop rule's run (null: none): the same failure in a row without progress
        "repeats": None
        if s.repeats is None
        else {
            "signature": s.repeats.signature,
            "count": s.repeats.count,
            "limit": policy.no_progress_limit if policy else None,
            "furthestStep": s.repeats.furthest,
        },
        "restartScope": policy.restart_scope.value if policy else None,
        "policyError": policy_error,
        "lastRecovery": _last_recovery(rec, now),
        "goodput": _goodput(s.goodput, now, s.recovery),
        "plannedMove": None if s.planned_stop is None else _planned(s.planned_stop),
        # the barrier's second look at the checkpoint steps, while it waits for it
        "stepRecheck": None
        if s.step_recheck is None or s.barrier_open
        else {"steps": list(s.step_recheck.steps), "deadline": rfc3339(s.step_recheck.deadline)},
        "memberPods": member_pods,
        # hot spares (null: none declared): how many, how many run, slot -> position serving
        "spares": spare_doc,
    }


def _spares(
    jobset: Obj | None, s: GangStatus
) -> tuple[dict[str, Any] | None, frozenset[str], dict[str, str | None]]:
    """Hot spares (core/spares.py): the document's part (None: the JobSet declares none, or
    it was not read), the positions that hold no slot, and the positions holding another's."""
    if jobset is None:
        return None, frozenset(), {}
    try:
        declared = spare_positions_of(jobset)
        members = expected_members(jobset) if declared else frozenset()
    except (PolicyError, KeyError, TypeError, ValueError):  # a malformed JobSet: said elsewhere
        return None, frozenset(), {}
    if not declared:
        return None, frozenset(), {}
    free = spares(s.slots, members, members | declared)
    doc = {"declared": len(declared), "running": 0, "serving": dict(sorted(s.slots.items()))}
    return doc, free, moved_positions(s.slots)


def _planned(ps: PlannedStop) -> dict[str, Any]:
    return {
        "members": list(ps.members),
        "reason": ps.reason,
        "requestedAt": rfc3339(ps.requested),
        "deadline": rfc3339(ps.deadline),
        "stopStep": ps.step,
    }


def _goodput(led: goodput.Ledger, now: float, recovery: Recovery | None) -> dict[str, Any] | None:
    """The gang's goodput as of ``now`` (None: it has not started)."""
    if led.since is None:
        return None
    account = goodput.live(led, now, recovery)
    window = goodput.recent(led, now, recovery=recovery)
    return {
        "ratio": None if account.ratio is None else round(account.ratio, 4),
        "recent": None
        if window is None
        else {
            "ratio": None if window.ratio is None else round(window.ratio, 4),
            "windowSeconds": round(window.seconds, 3),
        },
        "since": rfc3339(led.since),
        "productiveSeconds": round(account.productive, 3),
        "badputSeconds": {b.value: round(account.badput.get(b, 0.0), 3) for b in goodput.Bucket},
        "unmeasuredSeconds": round(led.unmeasured, 3),
        "runningSeconds": round(account.running, 3),
        "stepSeconds": led.step_seconds,
    }


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def fmt_goodput(g: Mapping[str, Any]) -> str:
    """``93.1% of 2h05m, 97.0% in the last 1h00m (badput: recovery 4m02s, ...)``."""
    measured = g["productiveSeconds"] + sum(g["badputSeconds"].values())
    ratio = fmt_ratio(g["ratio"])
    lost = [
        f"{bucket} {fmt_duration(v)}"
        for bucket, v in sorted(g["badputSeconds"].items(), key=lambda kv: -kv[1])
        if v >= 0.05
    ]
    text = f"{ratio} of {fmt_duration(measured)}"
    # the window only when it is shorter than the history (a young gang's is all of it)
    window = g.get("recent")
    if window and window["windowSeconds"] < measured + g["unmeasuredSeconds"] - 1:
        text += (
            f", {fmt_ratio(window['ratio'])} in the last {fmt_duration(window['windowSeconds'])}"
        )
    text += f" (badput: {', '.join(lost) or 'none'})"
    if g["unmeasuredSeconds"]:
        text += f"; {fmt_duration(g['unmeasuredSeconds'])} unmeasured (no progress reported)"
    return text


def _fmt_budget(b: Mapping[str, Any]) -> str:
    if b["limit"] is None:
        return f"{b['used']} used (limit unknown)"
    return f"{b['used']}/{b['limit']} used, {b['left']} left"


def render_status(doc: Mapping[str, Any], *, wide: bool = False) -> str:
    """The human view of :func:`status_document`."""
    m, pods = doc["members"], doc["pods"]
    phase = doc["phase"] or "Unknown (no status yet: is the controller running?)"
    if doc.get("reason"):
        phase += f" ({doc['reason']})"
    pod_text = ", ".join(f"{pods[k]} {k}" for k in POD_STATES if k != "succeeded" or pods[k])
    if doc["unhealthyNodes"] is None:
        nodes_text = "unknown (nodes not readable)"
    elif not doc["unhealthyNodes"]:
        nodes_text = "none"
    else:
        nodes_text = "; ".join(
            f"{n['name']} ({', '.join(n['problems'])})" for n in doc["unhealthyNodes"]
        )
    rows = [
        ("JobSet:", f"{doc['namespace']}/{doc['jobSet']}"),
        ("Phase:", phase),
        ("Epoch:", fmt_value(doc["epoch"])),
        ("Barrier:", "open" if doc["barrierOpen"] else "closed"),
        (
            "Members:",
            f"{m['expected']} expected, {m['reported']} reported, {m['ready']} ready",
        ),
        ("Pods:", pod_text),
        ("Unhealthy nodes:", nodes_text),
        ("Resume step:", fmt_value(doc["resumeStep"])),
        ("In-place budget:", _fmt_budget(doc["budgets"]["inPlace"])),
        ("Recreate budget:", _fmt_budget(doc["budgets"]["recreate"])),
        ("Restarts:", f"{doc['inPlaceRestarts']} in place over the gang's life"),
        ("Restart scope:", doc["restartScope"] or "unknown"),
    ]
    if (r := doc.get("repeats")) and r["count"] > 1:
        limit = "" if r["limit"] is None else f" of {r['limit']}"
        rows.append(
            (
                "Repeating:",
                f"{r['signature']} {r['count']}{limit} times in a row, never past step "
                f"{r['furthestStep']} (no-progress-limit escalates)",
            )
        )
    if m.get("onPod"):
        rows.insert(
            5,
            (
                "Channel:",
                f"{m['onPod']} member(s) reported on their pods, not to the report channel "
                "(see the ReportChannelUnreachable Events)",
            ),
        )
    waiting = m.get("waiting") or []
    if (ask := doc.get("stepRecheck")) and not waiting:
        waiting = [
            f"members lacking any of steps [{','.join(map(str, ask['steps']))}] to look at "
            "their checkpoint steps again "
            f"(until {ask['deadline']})"
        ]
    if waiting and not doc["barrierOpen"]:
        more = m["expected"] - m["reported"] - len(waiting)
        rows.insert(
            4, ("Waiting for:", ", ".join(waiting) + (f" (+{more} more)" if more > 0 else ""))
        )
    if doc.get("message"):
        rows.insert(2, ("Message:", doc["message"]))
    if doc.get("policyError"):
        rows.append(("Policy:", f"INVALID: {doc['policyError']}"))
    if not doc["jobSetFound"]:
        rows.append(("Warning:", "JobSet not found (GangState left over?)"))
    rec = doc["lastRecovery"]
    if rec is None:
        rows.append(("Last recovery:", "none"))
    else:
        if rec["inProgress"]:
            took = f"in progress, {fmt_duration(rec['elapsedSeconds'])} so far"
        else:
            took = f"took {fmt_duration(rec['durationSeconds'])} from the first signal"
        if rec.get("detectionSeconds") is not None:
            took += f" (detected in {fmt_duration(rec['detectionSeconds'])})"
        rows += [
            ("Last recovery:", f"epoch {fmt_value(rec['epoch'])}, {took}"),
            ("  Causes:", fmt_causes(rec["causes"])),
            ("  In place:", str(rec["inPlace"])),
            ("  Recreated:", str(rec["recreated"])),
            ("  Started:", fmt_value(rec["startedAt"])),
        ]
        if not rec["inProgress"]:
            rows.append(("  Resume step:", fmt_value(rec["resumeStep"])))
        if rec.get("progressStepsLost") is not None:
            rows.append(("  Steps to redo:", f"{rec['progressStepsLost']} (trainers' progress)"))
    if doc.get("goodput"):
        rows.append(("Goodput:", fmt_goodput(doc["goodput"])))
    if planned := doc.get("plannedMove"):
        at = (
            "step not chosen yet"
            if planned["stopStep"] is None
            else f"at step {planned['stopStep']}"
        )
        rows.append(
            (
                "Planned move:",
                f"{', '.join(planned['members'])} ({planned['reason']}): the gang stops {at}, "
                f"moves by {planned['deadline']} at the latest",
            )
        )
    if spare := doc.get("spares"):
        serving = ", ".join(f"{slot} on {pos}" for slot, pos in spare["serving"].items())
        rows.insert(
            6,
            (
                "Hot spares:",
                f"{spare['declared']} declared, {spare['running']} running"
                + (f"; serving: {serving}" if serving else ""),
            ),
        )
    w = max(len(k) for k, _ in rows)
    out = "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows) + "\n"
    if wide:
        header = ["MEMBER", "POD", "NODE", "STATE", "EPOCH", "STEP", "RESTARTS", "RECOVERY"]
        lines = [header]
        for p in doc["memberPods"]:
            rec_mark = p["cause"] or ""
            if p["recreated"]:
                rec_mark = f"{rec_mark} (recreated)".strip()
            state = p["state"] + (" (deleting)" if p["deleting"] else "")
            member = p["member"]
            if member is None:
                member = f"spare ({p['position']})"
            elif member != p.get("position", member):
                member = f"{member} (on {p['position']})"
            lines.append(
                [
                    member,
                    fmt_value(p["pod"]),
                    fmt_value(p["node"]),
                    state,
                    fmt_value(p["epoch"]),
                    fmt_value(p["newestStep"]),
                    fmt_value(p["restartsInPlace"]) + ("+" if p["restartsAtLeast"] else ""),
                    fmt_value(rec_mark),
                ]
            )
        out += "\n" + table(lines) + "\n"
    return out


# --- history -------------------------------------------------------------------------------------
def history_document(gangstate: Obj) -> dict[str, Any]:
    meta = gangstate.get("metadata") or {}
    status = gang_status(gangstate)
    entries = []
    for h in status.history if status else []:
        entries.append(
            {
                "epoch": h.get("epoch"),
                "causes": dict(sorted((h.get("causes") or {}).items())),
                "inPlace": int(h.get("inPlace") or 0),
                "recreated": int(h.get("recreated") or 0),
                "startedAt": h.get("startedAt"),
                "openedAt": h.get("openedAt"),
                "durationSeconds": h.get("durationSeconds"),
                "resumeStep": h.get("resumeStep"),
                "progressStepsLost": h.get("progressStepsLost"),
            }
        )
    # Newest last; the controller appends, the sort only guards against a hand-edited status.
    entries.sort(key=lambda e: (e["epoch"] is None, e["epoch"] or 0))
    return {
        "apiVersion": names.API_VERSION,
        "kind": HISTORY_KIND,
        "jobSet": meta.get("name"),
        "namespace": meta.get("namespace"),
        "recoveries": entries,
    }


def render_history(doc: Mapping[str, Any]) -> str:
    if not doc["recoveries"]:
        return f"No recoveries recorded for {doc['namespace']}/{doc['jobSet']}.\n"
    rows = [
        [
            "EPOCH",
            "CAUSES",
            "IN-PLACE",
            "RECREATED",
            "DURATION",
            "RESUME-STEP",
            "REDONE",
            "STARTED",
        ]
    ]
    for e in doc["recoveries"]:
        rows.append(
            [
                fmt_value(e["epoch"]),
                fmt_causes(e["causes"]),
                str(e["inPlace"]),
                str(e["recreated"]),
                fmt_duration(e["durationSeconds"]),
                fmt_value(e["resumeStep"]),
                fmt_value(e["progressStepsLost"]),
                fmt_value(e["startedAt"]),
            ]
        )
    return table(rows) + "\n"


# --- list ----------------------------------------------------------------------------------------
def list_document(gangstates: Sequence[Obj], now: float) -> dict[str, Any]:
    """One row per GangState (its JobSet's gang), sorted by namespace and name, as of ``now``.
    A GangState whose status cannot be read is listed with its error, not dropped."""
    rows = []
    for gs in gangstates:
        meta = gs.get("metadata") or {}
        row: dict[str, Any] = {"namespace": meta.get("namespace"), "name": meta.get("name")}
        try:
            st = gang_status(gs)
        except MalformedStatus as e:
            rows.append(row | {"error": str(e)})
            continue
        rec = st.recovery if st else None
        row |= {
            "phase": str(st.phase) if st else None,
            "epoch": st.epoch if st else None,
            "barrierOpen": st.barrier_open if st else None,
            "resumeStep": st.resume_step if st else None,
            "inPlaceUsed": st.inplace_used if st else 0,
            "recreateUsed": st.recreate_used if st else 0,
            "lastRecoverySeconds": None
            if rec is None or rec.duration is None
            else round(rec.duration, 3),
            "goodputRatio": None
            if st is None or st.goodput.since is None
            else goodput.live(st.goodput, now, st.recovery).ratio,
        }
        rows.append(row)
    rows.sort(key=lambda r: (str(r["namespace"]), str(r["name"])))
    return {"apiVersion": names.API_VERSION, "kind": LIST_KIND, "gangs": rows}


def render_list(doc: Mapping[str, Any], *, all_namespaces: bool) -> str:
    if not doc["gangs"]:
        return "No gangs found.\n"
    head = ["NAME", "PHASE", "EPOCH", "BARRIER", "STEP", "IN-PLACE", "RECREATED", "LAST-RECOVERY"]
    head.append("GOODPUT")
    rows = [["NAMESPACE", *head] if all_namespaces else head]
    for g in doc["gangs"]:
        if "error" in g:
            cells = [fmt_value(g["name"]), "?", "-", "-", "-", "-", "-", "-", g["error"]]
        else:
            barrier = {True: "open", False: "closed", None: "-"}[g["barrierOpen"]]
            cells = [
                fmt_value(g["name"]),
                fmt_value(g["phase"]),
                fmt_value(g["epoch"]),
                barrier,
                fmt_value(g["resumeStep"]),
                str(g["inPlaceUsed"]),
                str(g["recreateUsed"]),
                fmt_duration(g["lastRecoverySeconds"]),
                fmt_ratio(g["goodputRatio"]),
            ]
        rows.append([fmt_value(g["namespace"]), *cells] if all_namespaces else cells)
    return table(rows) + "\n"


# --- version -------------------------------------------------------------------------------------
_VERSION_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def image_version(image: str) -> str | None:
    """The version an image's tag names (``repo/controller:0.2.0`` -> ``0.2.0``), if any."""
    tag = image.split("@", 1)[0].rpartition("/")[2].partition(":")[2]
    match = _VERSION_TAG.match(tag)
    return ".".join(match.groups()) if match else None


def version_skew(plugin: str, controller: str | None) -> str | None:
    """A warning when the plugin and the controller differ in major or minor version (the
    GangState status and the annotations they read may differ); None when they match or the
    controller's version is unknown."""
    if controller is None:
        return None
    ours, theirs = _VERSION_TAG.match(plugin), _VERSION_TAG.match(controller)
    if ours is None or theirs is None or ours.groups()[:2] == theirs.groups()[:2]:
        return None
    return (
        f"the plugin ({plugin}) and the controller ({controller}) differ in minor version: "
        "install the plugin of the controller's release"
    )


def version_document(plugin: str, deployment: Obj | None, where: str) -> dict[str, Any]:
    containers = ((deployment or {}).get("spec") or {}).get("template", {}).get("spec", {}).get(
        "containers"
    ) or []
    image = str(containers[0].get("image", "")) if containers else None
    status = (deployment or {}).get("status") or {}
    controller = image_version(image) if image else None
    return {
        "plugin": plugin,
        "controller": {
            "deployment": where,
            "found": deployment is not None,
            "image": image,
            "version": controller,
            "readyReplicas": int(status.get("readyReplicas") or 0),
        },
        "skew": version_skew(plugin, controller),
    }


def render_version(doc: Mapping[str, Any]) -> str:
    c = doc["controller"]
    if not c["found"]:
        controller = f"not found (Deployment {c['deployment']})"
    else:
        controller = f"{c['version'] or 'unknown'} (image {c['image']}, {c['readyReplicas']} ready)"
    return f"plugin:     {doc['plugin']}\ncontroller: {controller}\n"
