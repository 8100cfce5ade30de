"""Hot spares on real kubelet nodes (docs/design/hot-spares.md, section 8): a PyTorch gang of 2
members and 1 spare, one pod per real node (a third node is added for the spare), opted in
with ``jobset-inplace.dev/hot-spares: "1"`` through the webhook. Each member runs ``torchrun``
with a static rendezvous and neither ``--node-rank`` nor ``--master-addr``: the launcher gives
each epoch's torchrun the slot its pod holds (``PET_NODE_RANK``) and slot 0's pod
(``PET_MASTER_ADDR``). DCP checkpoints go to one shared directory (the persistent tier every
pod mounts), and every pod's next torchrun is pre-started and held (``prestart-imports``, as
examples/pytorch-dcp-hot-spares.yaml).

A member's node loses power (its kubelet and containerd stopped: every container on it dies,
its agent falls silent; member 1's, or member 0's where the controller's leader runs on member
1's node: the rendezvous host then moves too). The spare takes the member's slot without a new
pod: its torchrun runs as that member's node rank (its workers have that member's ranks), every
rank resumes at one DCP step, and the gang trains again. The same gang without a spare is the
comparison: its dead member's pod is force-deleted once the node's Lease is stale, and its Job's
new pod starts on the free third node. Printed: the time from the power-off to every rank's
first step after the resume.

A drain of a member's node with the spare's node closed to new pods: the member's Job's new pod
can only go beside the other member, and the slot goes to the spare (on a node of its own)
instead; the new pod stands by as the spare."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.marks import KUBE_RELEASE
from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.prestart import HELD
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, member_pods, slot_holders
from testbed.demo import (
    assert_resumed,
    started_trainer_log,
    timed_log,
    trainers_running,
    training_gang,
)
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.torchgang import (
    RANKS,
    WORKERS,
    RankResume,
    rank_resumes,
    rank_runs,
    torch_jobset,
    with_prestart,
)
from testbed.versions import binaries

pytestmark = pytest.mark.e2e
NAME = "spares"
SPARE = "2"  # the spare's job index: the highest, beyond the 2 members


@pytest.fixture
def three_real_nodes(local_cluster: LocalCluster | None) -> Iterator[LocalCluster]:
    """The local cluster with a third real node for the spare (removed afterwards if added)."""
    if local_cluster is None:
        pytest.skip("powers a real node off: the local cluster's real kubelet nodes")
    added = local_cluster.add_real_node() if len(local_cluster.real_nodes()) < 3 else None
    try:
        yield local_cluster
    finally:
        if added is not None:
            local_cluster.remove_real_node(added)


def agent_log(kubeconfig: Path, namespace: str, pod: str) -> str:
    try:
        return "\n".join(line for _, line in timed_log(kubeconfig, namespace, pod, AGENT_CONTAINER))
    except subprocess.CalledProcessError:  # not started yet (or kubectl's notice instead)
        return ""


# A taint the spare's node gets for the drain test: closed to new pods, the spare stays.
CLOSED = {"key": "e2e.test/closed-to-new-pods", "effect": "NoSchedule"}
DRAIN_TIMEOUT_S = 300


@pytest.mark.parametrize(
    "spares", [pytest.param(1, marks=KUBE_RELEASE), 0], ids=["spare", "no-spare"]
)
def test_a_dead_nodes_member_trains_again_on_the_hot_spare_as_the_same_rank(
    spares: int,
    *,  # (fixtures)
    three_real_nodes: LocalCluster,
    torch_trainer: None,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    torch_site: Path,
    tmp_path: Path,
) -> None:
    """``spare``: the spare takes the dead member's slot. ``no-spare``, the same gang without
    one, for comparison: the dead member's pod is force-deleted once its node's Lease is stale
    and its Job's new pod starts on the free third node."""
    cluster = three_real_nodes
    # as examples/pytorch-dcp-hot-spares.yaml: every pod's next torchrun pre-started and held
    js = with_prestart(torch_jobset(tmp_path / "shared", torch_site, name=NAME, hot_spares=spares))
    create_jobset(kube, namespace, js)

    def trainer_log(pod: Any) -> str:
        return started_trainer_log(cluster_kubeconfig, namespace, pod.metadata.name)

    def trained(to: int) -> bool:
        pods = member_pods(kube, namespace, NAME)
        runs = rank_runs("".join(trainer_log(pods[i]) for i in ("0", "1") if i in pods))
        return len(runs) == RANKS and all(to in r.runs[-1] for r in runs.values())

    wait_for(f"all {RANKS} ranks past step 20", lambda: trained(20), 600)
    pods = member_pods(kube, namespace, NAME)
    assert set(pods) == ({"0", "1", SPARE} if spares else {"0", "1"}), sorted(pods)
    nodes = {i: p.spec.node_name for i, p in pods.items()}
    assert len(set(nodes.values())) == len(pods), f"one pod per real node: {nodes}"
    if spares:
        wait_for(
            "the spare's agent standing by",
            lambda: (
                "this pod holds no slot; standing by"
                in agent_log(cluster_kubeconfig, namespace, pods[SPARE].metadata.name)
            ),
            300,
        )
    wait_for(
        "every pod's next torchrun held (a spare's: its first)",
        lambda: all(
            trainer_log(p).count(HELD) >= (1 if i == SPARE else 2) for i, p in pods.items()
        ),
        300,
    )
    if spares:
        assert rank_runs(trainer_log(pods[SPARE])) == {}, "a spare's trainer is held, not training"
    epoch = gang_state(kube, namespace, NAME)["epoch"]

    # the member whose node dies: one whose node the controller's leader is not on (this test
    # is of the spare, not of a failover; e2e/test_failover.py has that)
    victim = "1" if nodes["1"] != controller.leader_node() else "0"
    survivor = "0" if victim == "1" else "1"
    slot = names.member_name("workers", int(victim), 0)
    dead = nodes[victim]
    t0 = time.time()
    cluster.power_off(dead)
    t_down = time.time()  # kubelet stopped, every container killed, containerd stopped
    try:
        st = barrier_open(kube, namespace, NAME, epoch + 1, 300)
        t_open = time.time()  # (within the poll's period of the opening)
        resume = st["resumeStep"]
        assert isinstance(resume, int)
        after = member_pods(kube, namespace, NAME, include_failed=False)
        assert after[survivor].metadata.uid == pods[survivor].metadata.uid, "restarted in place"
        if spares:
            spare_position = names.member_name("workers", int(SPARE), 0)
            assert st.get("slots", {}).get(slot) == spare_position, st.get("slots")
            assert after[SPARE].metadata.uid == pods[SPARE].metadata.uid, "the spare's own pod"
            took_over = after[SPARE]
        else:
            assert not st.get("slots"), st.get("slots")
            took_over = after[victim]
            assert took_over.metadata.uid != pods[victim].metadata.uid, "its Job's new pod"
        assert took_over.spec.node_name != dead

        def back() -> dict[int, RankResume] | None:
            try:  # (the new pod's trainer may not have started yet)
                lines = [
                    line
                    for p in (after[survivor], took_over)
                    for line in timed_log(cluster_kubeconfig, namespace, p.metadata.name, "trainer")
                ]
            except subprocess.CalledProcessError:
                return None
            resumed = rank_resumes(lines, t0)
            if sum(x.first_step is not None for x in resumed.values()) < RANKS:
                return None
            steps = {r: x.resume_step for r, x in resumed.items()}
            assert set(steps.values()) == {resume}, f"every rank at the gang's step: {steps}"
            return resumed

        resumed = wait_for(f"all {RANKS} ranks training again", back, 300)
        first_steps = {r: x.first_step for r, x in resumed.items() if x.first_step is not None}
        ranks = {int(victim) * WORKERS + w for w in range(WORKERS)}
        theirs = set(rank_runs(trainer_log(took_over)))
        assert theirs == ranks, f"node rank {victim}'s ranks {sorted(ranks)}: {sorted(theirs)}"
        how = "on the spare" if spares else "on its Job's new pod"
        print(
            f"\nreal nodes, {spares} spare(s): member {victim}'s node {dead} powered off; slot "
            f"{victim} {how} ({took_over.spec.node_name}), every rank resumed at step {resume}; "
            f"training again {max(first_steps.values()) - t0:.1f} s after the power-off (per "
            "rank: "
            + ", ".join(f"{r}: {t - t0:.1f} s" for r, t in sorted(first_steps.items()))
            + f"); the node was down {t_down - t0:.1f} s after the power-off began; barrier "
            f"of epoch {epoch + 1} seen open at {t_open - t0:.1f} s"
        )
        for rank, x in sorted(resumed.items()):
            marks = {k: v for k, v in vars(x).items() if isinstance(v, float)}
            print(f"  rank {rank}: " + ", ".join(f"{k} {v - t0:.1f} s" for k, v in marks.items()))
    finally:
        cluster.power_on(dead)


def test_a_drained_members_slot_goes_to_the_spare_not_beside_another_member(
    *,  # (fixtures)
    three_real_nodes: LocalCluster,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A demo gang of 2 members and 1 spare on 3 real nodes; the spare's node is closed to new
    pods (a NoSchedule taint: the spare stays) and a member's node is drained. The gang stops
    at one step, and the member's Job's new pod can only be scheduled beside the other member,
    where one node's death would take both: the slot goes to the spare once the old pod is
    fenced (whether the new pod was Ready by then or not), the new pod stands by as the spare,
    every member resumes at the planned step on a node of its own, and the drain completes."""
    name = "drained"
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        name,
        2,
        persistent=tmp_path / "shared",
        shared_root=True,
        spares=1,
    )
    before = member_pods(kube, namespace, name)
    assert set(before) == {"0", "1", SPARE}, sorted(before)
    nodes = {i: p.spec.node_name for i, p in before.items()}
    assert len(set(nodes.values())) == 3, f"one pod per real node: {nodes}"
    victim = "1" if nodes["1"] != controller.leader_node() else "0"
    survivor = "0" if victim == "1" else "1"
    drained, closed = nodes[victim], nodes[SPARE]
    epoch = gang_state(kube, namespace, name)["epoch"] + 1
    taints = kube.core.read_node(closed).spec.taints or []
    kube.core.patch_node(closed, {"spec": {"taints": [*taints, CLOSED]}})
    drain = [
        str(binaries().kubectl),
        "--kubeconfig",
        str(cluster_kubeconfig),
        "drain",
        drained,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={DRAIN_TIMEOUT_S}s",
    ]
    proc = subprocess.Popen(drain, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        st = barrier_open(kube, namespace, name, epoch, 240)
        slot = names.member_name("workers", int(victim), 0)
        assert st["recovery"]["causes"] == {slot: "PlannedMove"}, st
        assert st.get(names.STATUS_SLOTS) == {slot: names.member_name("workers", int(SPARE), 0)}
        reasons = {
            e.reason: e.message
            for e in kube.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}"
            ).items
        }
        m = re.search(r"every trainer stops at step (\d+)", reasons.get("PlannedStop", ""))
        assert m, reasons
        planned = int(m.group(1))
        assert (st["resumeStep"], st["recovery"]["progressStepsLost"]) == (planned, 0), st
        holders = slot_holders(kube, namespace, name, 2)
        on = {i: p.spec.node_name for i, p in holders.items()}
        assert on == {victim: closed, survivor: nodes[survivor]}, on
        wait_for(
            f"every member's trainer running in epoch {epoch}",
            lambda: trainers_running(kube, cluster_kubeconfig, namespace, name, 2, epoch=epoch),
            120,
        )
        assert_resumed(cluster_kubeconfig, namespace, holders.values(), epoch, planned)
        out, _ = proc.communicate(timeout=DRAIN_TIMEOUT_S)
        assert proc.returncode == 0, out
        new = member_pods(kube, namespace, name, include_failed=False)[victim]
        assert new.metadata.uid != before[victim].metadata.uid
        assert new.spec.node_name == nodes[survivor], "the only node open to it"
        assert "holds no slot; standing by" in agent_log(
            cluster_kubeconfig, namespace, new.metadata.name
        )
        print(
            f"\ndrain of {drained} (member {victim}), {closed} closed to new pods: member "
            f"{victim}'s Job's new pod went beside member {survivor} on {nodes[survivor]}; the "
            f"spare on {closed} took the slot ({reasons['SpareSwapped']}); resumed at step "
            f"{planned}, 0 steps lost ({reasons['BarrierOpened']})"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        kube.core.patch_node(drained, {"spec": {"unschedulable": None}})
        kube.core.patch_node(closed, {"spec": {"taints": taints or None}})
