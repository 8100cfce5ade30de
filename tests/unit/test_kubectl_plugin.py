"""``kubectl jobset-inplace``: rendering from fixed GangState/pod/node dicts, option parsing,
``enable`` output, doctor checks and exit codes (no cluster: a fake stands in for the API)."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any, cast

import jsonpatch
import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from jobset_inplace import __version__, names
from jobset_inplace.core.admission import mutate, validate, warnings
from jobset_inplace.core.agent_access import (
    AGENT_BINDING,
    AGENT_BINDING_LABEL,
    AGENT_CLUSTER_ROLE,
    Owner,
    agent_cluster_role,
    desired_binding,
)
from jobset_inplace.core.gangmembers import MemberRow, members_object
from jobset_inplace.core.transform import AGENT_CONTAINER, DEFAULT_AGENT_IMAGE, AgentSettings
from jobset_inplace.kubectl_plugin import ExitCode, doctor, main
from jobset_inplace.kubectl_plugin import render as r
from jobset_inplace.kubectl_plugin.cli import build_parser, restart_value
from jobset_inplace.kubectl_plugin.cluster import Cluster, ClusterConfigError
from jobset_inplace.kubectl_plugin.doctor import access, crds, install, platform_checks
from jobset_inplace.kubectl_plugin.enable import enable_diff, enable_text
from jobset_inplace.platform import RESTART_ALL_FEATURE
from jobset_inplace.times import parse_time

NS, NAME = "ml", "train"
NOW = parse_time("2026-11-21T10:00:30Z") or 0.0


V1BETA1 = "apiVersion: config.kueue.x-k8s.io/v1beta1\n"
V1BETA2 = "apiVersion: config.kueue.x-k8s.io/v1beta2\n"


def gangstate(**status: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "phase": "Running",
        "reason": "",
        "message": "",
        "epoch": 3,
        "barrierOpen": True,
        "resumeStep": 200,
        "members": {"expected": 3, "reported": 3, "ready": 3},
        "budgets": {"inPlaceUsed": 2, "recreateUsed": 1},
        "recovery": {
            "epoch": 3,
            "startedAt": "2026-11-21T10:00:00.000000Z",
            "deadline": "2026-11-21T10:05:00.000000Z",
            "openedAt": "2026-11-21T10:00:04.500000Z",
            "durationSeconds": 4.5,
            "causes": {"workers/1/0": "NodeUnhealthy", "workers/2/0": "TrainerExited"},
            "inPlace": 2,
            "recreated": {"workers/1/0": "uid-old"},
            "resumeStep": 200,
        },
        "history": [
            {
                "epoch": 2,
                "causes": {"TrainerExited": 1},
                "inPlace": 3,
                "recreated": 0,
                "startedAt": "2026-11-21T09:00:00.000000Z",
                "openedAt": "2026-11-21T09:00:03.000000Z",
                "durationSeconds": 3.0,
                "resumeStep": 100,
            },
            {
                "epoch": 3,
                "causes": {"NodeUnhealthy": 1, "TrainerExited": 1},
                "inPlace": 2,
                "recreated": 1,
                "startedAt": "2026-11-21T10:00:00.000000Z",
                "openedAt": "2026-11-21T10:00:04.500000Z",
                "durationSeconds": 4.5,
                "resumeStep": 200,
                "progressStepsLost": 12,
            },
        ],
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": "GangState",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"jobSetName": NAME},
        "status": base | status,
    }


def jobset(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "annotations": {names.ENABLED: "true"} | annotations,
        },
    }


def pod(
    i: int,
    node: str,
    *,
    phase: str = "Running",
    state: str = "running",
    created: str = "2026-11-21T08:00:00Z",
) -> dict[str, Any]:
    cs_state: dict[str, Any] = {state: {}}
    return {
        "metadata": {
            "name": f"{NAME}-workers-{i}-0-abcde",
            "uid": f"uid-{i}",
            "creationTimestamp": created,
            "labels": {
                names.JOBSET_NAME_LABEL: NAME,
                names.REPLICATED_JOB_LABEL: "workers",
                names.JOB_INDEX_LABEL: str(i),
                names.COMPLETION_INDEX_LABEL: "0",
            },
            "annotations": {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "200,100"},
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "trainer", "restartCount": i, "state": cs_state}],
        },
    }


def node(name: str, ready: str = "True", taint: bool = False) -> dict[str, Any]:
    taints = [{"key": names.UNHEALTHY_TAINT, "effect": "NoSchedule"}] if taint else []
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


PODS = [
    pod(0, "n0"),
    pod(1, "n3", phase="Pending", created="2026-11-21T10:00:02Z"),  # recreated at epoch 3
    pod(2, "n2", state="terminated"),
]
NODES: dict[str, dict[str, Any] | None] = {
    "n0": node("n0"),
    "n2": node("n2", ready="Unknown"),
    "n3": node("n3", taint=True),
}


def doc(**status: Any) -> dict[str, Any]:
    return r.status_document(gangstate(**status), jobset(), PODS, NODES, NOW)


# --- status ------------------------------------------------------------------------------------
def test_status_document_counts_budgets_nodes_and_last_recovery() -> None:
    out = doc()
    assert out["kind"] == "GangStatusReport"
    assert (out["jobSet"], out["namespace"], out["phase"], out["epoch"]) == (NAME, NS, "Running", 3)
    assert out["barrierOpen"] is True
    assert out["members"] == {"expected": 3, "reported": 3, "ready": 3, "waiting": [], "onPod": 0}
    assert out["pods"] == {
        "running": 1,
        "restarting": 1,
        "pending": 1,
        "failed": 0,
        "succeeded": 0,
    }
    assert out["unhealthyNodes"] == [
        {"name": "n2", "problems": ["Ready=Unknown"], "pods": ["train-workers-2-0-abcde"]},
        {
            "name": "n3",
            "problems": [f"taint {names.UNHEALTHY_TAINT}:NoSchedule"],
            "pods": ["train-workers-1-0-abcde"],
        },
    ]
    assert out["budgets"] == {
        "inPlace": {"used": 2, "limit": 10, "left": 8},
        "recreate": {"used": 1, "limit": 5, "left": 4},
    }
    rec = out["lastRecovery"]
    assert rec["causes"] == {"NodeUnhealthy": 1, "TrainerExited": 1}
    assert (rec["inPlace"], rec["recreated"], rec["recreatedMembers"]) == (2, 1, ["workers/1/0"])
    assert (rec["durationSeconds"], rec["inProgress"]) == (4.5, False)


def test_status_budget_limits_come_from_the_jobset_annotations() -> None:
    js = jobset(**{names.INPLACE_BUDGET: "3", names.RECREATE_BUDGET: "1"})
    out = r.status_document(gangstate(), js, PODS, NODES, NOW)
    assert out["budgets"]["inPlace"] == {"used": 2, "limit": 3, "left": 1}
    assert out["budgets"]["recreate"] == {"used": 1, "limit": 1, "left": 0}


def test_status_with_invalid_policy_shows_the_error_instead_of_limits() -> None:
    js = jobset(**{names.INPLACE_BUDGET: "many"})
    out = r.status_document(gangstate(), js, PODS, NODES, NOW)
    assert out["budgets"]["inPlace"]["limit"] is None
    assert names.INPLACE_BUDGET in out["policyError"]
    assert f"INVALID: annotation {names.INPLACE_BUDGET}" in r.render_status(out)


def test_status_table() -> None:
    text = r.render_status(doc())
    lines = dict((k.strip(), v.strip()) for k, v in (ln.split(":", 1) for ln in text.splitlines()))
    assert lines["JobSet"] == "ml/train"
    assert lines["Phase"] == "Running"
    assert lines["Epoch"] == "3"
    assert lines["Barrier"] == "open"
    assert lines["Members"] == "3 expected, 3 reported, 3 ready"
    assert lines["Pods"] == "1 running, 1 restarting, 1 pending, 0 failed"
    assert lines["Unhealthy nodes"] == (
        f"n2 (Ready=Unknown); n3 (taint {names.UNHEALTHY_TAINT}:NoSchedule)"
    )
    assert lines["Resume step"] == "200"
    assert lines["In-place budget"] == "2/10 used, 8 left"
    assert lines["Recreate budget"] == "1/5 used, 4 left"
    assert lines["Last recovery"] == "epoch 3, took 4.5s from the first signal"
    assert lines["Causes"] == "NodeUnhealthy, TrainerExited"
    assert (lines["In place"], lines["Recreated"]) == ("2", "1")
    assert "MEMBER" not in text


def test_the_recovery_time_counts_from_the_first_signal_with_detection_apart() -> None:
    rec = gangstate()["status"]["recovery"] | {
        "firstSignal": "TrainerExited",
        "firstSignalAt": "2026-11-21T09:59:58.500000Z",  # 1.5 s before the recovery started
    }
    out = doc(recovery=rec)
    assert out["lastRecovery"]["detectionSeconds"] == 1.5
    assert out["lastRecovery"]["durationSeconds"] == 6.0, "4.5 s after the start, plus 1.5"
    lines = dict(
        (k.strip(), v.strip())
        for k, _, v in (x.partition(":") for x in r.render_status(out).splitlines())
    )
    assert lines["Last recovery"] == "epoch 3, took 6.0s from the first signal (detected in 1.5s)"


def test_status_shows_the_gangs_goodput_as_of_now() -> None:
    assert doc()["goodput"] is None, "a status without an account (not started, or older)"
    account = {
        "since": "2026-11-21T09:00:00Z",
        "productiveSeconds": 3000.0,
        "badputSeconds": {"scheduling": 40.0, "recovery": 50.0, "wastedProgress": 10.0},
        "unmeasuredSeconds": 0.0,
        "stepSeconds": 0.5,
        "training": {"epoch": 3, "since": "2026-11-21T10:00:00Z", "afterRecovery": True},
    }
    out = doc(goodput=account)["goodput"]
    # NOW is 30 s after the running epoch's barrier opened: counted productive until it ends
    assert (out["productiveSeconds"], out["runningSeconds"]) == (3030.0, 30.0)
    assert out["ratio"] == round(3030 / 3130, 4)
    assert out["badputSeconds"]["restore"] == 0.0, "every bucket, zero or not"
    text = r.render_status(doc(goodput=account))
    assert "Goodput:          96.8% of 52m10s (badput: recovery 50.0s, scheduling 40.0s, " in text
    assert "wastedProgress 10.0s)" in text
    assert out["recent"] is None, "no marks (a status of an older release): no window"


def test_status_shows_the_last_hours_goodput_once_the_gang_is_older() -> None:
    account = {
        "since": "2026-11-21T08:00:00Z",
        "productiveSeconds": 6000.0,
        "badputSeconds": {"recovery": 1170.0},
        "unmeasuredSeconds": 0.0,
        "stepSeconds": 0.5,
        "training": {"epoch": 3, "since": "2026-11-21T10:00:00Z", "afterRecovery": True},
        # 08:00 start; 09:00: 3000 of 3600 productive; 10:00 (barrier): 6000 of 7170
        "marks": [
            {"at": "2026-11-21T08:00:00Z", "productiveSeconds": 0, "measuredSeconds": 0},
            {"at": "2026-11-21T09:00:00Z", "productiveSeconds": 3000, "measuredSeconds": 3600},
            {"at": "2026-11-21T10:00:00Z", "productiveSeconds": 6000, "measuredSeconds": 7170},
        ],
    }
    out = doc(goodput=account)["goodput"]
    # NOW = 10:00:30 (6030 of 7200 s productive): the hour from 09:00:30, 1/120 into the
    # 09:00-10:00 epoch, read at that epoch's average
    f = 30 / 3600
    p0, m0 = 3000 + f * 3000, 3600 + f * 3570
    expected = (6030 - p0) / (7200 - m0)
    assert out["recent"] == {"ratio": round(expected, 4), "windowSeconds": 3600}
    text = r.render_status(doc(goodput=account))
    assert f"83.8% of 2h00m, {expected * 100:.1f}% in the last 1h00m (badput:" in text


def test_status_shows_a_planned_move() -> None:
    planned = {
        "epoch": 3,
        "members": ["workers/0/0"],
        "reason": "node n0 cordoned",
        "requestedAt": "2026-11-21T10:00:20Z",
        "deadline": "2026-11-21T10:10:20Z",
        "step": 425,
    }
    out = doc(plannedStop=planned)
    assert out["plannedMove"]["stopStep"] == 425
    text = r.render_status(out)
    assert (
        "Planned move:     workers/0/0 (node n0 cordoned): the gang stops at step 425, moves by "
        "2026-11-21T10:10:20.000000Z at the latest"
    ) in text
    assert doc()["plannedMove"] is None


def test_status_shows_the_barrier_waiting_for_a_second_look_at_the_steps() -> None:
    ask = {"epoch": 3, "steps": [317, 310], "deadline": "2026-11-21T10:00:05Z"}
    out = doc(barrierOpen=False, phase="Recovering", stepRecheck=ask)
    assert out["stepRecheck"] == {"steps": [317, 310], "deadline": "2026-11-21T10:00:05.000000Z"}
    assert (
        "Waiting for:      members lacking any of steps [317,310] to look at their checkpoint "
        "steps again (until 2026-11-21T10:00:05.000000Z)"
    ) in r.render_status(out)
    assert doc(stepRecheck=ask)["stepRecheck"] is None, "the barrier opened: nothing to wait for"


def test_status_shows_the_in_place_restarts_and_a_failure_repeating_without_progress() -> None:
    repeats = {"signature": "TrainerExited", "count": 2, "furthestStep": 150}
    out = doc(restarts={"inPlace": 7}, repeats=repeats)
    assert out["inPlaceRestarts"] == 7
    assert out["repeats"] == repeats | {"limit": 3}
    text = r.render_status(out)
    assert "Restarts:         7 in place over the gang's life" in text
    assert (
        "Repeating:        TrainerExited 2 of 3 times in a row, never past step 150 "
        "(no-progress-limit escalates)"
    ) in text
    once = doc(repeats=repeats | {"count": 1})
    assert "Repeating:" not in r.render_status(once), "one failure is no repetition"
    assert (doc()["inPlaceRestarts"], doc()["repeats"]) == (0, None)


def test_status_recovery_in_progress_shows_elapsed_time() -> None:
    rec = gangstate()["status"]["recovery"] | {"openedAt": None, "durationSeconds": None}
    out = doc(phase="Recovering", barrierOpen=False, recovery=rec)
    assert out["lastRecovery"]["elapsedSeconds"] == 30.0
    text = r.render_status(out)
    assert "Barrier:          closed" in text
    assert "epoch 3, in progress, 30.0s so far" in text


def test_status_without_recovery_or_node_access() -> None:
    out = r.status_document(gangstate(recovery=None), None, [], None, NOW)
    assert out["lastRecovery"] is None
    assert out["unhealthyNodes"] is None
    text = r.render_status(out)
    assert "Last recovery:    none" in text
    assert "unknown (nodes not readable)" in text
    assert "JobSet not found" in text


def test_status_wide_adds_one_line_per_member() -> None:
    text = r.render_status(doc(), wide=True)
    table = text.split("\n\n", 1)[1].splitlines()
    assert table[0].split() == [
        "MEMBER",
        "POD",
        "NODE",
        "STATE",
        "EPOCH",
        "STEP",
        "RESTARTS",
        "RECOVERY",
    ]
    # its reports on its pod (no GangMembers read); restarted in place by both recoveries
    assert table[1].split() == [
        "workers/0/0",
        "train-workers-0-0-abcde",
        "n0",
        "running",
        "3",
        "200",
        "2",
        "-",
    ]
    assert table[2].split()[6] == "0", "recreated by the last recovery: a new pod"
    assert table[2].split()[3] == "pending"
    assert table[2].endswith("NodeUnhealthy (recreated)")
    assert table[3].split()[3] == "restarting"
    assert table[3].endswith("TrainerExited")


def test_status_of_a_gang_on_the_report_channel_names_who_the_barrier_waits_for() -> None:
    endpoint = {"url": "https://10.0.0.9:9444/v1/reports", "certSHA256": "a" * 64, "leader": "x"}
    pods = [
        {**p, "metadata": {**p["metadata"], "annotations": {}}} for p in PODS
    ]  # nothing reported on the pods: the agents use the channel
    out = r.status_document(
        gangstate(
            phase="Recovering",
            barrierOpen=False,
            members={
                "expected": 20,
                "reported": 8,
                "ready": 20,
                "waiting": ["workers/1/0"],
                "onPod": 2,
            },
            reportEndpoint=endpoint,
        ),
        jobset(),
        pods,
        NODES,
        NOW,
    )
    text = r.render_status(out, wide=True)
    assert "2 member(s) reported on their pods, not to the report channel" in text
    assert "Waiting for:" in text
    assert "workers/1/0 (+11 more)" in text
    table = text.split("\n\n", 1)[1].splitlines()
    assert table[1].split()[4:6] == ["-", "-"], "no GangMembers read: nothing to show"
    assert out["memberPods"][0]["reportedEpoch"] == "(channel)", "the key as it always was"
    rows = [MemberRow("workers/0/0", pods[0]["metadata"]["name"], 4, 250)]
    members = members_object(
        {**jobset(), "metadata": {**jobset()["metadata"], "uid": "u"}}, rows, NOW
    )
    out = r.status_document(gangstate(), jobset(), pods, NODES, NOW, members=members)
    assert (out["memberPods"][0]["epoch"], out["memberPods"][0]["newestStep"]) == (4, 250)
    table = r.render_status(out, wide=True).split("\n\n", 1)[1].splitlines()
    assert table[1].split()[4:7] == ["4", "250", "2"]


def test_status_json_and_yaml_are_the_same_stable_document() -> None:
    out = doc()
    as_json = json.loads(r.dump(out, "json"))
    assert as_json == yaml.safe_load(r.dump(out, "yaml")) == out
    assert list(as_json) == [
        "apiVersion",
        "kind",
        "jobSet",
        "namespace",
        "jobSetFound",
        "phase",
        "reason",
        "message",
        "epoch",
        "barrierOpen",
        "resumeStep",
        "members",
        "pods",
        "unhealthyNodes",
        "budgets",
        "inPlaceRestarts",
        "repeats",
        "restartScope",
        "policyError",
        "lastRecovery",
        "goodput",
        "plannedMove",
        "stepRecheck",
        "memberPods",
        "spares",
    ]


@pytest.mark.parametrize(
    ("status", "conditions", "state"),
    [
        ({"phase": "Failed"}, [], "failed"),
        ({"phase": "Succeeded"}, [], "succeeded"),
        ({"phase": "Pending"}, [], "pending"),
        ({}, [], "pending"),
        (
            {"phase": "Running"},
            [{"type": "AllContainersRestarting", "status": "True"}],
            "restarting",
        ),
        (
            {"phase": "Running", "containerStatuses": [{"state": {"waiting": {}}}]},
            [],
            "restarting",
        ),
        (
            {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]},
            [],
            "running",
        ),
    ],
)
def test_pod_state(status: dict[str, Any], conditions: list[Any], state: str) -> None:
    assert r.pod_state({"status": status | {"conditions": conditions}}) == state


def test_node_problems() -> None:
    assert r.node_problems(node("a")) == []
    assert r.node_problems(None) == ["NotFound"]
    assert r.node_problems({"status": {}}) == ["Ready=Missing"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.25, "0.2s"), (4.5, "4.5s"), (125, "2m05s"), (3720, "1h02m")],
)
def test_fmt_duration(seconds: float | None, text: str) -> None:
    assert r.fmt_duration(seconds) == text


# --- history -----------------------------------------------------------------------------------
def test_history_table_newest_last() -> None:
    gs = gangstate()
    gs["status"]["history"].reverse()  # stored order does not matter: sorted by epoch
    lines = r.render_history(r.history_document(gs)).splitlines()
    assert lines[0].split() == [
        "EPOCH",
        "CAUSES",
        "IN-PLACE",
        "RECREATED",
        "DURATION",
        "RESUME-STEP",
        "REDONE",
        "STARTED",
    ]
    assert lines[1].split() == [
        "2",
        "TrainerExited",
        "3",
        "0",
        "3.0s",
        "100",
        "-",  # recorded before trainers' progress was
        "2026-11-21T09:00:00.000000Z",
    ]
    assert lines[2].split()[:8] == [
        "3", "NodeUnhealthy,", "TrainerExited", "2", "1", "4.5s", "200", "12",
    ]  # fmt: skip


def test_history_empty() -> None:
    text = r.render_history(r.history_document(gangstate(history=[])))
    assert text == "No recoveries recorded for ml/train.\n"


def test_causes_are_ordered_by_count() -> None:
    assert r.fmt_causes({"A": 1, "B": 3}) == "B x3, A"
    assert r.fmt_causes({}) == "-"


# --- option parsing and exit codes ---------------------------------------------------------------
def test_exit_codes_are_distinct_and_fixed() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4]


def test_parser_cluster_flags() -> None:
    args = build_parser().parse_args(
        ["status", "x", "-o", "wide", "--kubeconfig", "k", "--context", "c", "-n", "ns"]
    )
    assert (args.name, args.output, args.kubeconfig, args.context, args.namespace) == (
        "x",
        "wide",
        "k",
        "c",
        "ns",
    )
    args = build_parser().parse_args(["-n", "before", "--context", "c", "status", "x"])
    assert (args.namespace, args.context, args.kubeconfig) == ("before", "c", None)
    args = build_parser().parse_args(["-n", "before", "history", "x", "-n", "after"])
    assert args.namespace == "after"
    args = build_parser().parse_args(["restart", "x", "--yes"])
    assert args.yes is True
    assert args.namespace is None


@pytest.mark.parametrize(
    "argv",
    [[], ["status"], ["status", "x", "-o", "table"], ["enable"], ["bogus"], ["history", "-o"]],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == ExitCode.USAGE
    assert "usage: kubectl jobset-inplace" in capsys.readouterr().err


class FakeCluster:
    """Stands in for :class:`Cluster` (same method names, canned answers)."""

    def __init__(self, js: dict[str, Any] | None = None, gs: dict[str, Any] | None = None) -> None:
        self.namespace = NS
        self._js, self._gs = js, gs
        self.patches: list[dict[str, str]] = []
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}

    def jobset(self, name: str) -> dict[str, Any]:
        if self._js is None:
            raise ApiException(status=404, reason="Not Found")
        return self._js

    def gangstate(self, name: str) -> dict[str, Any]:
        if self._gs is None:
            raise ApiException(status=404, reason="Not Found")
        return self._gs

    def gangstates(self, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
        return [] if self._gs is None else [self._gs]

    def gangmembers(self, name: str) -> dict[str, Any]:
        raise ApiException(status=403, reason="Forbidden")  # a reader without that right

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.deployments.get((namespace, name))

    def annotate_jobset(self, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        self.patches.append(annotations)
        return self._js or {}

    def jobset_pods(self, name: str) -> list[dict[str, Any]]:
        return PODS

    def node(self, name: str) -> dict[str, Any] | None:
        if name == "n2":
            raise ApiException(status=403, reason="Forbidden")
        return NODES.get(name)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(
    argv: list[str], fake: FakeCluster | None = None, stdin: io.StringIO | None = None
) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(
        argv,
        stdout=out,
        stderr=err,
        stdin=stdin or io.StringIO(),
        connector=lambda *_: cast(Cluster, fake or FakeCluster()),
    )
    return code, out.getvalue(), err.getvalue()


def test_status_not_found_says_what_to_check() -> None:
    code, out, err = run(["status", NAME], FakeCluster(jobset(), None))
    assert code == ExitCode.NOT_FOUND
    assert out == ""
    assert f"GangState {NAME} not found in namespace {NS}" in err
    assert f"({names.ENABLED}=true) and the controller running?" in err


def test_status_json_through_main_reports_unreadable_nodes() -> None:
    code, out, _ = run(["status", NAME, "-o", "json"], FakeCluster(jobset(), gangstate()))
    assert code == ExitCode.OK
    assert json.loads(out)["unhealthyNodes"] is None  # node n2 was forbidden


def test_status_watch_prints_again_only_when_the_status_changes_until_interrupted() -> None:
    class Changing(FakeCluster):
        """The gang's epoch moves from 3 to 4 at the third read."""

        reads = 0

        def gangstate(self, name: str) -> dict[str, Any]:
            self.reads += 1
            return gangstate(epoch=4) if self.reads >= 3 else gangstate()

    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 4:
            raise KeyboardInterrupt  # Ctrl-C

    fake, out, err = Changing(jobset(), gangstate()), io.StringIO(), io.StringIO()
    code = main(
        ["status", NAME, "-w", "--interval", "1s"],
        stdout=out,
        stderr=err,
        connector=lambda *_: cast(Cluster, fake),
        sleep=sleep,
    )
    assert (code, err.getvalue()) == (ExitCode.OK, "")
    assert (fake.reads, slept) == (4, [1.0] * 4)
    text = out.getvalue()
    assert text.count("Epoch:") == 2, "printed at first and once more on the change"
    assert "\n--- " in text
    assert text.index("Epoch:            3") < text.index("Epoch:            4")


def test_duration_flags_are_checked_by_name() -> None:
    code, _, err = run(["status", NAME, "-w", "--interval", "soon"], FakeCluster(jobset()))
    assert code == ExitCode.USAGE
    assert "--interval" in err
    assert "a duration such as 30s" in err
    code, _, err = run(["status", NAME, "-w", "--interval", "0"], FakeCluster(jobset()))
    assert (code, "above 0" in err) == (ExitCode.USAGE, True)
    code, _, err = run(["list", "--request-timeout", "-1"], FakeCluster(jobset()))
    assert code == ExitCode.USAGE
    assert "--request-timeout" in err


def test_request_timeout_reaches_every_request_and_its_expiry_is_said_so() -> None:
    calls: list[Any] = []

    class ApiClient:
        def call_api(self, *args: Any, **kwargs: Any) -> None:
            calls.append(kwargs.get("_request_timeout"))

    c = Cluster(cast(Any, ApiClient()), NS)
    c.set_request_timeout(5.0)
    c.api_client.call_api("/x", "GET")
    c.api_client.call_api("/x", "GET", _request_timeout=1.0)  # a call's own stays
    assert calls == [5.0, 1.0]

    class Slow(FakeCluster):
        timeout: float | None = None

        def set_request_timeout(self, seconds: float) -> None:
            self.timeout = seconds

        def gangstates(self, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
            raise urllib3.exceptions.ReadTimeoutError(None, "/apis", "Read timed out.")  # type: ignore[arg-type]

    slow = Slow(jobset(), gangstate())
    code, _, err = run(["list", "--request-timeout", "2m"], slow)
    assert (code, slow.timeout) == (ExitCode.NO_CLUSTER, 120.0)
    assert "did not answer within --request-timeout 2m" in err


def test_history_through_main() -> None:
    code, out, _ = run(["history", NAME], FakeCluster(jobset(), gangstate()))
    assert code == ExitCode.OK
    assert len(out.splitlines()) == 3


def test_list_one_line_per_gang_with_the_namespace_under_all_namespaces() -> None:
    other = gangstate() | {"metadata": {"name": "aaa", "namespace": "z-team"}}
    broken = gangstate(phase="Exploded") | {"metadata": {"name": "bad", "namespace": NS}}
    doc_ = r.list_document([other, broken, gangstate()], NOW)
    assert [(g["namespace"], g["name"]) for g in doc_["gangs"]] == [
        (NS, "bad"),
        (NS, NAME),
        ("z-team", "aaa"),
    ]
    text = r.render_list(doc_, all_namespaces=True)
    head, bad, ours, _ = text.splitlines()
    assert head.split()[:3] == ["NAMESPACE", "NAME", "PHASE"]
    assert ours.split() == [NS, NAME, "Running", "3", "open", "200", "2", "1", "4.5s", "-"]
    assert "cannot read the status" in bad, "listed with its error, not dropped"
    assert r.render_list(doc_, all_namespaces=False).splitlines()[0].split()[0] == "NAME"
    code, out, _ = run(["list"], FakeCluster(jobset(), None))
    assert (code, out) == (ExitCode.OK, "No gangs found.\n")
    code, out, _ = run(["list", "-A", "-o", "yaml"], FakeCluster(jobset(), gangstate()))
    assert code == ExitCode.OK
    assert yaml.safe_load(out)["gangs"][0]["lastRecoverySeconds"] == 4.5


def _controller(image: str, ready: int = 2) -> dict[str, Any]:
    return {
        "spec": {"template": {"spec": {"containers": [{"name": "controller", "image": image}]}}},
        "status": {"readyReplicas": ready},
    }


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("jobset-inplace/controller:0.2.0", "0.2.0"),
        ("registry.example:5000/jsi/controller:v0.2.1", "0.2.1"),
        ("jobset-inplace/controller:0.2.0@sha256:" + "a" * 64, "0.2.0"),
        ("registry.example:5000/controller", None),  # the port is not a tag
        ("jobset-inplace/controller:dev", None),
    ],
)
def test_image_version(image: str, version: str | None) -> None:
    assert r.image_version(image) == version


def test_version_says_the_plugins_own_without_a_cluster() -> None:
    def no_cluster(*_: object) -> Cluster:
        raise ClusterConfigError("no kubeconfig: set KUBECONFIG")

    out, err = io.StringIO(), io.StringIO()
    code = main(["version", "--client"], stdout=out, stderr=err, connector=no_cluster)
    assert (code, out.getvalue(), err.getvalue()) == (
        ExitCode.OK,
        f"plugin:     {__version__}\n",
        "",
    )
    code = main(["version", "--client", "-o", "json"], stdout=(out := io.StringIO()))
    assert json.loads(out.getvalue()) == {"plugin": __version__}
    out, err = io.StringIO(), io.StringIO()
    code = main(["version"], stdout=out, stderr=err, connector=no_cluster)
    assert code == ExitCode.NO_CLUSTER
    assert out.getvalue() == f"plugin:     {__version__}\n", "its own version first"
    assert "no kubeconfig" in err.getvalue()


def test_version_warns_when_plugin_and_controller_differ_in_minor_version() -> None:
    fake = FakeCluster()
    where = (names.INSTALL_NAMESPACE, names.CONTROLLER_NAME)
    major, minor, _ = __version__.split(".")
    fake.deployments = {where: _controller(f"jobset-inplace/controller:{major}.{minor}.99")}
    code, out, err = run(["version"], fake)
    assert code == ExitCode.OK
    assert out.splitlines() == [
        f"plugin:     {__version__}",
        f"controller: {major}.{minor}.99 (image jobset-inplace/controller:{major}.{minor}.99, "
        "2 ready)",
    ]
    assert err == "", "a patch release apart: no warning"
    fake.deployments = {where: _controller(f"jobset-inplace/controller:{major}.{int(minor) + 1}.0")}
    code, _, err = run(["version"], fake)
    assert code == ExitCode.OK
    assert err.startswith("warning: the plugin")
    fake.deployments = {}
    code, out, _ = run(["version", "-o", "json"], fake)
    doc_ = json.loads(out)
    assert (doc_["controller"]["found"], doc_["skew"]) == (False, None)
    assert "not found" in run(["version"], fake)[1]


def test_status_and_history_report_a_malformed_gangstate_status() -> None:
    gs = gangstate(phase="Exploded")  # read as the controller reads it: not a phase
    for command in ("status", "history"):
        code, out, err = run([command, NAME], FakeCluster(jobset(), gs))
        assert code == ExitCode.FAILED
        assert out == ""
        assert "cannot read the status of the GangState" in err
        assert "Exploded" in err


def test_status_of_a_gangstate_the_controller_has_not_initialised() -> None:
    gs = gangstate()
    gs["status"] = {}
    out = r.status_document(gs, jobset(), [], {}, NOW)
    assert (out["phase"], out["epoch"], out["barrierOpen"], out["resumeStep"]) == (
        None,
        None,
        False,
        None,
    )
    assert out["members"] == {"expected": 0, "reported": 0, "ready": 0, "waiting": [], "onPod": 0}
    assert out["lastRecovery"] is None
    assert "Unknown (no status yet" in r.render_status(out)
    assert r.history_document(gs)["recoveries"] == []


def test_member_id_marks_missing_labels() -> None:
    labels = {names.REPLICATED_JOB_LABEL: "workers", names.COMPLETION_INDEX_LABEL: "0"}
    assert r.member_id({"metadata": {"labels": labels}}) == "workers/?/0"
    assert r.member_id(PODS[0]) == "workers/0/0"


def test_restart_refuses_without_tty() -> None:
    fake = FakeCluster(jobset(), gangstate())
    code, _, err = run(["restart", NAME], fake, io.StringIO("y\n"))
    assert code == ExitCode.USAGE
    assert "stdin is not a terminal" in err
    assert "--yes" in err
    assert fake.patches == []


def test_restart_asks_on_a_tty() -> None:
    fake = FakeCluster(jobset(), gangstate())
    code, _, err = run(["restart", NAME], fake, FakeTTY("n\n"))
    assert (code, fake.patches) == (ExitCode.USAGE, [])
    assert "[y/N]" in err
    assert "not confirmed" in err
    code, out, _ = run(["restart", NAME], fake, FakeTTY("yes\n"))
    assert code == ExitCode.OK
    assert list(fake.patches[0]) == [names.RESTART_REQUEST]
    assert "restart requested" in out


def test_restart_yes_sets_a_fresh_value() -> None:
    fake = FakeCluster(jobset(), gangstate())
    assert run(["restart", NAME, "--yes"], fake)[0] == ExitCode.OK
    assert run(["restart", NAME, "-y"], fake)[0] == ExitCode.OK
    first, second = (p[names.RESTART_REQUEST] for p in fake.patches)
    assert first != second
    assert parse_time(first) is not None


def test_restart_refuses_a_jobset_that_has_not_opted_in() -> None:
    js = jobset()
    js["metadata"]["annotations"] = {}
    fake = FakeCluster(js, gangstate())
    code, _, err = run(["restart", NAME, "--yes"], fake)
    assert code == ExitCode.FAILED
    assert fake.patches == []
    assert f"has not opted in to jobset-inplace: set the annotation {names.ENABLED}" in err


def test_restart_missing_jobset() -> None:
    code, _, err = run(["restart", NAME, "--yes"], FakeCluster(None, None))
    assert code == ExitCode.NOT_FOUND
    assert f"JobSet {NAME} not found in namespace {NS}" in err


def test_restart_value_is_utc_microseconds() -> None:
    when = dt.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=dt.UTC)
    assert restart_value(when) == "2026-11-21T10:00:00.123456Z"


# --- enable -------------------------------------------------------------------------------------
JOBSET_YAML = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: train
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 1
        completions: 1
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: trainer
              image: trainer:1
              command: [python3, train.py]
"""


def test_enable_adds_opt_in_and_transforms() -> None:
    out = yaml.safe_load(enable_text(JOBSET_YAML, "agent:1")[0])
    assert out["metadata"]["annotations"] == {names.ENABLED: "true"}
    pod_spec = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod_spec["initContainers"][0]["image"] == "agent:1"
    assert out["spec"]["failurePolicy"] == {"maxRestarts": 2}
    # Idempotent: enabling the output changes nothing.
    assert enable_diff(enable_text(JOBSET_YAML, "agent:1")[0], "agent:1")[0] == ""
    # Plain YAML: a value shared in memory (the agent's volume mounts) written out twice,
    # never as an anchor and an alias.
    text, _ = enable_text(JOBSET_YAML, "agent:1")
    assert "&id" not in text
    assert "*id" not in text


def test_enable_keeps_an_explicit_opt_in_value_and_other_documents() -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n"
    docs = list(yaml.safe_load_all(enable_text(cm + "---\n" + JOBSET_YAML, "a")[0]))
    assert docs[0] == yaml.safe_load(cm)
    assert docs[1]["kind"] == "JobSet"


def test_enable_diff_through_main(tmp_path: Path) -> None:
    f = tmp_path / "js.yaml"
    f.write_text(JOBSET_YAML)
    code, out, _ = run(["enable", "-f", str(f), "--diff", "--image", "agent:2"])
    assert code == ExitCode.OK
    lines = out.splitlines()
    assert lines[0] == f"--- {f} (original)"
    assert lines[1] == f"+++ {f} (jobset-inplace)"
    assert f"+    {names.ENABLED}: 'true'" in lines
    assert "+              image: agent:2" in lines
    assert "+        backoffLimit: 2147483647" in lines
    assert not any(ln.startswith("-") and not ln.startswith("---") for ln in lines)


def test_enable_from_stdin() -> None:
    code, out, _ = run(["enable", "-f", "-"], stdin=io.StringIO(JOBSET_YAML))
    assert code == ExitCode.OK
    assert yaml.safe_load(out)["metadata"]["annotations"][names.ENABLED] == "true"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            JOBSET_YAML.replace(
                "  name: train\n",
                f'  name: train\n  annotations:\n    {names.INPLACE_BUDGET}: "lots"\n',
            ),
            f"annotation {names.INPLACE_BUDGET}='lots' is invalid",
        ),
        (
            JOBSET_YAML.replace("completions: 1", "completions: 2"),
            "spec.replicatedJobs[0].template.spec: completions (2) must equal parallelism (1)",
        ),
        (
            JOBSET_YAML.replace("restartPolicy: Never", "restartPolicy: OnFailure"),
            "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy must be Never",
        ),
        ("apiVersion: v1\nkind: ConfigMap\n", "no JobSet"),
        ("a: [b\n", "is not valid YAML"),
    ],
)
def test_enable_errors_name_the_field_and_exit_1(text: str, needle: str) -> None:
    code, out, err = run(["enable", "-f", "-"], stdin=io.StringIO(text))
    assert code == ExitCode.FAILED
    assert out == ""
    assert needle in err, err


def _with_annotations(**annotations: str) -> str:
    lines = "".join(f'    {k}: "{v}"\n' for k, v in annotations.items())
    return JOBSET_YAML.replace("  name: train\n", f"  name: train\n  annotations:\n{lines}")


def test_enable_refuses_what_the_webhook_refuses() -> None:
    """A typo in a key: the webhook's refusal, word for word, offline."""
    text = _with_annotations(**{f"{names.PREFIX}barier-timeout": "5m"})
    allowed, refusal = validate(yaml.safe_load(_with_annotations(
        **{names.ENABLED: "true", f"{names.PREFIX}barier-timeout": "5m"}
    )))  # fmt: skip
    assert not allowed
    assert "did you mean" in refusal
    code, out, err = run(["enable", "-f", "-"], stdin=io.StringIO(text))
    assert code == ExitCode.FAILED
    assert out == ""
    assert refusal in err, err


def test_enable_prints_the_webhooks_warnings_and_leaves_an_opt_out_alone() -> None:
    code, out, err = run(["enable", "-f", "-"], stdin=io.StringIO(JOBSET_YAML))
    assert code == ExitCode.OK
    said = warnings(yaml.safe_load(out))
    assert said, "a gang without checkpoint tiers is warned about"
    assert err.splitlines() == [f"Warning: JobSet train: {w}" for w in said]
    opted_out = _with_annotations(**{names.ENABLED: "false"})
    code, out, err = run(["enable", "-f", "-"], stdin=io.StringIO(opted_out))
    assert code == ExitCode.OK
    assert yaml.safe_load(out) == yaml.safe_load(opted_out), "no agent where it said false"
    assert "left as it is" in err


EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_enable_gives_every_example_what_the_webhook_gives_it(path: Path) -> None:
    """The same result and the same warnings as a live create through the webhook (its
    validate, then its mutate's JSON patch)."""
    text = path.read_text()
    written, said = enable_text(text, DEFAULT_AGENT_IMAGE)
    docs = [d for d in yaml.safe_load_all(text) if d]
    jobsets = [d for d in docs if d.get("kind") == "JobSet"]
    assert jobsets
    expected_warnings = []
    for js in jobsets:
        js["metadata"].setdefault("annotations", {}).setdefault(names.ENABLED, "true")
        assert validate(js) == (True, "")
        expected_warnings += [f"JobSet {js['metadata']['name']}: {w}" for w in warnings(js)]
        patched = jsonpatch.apply_patch(js, mutate(js, AgentSettings(image=DEFAULT_AGENT_IMAGE)))
        js.clear()
        js.update(patched)
    assert [d for d in yaml.safe_load_all(written) if d] == docs
    assert said == expected_warnings


def test_enable_missing_file(tmp_path: Path) -> None:
    code, _, err = run(["enable", "-f", str(tmp_path / "nope.yaml")])
    assert code == ExitCode.FAILED
    assert "cannot read" in err


# --- doctor -------------------------------------------------------------------------------------
GATES_135 = "RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true"


def version(minor: str) -> dict[str, Any]:
    return {"major": "1", "minor": minor, "gitVersion": f"v1.{minor.rstrip('+')}.2"}


def test_check_version_tells_gated_from_default_on() -> None:
    v135 = platform_checks.check_version(version("35"))
    assert v135.result == "PASS"
    assert "alpha" in v135.detail
    assert GATES_135 in v135.detail
    for minor in ("36", "37+"):
        c = platform_checks.check_version(version(minor))
        assert c.result == "PASS"
        assert "on by default" in c.detail
        assert "--feature-gates" not in c.detail
    old = platform_checks.check_version(version("34"))
    assert old.result == "FAIL"
    assert "upgrade" in old.hint
    assert platform_checks.check_version({"major": "x"}).result == "WARN"


def test_check_dry_run() -> None:
    ok = platform_checks.check_dry_run(platform_checks.probe_pod(), None)
    assert ok.result == "PASS"
    dropped = platform_checks.probe_pod()
    del dropped["spec"]["containers"][0]["restartPolicyRules"]
    assert platform_checks.check_dry_run(dropped, None).result == "FAIL"
    rejected = platform_checks.check_dry_run(
        None, 'spec.containers[0].restartPolicyRules[0].action: "x"'
    )
    assert rejected.result == "FAIL"
    assert RESTART_ALL_FEATURE in rejected.hint
    assert platform_checks.check_dry_run(None, "pods is forbidden").result == "WARN"


def test_check_dry_run_advice_follows_the_version() -> None:
    err = 'spec.containers[0].restartPolicyRules: Forbidden: "x"'
    assert platform_checks.check_dry_run(None, err, 35).hint == (
        f"1.35 needs --feature-gates={GATES_135} on kube-apiserver"
    )
    on37 = platform_checks.check_dry_run(None, err, 37).hint
    assert "on by default since 1.36" in on37
    assert "turns it off on kube-apiserver" in on37


def declaring(n: dict[str, Any], kubelet: str) -> dict[str, Any]:
    n["status"]["nodeInfo"] = {"kubeletVersion": kubelet}
    n["status"]["declaredFeatures"] = [RESTART_ALL_FEATURE]
    return n


def with_kubelet(n: dict[str, Any], kubelet: str) -> dict[str, Any]:
    n["status"]["nodeInfo"] = {"kubeletVersion": kubelet}
    return n


def test_check_declared_features() -> None:
    c = platform_checks.check_declared_features([declaring(node("a"), "v1.37.2")])
    assert (c.result, c.detail) == ("PASS", f"1/1 nodes declare {RESTART_ALL_FEATURE}")
    none = platform_checks.check_declared_features([with_kubelet(node("a"), "v1.35.4")])
    assert none.result == "FAIL"
    assert "cannot be scheduled anywhere" in none.detail
    assert none.hint == f"1.35 needs --feature-gates={GATES_135} on those kubelets"
    some = platform_checks.check_declared_features(
        [
            declaring(node("a"), "v1.37.2"),
            with_kubelet(node("b"), "v1.37.2"),
            with_kubelet(node("c"), "v1.34.1"),
            node("d"),
        ]
    )
    assert some.result == "WARN"
    assert some.detail.startswith(f"1/4 nodes declare {RESTART_ALL_FEATURE}")
    assert "b (kubelet v1.37.2), c (kubelet v1.34.1), d (kubelet ?)" in some.detail
    assert some.hint.split("; ")[:2] == [
        f"enable the {RESTART_ALL_FEATURE} feature gate on those kubelets"
        " (on by default from 1.36)",
        "upgrade kubelets older than 1.35",
    ]
    assert "remove the --feature-gates entry that turns it off" in some.hint.split("; ")[2]


def test_check_crds() -> None:
    crd = {
        "spec": {"versions": [{"name": "v1alpha1", "served": True}]},
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }
    assert crds.check_gangstate_crd(crd).result == "PASS"
    assert crds.check_gangstate_crd(None).result == "FAIL"
    assert crds.check_gangstate_crd(crd | {"status": {}}).result == "FAIL"
    js = {"spec": {"versions": [{"name": "v1alpha2", "served": True}]}}
    c = crds.check_jobset_crd(js, ["registry.k8s.io/jobset/jobset:v0.12.0"])
    assert c.result == "PASS"
    assert "v1alpha2" in c.detail
    assert "jobset:v0.12.0" in c.detail
    assert crds.check_jobset_crd(None).result == "FAIL"
    assert crds.check_kueue_crds(dict.fromkeys(crds.KUEUE_CRDS, False)).result == "WARN"
    assert crds.check_kueue_crds(dict.fromkeys(crds.KUEUE_CRDS, True)).result == "PASS"


@pytest.mark.parametrize(
    ("config", "result"),
    [
        (None, "SKIP"),
        # v1beta1: waitForPodsReady only with enable: true (timeout 5m, recoveryTimeout = it)
        (f"{V1BETA1}waitForPodsReady:\n  enable: false\n", "PASS"),
        (f"{V1BETA1}waitForPodsReady:\n  enable: true\n", "WARN"),
        # v1beta2 (Kueue 0.19): always on, 30m by default
        (f"{V1BETA2}integrations: {{}}\n", "PASS"),
        (f"{V1BETA2}waitForPodsReady:\n  timeout: 10m\n", "WARN"),
        (f"{V1BETA2}waitForPodsReady:\n  recoveryTimeout: 10m0s\n", "WARN"),  # 2 x 5m > 80 %
        (f"{V1BETA2}waitForPodsReady:\n  recoveryTimeout: 12m30s\n", "PASS"),  # exactly fits
        (f"{V1BETA2}waitForPodsReady:\n  recoveryTimeout: soon\n", "SKIP"),
        ("waitForPodsReady: [1, 2]\n", "SKIP"),
    ],
)
def test_check_kueue_recovery(config: str | None, result: str) -> None:
    assert crds.check_kueue_recovery(config, 300.0).result == result


def test_the_doctor_and_the_planner_keep_the_barrier_by_one_rule() -> None:
    config = f"{V1BETA2}waitForPodsReady:\n  recoveryTimeout: 10m\n"
    check = crds.check_kueue_recovery(config, 300.0)
    assert "cuts the barrier timeout to 4m00s" in check.detail  # 80 % of 10m, halved
    assert check.hint is not None
    assert "recoveryTimeout >= 12m30s" in check.hint


class FakeReader:
    namespace = "default"

    def __init__(self, *, gangstate_crd: bool = True) -> None:
        self.gangstate_crd = gangstate_crd

    def server_version(self) -> dict[str, Any]:
        return {"major": "1", "minor": "35", "gitVersion": "v1.35.4"}

    def crd(self, name: str) -> dict[str, Any] | None:
        if name.endswith("kueue.x-k8s.io"):
            return {}
        if name == crds.GANGSTATE_CRD and not self.gangstate_crd:
            return None
        ours = (crds.GANGSTATE_CRD, crds.GANGMEMBERS_CRD)
        version = "v1alpha1" if name in ours else "v1alpha2"
        return {
            "spec": {"versions": [{"name": version, "served": True}]},
            "status": {"conditions": [{"type": "Established", "status": "True"}]},
        }

    def nodes(self) -> list[dict[str, Any]]:
        return [declaring(node("a"), "v1.35.4"), with_kubelet(node("b"), "v1.35.4")]

    def dry_run_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def configmap(self, namespace: str, name: str) -> dict[str, Any]:
        raise ApiException(status=403, reason="Forbidden")

    def deployment_images(self, namespace: str) -> list[str]:
        raise ApiException(status=403, reason="Forbidden")

    def admission_policy(self, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name}, "spec": {"paramKind": {"kind": "RoleBinding"}}}

    def admission_policy_binding(self, name: str) -> dict[str, Any] | None:
        spec = {
            "validationActions": ["Deny"],
            "paramRef": {"selector": {"matchLabels": {AGENT_BINDING_LABEL: "true"}}},
        }
        return {"metadata": {"name": name}, "spec": spec}

    # the install: a ready controller whose leader renewed 3 s before the server's Date
    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}

    def lease(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]:
        spec = {
            "holderIdentity": "ctl-7d9-x2_ab12cd34",
            "renewTime": "2026-11-27T10:00:07.000000Z",
            "leaseDurationSeconds": 15,
        }
        return {"spec": spec}, "Fri, 27 Nov 2026 10:00:10 GMT"

    def dry_run_jobset(self, body: dict[str, Any]) -> dict[str, Any]:
        pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["initContainers"] = [{"name": AGENT_CONTAINER, "restartPolicy": "Always"}]
        return body

    def namespace_object(self, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "labels": {access.PSS_ENFORCE: "restricted"}}}

    def cluster_role(self, name: str) -> dict[str, Any] | None:
        return agent_cluster_role()

    def role_binding(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # no opted-in JobSet in the namespace yet

    def allowed(self, user: str, groups: list[str], attributes: dict[str, str]) -> bool:
        return True

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        ports = [{"name": "reports", "containerPort": 9555}]
        return {"spec": {"containers": [{"name": "controller", "ports": ports}]}}

    def pod_proxy_get(self, namespace: str, pod: str, port: int, path: str) -> tuple[int, str]:
        assert (pod, port, path) == ("ctl-7d9-x2", 9555, "/v1/reports")
        return 405, '{"error":"method GET: reports are sent with POST"}'


def test_check_controller() -> None:
    assert install.check_controller(None, "ns").result == "FAIL"
    down = install.check_controller({"spec": {"replicas": 2}, "status": {}}, "ns")
    assert (down.result, down.detail) == (
        "FAIL",
        "Deployment ns/jobset-inplace-controller: 0/2 replicas ready",
    )
    assert (
        install.check_controller(
            {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}, "ns"
        ).result
        == "WARN"
    )


@pytest.mark.parametrize(
    ("spec", "now", "result"),
    [
        (
            {
                "holderIdentity": "p_1",
                "renewTime": "2026-11-27T10:00:00Z",
                "leaseDurationSeconds": 15,
            },
            1795773610.0,
            "PASS",
        ),
        (
            {
                "holderIdentity": "p_1",
                "renewTime": "2026-11-27T10:00:00Z",
                "leaseDurationSeconds": 15,
            },
            1795773630.0,
            "FAIL",
        ),
        (
            {"holderIdentity": "", "renewTime": "2026-11-27T10:00:00Z", "leaseDurationSeconds": 1},
            1795773600.0,
            "FAIL",
        ),
        (
            {
                "holderIdentity": "p_1",
                "renewTime": "2026-11-27T10:00:00Z",
                "leaseDurationSeconds": 15,
            },
            None,
            "WARN",
        ),
    ],
)
def test_check_leader_judges_the_lease_by_the_servers_clock(
    spec: dict[str, Any], now: float | None, result: str
) -> None:
    assert install.check_leader({"spec": spec}, now, "ns").result == result
    assert install.check_leader(None, now, "ns").result == "FAIL"


def test_check_webhook() -> None:
    probe = install.probe_jobset("x1")
    assert probe["metadata"]["name"] == "jobset-inplace-doctor-x1", "the webhook needs a name"
    assert install.check_webhook(probe, None, "team").result == "FAIL", "accepted without the agent"
    assert "refused" in install.check_webhook(None, "failed calling webhook", "team").detail
    assert install.check_webhook(FakeReader().dry_run_jobset(probe), None, "team").result == "PASS"


def test_the_agent_permissions_check_asks_what_the_controller_needs_to_bind_them() -> None:
    asked = access.controller_permissions("team")
    assert {(a["resource"], a["verb"]) for a in asked} == {
        ("serviceaccounts", "create"), ("serviceaccounts", "patch"),
        ("rolebindings", "create"), ("rolebindings", "patch"), ("clusterroles", "bind"),
    }  # fmt: skip
    assert all(a["namespace"] == "team" for a in asked)
    [bind] = [a for a in asked if a["verb"] == "bind"]
    assert bind["name"] == AGENT_CLUSTER_ROLE, "bind on that ClusterRole only"
    role = agent_cluster_role()
    controller = "system:serviceaccount:jobset-inplace-system:jobset-inplace-controller"
    check = access.check_agent_access("team", role, [bind], None, controller)
    assert (check.result, check.detail) == (
        "FAIL",
        f"{controller} may not bind clusterroles.rbac.authorization.k8s.io in team: it cannot "
        "give agents their rights",
    )
    assert "manifests/controller/rbac.yaml" in check.hint
    check = access.check_agent_access("team", None, [], None, controller)
    assert (check.result, check.hint) == (
        "FAIL",
        "kubectl apply --server-side -f manifests/rbac/agent.yaml",
    )
    check = access.check_agent_access("team", role, [], None, controller)
    assert (check.result, "with its first opted-in JobSet" in check.detail) == ("PASS", True)
    ours = desired_binding("team", [Owner("js", "u1", frozenset({"trainer"}))])
    check = access.check_agent_access("team", role, [], ours, controller)
    assert check.result == "PASS"
    assert "to jobset-inplace-agent, trainer," in check.detail
    by_hand = {**ours, "metadata": {"name": AGENT_BINDING}}
    check = access.check_agent_access("team", role, [], by_hand, controller)
    assert (check.result, check.hint) == (
        "FAIL",
        f"kubectl -n team delete rolebinding {AGENT_BINDING} (the controller makes its own)",
    )


def test_check_channel_wants_the_channels_own_refusal() -> None:
    ours = '{"error":"method GET: reports are sent with POST"}'
    assert install.check_channel(405, ours, "p:9444").result == "PASS"
    status = '{"kind":"Status","message":"error trying to reach service: dial tcp: i/o timeout"}'
    check = install.check_channel(503, status, "p:9444")
    assert check.result == "WARN"
    assert "i/o timeout" in check.detail
    assert install.check_channel(405, "not json", "p:9444").result == "WARN"
    assert install.channel_port(None) == 9444


def test_check_pod_security_names_the_level() -> None:
    assert (
        "trainers must too"
        in access.check_pod_security("t", FakeReader().namespace_object("t")).detail
    )
    assert "none (privileged)" in access.check_pod_security("t", {"metadata": {}}).detail
    assert access.check_pod_security("t", None).result == "FAIL"


PARAM_POLICY = {"spec": {"paramKind": {"kind": "RoleBinding"}}}
PARAM = {"selector": {"matchLabels": {AGENT_BINDING_LABEL: "true"}}}
BY_NAME = {"name": AGENT_BINDING}  # an earlier release's: fetched per pod write on 1.37


@pytest.mark.parametrize(
    ("policy", "binding", "result"),
    [
        (None, None, "WARN"),
        ({}, None, "WARN"),
        ({}, {"spec": {"validationActions": ["Audit"]}}, "WARN"),
        ({}, {"spec": {"validationActions": ["Deny"]}}, "WARN"),  # an earlier release's
        (PARAM_POLICY, {"spec": {"validationActions": ["Deny"], "paramRef": PARAM}}, "PASS"),
        (PARAM_POLICY, {"spec": {"validationActions": ["Deny"], "paramRef": BY_NAME}}, "WARN"),
    ],
)
def test_check_agent_policy(
    policy: dict[str, Any] | None, binding: dict[str, Any] | None, result: str
) -> None:
    check = access.check_agent_policy(policy, binding)
    assert check.result == result
    if result == "WARN":
        assert check.hint == access.AGENT_POLICY_HINT


@pytest.mark.parametrize(
    ("policy", "binding", "result"),
    [
        (None, None, "WARN"),
        ({}, None, "WARN"),
        ({}, {"spec": {"validationActions": ["Warn"]}}, "WARN"),
        ({}, {"spec": {"validationActions": ["Deny"]}}, "PASS"),
    ],
)
def test_check_controller_pod_policy(
    policy: dict[str, Any] | None, binding: dict[str, Any] | None, result: str
) -> None:
    check = access.check_controller_pod_policy(policy, binding)
    assert check.result == result
    if result == "WARN":
        assert check.hint == access.CONTROLLER_RBAC_HINT
        assert "manifests/controller/rbac.yaml" in check.hint
    if policy is None:
        assert "waits for the Job's backoff" in check.detail


def test_run_checks_and_render() -> None:
    checks = doctor.run_checks(FakeReader())
    assert [(c.name, c.result.value) for c in checks] == [
        ("Kubernetes version", "PASS"),
        ("RestartAllContainers", "PASS"),
        ("JobSet CRD", "PASS"),
        ("GangState CRD", "PASS"),
        ("GangMembers CRD", "PASS"),
        ("Agent admission policy", "PASS"),
        ("Controller pod policy", "PASS"),
        ("Kueue CRDs", "PASS"),
        ("Node declared features", "WARN"),
        ("Kueue recoveryTimeout", "SKIP"),
        ("Controller", "PASS"),
        ("Leader", "PASS"),
        ("Webhook", "PASS"),
        ("Agent permissions", "PASS"),
        ("Pod Security", "PASS"),
        ("Report channel", "PASS"),
    ]
    assert "403" in checks[9].detail
    assert "ctl-7d9-x2 holds jobset-inplace-system/jobset-inplace-controller, renewed 3s ago" in (
        checks[11].detail
    )
    assert not doctor.failed(checks)
    text = doctor.render_checks(checks)
    assert f"    fix: 1.35 needs --feature-gates={GATES_135} on those kubelets" in text
    assert text.endswith("0 failed, 1 warnings, 16 checks\n")


def test_a_missing_gangmembers_crd_is_a_warning_naming_what_is_lost() -> None:
    check = crds.check_gangmembers_crd(None)
    assert (check.result, check.hint) == ("WARN", crds.CRD_HINT)
    assert "status -o wide shows only what agents wrote on their pods" in check.detail


def test_doctor_exit_code_is_1_on_any_fail() -> None:
    def doctor(reader: FakeReader, *extra: str) -> tuple[int, str]:
        out = io.StringIO()
        code = main(["doctor", *extra], stdout=out, connector=lambda *_: cast(Cluster, reader))
        return code, out.getvalue()

    assert doctor(FakeReader())[0] == ExitCode.OK
    code, text = doctor(FakeReader(gangstate_crd=False))
    assert code == ExitCode.FAILED
    assert "GangState CRD" in text
    assert "kubectl apply --server-side -k manifests/crd" in text
    code, text = doctor(FakeReader(), "-o", "json")
    assert code == ExitCode.OK
    assert json.loads(text)["failed"] is False


def test_a_check_the_reader_may_not_make_is_skipped_not_failed() -> None:
    class NoReviews(FakeReader):
        def allowed(self, user: str, groups: list[str], attributes: dict[str, str]) -> bool:
            raise ApiException(status=403, reason="Forbidden")

        def pod_proxy_get(self, namespace: str, pod: str, port: int, path: str) -> tuple[int, str]:
            raise ApiException(status=500, reason="Internal Server Error")

    checks = {c.name: c for c in doctor.run_checks(NoReviews())}
    assert checks["Agent permissions"].result == "SKIP"
    assert "not allowed to check" in checks["Agent permissions"].detail
    assert checks["Report channel"].result == "FAIL", "any other API error still fails"


@pytest.mark.parametrize(
    "command", ["list", "status", "history", "restart", "enable", "version", "doctor"]
)
def test_every_subcommands_help_has_an_example(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out
    assert f"kubectl jobset-inplace {command}" in out


def test_status_shows_hot_spares_and_which_member_each_serves() -> None:
    js = jobset(**{names.HOT_SPARES: "1"})
    js["spec"] = {
        "replicatedJobs": [
            {"name": "workers", "replicas": 4, "template": {"spec": {"parallelism": 1}}}
        ]
    }
    pods = [pod(0, "n0"), pod(2, "n2"), pod(3, "n3"), pod(1, "n4")]  # 1: the old one's Job's new
    slots = {"workers/1/0": "workers/3/0"}  # position 3 (the spare) took member 1's place
    out = r.status_document(gangstate(slots=slots), js, pods, NODES, NOW)
    assert out["spares"] == {"declared": 1, "running": 1, "serving": slots}
    by_pod = {p["position"]: (p["member"], p["spare"]) for p in out["memberPods"]}
    assert by_pod == {
        "workers/0/0": ("workers/0/0", False),
        "workers/1/0": (None, True),
        "workers/2/0": ("workers/2/0", False),
        "workers/3/0": ("workers/1/0", False),
    }
    text = r.render_status(out, wide=True)
    assert "Hot spares:       1 declared, 1 running; serving: workers/1/0 on workers/3/0" in text
    assert "spare (workers/1/0)" in text
    assert "workers/1/0 (on workers/3/0)" in text
    assert r.status_document(gangstate(), jobset(), PODS, NODES, NOW)["spares"] is None
