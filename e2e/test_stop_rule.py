"""The stop rule on the real kubelet nodes (core/no_progress.py): a demo gang one of whose
steps always crashes (a bad batch: every epoch's trainers resume from the checkpoint before
it and exit at it) fails the same way three times in a row without getting past that step:
the third failure escalates to JobSet's failure policy at once, with most of the in-place
budget left, instead of spending it (10 recoveries by default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.controller import gang_state
from testbed.demo import training_gang
from testbed.demo_trainer import ENV_CRASH_AT_STEP
from testbed.install import Installation
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e

CRASH_AT = 25  # checkpoints every 10 steps: each epoch resumes at 20 and crashes before 25


def _events(kube: Clients, namespace: str, name: str, reason: str) -> list[str]:
    found = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [e.message or "" for e in found.items if e.reason == reason]


def test_a_step_that_always_crashes_escalates_at_its_third_failure(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    training_gang(
        kube, cluster_kubeconfig, namespace, "gang", 2, env={ENV_CRASH_AT_STEP: str(CRASH_AT)}
    )
    said = wait_for(
        "the stop rule's escalation",
        lambda: _events(kube, namespace, "gang", "Escalated") or None,
        240,
        1.0,
    )
    assert len(said) == 1, said
    assert said[0].startswith("NoProgress: epoch 4: the same failure (TrainerExited) 3 times"), said
    assert f"never past step {CRASH_AT - 1}" in said[0], said
    started = _events(kube, namespace, "gang", "RecoveryStarted")
    assert len(started) == 3, "three failures, then the escalation (not ten)"
    # JobSet's failure policy restarts the gang: its budgets and the run start again
    st = wait_for(
        "JobSet's restart seen",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("restartAttempt") else None,
        120,
    )
    assert st["restarts"]["inPlace"] >= 3, st.get("restarts")
