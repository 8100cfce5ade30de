"""``kubectl jobset-inplace doctor`` on the cluster under test. On any cluster the suite
supports, no check fails (the GangState CRD is installed first, as the suite does); on the local
cluster every check that can pass does (Kubernetes 1.35 with the restart gates, JobSet, Kueue,
the GangState CRD, nodes declaring the feature). With the controller installed as users install
it, the install's live checks pass in a namespace prepared for gangs (a ready controller with a
live leader, the webhook adding the agent in a dry run, the agent's rights, the namespace's Pod
Security level, the leader's report channel answering), also in a namespace nobody prepared (the
controller binds the agents' rights with its first JobSet); a RoleBinding of the controller's
name made by hand fails, with the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from jobset_inplace.core.agent_access import AGENT_BINDING, RBAC_GROUP
from testbed.cluster import LocalCluster
from testbed.controller import AGENT_POLICY, CRD, prepare
from testbed.install import Installation
from testbed.kube import Clients, temporary_namespace
from testbed.kubectl import Kubectl

pytestmark = pytest.mark.e2e


def doctor(kubeconfig: Path, *args: str) -> tuple[int, dict[str, dict[str, str]], str]:
    """The plugin's doctor, as a user runs it: exit code, checks by name, its output."""
    plugin = [sys.executable, "-m", "jobset_inplace.kubectl_plugin"]
    res = subprocess.run(
        [*plugin, "doctor", "-o", "json", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    checks = json.loads(res.stdout)["checks"] if res.stdout.startswith("{") else []
    return res.returncode, {c["name"]: c for c in checks}, res.stdout + res.stderr


INSTALL_CHECKS = (
    "Controller",
    "Leader",
    "Webhook",
    "Agent permissions",
    "Pod Security",
    "Report channel",
)


def test_doctor_passes_on_the_cluster(
    cluster_kubeconfig: Path, local_cluster: LocalCluster | None
) -> None:
    Kubectl(cluster_kubeconfig).apply_files([CRD, AGENT_POLICY], server_side=True)
    _, by_name, output = doctor(cluster_kubeconfig)  # (no controller needed: no exit code)
    results = {n: c["result"] for n, c in by_name.items() if n not in INSTALL_CHECKS}
    assert results, output
    print("\n" + "\n".join(f"{r:5} {n}" for n, r in results.items()))
    failing = {n: r for n, r in results.items() if r == "FAIL"}
    assert not failing
    if local_cluster is None:
        return  # another cluster may lack Kueue or node feature declarations: WARN, not FAIL
    passed = [n for n, r in results.items() if r == "PASS"]
    # version, RestartAllContainers dry-run, JobSet, GangState CRD, agent admission policy,
    # Kueue, declared features
    assert len(passed) >= 7, results
    assert results["Agent admission policy"] == "PASS"


def test_doctor_checks_the_install_live(
    controller: Installation,
    kube: Clients,
    cluster_kubeconfig: Path,
    namespace: str,
    local_cluster: LocalCluster | None,
) -> None:
    prepare(kube, cluster_kubeconfig, namespace)
    code, by_name, output = doctor(cluster_kubeconfig, "-n", namespace)
    print("\n" + "\n".join(f"{c['result']:5} {n}: {c['detail']}" for n, c in by_name.items()))
    assert code == 0, output
    live = {n: by_name[n]["result"] for n in INSTALL_CHECKS}
    if local_cluster is not None:  # the apiserver reaches pod IPs here; elsewhere it may not
        assert set(live.values()) == {"PASS"}, live
    else:
        assert "FAIL" not in live.values(), live
    assert "the agent was added" in by_name["Webhook"]["detail"]
    assert "2/2 replicas ready" in by_name["Controller"]["detail"]

    with temporary_namespace(kube, "doctor-bare") as bare:
        # nothing applied there: the controller gives agents their rights with the first JobSet
        code, by_name, output = doctor(cluster_kubeconfig, "-n", bare)
        assert code == 0, output
        assert "with its first opted-in JobSet" in by_name["Agent permissions"]["detail"]
        # a RoleBinding of the controller's name made by hand: left alone, and doctor says so
        by_hand = {
            "metadata": {"name": AGENT_BINDING},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": bare}],
        }
        client.RbacAuthorizationV1Api(kube.api).create_namespaced_role_binding(bare, by_hand)
        code, by_name, output = doctor(cluster_kubeconfig, "-n", bare)
        assert code == 1, output
        agent = by_name["Agent permissions"]
        assert agent["result"] == "FAIL", agent
        assert f"delete rolebinding {AGENT_BINDING}" in agent["hint"]
