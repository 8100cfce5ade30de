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
rank resumes at one DCP step, and the gang trains
again. Printed: the time from the power-off to every rank's first step after the resume."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.prestart import HELD
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, member_pods, prepare
from testbed.demo import started_trainer_log, timed_log
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.torchgang import (
    RANKS,
    WORKERS,
    RankResume,
    create_trainer_config_map,
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


def test_a_dead_nodes_member_trains_again_on_the_hot_spare_as_the_same_rank(
    *,  # (fixtures)
    three_real_nodes: LocalCluster,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    torch_site: Path,
    tmp_path: Path,
) -> None:
    cluster = three_real_nodes
    prepare(kube, cluster_kubeconfig, namespace)
    create_trainer_config_map(kube, namespace)
    # as examples/pytorch-dcp-hot-spares.yaml: every pod's next torchrun pre-started and held
    js = with_prestart(torch_jobset(tmp_path / "shared", torch_site, name=NAME, hot_spares=1))
    create_jobset(kube, namespace, js)

    def trainer_logs(*indexes: str) -> str:
        pods = member_pods(kube, namespace, NAME)
        return "".join(
            started_trainer_log(cluster_kubeconfig, namespace, pods[i].metadata.name)
            for i in indexes
            if i in pods
        )

    def trained(to: int) -> bool:
        runs = rank_runs(trainer_logs("0", "1"))
        return len(runs) == RANKS and all(to in r.runs[-1] for r in runs.values())

    wait_for(f"all {RANKS} ranks past step 20", lambda: trained(20), 600)
    pods = member_pods(kube, namespace, NAME)
    assert set(pods) == {"0", "1", SPARE}, f"2 members and the spare: {sorted(pods)}"
    nodes = {i: p.spec.node_name for i, p in pods.items()}
    assert len(set(nodes.values())) == 3, f"one pod per real node: {nodes}"
    wait_for(
        "the spare's agent standing by",
        lambda: (
            "this pod holds no slot; standing by"
            in agent_log(cluster_kubeconfig, namespace, pods[SPARE].metadata.name)
        ),
        300,
    )
    wait_for(
        "every pod's next torchrun held (the spare's: its first)",
        lambda: all(
            started_trainer_log(cluster_kubeconfig, namespace, pods[i].metadata.name).count(HELD)
            >= (1 if i == SPARE else 2)
            for i in pods
        ),
        300,
    )
    spare_log = started_trainer_log(cluster_kubeconfig, namespace, pods[SPARE].metadata.name)
    assert rank_runs(spare_log) == {}, "a spare's trainer is held, it does not train"
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
        spare_position = names.member_name("workers", int(SPARE), 0)
        assert st.get("slots", {}).get(slot) == spare_position, st.get("slots")
        resume = st["resumeStep"]
        assert isinstance(resume, int)

        spare_pod = pods[SPARE].metadata.name
        other = pods[survivor].metadata.name

        def back() -> dict[int, RankResume] | None:
            lines = [
                *timed_log(cluster_kubeconfig, namespace, other, "trainer"),
                *timed_log(cluster_kubeconfig, namespace, spare_pod, "trainer"),
            ]
            resumed = rank_resumes(lines, t0)
            if sum(x.first_step is not None for x in resumed.values()) < RANKS:
                return None
            steps = {r: x.resume_step for r, x in resumed.items()}
            assert set(steps.values()) == {resume}, f"every rank at the gang's step: {steps}"
            return resumed

        resumed = wait_for(f"all {RANKS} ranks training again", back, 300)
        first_steps = {r: x.first_step for r, x in resumed.items() if x.first_step is not None}
        spare_ranks = rank_runs(started_trainer_log(cluster_kubeconfig, namespace, spare_pod))
        ranks = {int(victim) * WORKERS + w for w in range(WORKERS)}
        assert set(spare_ranks) == ranks, (
            f"the spare's workers are node rank {victim}'s {sorted(ranks)}: {sorted(spare_ranks)}"
        )
        after = member_pods(kube, namespace, NAME)
        assert after[survivor].metadata.uid == pods[survivor].metadata.uid, "restarted in place"
        assert after[SPARE].metadata.uid == pods[SPARE].metadata.uid, "the spare is the same pod"
        print(
            f"\nhot spare on real nodes: member {victim}'s node {dead} powered off; slot "
            f"{victim} on the spare ({nodes[SPARE]}), every rank resumed at step {resume}; "
            f"training again {max(first_steps.values()) - t0:.1f} s after the power-off (per rank: "
            + ", ".join(f"{r}: {t - t0:.1f} s" for r, t in sorted(first_steps.items()))
            + f"); the node was down {t_down - t0:.1f} s after the power-off began; barrier "
            f"of epoch {epoch + 1} seen open at {t_open - t0:.1f} s"
        )
        for rank, x in sorted(resumed.items()):
            marks = {k: v for k, v in vars(x).items() if isinstance(v, float)}
            print(f"  rank {rank}: " + ", ".join(f"{k} {v - t0:.1f} s" for k, v in marks.items()))
    finally:
        cluster.power_on(dead)
