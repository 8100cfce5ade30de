"""Kueue preempts a gang in the middle of a recovery: the controller stands down (does not
recreate or restart anything, charges no budget), the GangState says why; when Kueue admits
the gang again, it starts a fresh epoch and every member resumes from the same step."""

from __future__ import annotations

import re
import subprocess
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed import workloads
from testbed.controller import gang_state, member_pods, prepare
from testbed.demo import checkpointed, demo_jobset, inject_failure, trainers_running
from testbed.install import Installation
from testbed.kube import Clients, create_jobset, wait_for
from testbed.kueue import KUEUE, QUEUE_LABEL, condition, queue, workload_of
from testbed.versions import binaries

pytestmark = pytest.mark.e2e
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def _high_priority_job(name: str, local_queue: str, priority_class: str) -> dict[str, Any]:
    """A batch Job on a kwok node that needs the gang's quota."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {QUEUE_LABEL: local_queue, PRIORITY_LABEL: priority_class},
        },
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": workloads.KWOK_NODE_SELECTOR,
                    "containers": [
                        {
                            "name": "c",
                            "image": "x",
                            "resources": {"requests": {"cpu": "40m", "memory": "64Mi"}},
                        }
                    ],
                }
            },
        },
    }


def _resume_steps(kubeconfig: Any, namespace: str, pods: list[str]) -> list[list[int]]:
    out = []
    for pod in pods:
        log = subprocess.run(
            [
                str(binaries().kubectl),
                "--kubeconfig",
                str(kubeconfig),
                "-n",
                namespace,
                "logs",
                pod,
                "-c",
                "trainer",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        out.append([int(m) for m in re.findall(r"resuming at step (\d+)", log)])
    return out


def gang_trains(kube: Clients, kubeconfig: Path, namespace: str) -> bool:
    """Both trainers run in the gang's current epoch (under Kueue it is not necessarily 1)."""
    epoch = int(gang_state(kube, namespace, "gang")["epoch"])
    return trainers_running(kube, kubeconfig, namespace, "gang", 2, epoch=epoch)


def test_preemption_during_recovery_stands_down_then_resumes(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    prio = f"high-{uuid.uuid4().hex[:6]}"
    kube.custom.create_cluster_custom_object(
        *KUEUE,
        "workloadpriorityclasses",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": prio},
            "value": 10000,
        },
    )
    try:
        # Quota for the gang (2 agents x 10m + trainers without requests) but not for both.
        with queue(
            kube,
            namespace,
            cpu="50m",
            memory="512Mi",
            preemption={"withinClusterQueue": "LowerPriority"},
        ) as q:
            prepare(kube, cluster_kubeconfig, namespace)
            create_jobset(kube, namespace, demo_jobset("gang", 2, {QUEUE_LABEL: q.local_queue}))
            wait_for(
                "barrier of epoch 1",
                lambda: gang_state(kube, namespace, "gang").get("barrierOpen"),
                180,
                0.5,
            )
            wait_for(
                "trainers running",
                partial(gang_trains, kube, cluster_kubeconfig, namespace),
                120,
                0.5,
            )
            # A crash before every member has a checkpoint escalates (no common step): this
            # test is about preemption during an in-place recovery.
            wait_for(
                "a checkpoint on every member",
                partial(checkpointed, kube, cluster_kubeconfig, namespace, "gang", 2),
                60,
                0.5,
            )
            # Under Kueue the gang starts suspended (StoodDown) and begins a fresh epoch on
            # admission, so the epoch it trains in is not necessarily 1.
            trained = int(gang_state(kube, namespace, "gang")["epoch"])
            victim = sorted(member_pods(kube, namespace, "gang").items())[-1][1].metadata.name
            inject_failure(cluster_kubeconfig, namespace, victim)
            wait_for(
                "recovery started",
                lambda: (
                    (s := gang_state(kube, namespace, "gang")).get("epoch") == trained + 1
                    and s["budgets"]["inPlaceUsed"] == 1
                ),
                60,
                0.2,
            )

            # A higher-priority workload takes the quota while the gang recovers.
            batch = client.BatchV1Api(kube.api)
            batch.create_namespaced_job(
                namespace, _high_priority_job("urgent", q.local_queue, prio)
            )

            st = wait_for(
                "GangState StoodDown",
                lambda: (
                    s
                    if (s := gang_state(kube, namespace, "gang")).get("phase") == "StoodDown"
                    else None
                ),
                120,
                0.5,
            )
            assert st["reason"] == "Kueue" or "suspended" in st["message"], st
            assert st["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}, "nothing charged"
            wl = workload_of(kube, namespace, "gang")
            assert wl is not None
            evicted = condition(wl, "Evicted")
            assert evicted is not None
            assert evicted["status"] == "True"
            assert evicted["reason"] == "Preempted"

            def our_events() -> list[str]:
                events = kube.core.list_namespaced_event(
                    namespace, field_selector="involvedObject.name=gang"
                ).items
                return [e.reason for e in events if e.source.component == "jobset-inplace"]

            # Events come last in the controller's pass, after the status write seen above.
            ours = wait_for(
                "StoodDown event", lambda: r if "StoodDown" in (r := our_events()) else None, 30
            )
            assert "RecoveryExtended" not in ours
            assert "Escalated" not in ours

            # The urgent work is done: Kueue admits the gang again.
            batch.delete_namespaced_job("urgent", namespace, propagation_policy="Background")
            st = wait_for(
                "gang running again after re-admission",
                lambda: (
                    s
                    if (s := gang_state(kube, namespace, "gang")).get("phase") == "Running"
                    and s["epoch"] >= trained + 2
                    else None
                ),
                240,
                1,
            )
            wait_for(
                "trainers running again",
                partial(gang_trains, kube, cluster_kubeconfig, namespace),
                120,
                0.5,
            )
            pods = [p.metadata.name for p in member_pods(kube, namespace, "gang").values()]
            # A trainer container runs (waiting for its agent) before the barrier opens, and
            # logs where it resumes once it reads the resume point: wait for every log line.
            steps = wait_for(
                "every trainer logged where it resumed",
                lambda: (
                    got if all(got := _resume_steps(cluster_kubeconfig, namespace, pods)) else None
                ),
                60,
                1,
            )
            expected = st["resumeStep"] or 0
            assert steps == [[expected]] * len(pods), steps
            print(
                f"\npreempted mid-recovery -> StoodDown ({st['message'] or 'Kueue'}); "
                f"re-admitted -> epoch {st['epoch']}, every member resumed at step {expected}"
            )
    finally:
        try:
            kube.custom.delete_cluster_custom_object(*KUEUE, "workloadpriorityclasses", prio)
        except ApiException as e:
            if e.status != 404:
                raise
