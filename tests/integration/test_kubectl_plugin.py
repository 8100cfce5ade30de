"""``kubectl jobset-inplace`` as a real subprocess against the real apiserver: a known state is
created through the API (a JobSet, its pods and nodes as :mod:`testbed.gangsim` simulates them,
and a GangState whose status is written through the status subresource, as the controller would),
and every assertion is on the CLI's output, exit code, or the API state it changed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobset_inplace import __version__, names
from jobset_inplace.controller.executor import Executor
from jobset_inplace.core.gangmembers import MemberRow
from jobset_inplace.core.gangstate import new_gangstate
from jobset_inplace.kubectl_plugin import ExitCode
from jobset_inplace.platform import RESTART_ALL_FEATURE
from testbed.controller import AGENT_POLICY, MEMBERS_CRD
from testbed.controlplane import ControlPlane
from testbed.gangsim import CRD, Gang, ensure_node, set_node_ready
from testbed.kube import Clients, get_jobset

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gangstate_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl().apply_files([CRD], server_side=True)
    control_plane.kubectl().wait_crds_established([f"{names.GANGSTATE_PLURAL}.{names.GROUP}"])


def plugin(
    control_plane: ControlPlane, *args: str, namespace: str | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    cluster = ["--kubeconfig", str(control_plane.kubeconfig)]
    if namespace is not None:
        cluster += ["-n", namespace]
    cmd = [sys.executable, "-m", "jobset_inplace.kubectl_plugin", *args]
    if args[0] != "enable":
        cmd += cluster
    # stdin is a pipe here, never a TTY.
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False)


def status_of() -> dict[str, Any]:
    """What the controller would have written after one recovery (epoch 2: member 1 on a dead
    node recreated, the others restarted in place) and a second one now in progress."""

    def m(i: int) -> str:
        return f"workers/{i}/0"

    return {
        "phase": "Recovering",
        "reason": "MemberFailed",
        "message": "member workers/2/0: TrainerExited",
        "epoch": 3,
        "barrierOpen": False,
        "resumeStep": 200,
        "restartAttempt": 0,
        "members": {"expected": 3, "reported": 1, "ready": 1},
        "budgets": {"inPlaceUsed": 2, "recreateUsed": 1},
        "memberFailures": {m(2): 1},
        "recovery": {
            "epoch": 3,
            "startedAt": "2026-01-01T10:00:00.000000Z",
            "deadline": "2026-01-01T10:05:00.000000Z",
            "deadlineExtended": False,
            "openedAt": None,
            "durationSeconds": None,
            "causes": {m(2): "TrainerExited"},
            "inPlace": 3,
            "recreated": {},
            "resumeStep": None,
        },
        "history": [
            {
                "epoch": 2,
                "causes": {"NodeUnhealthy": 1},
                "inPlace": 2,
                "recreated": 1,
                "startedAt": "2026-01-01T09:00:00.000000Z",
                "openedAt": "2026-01-01T09:00:07.250000Z",
                "durationSeconds": 7.25,
                "resumeStep": 100,
            }
        ],
        "restartRequest": "",
    }


@pytest.fixture
def gang(kube: Clients, namespace: str, gangstate_crd: None) -> Iterator[Gang]:
    g = Gang(kube, namespace, f"plug-{uuid.uuid4().hex[:4]}", 3, {names.INPLACE_BUDGET: "4"})
    g.create()
    js = get_jobset(kube, namespace, g.name)
    kube.custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, names.GANGSTATE_PLURAL, new_gangstate(js)
    )
    kube.custom.patch_namespaced_custom_object_status(
        names.GROUP,
        names.VERSION,
        namespace,
        names.GANGSTATE_PLURAL,
        g.name,
        {"status": status_of()},
        _content_type="application/merge-patch+json",
    )
    g.fail_trainer(2)  # restarting (terminated non-zero, not yet restarted)
    set_node_ready(kube, g.node(1), "False")
    g.report(0, 3)
    yield g
    for i in range(g.size):
        kube.core.delete_node(g.node(i))


def test_status_table(control_plane: ControlPlane, gang: Gang) -> None:
    res = plugin(control_plane, "status", gang.name, namespace=gang.namespace)
    assert res.returncode == ExitCode.OK, res.stderr
    lines = dict(
        (k.strip(), v.strip()) for k, v in (ln.split(":", 1) for ln in res.stdout.splitlines())
    )
    assert lines["JobSet"] == f"{gang.namespace}/{gang.name}"
    assert lines["Phase"] == "Recovering (MemberFailed)"
    assert lines["Epoch"] == "3"
    assert lines["Barrier"] == "closed"
    assert lines["Members"] == "3 expected, 1 reported, 1 ready"
    assert lines["Pods"] == "2 running, 1 restarting, 0 pending, 0 failed"
    assert lines["Unhealthy nodes"] == f"{gang.node(1)} (Ready=False)"
    assert lines["In-place budget"] == "2/4 used, 2 left"
    assert lines["Recreate budget"] == "1/5 used, 4 left"
    assert lines["Last recovery"].startswith("epoch 3, in progress, ")
    assert lines["Causes"] == "TrainerExited"


def test_status_json_and_wide(control_plane: ControlPlane, gang: Gang) -> None:
    res = plugin(control_plane, "status", gang.name, "-o", "json", namespace=gang.namespace)
    assert res.returncode == ExitCode.OK, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["kind"], doc["jobSet"], doc["phase"], doc["epoch"]) == (
        "GangStatusReport",
        gang.name,
        "Recovering",
        3,
    )
    assert doc["barrierOpen"] is False
    assert doc["pods"] == {
        "running": 2,
        "restarting": 1,
        "pending": 0,
        "failed": 0,
        "succeeded": 0,
    }
    assert doc["unhealthyNodes"] == [
        {"name": gang.node(1), "problems": ["Ready=False"], "pods": [gang.pods[1]]}
    ]
    assert doc["budgets"]["inPlace"] == {"used": 2, "limit": 4, "left": 2}
    assert doc["lastRecovery"]["failedMembers"] == {"workers/2/0": "TrainerExited"}
    assert doc["lastRecovery"]["inProgress"] is True
    assert [p["pod"] for p in doc["memberPods"]] == [gang.pods[i] for i in range(3)]
    assert doc["memberPods"][0]["reportedEpoch"] == "3"

    as_yaml = plugin(control_plane, "status", gang.name, "-o", "yaml", namespace=gang.namespace)
    assert yaml.safe_load(as_yaml.stdout)["memberPods"] == doc["memberPods"]

    wide = plugin(control_plane, "status", gang.name, "-o", "wide", namespace=gang.namespace)
    assert wide.returncode == ExitCode.OK, wide.stderr
    rows = wide.stdout.split("\n\n", 1)[1].splitlines()
    assert rows[0].split()[:4] == ["MEMBER", "POD", "NODE", "STATE"]
    assert rows[3].split()[:4] == ["workers/2/0", gang.pods[2], gang.node(2), "restarting"]
    assert rows[3].endswith("TrainerExited")


def test_status_wide_shows_what_the_controller_wrote_into_gangmembers(
    control_plane: ControlPlane, kube: Clients, gang: Gang
) -> None:
    """The controller's own write (its executor, server-side apply, twice: create, then
    replace) into the GangMembers CRD, read back by the plugin: each member's epoch and step,
    the one reported on its pod (member 0) included as the controller merged it."""
    control_plane.kubectl().apply_files([MEMBERS_CRD], server_side=True)
    control_plane.kubectl().wait_crds_established([f"{names.GANGMEMBERS_PLURAL}.{names.GROUP}"])
    js = get_jobset(kube, gang.namespace, gang.name)
    rows = [MemberRow(f"workers/{i}/0", gang.pods[i], 3 if i == 0 else 2, 100) for i in range(3)]
    executor = Executor(kube.api)
    executor.write_members(js, rows[:2], 1.0)  # created
    executor.write_members(js, rows, 2.0)  # replaced: every row
    obj = kube.custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, gang.namespace, names.GANGMEMBERS_PLURAL, gang.name
    )
    assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [js["metadata"]["uid"]]
    assert len(obj["members"]) == 3
    wide = plugin(control_plane, "status", gang.name, "-o", "wide", namespace=gang.namespace)
    assert wide.returncode == ExitCode.OK, wide.stderr
    table = [ln.split() for ln in wide.stdout.split("\n\n", 1)[1].splitlines()]
    assert table[0][4:7] == ["EPOCH", "STEP", "RESTARTS"]
    assert [row[4:6] for row in table[1:]] == [["3", "100"], ["2", "100"], ["2", "100"]]
    # The write encodes its own body and reads the answer unparsed: a refusal is still raised,
    # with the apiserver's status and reason (the reconciler logs it and tries again).
    elsewhere = {**js, "metadata": {**js["metadata"], "namespace": f"absent-{uuid.uuid4().hex}"}}
    with pytest.raises(ApiException) as refused:
        executor.write_members(elsewhere, rows, 3.0)
    assert refused.value.status == 404
    assert "not found" in (refused.value.body or "")
    bad = [MemberRow("w" * 254, gang.pods[0], 1, None)]  # the CRD's maxLength is 253
    with pytest.raises(ApiException) as invalid:
        executor.write_members(js, bad, 4.0)
    assert invalid.value.status == 422
    assert "members[0].member" in (invalid.value.body or "")
    # the refused writes changed nothing
    again = kube.custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, gang.namespace, names.GANGMEMBERS_PLURAL, gang.name
    )
    assert len(again["members"]) == 3


def test_status_of_unknown_gang(control_plane: ControlPlane, gang: Gang) -> None:
    res = plugin(control_plane, "status", "nope", namespace=gang.namespace)
    assert res.returncode == ExitCode.NOT_FOUND
    assert f"GangState nope not found in namespace {gang.namespace}" in res.stderr
    assert res.stdout == ""


def test_history(control_plane: ControlPlane, gang: Gang) -> None:
    res = plugin(control_plane, "history", gang.name, namespace=gang.namespace)
    assert res.returncode == ExitCode.OK, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split()[:7] == [
        "EPOCH",
        "CAUSES",
        "IN-PLACE",
        "RECREATED",
        "DURATION",
        "RESUME-STEP",
        "REDONE",
    ]
    assert lines[1].split() == [
        "2",
        "NodeUnhealthy",
        "2",
        "1",
        "7.2s",
        "100",
        "-",  # no trainer reported progress in that recovery
        "2026-01-01T09:00:00.000000Z",
    ]
    assert len(lines) == 2


def test_list_in_the_namespace_and_across_namespaces(
    control_plane: ControlPlane, gang: Gang
) -> None:
    res = plugin(control_plane, "list", namespace=gang.namespace)
    assert res.returncode == ExitCode.OK, res.stderr
    head, *rows = res.stdout.splitlines()
    assert head.split() == [
        "NAME",
        "PHASE",
        "EPOCH",
        "BARRIER",
        "STEP",
        "IN-PLACE",
        "RECREATED",
        "LAST-RECOVERY",
        "GOODPUT",
    ]
    assert [r.split() for r in rows] == [
        [gang.name, "Recovering", "3", "closed", "200", "2", "1", "-", "-"]
    ]
    res = plugin(control_plane, "list", "-A", "-o", "json", namespace="default")
    assert res.returncode == ExitCode.OK, res.stderr
    gangs = json.loads(res.stdout)["gangs"]
    assert {"namespace": gang.namespace, "name": gang.name}.items() <= next(
        g for g in gangs if g["name"] == gang.name
    ).items()
    res = plugin(control_plane, "list", namespace="default")  # none there
    assert (res.returncode, res.stdout) == (ExitCode.OK, "No gangs found.\n")


def test_version_reads_the_controller_deployment(
    control_plane: ControlPlane, kube: Clients, namespace: str
) -> None:
    """The Deployment is made here (no controller runs in this control plane): its image tag
    is the controller's version."""
    res = plugin(control_plane, "version", "--controller-namespace", namespace)
    assert res.returncode == ExitCode.OK, res.stderr
    assert "controller: not found" in res.stdout
    labels = {"app": "c"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.CONTROLLER_NAME},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "jsi/controller:0.0.1"}]},
            },
        },
    }
    client.AppsV1Api(kube.api).create_namespaced_deployment(namespace, deployment)
    res = plugin(control_plane, "version", "--controller-namespace", namespace, "-o", "json")
    assert res.returncode == ExitCode.OK, res.stderr
    doc = json.loads(res.stdout)
    assert doc["controller"]["version"] == "0.0.1"
    assert doc["controller"]["image"] == "jsi/controller:0.0.1"
    major, minor = __version__.split(".")[:2]
    assert (doc["skew"] is None) == ((major, minor) == ("0", "0"))
    if doc["skew"]:
        assert res.stderr.startswith("warning: the plugin")


def test_restart(control_plane: ControlPlane, kube: Clients, gang: Gang) -> None:
    refused = plugin(control_plane, "restart", gang.name, namespace=gang.namespace, stdin="y\n")
    assert refused.returncode == ExitCode.USAGE
    assert "stdin is not a terminal" in refused.stderr
    annotations = get_jobset(kube, gang.namespace, gang.name)["metadata"]["annotations"]
    assert names.RESTART_REQUEST not in annotations

    values = []
    for _ in range(2):
        res = plugin(control_plane, "restart", gang.name, "--yes", namespace=gang.namespace)
        assert res.returncode == ExitCode.OK, res.stderr
        annotations = get_jobset(kube, gang.namespace, gang.name)["metadata"]["annotations"]
        values.append(annotations[names.RESTART_REQUEST])
        assert f"{names.RESTART_REQUEST}={values[-1]}" in res.stdout
    assert values[0] != values[1]
    assert annotations[names.INPLACE_BUDGET] == "4"  # the other annotations are kept


def test_restart_refuses_a_jobset_not_opted_in(
    control_plane: ControlPlane, kube: Clients, namespace: str, gangstate_crd: None
) -> None:
    g = Gang(kube, namespace, f"plain-{uuid.uuid4().hex[:4]}", 1)
    g.create(enabled=False)
    try:
        res = plugin(control_plane, "restart", g.name, "--yes", namespace=namespace)
        assert res.returncode == ExitCode.FAILED
        assert "has not opted in" in res.stderr
        assert not get_jobset(kube, namespace, g.name)["metadata"].get("annotations")
    finally:
        kube.core.delete_node(g.node(0))


def test_enable_on_a_file(control_plane: ControlPlane, tmp_path: Path) -> None:
    f = tmp_path / "js.yaml"
    js: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [
                                        {"name": "trainer", "image": "t:1", "command": ["train"]}
                                    ],
                                }
                            }
                        }
                    },
                }
            ]
        },
    }
    f.write_text(yaml.safe_dump(js))
    res = plugin(control_plane, "enable", "-f", str(f), "--image", "agent:9")
    assert res.returncode == ExitCode.OK, res.stderr
    out = yaml.safe_load(res.stdout)
    assert out["metadata"]["annotations"] == {names.ENABLED: "true"}
    pod = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["image"] == "agent:9"

    diff = plugin(control_plane, "enable", "-f", str(f), "--diff")
    assert diff.returncode == ExitCode.OK
    assert diff.stdout.startswith(f"--- {f} (original)\n+++ {f} (jobset-inplace)\n")

    js["metadata"]["annotations"] = {names.BARRIER_TIMEOUT: "soon"}
    f.write_text(yaml.safe_dump(js))
    bad = plugin(control_plane, "enable", "-f", str(f))
    assert bad.returncode == ExitCode.FAILED
    assert f"annotation {names.BARRIER_TIMEOUT}='soon' is invalid" in bad.stderr


def test_doctor(
    control_plane: ControlPlane, kube: Clients, namespace: str, gangstate_crd: None
) -> None:
    node = f"doctor-{uuid.uuid4().hex[:4]}"
    ensure_node(kube, node)
    try:
        for n in kube.core.list_node().items:  # other tests' nodes too: doctor checks all
            kube.core.patch_node_status(
                n.metadata.name, {"status": {"declaredFeatures": [RESTART_ALL_FEATURE]}}
            )
        control_plane.kubectl().run("delete", "-f", str(AGENT_POLICY), "--ignore-not-found")
        res = plugin(control_plane, "doctor", namespace=namespace)
        results = {}
        for line in res.stdout.splitlines()[1:]:
            for word in ("PASS", "WARN", "FAIL", "SKIP"):
                if f"   {word}   " in line:
                    results[line.split(f"   {word}   ")[0].strip()] = word
        assert results["Kubernetes version"] == "PASS", res.stdout
        assert results["RestartAllContainers"] == "PASS", res.stdout
        assert results["JobSet CRD"] == "PASS", res.stdout
        assert results["GangState CRD"] == "PASS", res.stdout
        assert results["Kueue CRDs"] == "WARN"  # not installed in the integration plane
        assert results["Kueue recoveryTimeout"] == "SKIP"
        assert results["Node declared features"] == "PASS", res.stdout
        assert results["Agent admission policy"] == "WARN", "least privilege not enforced"
        assert "manifests/rbac/agent-vap.yaml" in res.stdout, "the fix is named"
        assert results["Controller pod policy"] == "WARN", "an earlier release's RBAC"
        assert "manifests/controller/rbac.yaml" in res.stdout, "the fix is named"
        # nothing of the install here: no controller, no leader, no webhook, no agent account
        assert {n for n, r in results.items() if r == "FAIL"} == {
            "Controller", "Leader", "Webhook", "Agent permissions",
        }, res.stdout  # fmt: skip
        assert "accepted without the agent" in res.stdout
        assert results["Pod Security"] == "PASS"
        assert results["Report channel"] == "SKIP", "no leader to ask"
        assert res.returncode == ExitCode.FAILED, res.stdout + res.stderr

        as_json = plugin(control_plane, "doctor", "-o", "json", namespace=namespace)
        checks = {c["name"]: c for c in json.loads(as_json.stdout)["checks"]}
        assert "v1alpha2" in checks["JobSet CRD"]["detail"]

        control_plane.kubectl().apply_files([AGENT_POLICY], server_side=True)
        try:
            installed = plugin(control_plane, "doctor", "-o", "json", namespace=namespace)
            checks = {c["name"]: c for c in json.loads(installed.stdout)["checks"]}
            assert checks["Agent admission policy"]["result"] == "PASS"
        finally:
            control_plane.kubectl().run("delete", "-f", str(AGENT_POLICY), check=False)
    finally:
        kube.core.delete_node(node)
