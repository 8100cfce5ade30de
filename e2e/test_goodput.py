"""Goodput checked against the trainer's own truth, on the real nodes: a demo gang that logs
every step it does (when it started and ended) and every resume, in lockstep as data-parallel
trainers are, with trainer crashes injected at intervals; the goodput the controller accounts
(GangState ``status.goodput``) agrees with the trainers' within 1 percentage point, and the steps
each recovery made the gang redo match."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from e2e.marks import POD_SCOPE
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.times import parse_time
from testbed.cluster import LocalCluster
from testbed.controller import gang_state, member_pods
from testbed.demo import (
    GANG_MOUNT,
    PERSISTENT_MOUNT,
    barrier_opened,
    inject_failure,
    python_in_trainer,
    trainers_running,
    training_gang,
)
from testbed.demo_trainer import (
    CHECKPOINT_EVERY,
    ENV_GANG_SIZE,
    ENV_LOCKSTEP_DIR,
    ENV_TRUTH_FILE,
    PERSIST_EVERY,
    Truth,
    gang_began,
    parse_truth,
)
from testbed.install import Installation
from testbed.kube import Clients, wait_for
from testbed.versions import binaries

pytestmark = pytest.mark.e2e

TRUTH = "/ckpt/truth.log"  # on the pod's emptyDir: it outlives the trainer processes
# Training time before each injected crash (varied: the crash lands anywhere between checkpoints)
TRAINING_BEFORE_CRASH_S = (9.0, 14.5, 6.3)
MEMBERS = 2


def read_truth(kubeconfig: Path, namespace: str, pod: str) -> Truth:
    cmd = [str(binaries().kubectl), "--kubeconfig", str(kubeconfig), "-n", namespace, "exec"]
    out = subprocess.run(
        [*cmd, pod, "-c", "trainer", "--", "cat", TRUTH], capture_output=True, text=True, check=True
    ).stdout
    return parse_truth(out)


def truth_gang(  # noqa: PLR0917 (the demo gang's place, then the truth's)
    kube: Clients,
    kubeconfig: Path,
    namespace: str,
    name: str,
    truth: str,
    persistent: Path,
    *,
    scope: str | None = None,
    shared_host: bool = True,
) -> None:
    """A demo gang of MEMBERS training in lockstep, as data-parallel trainers do (the gang the
    account is made for: a member alone would train on past another's crash, and keep steps
    no such gang has), each trainer logging its own account to ``truth``; ``persistent``: the
    host directory of its persistent tier and of its lockstep (`demo_jobset`), which the
    nodes share only on the local cluster (one host): elsewhere (``shared_host`` False: kind)
    the members go on one node."""
    training_gang(
        kube,
        kubeconfig,
        namespace,
        name,
        MEMBERS,
        scope=scope,
        persistent=persistent,
        together=not shared_host,
        env={
            ENV_TRUTH_FILE: truth,
            ENV_LOCKSTEP_DIR: f"{GANG_MOUNT}/lockstep",
            ENV_GANG_SIZE: str(MEMBERS),
        },
    )


def reported_ratio(account: dict[str, Any]) -> float:
    productive = account["productiveSeconds"]
    return float(productive / (productive + sum(account["badputSeconds"].values())))


@pytest.mark.parametrize("scope", ["process", POD_SCOPE])
def test_goodput_agrees_with_the_trainers_own_account(  # noqa: PLR0917 (fixtures)
    local_cluster: LocalCluster | None,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    tmp_path: Path,
    scope: str,
) -> None:
    """Process scope: the trainer processes restart; pod scope: every container of every
    member (RestartAllContainers), the pods and their emptyDir kept. The members come back
    apart (one pod's restart ends later: 0.6 s in a CI run of 2026-12-04, unrecorded); the gang
    trains from its last member's first step, the time before is restore in both accounts."""
    name, members = "goodput", MEMBERS
    shared = tmp_path / "shared"
    truth_gang(
        kube, cluster_kubeconfig, namespace, name, TRUTH, shared, scope=scope,
        shared_host=local_cluster is not None,
    )  # fmt: skip
    pods = sorted(member_pods(kube, namespace, name).values(), key=lambda p: p.metadata.name)
    epoch = 1
    for i, training in enumerate(TRAINING_BEFORE_CRASH_S):
        time.sleep(training)  # the gang trains; then one trainer crashes (the injected fault)
        inject_failure(cluster_kubeconfig, namespace, pods[i % members].metadata.name)
        epoch += 1
        barrier_opened(kube, namespace, name, epoch)
        wait_for(
            f"every trainer running in epoch {epoch}",
            lambda e=epoch: trainers_running(  # type: ignore[misc]
                kube, cluster_kubeconfig, namespace, name, members, epoch=e
            ),
            120,
        )
    st = gang_state(kube, namespace, name)
    assert st["epoch"] == epoch, st
    account = st["goodput"]
    print(f"goodput account at epoch {epoch}'s barrier: {account}")
    assert account["unmeasuredSeconds"] == 0, "every ended epoch's span was reported"
    assert set(account["badputSeconds"]) == {
        "scheduling", "startup", "detection", "recovery", "restore", "wastedProgress"
    }  # fmt: skip
    since = parse_time(account["since"])
    opened = parse_time(st["recovery"]["openedAt"])
    assert since is not None
    assert opened is not None
    jobset = kube.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name
    )
    created = parse_time(jobset["metadata"]["creationTimestamp"])  # whole seconds
    assert created is not None
    print(f"the account starts {since - created:.2f} s after the JobSet's creation second")
    assert created <= since < created + 3, "from the gang's start (its first pass)"
    measured = account["productiveSeconds"] + sum(account["badputSeconds"].values())
    assert measured == pytest.approx(opened - since, abs=0.01), "every second accounted once"
    ours = reported_ratio(account)

    truths = {
        p.metadata.name: read_truth(cluster_kubeconfig, namespace, p.metadata.name) for p in pods
    }
    # when each epoch ended: the crashed trainer's own account of its crash
    ended = {e: at for truth in truths.values() for e, at in truth.crashes.items()}
    assert sorted(ended) == list(range(1, epoch)), ended
    began = gang_began(truths.values())
    wasted = account["badputSeconds"]["wastedProgress"] / measured
    for pod, truth in truths.items():
        assert sorted(truth.resumes) == list(range(1, epoch + 1)), (pod, truth.resumes)
        theirs = truth.kept_seconds(epoch, began) / (opened - since)
        their_waste = truth.wasted_seconds(epoch, began, ended) / (opened - since)
        print(
            f"{pod}: trainer's goodput {theirs:.4f}, reported {ours:.4f} "
            f"({abs(theirs - ours) * 100:.2f} points apart); wasted progress {their_waste:.4f}, "
            f"reported {wasted:.4f} ({abs(their_waste - wasted) * 100:.2f} points apart); the "
            f"rest (detection, recovery, restore, start) {1 - theirs - their_waste:.4f}, "
            f"reported {1 - ours - wasted:.4f}"
        )
        # where a member's own account may part from the gang's: per epoch, its first step's
        # start against the gang's (its last member's) and the time between its steps
        for e in sorted(began):
            steps = sorted((s for s in truth.steps if s.epoch == e), key=lambda s: s.start)
            gaps = sum(b.start - a.end for a, b in pairwise(steps))
            early = began[e] - steps[0].start if steps else 0.0
            print(f"  epoch {e}: began {early:.3f} s before the gang, {gaps:.3f} s between steps")
        assert abs(theirs - ours) <= 0.01, (pod, theirs, ours, account)
        assert abs(their_waste - wasted) <= 0.01, (pod, their_waste, wasted, account)
        rest = abs((1 - theirs - their_waste) - (1 - ours - wasted))
        assert rest <= 0.01, (pod, theirs, their_waste, account)

    # steps redone per recovery: how far the gang had got (its newest step) past the resume
    history = {h["epoch"]: h for h in st["history"]}
    for e in range(2, epoch + 1):
        newest = max(n for t in truths.values() if (n := t.newest_step(e - 1)) is not None)
        resume = _common(truth.resumes[e] for truth in truths.values())
        assert history[e]["resumeStep"] == resume, history[e]
        assert history[e]["progressStepsLost"] == newest - resume, (e, history[e], newest)


def _common(values: Sequence[int] | Any) -> int:
    (value,) = set(values)
    return int(value)


def test_an_epoch_whose_node_took_every_member_is_accounted(
    *,  # (fixtures)
    local_cluster: LocalCluster | None,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Both members on one real node, which loses power: their pods, and their progress
    records, go with it, and both are recreated on the other node. The epoch that ended is
    accounted from what the agents noted over the report channel while it ran (the leader's
    memory, or, where the leader died with the node, the sum the GangState keeps), not left
    unmeasured; the trainers' own account (on the shared tier, which outlives the pods) agrees
    within 1 point."""
    if local_cluster is None:
        pytest.skip("powers a real node off: the local cluster's real kubelet nodes")
    real = local_cluster.real_nodes()
    assert len(real) >= 2, real
    name, members, shared = "noded", MEMBERS, tmp_path / "shared"
    home, other = real[0], real[1:]
    for node in other:  # both members on `home`
        kube.core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        truth_gang(
            kube, cluster_kubeconfig, namespace, name, f"{PERSISTENT_MOUNT}/truth.log", shared
        )
    finally:
        for node in other:
            kube.core.patch_node(node, {"spec": {"unschedulable": False}})
    pods = member_pods(kube, namespace, name)
    assert {p.spec.node_name for p in pods.values()} == {home}, "both members on one node"
    noted = wait_for(
        "the agents' progress notes summed in the status",
        lambda: (
            (gang_state(kube, namespace, name).get("goodput") or {}).get("training") or {}
        ).get("noted"),
        60,
    )
    time.sleep(8.0)  # the gang trains on
    local_cluster.power_off(home)
    try:
        st = barrier_opened(kube, namespace, name, 2, 300)
        after = member_pods(kube, namespace, name, include_failed=False)
        assert all(p.metadata.uid != pods[i].metadata.uid for i, p in after.items()), "recreated"
        assert all(p.spec.node_name != home for p in after.values())
    finally:
        local_cluster.power_on(home)
    account = st["goodput"]
    print(f"notes summed before the power-off: {noted}; account at epoch 2's barrier: {account}")
    assert account["unmeasuredSeconds"] == 0, "the ended epoch accounted from the notes"
    since, opened = parse_time(account["since"]), parse_time(st["recovery"]["openedAt"])
    assert since is not None
    assert opened is not None
    ours = reported_ratio(account)
    truths = [parse_truth((shared / str(i) / "truth.log").read_text()) for i in range(members)]
    began = gang_began(truths)
    for index, truth in enumerate(truths):
        theirs = truth.kept_seconds(2, began) / (opened - since)
        print(
            f"member {index}: trainer's goodput {theirs:.4f}, reported {ours:.4f} "
            f"({abs(theirs - ours) * 100:.2f} points apart)"
        )
        assert abs(theirs - ours) <= 0.01, (index, theirs, ours, account)


# Sends the signal named by argv[1] to the demo trainer's process in its container (SIGKILL: as
# the OOM killer does; SIGSTOP/SIGCONT: to hold one member back).
SIGNAL_THE_TRAINER = """
import os, signal, sys
sig = getattr(signal, sys.argv[1])
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"demo_trainer" in cmd:
            os.kill(int(pid), sig)
            print("signalled", pid)
"""


HELD_STEP_S = 0.5  # the demo trainer's step where member 0 is held back (its default: 0.2)


@pytest.mark.parametrize("killed", ["as-it-runs", "ahead"])
def test_a_kept_step_reaches_the_member_killed_by_sigkill(  # noqa: PLR0917 (fixtures)
    local_cluster: LocalCluster | None,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    tmp_path: Path,
    *,
    killed: str,
) -> None:
    """A replicated demo gang keeping its steps (JSI_DEMO_KEEP_STEP=1) in one persistent root
    for the gang (periodic checkpoints every 10 steps locally, every 20 to it): member 1's
    trainer is SIGKILLed past step 25 (it keeps nothing); member 0's, stopped by the in-place
    restart, keeps its newest step in the shared root; every member resumes there, not at the
    last periodic checkpoint. (Without the keeper, or with a root per member, the killed member
    has no step past its periodic ones.) ``as-it-runs``: whichever member is ahead by the
    demo's own drift (they are not in lockstep). ``ahead``: member 0's trainer is held back
    (SIGSTOP) until member 1 has passed its local checkpoint 30, then member 1 is killed: each
    member then reports a step the other lacks (member 1's local 30, member 0's kept one),
    and both must look again (seen in CI when member 1 happened to be ahead)."""
    name, shared = "kept", tmp_path / "shared"
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        name,
        MEMBERS,
        persistent=shared,
        shared_root=True,
        together=local_cluster is None,  # (one root only where the nodes share this host's)
        env={
            ENV_TRUTH_FILE: TRUTH,
            "JSI_DEMO_KEEP_STEP": "1",
            # held back, member 0 must stop between the shared root's checkpoint 20 and its
            # local 30: at 0.5 s a step, 5 s for two kubectl execs however loaded the machine
            **({"JSI_DEMO_STEP_SECONDS": str(HELD_STEP_S)} if killed == "ahead" else {}),
        },
    )
    pods = sorted(member_pods(kube, namespace, name).values(), key=lambda p: p.metadata.name)
    first, second = (p.metadata.name for p in pods)
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig), "-n", namespace]

    def newest(pod: str) -> int:
        return read_truth(cluster_kubeconfig, namespace, pod).newest_step(1) or 0

    def signal_trainer(pod: str, sig: str) -> None:
        out = python_in_trainer(kubectl, pod, SIGNAL_THE_TRAINER, [sig])
        assert "signalled" in out.stdout, out.stdout + out.stderr

    if killed == "ahead":
        wait_for("member 0 past step 20", lambda: newest(first) > PERSIST_EVERY, 120)
        signal_trainer(first, "SIGSTOP")
        held = newest(first)
        assert held < 3 * CHECKPOINT_EVERY, f"member 0 held back at step {held}: too late"
        wait_for(
            "member 1 past its local checkpoint 30",
            lambda: newest(second) > 3 * CHECKPOINT_EVERY,
            60,
        )
        signal_trainer(second, "SIGKILL")
        signal_trainer(first, "SIGCONT")
    else:
        wait_for("member 0 past step 25", lambda: newest(first) > 25, 120)
        signal_trainer(second, "SIGKILL")
    st = barrier_opened(kube, namespace, name, 2)
    survivor, lead = newest(first), newest(second)
    log = [*kubectl, "logs", second, "-c", AGENT_CONTAINER]
    agent = subprocess.run(log, check=False, capture_output=True, text=True).stdout
    # whether the killed member reported before the survivor kept (then it looked again):
    # timing, so said, not asserted
    again = "looked at the checkpoint steps" in agent
    print(
        f"{killed}: epoch 2 resumes at {st.get('resumeStep')}; the survivor's newest step "
        f"{survivor}, the killed member's {lead}; the killed member "
        f"{'looked again' if again else 'did not look again'}"
    )
    assert survivor > PERSIST_EVERY, "the kept step is past the periodic one of the shared root"
    assert st["resumeStep"] == survivor, (st.get("resumeStep"), survivor)
    if killed == "ahead":
        assert lead > 3 * CHECKPOINT_EVERY > survivor, (lead, survivor)
    (summary,) = [h for h in st["history"] if h["epoch"] == 2]
    # the killed member's step, at most, past what any member finished (the demo's members
    # are not in lockstep as a DDP gang's are: the killed one's lead is lost too)
    assert summary["progressStepsLost"] <= 1 + max(0, lead - survivor), (summary, lead, survivor)
    wait_for(
        "every trainer running in epoch 2",
        lambda: trainers_running(kube, cluster_kubeconfig, namespace, name, MEMBERS, epoch=2),
        120,
    )
    for pod in (first, second):
        truth = read_truth(cluster_kubeconfig, namespace, pod)
        assert truth.resumes[2] == survivor, (pod, truth.resumes)
