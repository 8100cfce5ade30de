"""Hybrid recovery under Kueue (real Kueue, waitForPodsReady on by default in v0.19): an
in-place recovery of an admitted gang keeps its admission; the Workload's PodsReady returns
True with reason Recovered; no pod is recreated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.marks import POD_SCOPE
from testbed.demo import run_demo
from testbed.install import Installation
from testbed.kube import Clients, wait_for
from testbed.kueue import QUEUE_LABEL, condition, queue, workload_of

pytestmark = pytest.mark.e2e


# restart scope -> Kueue's PodsReady reason after the recovery: the pod scope's pods go not
# Ready and come back (Kueue's recovery); the process scope's never stop being Ready.
PODS_READY_REASON = {"pod": "Recovered", "process": "Started"}


@pytest.mark.parametrize("scope", ["process", POD_SCOPE])
def test_admitted_gang_keeps_admission_through_in_place_recovery(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str, scope: str
) -> None:
    with queue(kube, namespace) as q:
        result = run_demo(
            cluster_kubeconfig,
            name="queued",
            namespace=namespace,
            members=2,
            labels={QUEUE_LABEL: q.local_queue},
            scope=scope,
        )
        assert result.webhook_injected
        assert result.uids_after == result.uids_before, "no pod recreated"
        assert result.state["budgets"]["recreateUsed"] == 0

        def recovered() -> dict[str, Any] | None:
            wl = workload_of(kube, namespace, "queued")
            ready = wl and condition(wl, "PodsReady")
            return wl if ready and ready["status"] == "True" else None

        wl = wait_for("Workload PodsReady back to True", recovered, 120, 1)
        admitted = condition(wl, "Admitted")
        assert admitted is not None
        assert admitted["status"] == "True", "the Workload stayed admitted"
        evicted = condition(wl, "Evicted")
        assert evicted is None or evicted["status"] == "False", evicted
        ready = condition(wl, "PodsReady")
        assert ready is not None
        print(f"\nWorkload PodsReady after the in-place recovery: {ready['reason']}")
        assert ready["reason"] == PODS_READY_REASON[scope]
