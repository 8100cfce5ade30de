"""A real distributed framework, end to end on the real kubelet nodes, with no trainer-code
change (docs/integrations.md): two JAX processes (one per real node, ``jax.distributed`` with
member 0's JobSet name as the coordinator, found through cluster DNS; gloo collectives over TCP
between the pods) train and save with Orbax's CheckpointManager into one shared directory
(``checkpoint-layout: orbax``). The trainer (testbed/frameworks/jax_orbax_trainer.py) imports no
jobset-inplace: it resumes from ``latest_step()``. One process is killed mid-training: both
resume from the gang's step, and the losses after the resume are those the run had at the same
steps before (training continued from the checkpoint, not from scratch)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from testbed.cluster import REAL_NODE_LABEL
from testbed.controller import barrier_open, member_pods, prepare
from testbed.demo import python_in_trainer, started_trainer_log
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.versions import binaries
from testbed.workloads import shared_checkpoint_gang

pytestmark = pytest.mark.e2e

MEMBERS = 2
COORDINATOR = "gang-workers-0-0.gang:7777"  # JobSet's name for member 0 (its headless Service)
TRAINER = "jax_orbax_trainer"
STEP = re.compile(r"step (\d+) loss ([0-9.e+-]+)$")
# Kills the trainer process (not the launcher that runs it): a crashed rank.
KILL = f"""
import os, signal
for p in filter(str.isdigit, os.listdir("/proc")):
    argv = open(f"/proc/{{p}}/cmdline", "rb").read().split(b"\\0")
    if argv[1:3] == [b"-m", b"{TRAINER}"]:
        os.kill(int(p), signal.SIGKILL)
        print("killed", p)
"""


def _jax_jobset(shared: Path, image: str) -> dict[str, Any]:
    index = f"metadata.labels['{names.JOB_INDEX_LABEL}']"
    trainer = {
        "name": "trainer",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["python3", "-m", TRAINER],
        "env": [
            {"name": "JAX_COORDINATOR", "value": COORDINATOR},
            {"name": "JAX_NUM_PROCESSES", "value": str(MEMBERS)},
            {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": index}}},
            {"name": "CHECKPOINT_DIR", "value": "/ckpt"},
            {"name": "STEPS", "value": "100000"},
        ],
        "volumeMounts": [{"name": "shared", "mountPath": "/ckpt"}],
    }
    return shared_checkpoint_gang(
        "orbax", trainer, MEMBERS, shared=shared, node_selector={REAL_NODE_LABEL: "true"}
    )


def _losses(log: str) -> list[dict[int, float]]:
    """Each run's ``step -> loss`` (a new run starts at each ``resumed at`` line)."""
    runs: list[dict[int, float]] = [{}]
    for line in log.splitlines():
        if "resumed at step" in line:
            runs.append({})
        elif m := STEP.search(line):
            runs[-1][int(m.group(1))] = float(m.group(2))
    return runs


def test_jax_ranks_resume_from_one_orbax_step_with_no_code_change(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    jax_examples_image: str,
    tmp_path: Path,
) -> None:
    prepare(kube, cluster_kubeconfig, namespace)
    shared = tmp_path / "shared"
    create_jobset(kube, namespace, _jax_jobset(shared, jax_examples_image))

    def trained(to: int) -> bool:
        pods = member_pods(kube, namespace, "gang")
        return len(pods) == MEMBERS and all(
            f"step {to} loss" in started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
            for p in pods.values()
        )

    wait_for("both JAX processes past step 40", lambda: trained(40), 300)
    before = {i: p.metadata.uid for i, p in member_pods(kube, namespace, "gang").items()}
    victim = member_pods(kube, namespace, "gang")["1"].metadata.name
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]
    done = python_in_trainer(kubectl, victim, KILL)
    assert done.stdout.startswith("killed"), (done.stdout, done.stderr)

    st = barrier_open(kube, namespace, "gang", 2, 180)
    resume = st["resumeStep"]
    assert isinstance(resume, int)
    assert resume >= 40 - 10, "a recent step: Orbax saves every 10"

    def resumed() -> dict[str, str] | None:
        logs = {
            i: started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
            for i, p in member_pods(kube, namespace, "gang").items()
        }
        runs = [_losses(x) for x in logs.values()]
        return logs if all(len(r) > 1 and resume + 3 in r[-1] for r in runs) else None

    logs = wait_for("both processes 3 steps past the resume", resumed, 180)
    after = member_pods(kube, namespace, "gang")
    assert {i: p.metadata.uid for i, p in after.items()} == before, "in place: same pods"
    for i, log in logs.items():
        assert f"resumed at step {resume} loss" in log, f"member {i}:\n{log[-2000:]}"
        first, last = _losses(log)[0], _losses(log)[-1]
        assert first[1] > 10 * last[resume + 1], "the resumed run is trained, not from scratch"
        for step in range(resume + 1, resume + 4):
            if step in first:  # reached before the kill too: the same loss again
                assert last[step] == pytest.approx(first[step], rel=1e-5), (i, step)
    aside = shared / ".jobset-inplace-set-aside" / "epoch-2"
    set_aside = sorted(p.name for p in aside.iterdir()) if aside.exists() else []
    print(
        f"\nJAX + Orbax, 2 processes on 2 real nodes: rank 1 killed after step 40; both "
        f"resumed at step {resume} (Orbax steps set aside: {set_aside or 'none'}); "
        f"loss at step {resume + 1}: {_losses(logs['0'])[-1][resume + 1]:.6e}"
    )
