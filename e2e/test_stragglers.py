"""Straggler detection end to end on the real kubelet nodes: one member of a 3-member gang
computes 4x longer per step (a degraded device or node; the gang keeps one pace, as synchronous
training does); its agent's busy windows show it, the controller flags it (Event, GangState
status) and, with ``straggler-action: recreate``, replaces it on another node (its node
tainted) at the gang's next checkpoint while the others restart in place, every member resuming
from one step, newer than the newest at detection. The latencies are printed
(docs/guarantees.md quotes them)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobset_inplace import names
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, gang_state, member_pods, recovery_times
from testbed.demo import inject_slowdown, one_replaced_others_in_place, training_gang
from testbed.install import Installation
from testbed.kube import Clients, remove_taint, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 3  # a median needs 3 (core/stragglers.py)
WINDOW_S = 30  # the shortest straggler-window
WINDOWS = 2


@pytest.fixture
def untainted(local_cluster: LocalCluster | None, kube: Clients) -> Iterator[None]:
    """The straggler's node is tainted like a failed device's: people remove it (here: the
    test, afterwards)."""
    if local_cluster is None:
        pytest.skip("taints the local cluster's real nodes")
    yield
    for node in local_cluster.real_nodes():
        remove_taint(kube, node, names.DEVICE_UNHEALTHY_TAINT)


def test_a_straggler_is_flagged_and_replaced_elsewhere(
    *,  # (fixtures)
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    untainted: None,
    tmp_path: Path,
) -> None:
    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        MEMBERS,
        annotations={
            names.STRAGGLER_FACTOR: "2",
            names.STRAGGLER_WINDOWS: str(WINDOWS),
            names.STRAGGLER_WINDOW: f"{WINDOW_S}s",
            names.STRAGGLER_ACTION: "recreate",
        },
        persistent=tmp_path / "shared",  # the replacement's steps
    )
    before = member_pods(kube, namespace, "gang")
    victim = before["2"]
    inject_slowdown(cluster_kubeconfig, namespace, victim.metadata.name, 4)
    slowed_at = time.time()

    st = wait_for(
        "the straggler's recovery",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 else None,
        (WINDOWS + 3) * WINDOW_S + 60,  # + a window for the next checkpoint
    )
    rec = st["recovery"]
    assert rec["causes"] == {"workers/2/0": "Straggler"}
    assert set(rec["recreated"]) == {"workers/2/0"}
    events = kube.core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=gang,reason=StragglerDetected"
    ).items
    assert [e.type for e in events] == ["Warning"], "one straggler, flagged once"
    assert "member workers/2/0" in events[0].message
    # replaced at the gang's next checkpoint: every member past the newest one at detection
    (pending,) = kube.core.list_namespaced_event(
        namespace,
        field_selector="involvedObject.name=gang,reason=StragglerReplacementPending",
    ).items
    m = re.search(r"past step (\d+)\)", pending.message)
    assert m, pending.message
    held = int(m.group(1))
    node = victim.spec.node_name

    def effect() -> str | None:
        taints = kube.core.read_node(node).spec.taints or []
        return next((t.effect for t in taints if t.key == names.DEVICE_UNHEALTHY_TAINT), None)

    # the pass that opened epoch 2 writes its status first, then taints and replaces: the
    # status can be seen a moment before the taint is there
    assert wait_for(f"node {node} tainted", effect, 30, 0.2) == "NoSchedule"

    st = barrier_open(kube, namespace, "gang", 2, 120)
    resume = st["resumeStep"]
    assert resume > held, "from the checkpoint after the detection, not the one before"
    after = one_replaced_others_in_place(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        before=before,
        replaced="2",
        epoch=2,
        resume=resume,
    )
    assert after["2"].spec.node_name != node, "replaced on another node"
    started, opened = recovery_times(st["recovery"])
    flagged = events[0].first_timestamp
    print(
        f"\nstraggler (computing 4x longer, factor 2, {WINDOWS} windows of {WINDOW_S}s): "
        f"slowdown -> flagged {flagged.timestamp() - slowed_at:.1f}s -> replaced after the next "
        f"checkpoint: recovery started {started - slowed_at:.1f}s, barrier open "
        f"{opened - slowed_at:.1f}s, resumed at step {resume} (newest at detection {held}); "
        f"replaced on {after['2'].spec.node_name}"
    )
