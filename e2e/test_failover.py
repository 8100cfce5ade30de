"""HA: two controller replicas with leader election on the local cluster. The leader is killed
(SIGKILL, as a deleted or crashed pod) in the middle of a recovery; the standby takes the Lease
once it expires and completes that recovery exactly once: one new epoch, one barrier opening,
one charge of the in-place budget, every member in place."""

from __future__ import annotations

import time

import pytest

from jobset_inplace import names
from jobset_inplace.controller.leader import DEFAULT_LEASE
from testbed.cluster import LocalCluster
from testbed.controller import ControllerProcess, gang_state, member_pods
from testbed.demo import inject_failure, trainers_running, training_gang
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 2
STANDBY = "e2e-standby"


def _leader(kube: Clients) -> str:
    lease = kube.coordination.read_namespaced_lease(DEFAULT_LEASE, names.INSTALL_NAMESPACE)
    return str(lease.spec.holder_identity or "")


def _barrier_openings(kube: Clients, namespace: str, name: str) -> list[str]:
    events = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return [e.message for e in events if e.reason == "BarrierOpened"]


def test_leader_killed_mid_recovery_the_standby_completes_it_exactly_once(
    local_cluster: LocalCluster | None, controller: ControllerProcess, kube: Clients, namespace: str
) -> None:
    assert local_cluster is not None
    training_gang(kube, local_cluster, namespace, "gang", MEMBERS)
    before = {i: p.metadata.uid for i, p in member_pods(kube, namespace, "gang").items()}

    log = local_cluster.logs_dir / "controller-standby.log"
    log.unlink(missing_ok=True)
    standby = ControllerProcess(local_cluster, log, leader_identity=STANDBY, install_webhook=False)
    try:
        wait_for(
            "the standby waiting for the Lease",
            lambda: "leader: waiting" in log.read_text(errors="replace"),
            30,
        )
        victim = member_pods(kube, namespace, "gang")["1"]
        inject_failure(local_cluster.kubeconfig, namespace, victim.metadata.name)
        st = wait_for(
            "the leader opens epoch 2",
            lambda: s if (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 else None,
            60,
            0.05,
        )
        controller.kill()  # mid-recovery: the barrier of epoch 2 is not open yet
        killed = time.monotonic()
        assert not st["barrierOpen"], "the recovery must still be running when the leader dies"

        wait_for("the standby takes the Lease", lambda: _leader(kube) == STANDBY, 60, 0.2)
        took_over = time.monotonic() - killed
        st = wait_for(
            "barrier of epoch 2, opened by the standby",
            lambda: s if (s := gang_state(kube, namespace, "gang")).get("barrierOpen") else None,
            120,
        )
        opened = time.monotonic() - killed
        print(
            f"\nleader killed mid-recovery: standby leads after {took_over:.1f}s, barrier of"
            f" epoch 2 open {opened:.1f}s after the kill (lease duration 15s)"
        )
        assert st["epoch"] == 2, "one new epoch, not two"
        assert st["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}, "charged once"
        assert st["recovery"]["causes"] == {"workers/1/0": "TrainerExited"}
        assert [h["epoch"] for h in st["history"]] == [2], "one recovery record"
        wait_for(
            "BarrierOpened events of epochs 1 and 2",
            lambda: len(_barrier_openings(kube, namespace, "gang")) >= 2,
            30,
        )
        wait_for(
            "every trainer running again",
            lambda: trainers_running(kube, namespace, "gang", MEMBERS, 1),
            120,
        )
        # Once training runs again, still that one recovery: no epoch 3, no second opening.
        final = gang_state(kube, namespace, "gang")
        assert (final["epoch"], final["budgets"]["inPlaceUsed"]) == (2, 1), final
        openings = _barrier_openings(kube, namespace, "gang")
        assert len(openings) == 2, openings
        after = {i: p.metadata.uid for i, p in member_pods(kube, namespace, "gang").items()}
        assert after == before, "every member kept its pod (in place)"
    finally:
        standby.stop()  # releases the Lease
        controller.start()  # the session's controller leads again for the tests after this
