"""The controller's Prometheus metrics (docs/metrics.md): instruments in a private registry,
fed by the reconciler (what each pass did, as :mod:`jobset_inplace.core.telemetry` observes it;
the planning CPU time; passes and failed passes), the raw watches (event lag, restarts), the
leader elector, and read at scrape time from the reconciler's cache (gangs by phase, budgets
left). Nothing here decides anything; recording costs a few dictionary lookups per pass and no
series per member.

The process's instruments are :data:`METRICS`; the wiring serves :func:`exposition` on
``/metrics``, calls ``Metrics.bind`` with the reconciler's cache and hands ``set_leader`` to
the runtime (it follows the leader Lease, or is set once without an election)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, assert_never

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobset_inplace.core import goodput
from jobset_inplace.core.statemachine import EscalationReason, Phase, StandDownReason
from jobset_inplace.core.telemetry import (
    OUTCOMES,
    RECOVERY_CAUSES,
    Escalated,
    FailureDetected,
    MembersRestarted,
    Observation,
    ProgressLost,
    RecoveryEnded,
    RecoveryStarted,
    RecoveryTimed,
    SpareShortfall,
    SparesSwapped,
    StepsLost,
    StoodDown,
    budgets_left,
)
from jobset_inplace.runtime.report_limits import REFUSALS
from jobset_inplace.runtime.watches import WATCH_REASONS

if TYPE_CHECKING:
    from jobset_inplace.controller.cache import ClusterCache

PREFIX = "jobset_inplace_"
# Recoveries and their phases take seconds (in place) to minutes (new pods, node thresholds,
# barrier deadlines of 5 min by default): one bucket set for all of them, so they compare.
RECOVERY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300,
                    600, 1200, 1800)  # fmt: skip
STEP_BUCKETS = (0, 1, 10, 50, 100, 500, 1000, 5000, 10_000, 50_000, 100_000)
# A plan over 5000 members takes ~12 ms of CPU.
PLANNING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
IN_PLACE, RECREATED = "in_place", "recreated"  # members_restarted_total's modes


def watch_label(what: str) -> str:
    """The ``watch`` label of a raw watch (``"node Leases"`` -> ``"node_leases"``)."""
    return what.lower().replace(" ", "_")


class GangCollector(Collector):
    """Per-gang state read from the cache at scrape time: series of deleted gangs go with
    them, and nothing is kept between scrapes."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        phases, budgets, slow, on_pod, ratio, recent, productive, badput, restarts = (
            self._families()
        )
        now = time.time()
        counts = dict.fromkeys(Phase, 0)
        # a scrape runs on another thread than the event loop that changes the cache: tuple()
        # copies the dict's values in one step under the GIL, and each gang's status and policy
        # are replaced whole, never changed in place
        for gang in tuple(self.cache.gangs.values()):
            status, policy = gang.status, gang.policy
            if status is None or policy is None:  # not loaded yet, or not recovered at all
                continue
            counts[status.phase] += 1
            for budget, left in budgets_left(policy, status).items():
                budgets.add_metric([*gang.key, budget], left)
            if policy.straggler_factor is not None:
                slow.add_metric(list(gang.key), len(status.stragglers))
            on_pod.add_metric(list(gang.key), status.on_pod)
            restarts.add_metric(list(gang.key), status.in_place_restarts)
            if status.goodput.since is not None:
                account = goodput.live(status.goodput, now, status.recovery)
                if account.ratio is not None:
                    ratio.add_metric(list(gang.key), account.ratio)
                window = goodput.recent(status.goodput, now, recovery=status.recovery)
                if window is not None and window.ratio is not None:
                    recent.add_metric(list(gang.key), window.ratio)
                productive.add_metric(list(gang.key), account.productive)
                for bucket in goodput.Bucket:
                    badput.add_metric([*gang.key, bucket.value], account.badput.get(bucket, 0.0))
        for phase, n in counts.items():
            phases.add_metric([phase.value], n)
        yield phases
        yield budgets
        yield slow
        yield on_pod
        yield ratio
        yield recent
        yield productive
        yield badput
        yield restarts

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                f"{PREFIX}gangs", "Opted-in gangs by phase of their GangState.", labels=["phase"]
            ),
            _per_gang(
                "gang_restart_budget_remaining",
                "What is left of a gang's budget: in_place (recoveries), recreate (pods).",
                "budget",
            ),
            _per_gang(
                "gang_stragglers",
                "Members of a gang slower than its median now (gangs with straggler detection).",
            ),
            _per_gang(
                "gang_members_reporting_on_pod",
                "Members of a gang whose report of this epoch is on their pods although the "
                "leader serves a report channel (the channel failed them).",
            ),
            # gauges, not counters: when an epoch ends, its running time (counted productive
            # until then) is split into productive, restore and wasted progress, so productive
            # can go down; their sum (the gang's measured time) only grows, and a window's
            # goodput is delta(productive) / delta(productive + badput) (docs/metrics.md)
            _per_gang(
                "gang_goodput_ratio",
                "A gang's productive share of its measured time since it first started.",
            ),
            _per_gang(
                "gang_recent_goodput_ratio",
                "A gang's productive share of its measured time in the last hour (less while it "
                "is younger).",
            ),
            _per_gang(
                "gang_productive_seconds",
                "A gang's training time on steps that are kept (the running epoch's training "
                "counted until it ends).",
            ),
            _per_gang(
                "gang_badput_seconds",
                "A gang's time lost, by bucket: scheduling, startup, detection, recovery, "
                "restore, wastedProgress.",
                "bucket",
            ),
            # from the GangState's status (restarts.inPlace), which only grows: a counter
            CounterMetricFamily(
                f"{PREFIX}gang_in_place_restarts",
                "Times a gang's pods were restarted in place (a failure's recovery, a manual "
                "restart, a planned move) over its life; JobSet's restart counter counts none.",
                labels=["namespace", "jobset"],
            ),
        )


def _per_gang(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    """A per-gang family: labelled by the gang (``namespace``, ``jobset``) and ``labels``."""
    return GaugeMetricFamily(
        f"{PREFIX}{name}", documentation, labels=["namespace", "jobset", *labels]
    )


class Metrics:
    """The controller's instruments in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._gangs: GangCollector | None = None
        r = registry
        self.recoveries_started = Counter(
            f"{PREFIX}recoveries_started_total",
            "Recoveries started (new epochs after the first), by cause.",
            ["cause"],
            registry=r,
        )
        self.recoveries = Counter(
            f"{PREFIX}recoveries_total",
            "Recoveries ended, by cause and outcome (the edge that ended it).",
            ["cause", "outcome"],
            registry=r,
        )
        self.detection = Histogram(
            f"{PREFIX}recovery_detection_seconds",
            "Member failure's first signal -> the pass that opened its recovery epoch.",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.restart = Histogram(
            f"{PREFIX}recovery_restart_seconds",
            "Recovery epoch opened -> the last member's agent started again.",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.barrier = Histogram(
            f"{PREFIX}recovery_barrier_seconds",
            "The last member's agent started -> barrier opened (its report, the opening pass).",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            f"{PREFIX}recovery_duration_seconds",
            "Member failure's first signal -> barrier opened, for recoveries that completed.",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.steps_lost = Histogram(
            f"{PREFIX}recovery_steps_lost",
            "Newest checkpoint step any member reported minus the resume step, per recovery.",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.progress_lost = Histogram(
            f"{PREFIX}recovery_progress_steps_lost",
            "Training steps a recovery makes the gang redo: the newest step any member's "
            "trainers reported progress for, minus the resume step (trainers that report "
            "progress only).",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.members_restarted = Counter(
            f"{PREFIX}members_restarted_total",
            "Members restarted in place or recreated (a new pod) by a recovery.",
            ["mode"],
            registry=r,
        )
        self.escalations = Counter(
            f"{PREFIX}escalations_total",
            "Escalations to JobSet's failure policy, by reason.",
            ["reason"],
            registry=r,
        )
        self.stand_downs = Counter(
            f"{PREFIX}stand_downs_total",
            "Stand-downs (JobSet suspended, Kueue took the gang away), by reason.",
            ["reason"],
            registry=r,
        )
        self.spare_swaps = Counter(
            f"{PREFIX}spare_swaps_total",
            "Member slots given to a hot spare (a member continued on a spare's pod).",
            registry=r,
        )
        self.spare_shortfalls = Counter(
            f"{PREFIX}spare_shortfalls_total",
            "Recoveries in which members that wanted a hot spare found none ready.",
            registry=r,
        )
        self.planning = Histogram(
            f"{PREFIX}planning_cpu_seconds",
            "CPU time of one plan() of a gang.",
            buckets=PLANNING_BUCKETS,
            registry=r,
        )
        self.passes = Counter(f"{PREFIX}passes_total", "Planning passes run.", registry=r)
        self.pass_failures = Counter(
            f"{PREFIX}pass_failures_total", "Planning passes that failed (retried).", registry=r
        )
        self.event_lag = Histogram(
            f"{PREFIX}event_lag_seconds",
            "Handled watch event: now minus the newest change time the object records.",
            ["watch"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.report_channel_requests = Counter(
            f"{PREFIX}report_channel_requests_total",
            "Agents' reports over the report channel, by answer (200 accepted; any other: "
            "refused, the agent wrote that report on its pod).",
            ["code"],
            registry=r,
        )
        self.report_channel_connections_refused = Counter(
            f"{PREFIX}report_channel_connections_refused_total",
            "Report channel connections closed before a report was accepted on them, by reason "
            "(a limit reached, a rate exceeded, no report within the pre-authentication time).",
            ["reason"],
            registry=r,
        )
        self.report_fronts = Gauge(
            f"{PREFIX}report_fronts",
            "Report fronts the leader names in the GangStates' status (those that said hello "
            "on its link lately).",
            registry=r,
        )
        self.report_front_requests = Counter(
            f"{PREFIX}report_front_requests_total",
            "On a replica serving as a report front: agents' reports by answer (the leader's "
            "answer passed on; 503: the leader was not reachable over the link, the agent sent "
            "the report to the leader itself).",
            ["code"],
            registry=r,
        )
        self.report_front_link_failures = Counter(
            f"{PREFIX}report_front_link_failures_total",
            "On a replica serving as a report front: batches (or hellos) the leader's link did "
            "not take (no leader known, not reachable, no answer in time, refused).",
            registry=r,
        )
        self.watch_restarts = Counter(
            f"{PREFIX}watch_restarts_total",
            "Raw watches restarted, by watch and reason (error: retried; expired: relisted).",
            ["watch", "reason"],
            registry=r,
        )
        self.leader = Gauge(
            f"{PREFIX}leader", "1 if this replica acts as the controller, else 0.", registry=r
        )
        # Every label value known in advance starts at 0. Prometheus sees no increase() in a
        # series born at 1: the first escalation (recovery, refusal) of a kind would reach no
        # alert and no per-hour panel (e2e/test_prometheus.py).
        for mode in (IN_PLACE, RECREATED):
            self.members_restarted.labels(mode)
        for cause in RECOVERY_CAUSES:
            self.recoveries_started.labels(cause)
            for outcome in OUTCOMES:
                self.recoveries.labels(cause, outcome.value)
        for escalation in EscalationReason:
            self.escalations.labels(escalation.value)
        for stand_down in StandDownReason:
            self.stand_downs.labels(stand_down.value)
        for refusal in REFUSALS:
            self.report_channel_connections_refused.labels(refusal)

    # --- what passes did ----------------------------------------------------------------------
    def record(self, observations: Iterable[Observation]) -> None:
        for o in observations:
            match o:
                case RecoveryStarted():
                    self.recoveries_started.labels(o.cause).inc()
                case FailureDetected():
                    self.detection.observe(o.seconds)
                case MembersRestarted():
                    self.members_restarted.labels(IN_PLACE).inc(o.in_place)
                    self.members_restarted.labels(RECREATED).inc(o.recreated)
                case RecoveryEnded():
                    self.recoveries.labels(o.cause, o.outcome.value).inc()
                case RecoveryTimed():
                    for histogram, seconds in (
                        (self.restart, o.restart),
                        (self.barrier, o.barrier),
                        (self.duration, o.total),
                    ):
                        if seconds is not None:
                            histogram.observe(seconds)
                case StepsLost():
                    self.steps_lost.observe(o.steps)
                case ProgressLost():
                    self.progress_lost.observe(o.steps)
                case Escalated():
                    self.escalations.labels(o.reason).inc()
                case StoodDown():
                    self.stand_downs.labels(o.reason).inc()
                case SparesSwapped():
                    self.spare_swaps.inc(o.count)
                case SpareShortfall():
                    self.spare_shortfalls.inc()
                case _:
                    assert_never(o)

    def planned(self, cpu_s: float) -> None:
        self.planning.observe(cpu_s)

    def passed(self, *, failed: bool) -> None:
        self.passes.inc()
        if failed:
            self.pass_failures.inc()

    # --- watches and leadership ---------------------------------------------------------------
    def event_handled(self, what: str, lag_s: float) -> None:
        self.event_lag.labels(watch_label(what)).observe(max(0.0, lag_s))

    def watch_started(self, what: str) -> None:
        """A raw watch exists: its restart series start at 0 (see ``__init__``)."""
        for reason in WATCH_REASONS:
            self.watch_restarts.labels(watch_label(what), reason)

    def watch_restarted(self, what: str, reason: str) -> None:
        self.watch_restarts.labels(watch_label(what), reason).inc()

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    # --- scraping -----------------------------------------------------------------------------
    def bind(self, cache: ClusterCache) -> None:
        """Read the per-gang gauges from ``cache`` at scrape time (instead of an earlier one)."""
        if self._gangs is not None:
            self.registry.unregister(self._gangs)
        self._gangs = GangCollector(cache)
        self.registry.register(self._gangs)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# The process's metrics, in a registry of their own (not prometheus_client's global one).
METRICS = Metrics(CollectorRegistry())


def exposition() -> tuple[bytes, str]:
    """``/metrics`` of this replica: (body, content type)."""
    return METRICS.exposition()


def set_leader(leading: bool) -> None:
    """Whether this replica acts as the controller: the elector sets it; without an election
    the wiring calls ``set_leader(True)``."""
    METRICS.set_leader(leading)
