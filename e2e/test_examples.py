"""examples/ as a user runs them, with the in-cluster install: each example applied with kubectl
as written (on the local cluster only pinned to its real kubelet nodes: the simulated kwok nodes
would take the pods otherwise; a claim of the example is bound to a hostPath volume made for it,
the real nodes sharing this host as nodes share a network filesystem), trained to a checkpoint
on both members, then examples/kill-one-trainer.sh kills one member's trainer processes and
waits for the recovery, which is in place (the same pods, JobSet not restarted) and resumes
every member from one checkpoint step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobset_inplace import names
from testbed.cluster import REAL_NODE_LABEL, LocalCluster
from testbed.controller import gang_state, member_pods, slot_holders
from testbed.demo import started_trainer_log
from testbed.install import Installation
from testbed.kube import Clients, get_jobset, wait_for
from testbed.versions import REPO_ROOT, binaries

pytestmark = pytest.mark.e2e

EXAMPLES = REPO_ROOT / "examples"
KILL = EXAMPLES / "kill-one-trainer.sh"
# The first test to use an examples' image also builds it (PyTorch's: ~2 min) and imports it into
# the real nodes (~2 min) in its setup, which the timeout counts.
IMAGE_AND_TEST_S = 1200


class Example:
    """An example file applied in ``namespace`` as written, and its kill script's run."""

    def __init__(
        self,
        path: Path,
        *,
        kubeconfig: Path,
        kube: Clients,
        namespace: str,
        local_cluster: LocalCluster | None,
        tmp_path: Path,
    ) -> None:
        self.kube, self.namespace, self.kubeconfig = kube, namespace, kubeconfig
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        [jobset] = [d for d in docs if d["kind"] == "JobSet"]
        self.name: str = jobset["metadata"]["name"]
        self.spares = names.HOT_SPARES in jobset["metadata"].get("annotations", {})
        self.members = sum(rj["replicas"] for rj in jobset["spec"]["replicatedJobs"])
        if local_cluster is not None:
            for rj in jobset["spec"]["replicatedJobs"]:
                pod = rj["template"]["spec"]["template"]["spec"]
                pod["nodeSelector"] = {REAL_NODE_LABEL: "true"}
        self.volumes: list[str] = []
        for claim in (d for d in docs if d["kind"] == "PersistentVolumeClaim"):
            self._bind(claim, tmp_path)
        manifest = tmp_path / path.name
        manifest.write_text(yaml.safe_dump_all(docs))
        kubectl = str(binaries().kubectl)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            # kubectl, and the plugin the script calls through it (this environment's)
            "PATH": os.pathsep.join([str(Path(kubectl).parent), str(Path(sys.executable).parent)])
            + os.pathsep
            + os.environ.get("PATH", ""),
        }
        subprocess.run(
            [kubectl, "apply", "-n", namespace, "-f", str(manifest)],
            env=self.env,
            check=True,
            capture_output=True,
        )

    def _bind(self, claim: dict[str, Any], tmp_path: Path) -> None:
        """A hostPath volume on this host bound to ``claim`` (as a storage class would
        provision one): the real nodes share this host's directories."""
        name = f"{self.namespace}-{claim['metadata']['name']}"[:253]
        directory = tmp_path / "volumes" / claim["metadata"]["name"]
        directory.mkdir(parents=True)
        self.kube.core.create_persistent_volume(
            {
                "metadata": {"name": name},
                "spec": {
                    "accessModes": claim["spec"]["accessModes"],
                    "capacity": claim["spec"]["resources"]["requests"],
                    "hostPath": {"path": str(directory), "type": "Directory"},
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"namespace": self.namespace, "name": claim["metadata"]["name"]},
                },
            }
        )
        self.volumes.append(name)

    def delete_volumes(self) -> None:
        for name in self.volumes:
            self.kube.core.delete_persistent_volume(name)

    def logs(self) -> dict[str, str]:
        """Each member pod's trainer log (its container's whole log: in the process scope the
        container outlives its trainers)."""
        return {
            i: started_trainer_log(self.kubeconfig, self.namespace, p.metadata.name)
            for i, p in self.pods().items()
        }

    def pods(self) -> dict[str, Any]:
        """The member pods by job index (not a failed one: a pod a node refused is replaced);
        with hot spares, the pods that hold the members' slots, by slot."""
        if self.spares:
            return slot_holders(self.kube, self.namespace, self.name, self.members)
        return member_pods(self.kube, self.namespace, self.name, include_failed=False)

    def pod_uids(self) -> dict[str, str]:
        return {i: p.metadata.uid for i, p in self.pods().items()}

    def kill_one_trainer(self) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(KILL), self.namespace, self.name],
            check=False,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=200,
        )
        print(done.stdout, done.stderr)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "killing the trainer of pod/" in done.stdout
        assert "MEMBER" in done.stdout, "the script ends with status -o wide"
        return done

    def recovered_in_place(self, before: dict[str, str]) -> int:
        """The gang's resume step once epoch 2's barrier is open, after checking the recovery
        was in place: the same pods, the JobSet not restarted."""
        st = gang_state(self.kube, self.namespace, self.name)
        assert (st["epoch"], st["barrierOpen"]) == (2, True), st
        assert self.pod_uids() == before, "recovered in place"
        jobset = get_jobset(self.kube, self.namespace, self.name)
        assert (jobset.get("status") or {}).get("restarts", 0) == 0, "escalated to a JobSet restart"
        step: int = st["resumeStep"]
        return step


@pytest.fixture
def example(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    local_cluster: LocalCluster | None,
    tmp_path: Path,
) -> Iterator[Callable[[Path], Example]]:
    made: list[Example] = []

    def apply(path: Path) -> Example:
        made.append(
            Example(
                path,
                kubeconfig=cluster_kubeconfig,
                kube=kube,
                namespace=namespace,
                local_cluster=local_cluster,
                tmp_path=tmp_path,
            )
        )
        return made[-1]

    yield apply
    for e in made:
        e.delete_volumes()  # each kept until its claim goes with the namespace


def test_the_trainer_contract_example_recovers_from_the_kill_script(
    example: Callable[[Path], Example],
) -> None:
    gang = example(EXAMPLES / "trainer-contract.yaml")

    def checkpointed() -> bool:
        logs = gang.logs()
        return len(logs) == 2 and all("step 10: checkpoint saved" in log for log in logs.values())

    wait_for("both trainers past their first checkpoint", checkpointed, 240)
    before = gang.pod_uids()
    gang.kill_one_trainer()
    step = gang.recovered_in_place(before)
    assert step >= 10
    wait_for(
        f"both trainers resumed at step {step}",
        lambda: all(f"epoch 2: resumed at step {step}" in log for log in gang.logs().values()),
        60,
    )


# (file, its image's fixture, what every member's log says once a checkpoint is complete, the
# least step the gang can resume from then)
FRAMEWORK_EXAMPLES = [
    # the Trainer's own resume (get_last_checkpoint) on a shared output_dir
    pytest.param(
        "hf-trainer.yaml", "pytorch_examples_image", "step 20: checkpoint saved", 20, id="hf"
    ),
    # 4 DDP workers in 2 pods, DCP steps on a shared volume, the next torchrun pre-started
    pytest.param("pytorch-dcp.yaml", "pytorch_examples_image", "step 21 loss", 20, id="dcp"),
    # 4 members of 2 workers and 2 spares on the 2 nodes, ranks from the launcher (the spares
    # stay spares: the recovery is in place)
    pytest.param(
        "pytorch-dcp-hot-spares.yaml", "pytorch_examples_image", "step 21 loss", 20, id="spares"
    ),
    # two JAX processes, Orbax steps on a shared volume (Orbax may still be finishing step 20
    # in the background when step 21 is logged)
    pytest.param("jax-orbax.yaml", "jax_examples_image", "step 21 loss", 10, id="jax"),
]


@pytest.mark.timeout(IMAGE_AND_TEST_S)
@pytest.mark.parametrize(("file", "image", "checkpointed", "least_step"), FRAMEWORK_EXAMPLES)
def test_a_framework_example_recovers_in_place_from_one_checkpoint(
    example: Callable[[Path], Example],
    request: pytest.FixtureRequest,
    *,
    file: str,
    image: str,
    checkpointed: str,
    least_step: int,
) -> None:
    """A framework example, its image built into the real nodes: once every member is past a
    checkpoint, one member's trainer processes are killed; every member resumes at the gang's
    step and trains on, with no escalation."""
    request.getfixturevalue(image)
    gang = example(EXAMPLES / file)

    def past_a_checkpoint() -> bool:
        logs = gang.logs()
        return len(logs) == gang.members and all(checkpointed in log for log in logs.values())

    wait_for(f"every member's log saying {checkpointed!r}", past_a_checkpoint, 420)
    before = gang.pod_uids()
    gang.kill_one_trainer()
    step = gang.recovered_in_place(before)
    assert step >= least_step

    def trained_on() -> bool:
        for log in gang.logs().values():
            resumed = re.search(rf"resumed at step {step}\b", log)
            if resumed is None or f"step {step + 1} loss" not in log[resumed.end() :]:
                return False
        return True

    wait_for(f"every member resumed at step {step} and trained on", trained_on, 240)
