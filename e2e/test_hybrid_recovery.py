"""Hybrid recovery end to end on the local cluster: the real controller, real agents and the
demo trainer in real containers on the real kubelet nodes, JobSet and its Job controller."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest

from testbed.demo import run_demo, trainer_log
from testbed.install import Installation
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e


def _resumed_at(kubeconfig: Path, namespace: str, pod: str) -> list[int]:
    out = trainer_log(kubeconfig, namespace, pod)
    return [int(m) for m in re.findall(r"resuming at step (\d+)", out)]


def _barrier_openings(kube: Clients, namespace: str, name: str) -> int:
    events = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return sum(1 for e in events if e.reason == "BarrierOpened")


def test_trainer_crash_restarts_the_gang_in_place_from_one_step(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    result = run_demo(cluster_kubeconfig, name="gang", namespace=namespace, members=2)

    assert result.webhook_injected, "the admission webhook injected the agent at create"
    assert result.uids_after == result.uids_before, "every member kept its pod (in place)"
    assert result.state["epoch"] == 2
    assert result.state["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}
    assert result.resume_step is not None
    assert result.resume_step > 0, "the gang resumed from a checkpoint, not from scratch"
    # The BarrierOpened Event is posted after the status write that opened the barrier, which
    # the demo may have read before it: count the Events once they are there.
    openings = wait_for(
        "2 BarrierOpened events",
        lambda: n if (n := _barrier_openings(kube, namespace, "gang")) >= 2 else None,
        30,
    )
    assert openings == 2, "epoch 1 at start, epoch 2 once after the failure"
    pods = kube.core.list_namespaced_pod(namespace).items
    assert len(pods) == 2
    kubeconfig = cluster_kubeconfig
    for pod in pods:
        # This container's log (after the in-place restart) says where it resumed, once its
        # trainer has read the resume point (it runs, waiting, before the barrier opens).
        name = pod.metadata.name
        resumed = wait_for(
            f"{name}: trainer logged where it resumed",
            partial(_resumed_at, kubeconfig, namespace, name),
            60,
            1,
        )
        assert resumed == [result.resume_step]
    steps = "; ".join(f"+{t:.2f}s {w.split(':')[0]}" for t, w in result.timeline.entries)
    print(f"\nreal in-place gang recovery: {result.recovery_seconds:.2f}s to barrier; {steps}")
