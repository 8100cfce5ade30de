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

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import images
from testbed.controller import barrier_open, member_pods
from testbed.demo import started_trainer_log
from testbed.kube import Clients, create_jobset, wait_for
from testbed.torchgang import (
    RANKS,
    TRANSFORMER,
    WORKERS,
    Model,
    RankRuns,
    kill_worker,
    rank_runs,
    released_pid,
    stand_ins,
    standby_held,
    torch_jobset,
    warm_held,
    with_prestart,
    with_warm,
    worker_pids,
)
from testbed.versions import binaries

pytestmark = pytest.mark.e2e

# The tests' model with one worker a pod: a warm standby is one trainer process a container.
ONE_WORKER = Model("linear", 1, trained_step=40)


def gang_logs(kubeconfig: Path, kube: Clients, namespace: str) -> str:
    """The trainer containers' logs of every member pod of JobSet ``gang``, this epoch's."""
    return "".join(
        started_trainer_log(kubeconfig, namespace, p.metadata.name)
        for p in member_pods(kube, namespace, "gang").values()
    )


def past_the_resume(
    logs: str, resume: int, steps: int, ranks: int = RANKS
) -> dict[int, RankRuns] | None:
    """Every rank's runs once each has resumed and logged step ``resume + steps``; None
    before."""
    runs = rank_runs(logs)
    done = len(runs) == ranks and all(
        r.resumed_at and resume + steps in r.runs[-1] for r in runs.values()
    )
    return runs if done else None


def every_rank_at(logs: str, step: int, ranks: int = RANKS) -> bool:
    """Every rank's latest run (since its latest resume) has logged ``step``."""
    runs = rank_runs(logs)
    return len(runs) == ranks and all(step in r.runs[-1] for r in runs.values())


def resumed_where_it_left(runs: dict[int, RankRuns], resume: int) -> None:
    """Every rank resumed once, at the gang's step ``resume``, went on from it trained (not
    from scratch), with the losses of the run before it at the steps both reached."""
    for rank, mine in runs.items():
        assert mine.resumed_at == [resume], f"rank {rank} resumed at {mine.resumed_at}"
        first, last = mine.runs[0], mine.runs[-1]
        assert min(last) == resume + 1, f"rank {rank} went on from the gang's step"
        assert first[1] > 10 * last[resume + 1], "the resumed run is trained, not from scratch"
        for step in range(resume + 1, resume + 4):
            if step in first:  # reached before the kill too: the same loss again
                assert last[step] == pytest.approx(first[step], rel=1e-5), (rank, step)


@pytest.mark.parametrize("start", ["cold", "prestart"])
@pytest.mark.usefixtures("torch_trainer")
def test_torchrun_ranks_resume_from_one_dcp_step_and_no_old_worker_survives(
    start: str,
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    kube: Clients,
    namespace: str,
    torch_site: Path,
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    js = torch_jobset(shared, torch_site)
    create_jobset(kube, namespace, with_prestart(js) if start == "prestart" else js)
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]

    def logs() -> str:
        return gang_logs(cluster_kubeconfig, kube, namespace)

    wait_for(f"all {RANKS} ranks past step 40", lambda: every_rank_at(logs(), 40), 600)
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

    runs = wait_for(
        f"all {RANKS} ranks 3 steps past the resume",
        lambda: past_the_resume(logs(), resume, 3),
        300,
    )
    after = member_pods(kube, namespace, "gang")
    assert {i: p.metadata.uid for i, p in after.items()} == before, "in place: same pods"
    resumed_where_it_left(runs, resume)
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


@pytest.mark.usefixtures("torch_trainer")
def test_a_warm_standby_resumes_every_rank_at_the_gangs_step_with_its_model_held(
    cluster_kubeconfig: Path,
    kube: Clients,
    namespace: str,
    torch_site: Path,
    tmp_path: Path,
) -> None:
    """``prestart-warm``: one trainer a member (``python3 -u``, no torchrun), each epoch's
    standby built its model and loaded the newest step before its word. The running trainer of
    member 1 is SIGKILLed: every rank resumes at the gang's step with the losses of the run
    before it, the standby released is the process that trains (not a cold one), and no
    process of the old epoch is left."""
    js = with_warm(torch_jobset(tmp_path / "shared", torch_site, model=ONE_WORKER), "gang")
    create_jobset(kube, namespace, js)
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]

    def logs() -> str:
        return gang_logs(cluster_kubeconfig, kube, namespace)

    def log_of(pod: str) -> str:
        return started_trainer_log(cluster_kubeconfig, namespace, pod)

    ranks = ONE_WORKER.ranks
    wait_for(f"all {ranks} ranks past step 40", lambda: every_rank_at(logs(), 40, ranks), 600)
    pods = member_pods(kube, namespace, "gang")
    wait_for(
        "every pod's standby holding a step",
        lambda: all(warm_held(log_of(p.metadata.name)) for p in pods.values()),
        600,
    )
    before = {i: p.metadata.uid for i, p in pods.items()}
    running = {i: released_pid(log_of(p.metadata.name)) for i, p in pods.items()}
    assert None not in running.values(), running
    standbys = {i: worker_pids(kubectl, p.metadata.name) - {running[i]} for i, p in pods.items()}
    assert all(len(s) == 1 for s in standbys.values()), f"one standby a pod: {standbys}"
    victim = running["1"]
    assert victim is not None
    kill_worker(kubectl, pods["1"].metadata.name, victim)

    st = barrier_open(kube, namespace, "gang", 2, 300)
    resume = st["resumeStep"]
    assert isinstance(resume, int)
    runs = wait_for(
        f"all {ranks} ranks 3 steps past the resume",
        lambda: past_the_resume(logs(), resume, 3, ranks),
        300,
    )
    after = member_pods(kube, namespace, "gang")
    assert {i: p.metadata.uid for i, p in after.items()} == before, "in place: same pods"
    resumed_where_it_left(runs, resume)
    for i, p in after.items():
        text = log_of(p.metadata.name)
        now = released_pid(text)
        assert {now} == standbys[i], f"member {i}: released {now}, its standby was {standbys[i]}"
        # the standby released had built its model and loaded a step before its word
        assert f"standby[{now}]: warm: held at step" in text, f"member {i}: not held warm"
        assert f"standby[{now}]: epoch 2: released at step {resume}" in text, i
        left = worker_pids(kubectl, p.metadata.name)
        assert running[i] not in left, f"member {i}: the old trainer {running[i]} is left"
    print(
        f"\nwarm standby: member 1's trainer (pid {victim}) SIGKILLed after step 40; every rank "
        f"resumed at step {resume} in its standby ({standbys}), loss at step {resume + 1}: "
        f"{runs[0].runs[-1][resume + 1]:.6e}"
    )


@pytest.mark.usefixtures("torch_trainer")
def test_a_kept_step_is_where_every_rank_resumes(
    cluster_kubeconfig: Path, kube: Clients, namespace: str, torch_site: Path, tmp_path: Path
) -> None:
    """The trainer keeps the step a failure interrupts (``KEEP_STEP=1``: the few lines of
    jobset_inplace.trainer.keep) and takes no periodic checkpoint within reach: a worker of
    member 1 is SIGKILLed long into training, the healthy workers' collective fails, one of
    them saves the step its state holds, and the controller hands every rank that step (the
    newest every member can load: the shared directory's). At most one step is lost, where
    without the kept step every step would be."""
    shared = tmp_path / "shared"
    js = torch_jobset(shared, torch_site, env={"KEEP_STEP": "1", "SAVE_EVERY": "100000"})
    create_jobset(kube, namespace, js)
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]

    def logs() -> str:
        return gang_logs(cluster_kubeconfig, kube, namespace)

    wait_for(f"all {RANKS} ranks past step 25", lambda: every_rank_at(logs(), 25), 600)
    pods = member_pods(kube, namespace, "gang")
    kill_worker(
        kubectl, pods["1"].metadata.name, min(worker_pids(kubectl, pods["1"].metadata.name))
    )

    st = barrier_open(kube, namespace, "gang", 2, 300)
    resume = st["resumeStep"]
    assert isinstance(resume, int), f"no step to resume from: {st}"

    runs = wait_for(
        f"all {RANKS} ranks 2 steps past the resume",
        lambda: past_the_resume(logs(), resume, 2),
        300,
    )
    newest = max(max(r.runs[0]) for r in runs.values())  # logged before the kill
    assert resume >= newest - 1, f"resumed at {resume}, newest step logged before: {newest}"
    assert f"kept step {resume}" in logs(), "a worker kept it (no periodic checkpoint exists)"
    for rank, mine in runs.items():
        assert mine.resumed_at == [resume], f"rank {rank} resumed at {mine.resumed_at}"
        for step, loss in mine.runs[-1].items():
            if step in mine.runs[0]:  # reached before the kill too: the same loss again
                assert loss == pytest.approx(mine.runs[0][step], rel=1e-5), (rank, step)
    lost = st["recovery"]["progressStepsLost"]
    assert lost is not None, st
    assert lost <= 1, f"the controller's account: {lost} steps lost"
    print(
        f"\nkept step: a worker of member 1 SIGKILLed, newest step logged {newest}, every rank "
        f"resumed at {resume}; the controller counts {lost} step(s) lost"
    )


def test_the_real_size_trainer_resumes_its_model_and_adamw_exactly(
    torch_site: Path, tmp_path: Path
) -> None:
    """The real-size benchmark's transformer (testbed.torchgang.TRANSFORMER; its dimensions
    made small here, the code is the same), under ``torchrun`` on this host: 12 steps with a
    checkpoint every 5, then started again: it resumes at step 10, and its losses at steps 11
    and 12 are the first run's (the model and AdamW's moments restored: step 12's loss is of
    parameters that AdamW's restored moments updated), and it logs where its start went."""
    small = {"MODEL_DIM": "32", "MODEL_LAYERS": "2", "MODEL_HEADS": "2", "VOCAB": "128"}
    env = {
        **os.environ,
        **TRANSFORMER.env,
        **small,
        "SEQ_LEN": "16",
        "PYTHONPATH": str(torch_site),
        "OMP_NUM_THREADS": "1",
        "CHECKPOINT_DIR": str(tmp_path),
    }
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]

    def train(steps: int, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*run, str(images.TORCH_TRAINER)],
            env=env | {"STEPS": str(steps)} | more,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    first = train(12)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "model built: transformer" in first.stdout
    second = train(14)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    before, after = rank_runs(first.stdout), rank_runs(second.stdout)
    assert set(after) == {0, 1}
    for rank, mine in after.items():
        assert mine.resumed_at == [10], f"rank {rank}: resumed at {mine.resumed_at}"
        for step in (11, 12):
            assert mine.runs[-1][step] == pytest.approx(before[rank].runs[0][step], rel=1e-6)
    bad = train(12, MODEL="cnn")
    assert bad.returncode != 0
    assert "MODEL: 'cnn' is not one of ['linear', 'transformer']" in bad.stdout + bad.stderr
