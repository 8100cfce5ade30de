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
first step after the resume."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.prestart import HELD
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, member_pods
from testbed.demo import started_trainer_log, timed_log
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


@pytest.mark.parametrize("spares", [1, 0], ids=["spare", "no-spare"])
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
    leader = kube.core.read_namespaced_pod(controller.leader(), names.INSTALL_NAMESPACE)
    victim = "1" if nodes["1"] != leader.spec.node_name else "0"
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
