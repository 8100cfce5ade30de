"""Kueue signals the planner uses: Workload stand-down, Kueue's own pod actions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobset_inplace.core.decode import (
    kueue_recovery_timeout,
    kueue_stand_down,
    pod_view,
    workload_owner,
)
from jobset_inplace.core.model import Event
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Phase

from .gangs import pods, snapshot, with_pod


def workload(conditions: list[dict[str, Any]], active: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "jobset-train-1a2b3",
            "ownerReferences": [
                {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train"}
            ],
        },
        "spec": {"active": active},
        "status": {"conditions": conditions},
    }


def cond(ctype: str, status: str, at: str, reason: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastTransitionTime": at, "reason": reason}


@pytest.mark.parametrize(
    ("wl", "expect"),
    [
        (workload([cond("Admitted", "True", "2026-01-01T00:00:00Z")]), ""),
        (workload([cond("Admitted", "True", "2026-01-01T00:00:00Z")], active=False), "deactivated"),
        (workload([cond("Admitted", "True", "2026-01-01T00:00:00Z"),
                   cond("Evicted", "True", "2026-01-01T00:05:00Z", "Preempted")]), "Preempted"),
        (workload([cond("Evicted", "True", "2026-01-01T00:05:00Z", "PodsReadyTimeout")]),
         "PodsReadyTimeout"),
        # re-admitted after the eviction: the old Evicted condition is history
        (workload([cond("Evicted", "True", "2026-01-01T00:05:00Z", "Preempted"),
                   cond("Admitted", "True", "2026-01-01T00:09:00Z")]), ""),
        (workload([cond("Finished", "True", "2026-01-01T00:05:00Z")]), "finished"),
    ],
)  # fmt: skip
def test_workload_stand_down(wl: dict[str, Any], expect: str) -> None:
    got = kueue_stand_down(wl)
    assert (expect in got) if expect else got == ""
    assert workload_owner(wl) == ("ns", "train")


def test_kueue_eviction_stands_the_gang_down_and_cancels_recovery() -> None:
    pl = with_pod(pods(4, epoch=2), 0, trainer_failed=True)
    s = snapshot(pod_list=pl, kueue_stand_down="Kueue evicted the Workload (Preempted)")
    p = plan(s)
    assert p.status.phase == Phase.STOOD_DOWN
    assert p.status.reason == "Kueue"
    assert "Preempted" in p.status.message
    assert p.status.epoch == 2, "no recovery started against Kueue"
    assert p.status.inplace_used == 0, "preemption does not eat the in-place budget"
    assert [a for a in p.actions if not hasattr(a, "reason")] == []


def test_pod_terminated_by_kueue_is_not_a_failure() -> None:
    raw = {
        "metadata": {
            "name": "p0",
            "uid": "u0",
            "labels": {
                "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "status": {
            "phase": "Failed",
            "conditions": [{"type": "TerminatedByKueue", "status": "True"}],
        },
    }
    view = pod_view(raw)
    assert view is not None
    assert view.by_kueue
    pl = pods(4, epoch=2)
    pl[0] = dataclasses.replace(pl[0], phase="Failed", by_kueue=True)
    p = plan(snapshot(pod_list=pl))
    assert p.status.epoch == 2
    assert p.actions == []


def test_barrier_deadline_is_kept_inside_kueue_recovery_timeout() -> None:
    pl = with_pod(pods(4, epoch=2), 0, trainer_failed=True)
    # 5m barrier, Kueue recoveryTimeout 5m: two deadlines must fit in 80% of it -> 120 s each
    p = plan(snapshot(pod_list=pl, kueue_recovery_timeout_s=300.0))
    rec = p.status.recovery
    assert rec is not None
    assert rec.deadline - rec.started == pytest.approx(120)
    assert p.status.kueue_margin_s == pytest.approx(60)
    assert "KueueRecoveryTimeout" in [a.reason for a in p.actions if isinstance(a, Event)]
    # plenty of room: the configured barrier timeout is kept, no warning
    roomy = plan(snapshot(pod_list=pl, policy=Policy(kueue_recovery_timeout_s=1800.0)))
    assert roomy.status.recovery is not None
    assert roomy.status.recovery.deadline - roomy.status.recovery.started == pytest.approx(300)
    assert roomy.status.kueue_margin_s == pytest.approx(1200)
    assert "KueueRecoveryTimeout" not in [a.reason for a in roomy.actions if isinstance(a, Event)]


def test_kueue_recovery_timeout_from_its_configuration_with_kueues_defaults() -> None:
    v2 = "apiVersion: config.kueue.x-k8s.io/v1beta2\n"
    v1 = "apiVersion: config.kueue.x-k8s.io/v1beta1\n"
    assert kueue_recovery_timeout(f"{v2}waitForPodsReady:\n  recoveryTimeout: 3m\n") == 180
    assert kueue_recovery_timeout("waitForPodsReady:\n  recoveryTimeout: 1h0m0s\n") == 3600
    # v1beta2: always on; recoveryTimeout defaults to timeout, which defaults to 30m
    assert kueue_recovery_timeout(f"{v2}integrations: {{}}\n") == 1800
    assert kueue_recovery_timeout(f"{v2}waitForPodsReady:\n  timeout: 10m\n") == 600
    # v1beta1: only with enable: true (timeout 5m)
    assert kueue_recovery_timeout(f"{v1}integrations: {{}}\n") is None
    assert kueue_recovery_timeout(f"{v1}waitForPodsReady:\n  enable: true\n") == 300
    for unreadable in (
        "a: [",
        "- 1\n",
        "waitForPodsReady: 3\n",
        f"{v2}waitForPodsReady:\n  timeout: x\n",
    ):
        with pytest.raises(ValueError, match=r"YAML|mapping|waitForPodsReady"):
            kueue_recovery_timeout(unreadable)
