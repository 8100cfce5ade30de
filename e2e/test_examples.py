"""examples/ as a user runs them, with the in-cluster install: the trainer-contract example
applied with kubectl as written (on the local cluster only pinned to its real kubelet nodes: the
simulated kwok nodes would take the pods otherwise), trained to a checkpoint on both members,
then examples/kill-one-trainer.sh kills one trainer and waits for the recovery, which is in
place and resumes every member from one checkpoint step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.cluster import REAL_NODE_LABEL, LocalCluster
from testbed.controller import gang_state, member_pods
from testbed.demo import member_uids, started_trainer_log
from testbed.install import Installation
from testbed.kube import Clients, wait_for
from testbed.versions import REPO_ROOT, binaries

pytestmark = pytest.mark.e2e

EXAMPLE = REPO_ROOT / "examples" / "trainer-contract.yaml"
KILL = REPO_ROOT / "examples" / "kill-one-trainer.sh"
NAME = "contract-demo"


def test_the_trainer_contract_example_recovers_from_the_kill_script(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    local_cluster: LocalCluster | None,
    tmp_path: Path,
) -> None:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    if local_cluster is not None:
        for d in docs:
            if d["kind"] == "JobSet":
                for rj in d["spec"]["replicatedJobs"]:
                    pod = rj["template"]["spec"]["template"]["spec"]
                    pod["nodeSelector"] = {REAL_NODE_LABEL: "true"}
    manifest = tmp_path / EXAMPLE.name
    manifest.write_text(yaml.safe_dump_all(docs))
    kubectl = str(binaries().kubectl)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster_kubeconfig),
        # kubectl, and the plugin the script calls through it (this environment's)
        "PATH": os.pathsep.join([str(Path(kubectl).parent), str(Path(sys.executable).parent)])
        + os.pathsep
        + os.environ.get("PATH", ""),
    }
    subprocess.run(
        [kubectl, "apply", "-n", namespace, "-f", str(manifest)],
        env=env,
        check=True,
        capture_output=True,
    )

    def checkpointed() -> bool:
        pods = member_pods(kube, namespace, NAME)
        logs = [
            started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
            for p in pods.values()
        ]
        return len(pods) == 2 and all("step 10: checkpoint saved" in log for log in logs)

    wait_for("both trainers past their first checkpoint", checkpointed, 240)
    before = member_uids(kube, namespace, NAME)
    done = subprocess.run(
        [str(KILL), namespace, NAME],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "killing the trainer of pod/" in done.stdout
    assert "MEMBER" in done.stdout, "the script ends with status -o wide"
    st = gang_state(kube, namespace, NAME)
    assert (st["epoch"], st["barrierOpen"]) == (2, True)
    assert (st["resumeStep"] or 0) >= 10, st
    assert member_uids(kube, namespace, NAME) == before, "recovered in place"
    step = st["resumeStep"]
    wait_for(
        f"both trainers resumed at step {step}",
        lambda: all(
            f"epoch 2: resumed at step {step}"
            in started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
            for p in member_pods(kube, namespace, NAME).values()
        ),
        60,
    )
