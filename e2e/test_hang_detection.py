"""Hang detection end to end on the real kubelet nodes: a trainer that stops advancing (every
process alive, SIGTERM ignored: what a collective stuck on a failed peer looks like) and one
that never makes its first step are found by their agents and the gang recovers in place from
one step. The detection latencies are printed (docs/trainer-contract.md quotes them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from e2e.marks import POD_SCOPE
from jobset_inplace import names
from jobset_inplace.core import policy
from jobset_inplace.times import parse_time
from testbed.controller import barrier_open, member_pods, prepare, recovery_times
from testbed.demo import (
    demo_jobset,
    inject_hang,
    timed_log,
    trainer_log,
    trainers_running,
    training_gang,
)
from testbed.demo_trainer import ENV_STARTUP_HANG_EPOCHS
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 2
# A hang-timeout well under the old 10 s floor (the demo trainer steps every 0.2 s: 4 s is
# twenty steps), and the shortest startup-timeout accepted.
TIMEOUT_S = 4
STARTUP_TIMEOUT_S = policy.STARTUP_TIMEOUT_RANGE_S[0]
HANG = {names.HANG_TIMEOUT: f"{TIMEOUT_S}s"}


def _resumed(kubeconfig: Path, namespace: str, pod: str) -> list[int]:
    return [
        int(m)
        for m in re.findall(r"resuming at step (\d+)", trainer_log(kubeconfig, namespace, pod))
    ]


@pytest.mark.parametrize("scope", ["process", POD_SCOPE])
def test_a_hung_trainer_is_found_and_the_gang_restarts_in_place(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str, scope: str
) -> None:
    training_gang(
        kube, cluster_kubeconfig, namespace, "gang", MEMBERS, scope=scope, annotations=HANG
    )
    before = {i: p.metadata.uid for i, p in member_pods(kube, namespace, "gang").items()}
    victim = member_pods(kube, namespace, "gang")["1"].metadata.name
    inject_hang(cluster_kubeconfig, namespace, victim)

    st = barrier_open(kube, namespace, "gang", 2, TIMEOUT_S + 90)
    rec = st["recovery"]
    assert isinstance(rec, dict)
    assert rec["causes"] == {"workers/1/0": "TrainerHung"}
    assert st["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}
    resume = st["resumeStep"]
    assert isinstance(resume, int)
    assert resume > 0, "from the common checkpoint"
    wait_for(
        "every trainer running again",
        lambda: trainers_running(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, epoch=2),
        120,
    )
    after = member_pods(kube, namespace, "gang")
    assert {i: p.metadata.uid for i, p in after.items()} == before, "in place: same pods"
    for p in after.values():
        assert _resumed(cluster_kubeconfig, namespace, p.metadata.name)[-1] == resume
        assert names.REPORT_HUNG not in (p.metadata.annotations or {}), "cleared by the report"
    if scope == "pod":
        return  # the hung container's log went with its restart: the latency is measured below
    # Detection latency: the trainer's hang (its own log line, the runtime's timestamp) -> the
    # controller's recovery start. The rule's share of it is the hang-timeout.
    log = timed_log(cluster_kubeconfig, namespace, victim, "trainer")
    hung_at = next(t for t, line in log if "hanging at step" in line)
    started = parse_time(str(rec["startedAt"]))
    assert started is not None
    latency = started - hung_at
    assert latency >= TIMEOUT_S - 1, "not before the hang-timeout (less the last step's age)"
    print(
        f"\nhang ({scope} scope): hang -> recovery started {latency:.2f}s "
        f"(hang-timeout {TIMEOUT_S}s); recovery {rec['durationSeconds']}s"
    )


def test_a_trainer_that_never_makes_a_first_step_is_recovered(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    """Epoch 1: every trainer hangs before its first step (a rendezvous that never forms);
    startup-timeout finds them, epoch 2 trains."""
    prepare(kube, cluster_kubeconfig, namespace)
    js = demo_jobset(
        "gang",
        MEMBERS,
        annotations={names.STARTUP_TIMEOUT: f"{STARTUP_TIMEOUT_S:g}s"},
        env={ENV_STARTUP_HANG_EPOCHS: "1"},
    )
    create_jobset(kube, namespace, js)
    first = barrier_open(kube, namespace, "gang", 1, 180)
    _, opened = recovery_times(first["recovery"])
    st = barrier_open(kube, namespace, "gang", 2, STARTUP_TIMEOUT_S + 90)
    rec = st["recovery"]
    assert set(rec["causes"].values()) == {"TrainerHung"}
    started, _ = recovery_times(rec)
    assert started - opened >= STARTUP_TIMEOUT_S, "not before the startup-timeout"
    wait_for(
        "every trainer running in epoch 2",
        lambda: trainers_running(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, epoch=2),
        120,
    )
    for p in member_pods(kube, namespace, "gang").values():
        log = trainer_log(cluster_kubeconfig, namespace, p.metadata.name)
        assert "epoch 2: resuming at step 0" in log
    print(
        f"\nstartup hang: barrier open -> recovery started {started - opened:.2f}s "
        f"(startup-timeout {STARTUP_TIMEOUT_S:g}s)"
    )
