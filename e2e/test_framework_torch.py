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

With ``prestart-imports`` (the ``prestart`` case) every epoch's ``torchrun`` is pre-started
and held, and its workers are forked from its worker forker with ``torch`` imported: the
same checks hold, and each container runs its workers' stand-ins (jobset_inplace/prestart.py).

PyTorch comes from PyPI's CUDA build with its NVIDIA libraries (``import torch`` loads them,
with no GPU), installed once into the cache and mounted read-only into the containers
(testbed/images.py ``torch_site``; the cost is in docs/integrations.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.controller import barrier_open, member_pods, prepare
from testbed.demo import started_trainer_log
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.torchgang import (
    RANKS,
    WORKERS,
    RankRuns,
    create_trainer_config_map,
    kill_worker,
    rank_runs,
    stand_ins,
    standby_held,
    torch_jobset,
    with_prestart,
    worker_pids,
)
from testbed.versions import binaries

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("start", ["cold", "prestart"])
def test_torchrun_ranks_resume_from_one_dcp_step_and_no_old_worker_survives(
    start: str,
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    torch_site: Path,
    tmp_path: Path,
) -> None:
    prepare(kube, cluster_kubeconfig, namespace)
    create_trainer_config_map(kube, namespace)
    shared = tmp_path / "shared"
    js = torch_jobset(shared, torch_site)
    create_jobset(kube, namespace, with_prestart(js) if start == "prestart" else js)
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]

    def logs() -> str:
        return "".join(
            started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
            for p in member_pods(kube, namespace, "gang").values()
        )

    def trained(to: int) -> bool:
        runs = rank_runs(logs())
        return len(runs) == RANKS and all(to in r.runs[-1] for r in runs.values())

    wait_for(f"all {RANKS} ranks past step 40", lambda: trained(40), 600)
    pods = member_pods(kube, namespace, "gang")
    if start == "prestart":  # a failure long into training: the next epoch is held, imported
        wait_for(
            "every pod's standby held",
            lambda: all(
                standby_held(started_trainer_log(cluster_kubeconfig, namespace, p.metadata.name))
                for p in pods.values()
            ),
            600,
        )
    before = {i: p.metadata.uid for i, p in pods.items()}
    old = {i: worker_pids(kubectl, p.metadata.name) for i, p in pods.items()}
    assert all(len(pids) == WORKERS for pids in old.values()), old
    kill_worker(kubectl, pods["1"].metadata.name, min(old["1"]))

    st = barrier_open(kube, namespace, "gang", 2, 300)
    resume = st["resumeStep"]
    assert isinstance(resume, int)
    assert resume >= 40 - 10, "a recent step: the trainer saves every 10"

    def resumed() -> dict[int, RankRuns] | None:
        runs = rank_runs(logs())
        done = len(runs) == RANKS and all(
            r.resumed_at and resume + 3 in r.runs[-1] for r in runs.values()
        )
        return runs if done else None

    runs = wait_for(f"all {RANKS} ranks 3 steps past the resume", resumed, 300)
    after = member_pods(kube, namespace, "gang")
    assert {i: p.metadata.uid for i, p in after.items()} == before, "in place: same pods"
    for rank, mine in runs.items():
        assert mine.resumed_at == [resume], f"rank {rank} resumed at {mine.resumed_at}"
        first, last = mine.runs[0], mine.runs[-1]
        assert min(last) == resume + 1, f"rank {rank} went on from the gang's step"
        assert first[1] > 10 * last[resume + 1], "the resumed run is trained, not from scratch"
        for step in range(resume + 1, resume + 4):
            if step in first:  # reached before the kill too: the same loss again
                assert last[step] == pytest.approx(first[step], rel=1e-5), (rank, step)
    new = {i: worker_pids(kubectl, p.metadata.name) for i, p in after.items()}
    for i, now in new.items():
        assert len(now) == WORKERS, f"member {i}: workers now {now}"
        assert not now & old[i], f"member {i}: old workers {old[i]} still there: {now}"
        if start == "prestart":
            forked = stand_ins(kubectl, after[i].metadata.name)
            assert forked == WORKERS, f"member {i}: {forked} forked workers, not {WORKERS}"
    print(
        f"\nPyTorch torchrun + DDP (gloo) + DCP ({start}), {RANKS} ranks on 2 real nodes: a "
        f"worker of member 1 killed after step 40; every rank resumed at step {resume}; loss at "
        f"step {resume + 1}: {runs[0].runs[-1][resume + 1]:.6e}; worker pids before {old}, "
        f"after {new}"
    )
