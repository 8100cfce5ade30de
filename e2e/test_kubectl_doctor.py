"""``kubectl jobset-inplace doctor`` on the cluster under test. On any cluster the suite
supports, no check fails (the GangState CRD is installed first, as the suite does); on the local
cluster every check that can pass does (Kubernetes 1.35 with the restart gates, JobSet, Kueue,
the GangState CRD, nodes declaring the feature)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cluster import LocalCluster
from testbed.controller import AGENT_POLICY, CRD
from testbed.kubectl import Kubectl

pytestmark = pytest.mark.e2e


def test_doctor_passes_on_the_cluster(
    cluster_kubeconfig: Path, local_cluster: LocalCluster | None
) -> None:
    Kubectl(cluster_kubeconfig).apply_files([CRD, AGENT_POLICY], server_side=True)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobset_inplace.kubectl_plugin",
            "doctor",
            "-o",
            "json",
            "--kubeconfig",
            str(cluster_kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    checks = report["checks"] if isinstance(report, dict) else report
    results = {c["name"]: c["result"] for c in checks}
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
