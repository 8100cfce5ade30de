"""The integration control plane is real: a pinned kube-apiserver backed by etcd, with the
JobSet CRDs from the pinned JobSet module."""

from __future__ import annotations

import pytest
from kubernetes import client

from testbed import workloads
from testbed.controlplane import ControlPlane
from testbed.kube import Clients, create_jobset, get_jobset
from testbed.versions import versions

pytestmark = pytest.mark.integration


def test_apiserver_reports_pinned_version(kube: Clients) -> None:
    info = client.VersionApi(kube.api).get_code()
    assert info.git_version == versions().kubernetes


def test_create_and_read_jobset_and_pod(kube: Clients, namespace: str) -> None:
    body = workloads.jobset("fixture-check", [("workers", 2, 2)])
    create_jobset(kube, namespace, body)
    got = get_jobset(kube, namespace, "fixture-check")
    assert got["metadata"]["namespace"] == namespace
    assert [rj["name"] for rj in got["spec"]["replicatedJobs"]] == ["workers"]
    assert got["spec"]["replicatedJobs"][0]["replicas"] == 2

    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
    )
    kube.core.create_namespaced_pod(namespace, pod)
    read = kube.core.read_namespaced_pod("p", namespace)
    assert read.metadata.uid
    assert read.status.phase == "Pending"  # no kubelet or scheduler here: nothing runs it


def test_restart_all_containers_rule_is_accepted(kube: Clients, namespace: str) -> None:
    """The control plane has the in-place restart API enabled (alpha gates on 1.35)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rules"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "agent",
                    "image": "busybox",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [
                        {
                            "action": "RestartAllContainers",
                            "exitCodes": {"operator": "In", "values": [88]},
                        }
                    ],
                }
            ],
            "containers": [{"name": "trainer", "image": "busybox"}],
        },
    }
    kube.core.create_namespaced_pod(namespace, pod)
    got = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod("rules", namespace))
    rules = got["spec"]["initContainers"][0].get("restartPolicyRules")
    assert rules == pod["spec"]["initContainers"][0]["restartPolicyRules"]  # type: ignore[index]


def test_namespaces_are_per_test(control_plane: ControlPlane, namespace: str) -> None:
    assert namespace.startswith("test-namespaces-are-per-test-")
    out = control_plane.kubectl().run("get", "namespace", namespace, "-o", "name")
    assert out.strip() == f"namespace/{namespace}"
