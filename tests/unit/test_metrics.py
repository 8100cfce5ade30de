"""The Prometheus adapter: observations, passes, watches and leadership recorded into a fresh
registry, read back from the exposition text as Prometheus would parse it."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import prometheus_client
import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from jobset_inplace.controller import metrics
from jobset_inplace.controller.cache import ClusterCache
from jobset_inplace.controller.metrics import Metrics
from jobset_inplace.core.goodput import Bucket, Ledger
from jobset_inplace.core.model import GangStatus, Mark
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Edge, EscalationReason, Phase, StandDownReason
from jobset_inplace.core.telemetry import (
    Escalated,
    FailureDetected,
    MembersRestarted,
    RecoveryEnded,
    RecoveryStarted,
    RecoveryTimed,
    StepsLost,
    StoodDown,
)
from jobset_inplace.runtime import leader_election
from jobset_inplace.runtime.leader_election import Election, LeaderElector
from jobset_inplace.runtime.manager import Manager, Settings
from jobset_inplace.runtime.report_limits import REFUSALS
from jobset_inplace.times import format_time

from .test_reconciler_timing import KEY, RecordingExecutor, gang, jobset
from .test_watches import Response, Scripted, run_to_the_end

Labels = frozenset[tuple[str, str]]


def scrape(m: Metrics) -> dict[tuple[str, Labels], float]:
    """Every sample of the exposition, by (name, labels)."""
    body, ctype = m.exposition()
    assert ctype.startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(m: Metrics, sample: str, **labels: str) -> float | None:
    return scrape(m).get((sample, frozenset(labels.items())))


@pytest.fixture
def m() -> Metrics:
    return Metrics(CollectorRegistry())


# --- observations --------------------------------------------------------------------------------
def test_a_recovery_moves_its_counters_and_histograms(m: Metrics) -> None:
    m.record(
        [
            RecoveryStarted("TrainerExited"),
            FailureDetected(2.5),
            MembersRestarted(in_place=4, recreated=1),
            RecoveryEnded("TrainerExited", Edge.BARRIER_OPENED),
            StepsLost(100),
            RecoveryTimed(restart=None, barrier=None, total=12.5),
        ]
    )
    assert value(m, "jobset_inplace_recoveries_started_total", cause="TrainerExited") == 1
    assert (
        value(m, "jobset_inplace_recoveries_total", cause="TrainerExited", outcome="BarrierOpened")
        == 1
    )
    detection = "jobset_inplace_recovery_detection_seconds"
    assert value(m, f"{detection}_count") == 1
    assert value(m, f"{detection}_sum") == 2.5
    assert value(m, f"{detection}_bucket", le="2.0") == 0
    assert value(m, f"{detection}_bucket", le="3.0") == 1
    assert value(m, "jobset_inplace_members_restarted_total", mode="in_place") == 4
    assert value(m, "jobset_inplace_members_restarted_total", mode="recreated") == 1
    assert value(m, "jobset_inplace_recovery_duration_seconds_sum") == 12.5
    assert value(m, "jobset_inplace_recovery_restart_seconds_count") == 0, "unknown: not observed"
    assert value(m, "jobset_inplace_recovery_barrier_seconds_count") == 0
    assert value(m, "jobset_inplace_recovery_steps_lost_bucket", le="50.0") == 0
    assert value(m, "jobset_inplace_recovery_steps_lost_bucket", le="100.0") == 1


def test_escalations_and_stand_downs_are_counted_by_reason(m: Metrics) -> None:
    m.record([Escalated("BarrierTimeout"), Escalated("BarrierTimeout"), StoodDown("Kueue")])
    m.record([RecoveryTimed(restart=8.0, barrier=2.0, total=None)])
    assert value(m, "jobset_inplace_escalations_total", reason="BarrierTimeout") == 2
    assert value(m, "jobset_inplace_stand_downs_total", reason="Kueue") == 1
    assert value(m, "jobset_inplace_recovery_restart_seconds_sum") == 8.0
    assert value(m, "jobset_inplace_recovery_barrier_seconds_sum") == 2.0
    assert value(m, "jobset_inplace_recovery_duration_seconds_count") == 0


def test_known_label_values_and_internals_exist_before_anything_happened(m: Metrics) -> None:
    samples = scrape(m)
    for mode in ("in_place", "recreated"):
        assert samples[("jobset_inplace_members_restarted_total", frozenset({("mode", mode)}))] == 0
    for sample in ("passes_total", "pass_failures_total", "leader"):
        assert samples[(f"jobset_inplace_{sample}", frozenset())] == 0


# --- per gang, at scrape time --------------------------------------------------------------------
def test_gangs_by_phase_and_budgets_left_are_read_from_the_cache_when_scraped(m: Metrics) -> None:
    cache = ClusterCache()
    m.bind(cache)
    g = cache.upsert_jobset(jobset(), Policy(inplace_budget=3, recreate_budget=2), "")
    other = ("ns", "other")
    cache.upsert_jobset(
        jobset() | {"metadata": {**jobset()["metadata"], "name": other[1]}}, None, ""
    )
    assert value(m, "jobset_inplace_gangs", phase="Running") == 0, "status not loaded: not counted"
    g.status = GangStatus(phase=Phase.RUNNING, inplace_used=1, recreate_used=2)
    budget = "jobset_inplace_gang_restart_budget_remaining"
    assert value(m, "jobset_inplace_gangs", phase="Running") == 1
    assert value(m, "jobset_inplace_gangs", phase="Escalated") == 0
    assert value(m, budget, namespace="ns", jobset="gang", budget="in_place") == 2
    assert value(m, budget, namespace="ns", jobset="gang", budget="recreate") == 0
    assert not any(dict(labels).get("jobset") == "other" for _, labels in scrape(m))
    slow = "jobset_inplace_gang_stragglers"
    assert value(m, slow, namespace="ns", jobset="gang") is None, "straggler detection off"
    g.policy = Policy(straggler_factor=2.0)
    g.status = GangStatus(phase=Phase.RUNNING, stragglers={"workers/1/0": 2.5})
    assert value(m, slow, namespace="ns", jobset="gang") == 1
    cache.forget_jobset(KEY)
    assert not any(sample == budget for sample, _ in scrape(m)), "no series of a deleted gang"
    assert value(m, "jobset_inplace_gangs", phase="Running") == 0


def test_a_gangs_goodput_is_read_live_from_its_ledger(m: Metrics) -> None:
    cache = ClusterCache()
    m.bind(cache)
    g = cache.upsert_jobset(jobset(), Policy(), "")
    g.status = GangStatus(phase=Phase.RUNNING)
    ratio = "jobset_inplace_gang_goodput_ratio"
    assert value(m, ratio, namespace="ns", jobset="gang") is None, "not started: no series"
    now = time.time()
    # 100 s productive and 20 s of badput closed, an epoch running for ~80 s
    g.status = GangStatus(
        phase=Phase.RUNNING,
        goodput=Ledger(
            since=now - 200,
            productive=100.0,
            badput={Bucket.RECOVERY: 15.0, Bucket.WASTED_PROGRESS: 5.0},
            training_epoch=2,
            training_since=now - 80,
        ),
    )
    one = scrape(m)  # both from one scrape (one clock reading)
    gang_ = frozenset({("namespace", "ns"), ("jobset", "gang")})
    productive = one[("jobset_inplace_gang_productive_seconds", gang_)]
    assert 180 <= productive < 185, "the running epoch counted since its barrier opened"
    assert one[(ratio, gang_)] == pytest.approx(productive / (productive + 20))
    badput = "jobset_inplace_gang_badput_seconds"
    assert value(m, badput, namespace="ns", jobset="gang", bucket="recovery") == 15
    assert value(m, badput, namespace="ns", jobset="gang", bucket="restore") == 0, "every bucket"
    recent = "jobset_inplace_gang_recent_goodput_ratio"
    assert value(m, recent, namespace="ns", jobset="gang") is None, "no marks yet: no series"
    # marked at its start (nothing), at its first barrier (5 s scheduling) and at the running
    # epoch's barrier (100 of 120 s): younger than the window, all of its 200 s, 180 productive
    g.status = GangStatus(
        phase=Phase.RUNNING,
        goodput=dataclasses.replace(
            g.status.goodput,
            marks=(Mark(now - 200, 0, 0), Mark(now - 195, 0, 5), Mark(now - 80, 100, 120)),
        ),
    )
    assert value(m, recent, namespace="ns", jobset="gang") == pytest.approx(180 / 200, abs=0.01)


def test_binding_again_reads_the_new_cache_only(m: Metrics) -> None:
    first, second = ClusterCache(), ClusterCache()
    for cache in (first, second):
        m.bind(cache)
    g = first.upsert_jobset(jobset(), Policy(), "")
    g.status = GangStatus(phase=Phase.RUNNING)
    assert value(m, "jobset_inplace_gangs", phase="Running") == 0


def test_every_label_value_known_in_advance_starts_at_0(m: Metrics) -> None:
    # Prometheus sees no increase() in a series born at 1: without these the first escalation
    # (recovery, refusal) of a kind would reach no alert and no per-hour panel.
    for reason in EscalationReason:
        assert value(m, "jobset_inplace_escalations_total", reason=reason.value) == 0
    for stand_down in StandDownReason:
        assert value(m, "jobset_inplace_stand_downs_total", reason=stand_down.value) == 0
    for refusal in REFUSALS:
        assert (
            value(m, "jobset_inplace_report_channel_connections_refused_total", reason=refusal) == 0
        )
    for cause in ("PodFailed", "ManualRestart", "Resumed", "Unknown"):
        assert value(m, "jobset_inplace_recoveries_started_total", cause=cause) == 0
        for outcome in ("BarrierOpened", "Escalated", "StoodDown", "JobSetRestarted"):
            labels = {"cause": cause, "outcome": outcome}
            assert value(m, "jobset_inplace_recoveries_total", **labels) == 0
    assert value(m, "jobset_inplace_watch_restarts_total", watch="pods", reason="error") is None
    m.watch_started("pods")
    for why in ("error", "expired"):
        assert value(m, "jobset_inplace_watch_restarts_total", watch="pods", reason=why) == 0


def test_the_process_registry_is_private_and_served_as_text() -> None:
    body, ctype = metrics.exposition()
    assert b"jobset_inplace_leader" in body
    assert ctype == prometheus_client.CONTENT_TYPE_LATEST
    assert b"jobset_inplace_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)


# --- the reconciler's passes ---------------------------------------------------------------------
async def test_a_pass_that_starts_a_recovery_records_it_after_the_status_write(m: Metrics) -> None:
    ex = RecordingExecutor(GangStatus(phase=Phase.RUNNING, epoch=2, barrier_open=True))
    r, clock, _ = gang(ex, trainer_failed=True)
    r.metrics = m
    clock.cpu_step = 0.004
    await r.reconcile(KEY)
    assert ex.calls == ["load", "write epoch 3 Recovering", "act"]
    assert value(m, "jobset_inplace_recoveries_started_total", cause="TrainerExited") == 1
    assert value(m, "jobset_inplace_members_restarted_total", mode="in_place") == 2
    assert value(m, "jobset_inplace_passes_total") == 1
    assert value(m, "jobset_inplace_pass_failures_total") == 0
    assert value(m, "jobset_inplace_planning_cpu_seconds_count") == 1
    assert value(m, "jobset_inplace_planning_cpu_seconds_sum") == pytest.approx(0.004)


class FailingWrite(RecordingExecutor):
    def write_status(self, namespace: str, name: str, status: GangStatus) -> None:
        raise RuntimeError("the apiserver went away")


async def test_a_pass_whose_status_write_fails_records_no_recovery(m: Metrics) -> None:
    ex = FailingWrite(GangStatus(phase=Phase.RUNNING, epoch=2, barrier_open=True))
    r, _, _ = gang(ex, trainer_failed=True)
    r.metrics = m
    await r.reconcile(KEY)  # retried later: the retry plans the same recovery again
    assert value(m, "jobset_inplace_pass_failures_total") == 1
    assert value(m, "jobset_inplace_passes_total") == 1
    assert value(m, "jobset_inplace_recoveries_started_total", cause="TrainerExited") == 0


# --- watches ------------------------------------------------------------------------------------
class Broken(Response):
    """A watch whose connection breaks."""

    def __iter__(self) -> Iterator[bytes]:
        raise ConnectionError("connection reset")


def test_watch_events_have_a_lag_and_restarts_are_counted_by_reason(m: Metrics) -> None:
    changed = format_time(time.time() - 3)
    fields = [{"manager": "kubelet", "time": changed}]
    stamped = {"metadata": {"name": "a", "resourceVersion": "11", "managedFields": fields}}
    call = Scripted(
        lists=[Response({"metadata": {"resourceVersion": "10"}, "items": []})] * 2,
        watches=[
            Response(lines=[{"type": "MODIFIED", "object": stamped}]),
            Response(lines=[{"type": "DELETED", "object": stamped}]),  # not stamped: no lag
            Broken(),
            Response(lines=[{"type": "ERROR", "object": {"message": "too old", "code": 410}}]),
        ],
    )
    _, events = run_to_the_end(call, "node Leases", metrics=m)
    assert events == [("MODIFIED", "a"), ("DELETED", "a")]
    lag = "jobset_inplace_event_lag_seconds"
    assert value(m, f"{lag}_count", watch="node_leases") == 1
    assert 3 <= (value(m, f"{lag}_sum", watch="node_leases") or 0) < 13
    restarts = "jobset_inplace_watch_restarts_total"
    assert value(m, restarts, watch="node_leases", reason="error") == 1
    assert value(m, restarts, watch="node_leases", reason="expired") == 1


def test_a_change_that_moved_no_stamp_has_no_lag(m: Metrics) -> None:
    # A Job whose status lost a field (status.active 1 -> gone) keeps its managedFields times:
    # its lag would be the time since its last stamped change (270 s seen in a soak).
    def job(rv: str, changed: float) -> dict[str, Any]:
        fields = [{"manager": "kube-controller-manager", "time": format_time(changed)}]
        return {"metadata": {"uid": "u1", "name": "j", "resourceVersion": rv,
                             "managedFields": fields}}  # fmt: skip

    old, new = time.time() - 300, time.time() - 2
    call = Scripted(
        lists=[Response({"metadata": {"resourceVersion": "10"}, "items": [job("9", old)]})],
        watches=[
            Response(
                lines=[
                    {"type": "MODIFIED", "object": job("11", old)},  # a field removed
                    {"type": "MODIFIED", "object": job("12", new)},  # a field set
                    {"type": "MODIFIED", "object": job("13", new)},
                ]
            )
        ],
    )
    _, events = run_to_the_end(call, "Jobs", metrics=m)
    assert len(events) == 3, "every event handed over"
    lag = "jobset_inplace_event_lag_seconds"
    assert value(m, f"{lag}_count", watch="jobs") == 1, "only the change that moved a stamp"
    assert 2 <= (value(m, f"{lag}_sum", watch="jobs") or 0) < 12


def test_a_negative_lag_from_clock_skew_counts_as_none(m: Metrics) -> None:
    m.event_handled("pods", -0.4)
    assert value(m, "jobset_inplace_event_lag_seconds_sum", watch="pods") == 0


# --- leadership ---------------------------------------------------------------------------------
class LeaseApi:
    """A Lease store answering as the apiserver does (404 until created)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> SimpleNamespace:
        if self.lease is None:
            raise ApiException(status=404)
        return SimpleNamespace(data=json.dumps(self.lease).encode())

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.lease = body | {"metadata": body["metadata"] | {"resourceVersion": "1"}}

    def replace_namespaced_lease(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> None:
        self.create_namespaced_lease(ns, body)


def test_a_leader_is_fresh_only_until_its_renewal_is_renew_deadline_old() -> None:
    """What the report channel asks before each answer (:meth:`Manager.leads`): the
    watchdog's rule at that moment; no election: always."""
    election = Election("jobset-inplace-system")
    elector = LeaderElector(LeaseApi(), election)
    assert not elector.fresh(), "not acquired"
    elector.acquire()
    assert elector.fresh()
    assert elector.renewed_at is not None
    elector.renewed_at -= election.timing.renew_deadline_s
    assert not elector.fresh()
    assert Manager(Settings()).leads()


def test_a_slow_read_dates_a_renewal_before_it_and_anothers_record_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two sides of the fence between leaders: this replica's renewal is dated before its
    read (it stops no later than it must), another's record when the read returned (it waits
    a whole lease-duration after the last renewal it could have missed, as client-go)."""
    clock = [100.0]

    class SlowLeases(LeaseApi):
        def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> SimpleNamespace:
            clock[0] += 4.0  # the apiserver took 4 s to answer
            return super().read_namespaced_lease(name, namespace, **kw)

    monkeypatch.setattr(
        leader_election, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time)
    )
    api = SlowLeases()
    mine = LeaderElector(api, Election("jobset-inplace-system", identity="a"))
    assert mine.try_once()
    assert mine.renewed_at == 100.0, "dated before the read"
    other = LeaderElector(api, Election("jobset-inplace-system", identity="b"))
    assert not other.try_once()
    assert other._seen is not None
    assert other._seen[1] == 108.0, "first seen when the read returned"


def test_the_leader_gauge_follows_the_lease() -> None:
    metrics.set_leader(False)
    elector = LeaderElector(LeaseApi(), Election("jobset-inplace-system"), metrics.set_leader)
    elector.acquire()
    assert value(metrics.METRICS, "jobset_inplace_leader") == 1
    elector.release()
    assert value(metrics.METRICS, "jobset_inplace_leader") == 0
    metrics.set_leader(True)  # no election: the wiring says this replica acts
    assert value(metrics.METRICS, "jobset_inplace_leader") == 1
    metrics.set_leader(False)
