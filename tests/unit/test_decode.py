"""``pod_view``: the detection table. One API pod per signal, the view it decodes to (only that
signal's field differs from a healthy member's view), and what the planner makes of it."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from jobset_inplace import names
from jobset_inplace.core.decode import pod_view
from jobset_inplace.core.model import Cause, Event, PodView
from jobset_inplace.core.planner import plan
from jobset_inplace.protocol.report import REPORT_ERROR_MAX, REPORT_VALUE_SHOWN

from .gangs import pods, running, snapshot

CREATED = "2026-01-01T00:00:00Z"
DELETED = "2026-01-01T01:00:00Z"
Pod = dict[str, Any]


def raw_pod() -> Pod:
    """A healthy member pod as the API returns it: member ``workers/0/0`` on node ``n0``,
    trainer running, its agent's report of epoch 2 with steps 200 and 100."""
    return {
        "metadata": {
            "name": "p0",
            "uid": "uid-0",
            "creationTimestamp": CREATED,
            "labels": {
                names.JOBSET_NAME_LABEL: "train",
                names.REPLICATED_JOB_LABEL: "workers",
                names.JOB_INDEX_LABEL: "0",
                names.COMPLETION_INDEX_LABEL: "0",
                names.RESTART_ATTEMPT_LABEL: "0",
            },
            "annotations": {names.REPORT_EPOCH: "2", names.REPORT_STEPS: "200,100"},
        },
        "spec": {"nodeName": "n0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "trainer", "restartCount": 0, "state": {"running": {}}}],
        },
    }


HEALTHY = PodView(
    name="p0",
    uid="uid-0",
    member="workers/0/0",
    node="n0",
    phase="Running",
    created=dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp(),
    reported_epoch=2,
    reported_steps=(200, 100),
    pod_report_epoch=2,
)


def test_healthy_member_pod() -> None:
    assert pod_view(raw_pod()) == HEALTHY


def _trainer_exited(code: int) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}
        }

    return change


def _condition(ctype: str, status: str = "True", reason: str = "") -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["status"]["conditions"].append(
            {"type": ctype, "status": status, **({"reason": reason} if reason else {})}
        )

    return change


def _phase(phase: str) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["status"]["phase"] = phase

    return change


def _deleting(p: Pod) -> None:
    p["metadata"]["deletionTimestamp"] = DELETED


def _device_health(health: str) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
            {
                "name": "example.com/gpu",
                "resources": [
                    {"resourceID": "gpu-0", "health": "Healthy"},
                    {"resourceID": "gpu-1", "health": health},
                ],
            }
        ]

    return change


def _annotations(**values: str | None) -> Callable[[Pod], None]:
    keys = {
        "epoch": names.REPORT_EPOCH,
        "steps": names.REPORT_STEPS,
        "late": names.REPORT_LATE,
        "exited": names.REPORT_EXITED,
        "hung": names.REPORT_HUNG,
        "busy": names.REPORT_BUSY,
        "newest": names.REPORT_NEWEST_STEP,
    }

    def change(p: Pod) -> None:
        ann = p["metadata"]["annotations"]
        for k, v in values.items():
            if v is None:
                ann.pop(keys[k], None)
            else:
                ann[keys[k]] = v

    return change


def _not_ready(since: str) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["status"]["conditions"] = [
            {"type": "Ready", "status": "False", "lastTransitionTime": since}
        ]

    return change


def _agent_running(since: str) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["status"]["initContainerStatuses"] = [
            {"name": "jobset-inplace-agent", "state": {"running": {"startedAt": since}}},
            {"name": "other-init", "state": {"running": {"startedAt": CREATED}}},
        ]

    return change


def _restart_attempt(value: str | None) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        if value is None:
            p["metadata"]["labels"].pop(names.RESTART_ATTEMPT_LABEL, None)
        else:
            p["metadata"]["labels"][names.RESTART_ATTEMPT_LABEL] = value

    return change


# signal -> (change to the healthy pod, fields of the view that change, cause the planner takes
# from it on a running gang at epoch 2 (None: no recovery))
TABLE: dict[str, tuple[Callable[[Pod], None], dict[str, Any], Cause | None]] = {
    "trainer exited non-zero": (_trainer_exited(1), {"trainer_failed": True}, Cause.TRAINER_EXITED),
    "trainer exited zero (not a failure)": (_trainer_exited(0), {}, None),
    "AllContainersRestarting=True": (
        _condition("AllContainersRestarting"),
        {"restarting": True},
        Cause.RESTARTING,
    ),
    "AllContainersRestarting=False": (_condition("AllContainersRestarting", "False"), {}, None),
    "pod Failed": (_phase("Failed"), {"phase": "Failed"}, Cause.POD_FAILED),
    "pod deleting": (_deleting, {"deleting": True}, Cause.POD_DELETED),
    "allocated device Unhealthy": (
        _device_health("Unhealthy"),
        {"devices_unhealthy": True},
        Cause.DEVICE_UNHEALTHY,
    ),
    "allocated devices Healthy": (_device_health("Healthy"), {}, None),
    "evicted for a DRA device taint": (
        _condition("DisruptionTarget", reason="DeletionByDeviceTaintManager"),
        {"device_taint_evicted": True},
        Cause.DEVICE_TAINTED,
    ),
    "evicted for a node taint (not a device's)": (
        _condition("DisruptionTarget", reason="DeletionByTaintManager"),
        {},
        None,
    ),
    "DisruptionTarget False": (
        _condition("DisruptionTarget", "False", reason="DeletionByDeviceTaintManager"),
        {},
        None,
    ),
    "allocated device Unknown (not a fault)": (_device_health("Unknown"), {}, None),
    "our escalation condition": (
        _condition(names.ESCALATION_CONDITION),
        {"escalated": True},
        None,  # already escalated by us: the Job's failure policy takes it from there
    ),
    "escalation condition False": (_condition(names.ESCALATION_CONDITION, "False"), {}, None),
    "Kueue TerminatedByKueue": (_condition("TerminatedByKueue"), {"by_kueue": True}, None),
    "Kueue KueueFailureRecovery": (_condition("KueueFailureRecovery"), {"by_kueue": True}, None),
    "Kueue condition False": (_condition("TerminatedByKueue", "False"), {}, None),
    "restart-attempt label 3": (_restart_attempt("3"), {"restart_attempt": 3}, None),
    "no restart-attempt label": (_restart_attempt(None), {}, None),
    "no report yet": (
        _annotations(epoch=None, steps=None),
        {"reported_epoch": None, "reported_steps": None, "pod_report_epoch": None},
        None,
    ),
    "report without checkpoints": (_annotations(steps=""), {"reported_steps": ()}, None),
    "its agent reported into the open barrier (restarted unseen)": (
        _annotations(late="2"),
        {"late_for_epoch": 2},
        Cause.AGENT_WAITING,
    ),
    "late for an older epoch": (_annotations(late="1"), {"late_for_epoch": 1}, None),
    "its trainer process exited in the running epoch (process scope)": (
        _annotations(exited="2"),
        {"exited_in_epoch": 2},
        Cause.TRAINER_EXITED,
    ),
    "its trainer hung in the running epoch": (
        _annotations(hung="2"),
        {"hung_in_epoch": 2},
        Cause.TRAINER_HUNG,
    ),
    "its trainer hung in an older epoch": (_annotations(hung="1"), {"hung_in_epoch": 1}, None),
    "its busy windows (straggler detection)": (
        _annotations(busy="250,240"),
        {"busy_ms": (250, 240)},
        None,
    ),
    "malformed busy windows are ignored": (_annotations(busy="250,x"), {"busy_ms": ()}, None),
    "its newest checkpoint (with the busy windows)": (
        _annotations(busy="250", newest="4200"),
        {"busy_ms": (250,), "newest_step": 4200},
        None,
    ),
    "a malformed newest checkpoint is ignored": (
        _annotations(newest="042"),
        {"newest_step": None},
        None,
    ),
    "its trainer exited in an older epoch": (
        _annotations(exited="1"),
        {"exited_in_epoch": 1},
        None,
    ),
    "not Ready for long (its agent not restarted since: a cold start, an image pull)": (
        _not_ready("1970-01-01T00:00:00Z"),
        {"not_ready_since": 0.0},
        None,
    ),
    "its agent running since": (
        _agent_running(DELETED),
        {"agent_started": dt.datetime(2026, 1, 1, 1, tzinfo=dt.UTC).timestamp()},
        None,
    ),
    "not Ready just now": (
        _not_ready(CREATED),
        {"not_ready_since": dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()},
        None,
    ),
}


@pytest.mark.parametrize("signal", TABLE)
def test_each_signal_decodes_to_its_field_alone(signal: str) -> None:
    change, fields, _ = TABLE[signal]
    pod = raw_pod()
    change(pod)
    assert pod_view(pod) == dataclasses.replace(HEALTHY, **fields)


@pytest.mark.parametrize("signal", TABLE)
def test_each_signal_gives_the_planner_its_cause(signal: str) -> None:
    change, _, cause = TABLE[signal]
    pod = raw_pod()
    change(pod)
    view = pod_view(pod)
    assert view is not None
    # the gang, at epoch 2 of the pod's JobSet restart attempt, and member workers/1/0, healthy
    attempt = view.restart_attempt
    other = dataclasses.replace(pods(2, epoch=2)[1], restart_attempt=attempt)
    status = running(restart_attempt=attempt)
    p = plan(snapshot(2, status=status, pod_list=[view, other], restart_attempt=attempt))
    rec = p.status.recovery
    if cause is None:
        assert p.status.epoch == 2, f"{signal}: no recovery"
        assert rec is None or rec.causes == {}
    else:
        assert p.status.epoch == 3
        assert rec is not None
        assert rec.causes == {"workers/0/0": cause}


@pytest.mark.parametrize(
    ("epoch", "steps", "key"),
    [
        ("x", "200,100", names.REPORT_EPOCH),
        ("-1", "200,100", names.REPORT_EPOCH),
        ("2.0", "200,100", names.REPORT_EPOCH),
        ("2", "300,x", names.REPORT_STEPS),
        ("2", "100,200", names.REPORT_STEPS),  # not newest first
        ("2", "200,,100", names.REPORT_STEPS),
    ],
)
def test_malformed_report_is_an_error_and_reports_nothing(epoch: str, steps: str, key: str) -> None:
    pod = raw_pod()
    _annotations(epoch=epoch, steps=steps)(pod)
    view = pod_view(pod)
    assert view is not None
    assert view.report_error is not None
    assert key in view.report_error
    # neither half of a malformed report counts, even the well-formed one
    assert (view.reported_epoch, view.reported_steps) == (None, None)
    assert dataclasses.replace(view, report_error=None) == dataclasses.replace(
        HEALTHY, reported_epoch=None, reported_steps=None, pod_report_epoch=None
    )
    # the planner posts an Event and starts no recovery
    p = plan(snapshot(2, pod_list=[view, *pods(2, epoch=2)[1:]]))
    assert p.status.epoch == 2
    reasons = [a.reason for a in p.actions if isinstance(a, Event)]
    assert reasons == ["MalformedReport"]


# Python's int() takes all of these as an epoch; a report number is canonical only (the agent
# writes str(epoch)). Full-width (\uff11) and Arabic-Indic (\u0661) digits are escaped.
NON_CANONICAL = ["\uff12", "\u0662", "1_0", " 2", "2 ", "+2", "02", "-0", "00", "2\n", "0x2"]


@pytest.mark.parametrize("key", [names.REPORT_EPOCH, names.REPORT_LATE])
@pytest.mark.parametrize("value", [*NON_CANONICAL, "9" * 19 + "0", "9" * 5000, ""])
def test_report_numbers_are_canonical_decimal_only(key: str, value: str) -> None:
    pod = raw_pod()
    pod["metadata"]["annotations"][key] = value
    view = pod_view(pod)
    assert view is not None
    assert view.report_error is not None
    assert view.report_error.startswith(f"{key}={repr(value)[:20]}")
    assert "canonical form" in view.report_error
    assert (view.reported_epoch, view.reported_steps, view.late_for_epoch) == (None, None, None)


@pytest.mark.parametrize("value", ["0", "2", "10", str(2**63 - 1)])
def test_canonical_report_numbers_are_read(value: str) -> None:
    pod = raw_pod()
    pod["metadata"]["annotations"][names.REPORT_EPOCH] = value
    pod["metadata"]["annotations"][names.REPORT_LATE] = value
    view = pod_view(pod)
    assert view is not None
    assert (view.report_error, view.reported_epoch, view.late_for_epoch) == (
        None,
        int(value),
        int(value),
    )


HUGE = 100_000  # an annotation of 100 KB: seen in the controller log, whole, once per value


@pytest.mark.parametrize(
    ("epoch", "steps"),
    [
        ("7" * HUGE, "200,100"),
        ("2", "300," * (HUGE // 4)),
        ("x" * HUGE, "y" * HUGE),
        ("\x00" * HUGE, "\U000e0001" * HUGE),  # repr escapes: 4 and 10 characters each
    ],
    ids=["epoch digits", "steps list", "both", "escaped characters"],
)
def test_report_error_of_a_huge_value_stays_short(epoch: str, steps: str) -> None:
    pod = raw_pod()
    _annotations(epoch=epoch, steps=steps)(pod)
    view = pod_view(pod)
    assert view is not None
    error = view.report_error
    assert error is not None
    assert len(error) <= REPORT_ERROR_MAX
    # each part alone is short: the backstop did not have to cut it
    for part in error.split(f"; {names.REPORT_STEPS}"):
        assert len(part) < 512, part
    assert not error.endswith("...")
    if epoch != "2":  # the bad epoch is shown cut, with its length
        assert f"... ({HUGE} chars)" in error
        shown = error.split("=", 1)[1].split("... (", 1)[0]
        assert len(shown) == REPORT_VALUE_SHOWN
    # ... and so is the Event the planner posts for it
    p = plan(snapshot(2, pod_list=[view, *pods(2, epoch=2)[1:]]))
    [message] = [a.message for a in p.actions if isinstance(a, Event)]
    assert len(message) <= REPORT_ERROR_MAX + 100


def test_both_halves_malformed_name_both_keys() -> None:
    pod = raw_pod()
    _annotations(epoch="soon", steps="x")(pod)
    view = pod_view(pod)
    assert view is not None
    assert view.report_error is not None
    assert names.REPORT_EPOCH in view.report_error
    assert names.REPORT_STEPS in view.report_error


@pytest.mark.parametrize(
    "label",
    [names.REPLICATED_JOB_LABEL, names.JOB_INDEX_LABEL, names.COMPLETION_INDEX_LABEL],
)
def test_pod_without_a_member_label_is_not_a_member(label: str) -> None:
    pod = raw_pod()
    del pod["metadata"]["labels"][label]
    assert pod_view(pod) is None


def test_pod_without_labels_is_not_a_member() -> None:
    pod = raw_pod()
    del pod["metadata"]["labels"]
    assert pod_view(pod) is None


def test_pod_just_created_without_status_or_node() -> None:
    pod = raw_pod()
    del pod["status"]
    del pod["spec"]["nodeName"]
    assert pod_view(pod) == dataclasses.replace(HEALTHY, phase="Pending", node=None)


def test_decoding_does_not_change_the_pod() -> None:
    pod = raw_pod()
    for change, _, _ in TABLE.values():
        change(pod)
    before = copy.deepcopy(pod)
    pod_view(pod)
    assert pod == before


def test_report_error_of_three_huge_values_stays_short() -> None:
    pod = raw_pod()
    _annotations(epoch="\x00" * HUGE, steps="\U000e0001" * HUGE)(pod)
    pod["metadata"]["annotations"][names.REPORT_LATE] = "\x00" * HUGE
    view = pod_view(pod)
    assert view is not None
    assert view.report_error is not None
    assert len(view.report_error) <= REPORT_ERROR_MAX
    assert names.REPORT_LATE in view.report_error
