"""PyTorch as users run it, end to end on the real kubelet nodes, with no trainer-code change
(docs/integrations.md): each member pod runs ``torchrun`` with two workers (4 ranks over 2 real
nodes, a static rendezvous at member 0's JobSet hostname), ``DistributedDataParallel`` over
gloo, and DCP checkpoints in torchtitan's ``step-<S>`` layout in one shared directory
(``checkpoint-layout: torch-dcp``). The trainer (testbed/frameworks/torch_dcp_trainer.py)
imports no jobset-inplace: it loads the newest complete ``step-<S>``.

One worker process (a grandchild of the launcher, in a session of its own as torchrun starts
it) is killed mid-training: every rank resumes at the gang's step, the losses after the resume
are those of the run before it at the same steps, the pods are the same, and no process of the
old epoch is left in either trainer container (process scope: the launcher stops torchrun's
whole tree).

PyTorch comes from PyPI's CUDA build with its NVIDIA libraries (``import torch`` loads them,
with no GPU), installed once into the cache and mounted read-only into the containers
(testbed/images.py ``torch_site``; the cost is in docs/integrations.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from testbed import images
from testbed.cluster import REAL_NODE_LABEL, LocalCluster
from testbed.controller import barrier_open, member_pods, prepare
from testbed.demo import started_trainer_log
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.versions import binaries
from testbed.workloads import shared_checkpoint_gang

pytestmark = pytest.mark.e2e

MEMBERS = 2
WORKERS = 2  # torchrun's workers per pod
RANKS = MEMBERS * WORKERS
MASTER = "gang-workers-0-0.gang"  # JobSet's hostname of member 0 (its headless Service)
TRAINER = "torch_dcp_trainer.py"
# (found anywhere in a line: the ranks of a pod share its stdout, and a line may hold two)
LINE = re.compile(r"\[rank (\d+)\] (?:step (\d+)|resumed at step (\d+)) loss (\d\.\d+e[+-]\d+)")
# The trainer's worker processes in this container: "<pid> <argv>" lines.
WORKER_PIDS = f"""
import os
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{{p}}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if any(a.endswith(b"{TRAINER}") for a in argv) and b"torch.distributed.run" not in argv:
        print(p)
"""


@pytest.fixture(scope="module")
def torch_site(local_cluster: LocalCluster | None) -> Path:
    if local_cluster is None:
        pytest.skip("mounts PyTorch from this host into the local cluster's real nodes")
    return images.torch_site()


def _torch_jobset(shared: Path, site: Path) -> dict[str, Any]:
    index = f"metadata.labels['{names.JOB_INDEX_LABEL}']"
    torchrun = [
        "python3", "-m", "torch.distributed.run",
        f"--nnodes={MEMBERS}", f"--nproc-per-node={WORKERS}", "--node-rank=$(NODE_RANK)",
        f"--master-addr={MASTER}", "--master-port=29500", "--max-restarts=0",
        f"/trainer/{TRAINER}",
    ]  # fmt: skip
    trainer = {
        "name": "trainer",
        "image": images.NODE_IMAGE,
        "imagePullPolicy": "Never",
        "command": torchrun,
        "env": [
            {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
            {"name": "CHECKPOINT_DIR", "value": "/ckpt"},
            {"name": "STEPS", "value": "100000"},
            {"name": "OMP_NUM_THREADS", "value": "1"},
            {"name": "PYTHONPATH", "value": "/opt/torch"},
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [
            {"name": "shared", "mountPath": "/ckpt"},
            {"name": "torch", "mountPath": "/opt/torch", "readOnly": True},
            {"name": "trainer", "mountPath": "/trainer", "readOnly": True},
        ],
    }
    return shared_checkpoint_gang(
        "torch-dcp",
        trainer,
        MEMBERS,
        shared=shared,
        node_selector={REAL_NODE_LABEL: "true"},
        volumes=[
            {"name": "torch", "hostPath": {"path": str(site), "type": "Directory"}},
            {"name": "trainer", "configMap": {"name": "torch-trainer"}},
        ],
    )


def _runs(logs: str) -> dict[int, list[dict[int, float]]]:
    """Per rank, each run's ``step -> loss`` (a new run starts at its ``resumed at`` line)."""
    runs: dict[int, list[dict[int, float]]] = {}
    for m in LINE.finditer(logs):
        rank, step, resumed, loss = m.groups()
        mine = runs.setdefault(int(rank), [{}])
        if resumed is not None:
            mine.append({})
        else:
            mine[-1][int(step)] = float(loss)
    return runs


def _worker_pids(kubectl: list[str], pod: str) -> set[int]:
    out = subprocess.run(
        [*kubectl, "exec", pod, "-c", "trainer", "--", "python3", "-c", WORKER_PIDS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {int(p) for p in out.split()}


def test_torchrun_ranks_resume_from_one_dcp_step_and_no_old_worker_survives(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    torch_site: Path,
    tmp_path: Path,
) -> None:
    prepare(kube, cluster_kubeconfig, namespace)
    kube.core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "torch-trainer"},
            "data": {TRAINER: images.TORCH_TRAINER.read_text()},
        },
    )
    shared = tmp_path / "shared"
    create_jobset(kube, namespace, _torch_jobset(shared, torch_site))
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]

    def logs() -> str:
        return "".join(
            started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
            for p in member_pods(kube, namespace, "gang").values()
        )

    def trained(to: int) -> bool:
        runs = _runs(logs())
        return len(runs) == RANKS and all(to in r[-1] for r in runs.values())

    wait_for(f"all {RANKS} ranks past step 40", lambda: trained(40), 600)
    pods = member_pods(kube, namespace, "gang")
    before = {i: p.metadata.uid for i, p in pods.items()}
    old = {i: _worker_pids(kubectl, p.metadata.name) for i, p in pods.items()}
    assert all(len(pids) == WORKERS for pids in old.values()), old
    victim = pods["1"].metadata.name
    kill = f"import os, signal; os.kill({min(old['1'])}, signal.SIGKILL)"
    subprocess.run(
        [*kubectl, "exec", victim, "-c", "trainer", "--", "python3", "-c", kill], check=True
    )

    st = barrier_open(kube, namespace, "gang", 2, 300)
    resume = st["resumeStep"]
    assert isinstance(resume, int)
    assert resume >= 40 - 10, "a recent step: the trainer saves every 10"

    def resumed() -> dict[int, list[dict[int, float]]] | None:
        runs = _runs(logs())
        done = len(runs) == RANKS and all(len(r) > 1 and resume + 3 in r[-1] for r in runs.values())
        return runs if done else None

    runs = wait_for(f"all {RANKS} ranks 3 steps past the resume", resumed, 300)
    after = member_pods(kube, namespace, "gang")
    assert {i: p.metadata.uid for i, p in after.items()} == before, "in place: same pods"
    text = logs()
    for rank, mine in runs.items():
        assert f"[rank {rank}] resumed at step {resume} loss" in text, f"rank {rank}"
        first, last = mine[0], mine[-1]
        assert min(last) == resume + 1, f"rank {rank} went on from the gang's step"
        assert first[1] > 10 * last[resume + 1], "the resumed run is trained, not from scratch"
        for step in range(resume + 1, resume + 4):
            if step in first:  # reached before the kill too: the same loss again
                assert last[step] == pytest.approx(first[step], rel=1e-5), (rank, step)
    new = {i: _worker_pids(kubectl, p.metadata.name) for i, p in after.items()}
    for i, now in new.items():
        assert len(now) == WORKERS, f"member {i}: workers now {now}"
        assert not now & old[i], f"member {i}: old workers {old[i]} still there: {now}"
    print(
        f"\nPyTorch torchrun + DDP (gloo) + DCP, {RANKS} ranks on 2 real nodes: a worker of "
        f"member 1 killed after step 40; every rank resumed at step {resume}; loss at step "
        f"{resume + 1}: {runs[0][-1][resume + 1]:.6e}; worker pids before {old}, after {new}"
    )
