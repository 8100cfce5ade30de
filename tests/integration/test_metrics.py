"""The controller's metrics over a real recovery against the real apiserver: the reconciler,
executor and raw watches of ``jobset-inplace run`` in this process (without kopf: the gang's
JobSet comes from the cache's prime), kubelets and agents simulated by :mod:`testbed.gangsim`. The
metrics are read as Prometheus would, from the exposition of their own registry."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client, config
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from jobset_inplace import names
from jobset_inplace.controller.cache import ClusterCache
from jobset_inplace.controller.executor import Executor
from jobset_inplace.controller.metrics import Metrics
from jobset_inplace.controller.operator import plan_all, prime, raw_watches
from jobset_inplace.controller.reconciler import Reconciler
from jobset_inplace.runtime.watches import event_time
from testbed.controlplane import ControlPlane
from testbed.gangsim import CRD, Gang, LeaseKeeper
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.integration

FAST = {names.NODE_UNHEALTHY_AFTER: "5s", names.BARRIER_TIMEOUT: "60s"}


@pytest.fixture(scope="module")
def leases(kube: Clients, control_plane: ControlPlane) -> Iterator[LeaseKeeper]:
    control_plane.kubectl().apply_files([CRD], server_side=True)
    control_plane.kubectl().wait_crds_established([f"{names.GANGSTATE_PLURAL}.{names.GROUP}"])
    keeper = LeaseKeeper(kube)
    keeper.start()
    yield keeper
    keeper.stop()


@contextmanager
def default_kube_config(kubeconfig: Path) -> Iterator[None]:
    """``kubeconfig`` as the client's process-wide default Configuration (what the watches'
    clients use), restored afterwards: the tests that follow, of any tier when ``make test``
    runs them in one process, must not reach this control plane by accident."""
    saved = client.Configuration.get_default_copy()
    config.load_kube_config(config_file=str(kubeconfig))
    try:
        yield
    finally:
        client.Configuration.set_default(saved)


@contextmanager
def controller_for(gang: Gang, kube: Clients, kubeconfig: Path) -> Iterator[Metrics]:
    """The controller of ``jobset-inplace run`` for ``gang`` only (other tests' JobSets stay in
    their terminating namespaces: forgotten), recording into a registry of its own."""
    with default_kube_config(kubeconfig), _controller_for(gang, kube) as m:
        yield m


@contextmanager
def _controller_for(gang: Gang, kube: Clients) -> Iterator[Metrics]:
    m = Metrics(CollectorRegistry())
    r = Reconciler(ClusterCache(), Executor(kube.api), metrics=m)
    m.bind(r.cache)
    watches = raw_watches(r)
    for w in watches:
        w.timeout_s = 10  # each watch thread ends within that once halted
        w.metrics = m
    prime(r, watches)
    for key in list(r.cache.gangs):
        if key != (gang.namespace, gang.name):
            r.cache.forget_jobset(key)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="controller", daemon=True)
    thread.start()

    async def begin() -> None:
        for w in watches:
            w.start_on(loop)
        plan_all(r)

    asyncio.run_coroutine_threadsafe(begin(), loop).result(10)
    try:
        yield m
    finally:
        for w in watches:
            w.halt.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def sample(m: Metrics, name: str, **labels: str) -> float:
    """A sample's value in the exposition (0 when absent)."""
    body, _ = m.exposition()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def test_a_trainer_crash_and_its_recovery_move_the_metrics(
    kube: Clients, namespace: str, kubeconfig: Path, leases: LeaseKeeper
) -> None:
    gang = Gang(kube, namespace, f"metrics-{uuid.uuid4().hex[:4]}", 4, dict(FAST), leases=leases)
    gang.create()
    with controller_for(gang, kube, kubeconfig) as m:
        gang.wait_state("created with epoch 1", lambda s: s.get("epoch") == 1)
        gang.report_all(1)
        gang.wait_state("barrier open at epoch 1", lambda s: s.get("barrierOpen") is True)
        running = {"phase": "Running"}
        wait_for("gang counted Running", lambda: sample(m, "jobset_inplace_gangs", **running), 10)
        assert sample(m, "jobset_inplace_recoveries_started_total", cause="TrainerExited") == 0

        gang.fail_trainer(2)
        st = gang.wait_state("epoch 2", lambda s: s["epoch"] == 2)
        # what the metrics of a later pass (or another replica) need is kept by the CRD schema
        rec = st["recovery"]
        assert (rec["openedBy"], rec["firstSignal"]) == ("MemberFailed", "TrainerExited")
        assert rec["firstSignalAt"] is not None
        for i in gang.pods:  # member 2 kept only older checkpoints than the others
            gang.restart_in_place(i)
            gang.report(i, 2, steps="200,100" if i == 2 else "300,200,100")
        gang.wait_state("barrier open at epoch 2", lambda s: s["barrierOpen"] and s["epoch"] == 2)

        ended = {"cause": "TrainerExited", "outcome": "BarrierOpened"}
        wait_for(
            "recovery counted", lambda: sample(m, "jobset_inplace_recoveries_total", **ended), 10
        )
        assert sample(m, "jobset_inplace_recoveries_started_total", cause="TrainerExited") == 1
        assert sample(m, "jobset_inplace_members_restarted_total", mode="in_place") == 4
        assert sample(m, "jobset_inplace_members_restarted_total", mode="recreated") == 0
        assert sample(m, "jobset_inplace_recovery_detection_seconds_count") == 1
        assert sample(m, "jobset_inplace_recovery_duration_seconds_count") == 1
        assert 0 < sample(m, "jobset_inplace_recovery_duration_seconds_sum") < 30
        # simulated pods have no agent container: its start, hence those phases, are unknown
        assert sample(m, "jobset_inplace_recovery_restart_seconds_count") == 0
        assert sample(m, "jobset_inplace_recovery_steps_lost_sum") == 100
        assert sample(m, "jobset_inplace_gangs", phase="Running") == 1
        budget = "jobset_inplace_gang_restart_budget_remaining"
        where = {"namespace": gang.namespace, "jobset": gang.name}
        assert sample(m, budget, **where, budget="in_place") == 9
        assert sample(m, budget, **where, budget="recreate") == 5
        assert sample(m, "jobset_inplace_passes_total") >= 4
        assert sample(m, "jobset_inplace_planning_cpu_seconds_count") >= 4
        # a pod change is timed when it moves the pod's newest managedFields time (whole
        # seconds): how many of the changes above did depends on where the second boundaries
        # fell, so make one that must: a write in a later second than the pod's newest stamp.
        lag = "jobset_inplace_event_lag_seconds_count"
        timed = sample(m, lag, watch="pods")
        newest = event_time(kube.api.sanitize_for_serialization(gang.pod(0)))
        assert newest is not None
        wait_for("a second after the pod's newest stamp", lambda: time.time() >= newest + 1, 5)
        kube.core.patch_namespaced_pod(
            gang.pods[0], gang.namespace, {"metadata": {"labels": {"lag-probe": "1"}}}
        )
        wait_for("the pod change timed", lambda: sample(m, lag, watch="pods") > timed, 10)
        wait_for(
            "a Lease renewal handled",
            lambda: sample(m, "jobset_inplace_event_lag_seconds_count", watch="node_leases"),
            10,
        )
