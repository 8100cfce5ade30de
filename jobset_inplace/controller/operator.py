"""Process wiring of the recovery loop (``jobset-inplace run``): the API client, kopf's
registry and settings, the watches and what each of their events feeds (the cache, then a
poke of the gangs it concerns), priming the cache before any pass, the report channel. The
replica's other parts (health, webhook, leader election) are the runtime's
(:mod:`jobset_inplace.runtime.manager`), which runs this loop once the replica leads.
Per-gang scheduling and passes are :mod:`.reconciler`'s; nothing here decides anything.

Watches: JobSets (opt-in by annotation) and Kueue Workloads through kopf; pods labelled with a
JobSet name, Jobs, nodes and node Leases through raw JSON watch threads
(:mod:`jobset_inplace.runtime.watches`: thousands of
objects, a few fields each). Lease renewals only refresh the cache (and plan that node: our
taint comes off a node that is back); the planner asks to be woken when a Lease would go stale,
so a silently dead node is noticed without any event."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import kopf
import uvloop
from kubernetes import client, config

from jobset_inplace import names
from jobset_inplace.core.decode import (
    kueue_recovery_timeout,
    kueue_stand_down,
    lease_renewal,
    workload_owner,
)
from jobset_inplace.core.detection import observation_restarts
from jobset_inplace.core.model import NodeView
from jobset_inplace.core.policy import PolicyError, is_managed, parse_policy
from jobset_inplace.core.report_fronts import link_annotations
from jobset_inplace.runtime.manager import Manager, Settings
from jobset_inplace.runtime.process import freeze_heap
from jobset_inplace.runtime.watches import RawWatch, WatchEvent

from . import metrics
from .agent_access import AgentAccessKeeper
from .cache import ClusterCache, JobEntry, PodEntry, job_entry, node_entry, pod_entry
from .device_taints import dra_watches
from .disruption_budget import DisruptionBudgetKeeper
from .executor import Executor
from .lease_observer import LeaseObserver, lease_observer
from .reconciler import Reconciler
from .report_front import standby_front
from .report_server import report_server_from_env

log = logging.getLogger("jobset_inplace.controller")


def _jobset_event(r: Reconciler, body: dict[str, Any], deleted: bool) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    if deleted or not is_managed(body):
        if key in r.cache.gangs:
            why = "deleted" if deleted or meta.get("deletionTimestamp") else "opted out"
            log.info("%s/%s: JobSet %s: recovery stops", *key, why)
        r.forget(key)
        return
    try:
        policy, error = parse_policy(meta.get("annotations")), ""
    except PolicyError as e:
        policy, error = None, str(e)
    r.cache.upsert_jobset(body, policy, error)
    r.poke(key)


def setup(
    reconciler: Reconciler,
    access: AgentAccessKeeper | None = None,
    budgets: DisruptionBudgetKeeper | None = None,
) -> None:
    """Register the kopf handlers that feed ``reconciler`` (and ``access``: the agents'
    ServiceAccount and RoleBinding per namespace; ``budgets``: each gang's
    PodDisruptionBudget)."""

    @kopf.on.event("jobset.x-k8s.io", "v1alpha2", "jobsets")
    async def jobset_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        _jobset_event(reconciler, dict(body), type == "DELETED")
        for keeper in (access, budgets):
            if keeper is not None:
                keeper.observe(dict(body), type == "DELETED")

    @kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads")
    async def workload_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        key = workload_owner(body)
        gang = reconciler.cache.gangs.get(key) if key else None
        if key is None or gang is None:
            return
        reason = "" if type == "DELETED" else kueue_stand_down(body)
        managed = type != "DELETED"
        if reason != gang.kueue_stand_down or managed != gang.kueue_managed:
            gang.kueue_stand_down, gang.kueue_managed = reason, managed
            reconciler.poke(key)


def pod_events(r: Reconciler, events: list[WatchEvent[PodEntry]]) -> None:
    for kind, pod in events:
        key = r.cache.upsert_pod(pod, deleted=kind == "DELETED")
        if key is not None and key in r.cache.gangs:
            r.poke(key)


def job_events(r: Reconciler, events: list[WatchEvent[JobEntry]]) -> None:
    for kind, job in events:
        if r.cache.upsert_job(job, deleted=kind == "DELETED"):
            # its pods may have become members (or stopped being): plan their gang
            for key, gang in r.cache.gangs.items():
                if gang.uid == job.jobset:
                    r.poke(key)


def node_events(r: Reconciler, events: list[WatchEvent[NodeView]]) -> None:
    for kind, node in events:
        before = r.cache.nodes.get(node.name)
        if r.cache.upsert_node(node, deleted=kind == "DELETED"):
            # status heartbeats change nothing the planner looks at: no pass for those
            for key in r.cache.gangs_on_node(node.name):
                r.poke(key)
        after = r.cache.nodes.get(node.name)
        if after is not None and (before is None or after.opened_at > before.opened_at):
            # a node that opened (new, Ready again, uncordoned, a taint gone) holds none of a
            # gang's pods, perhaps, but may take a spare that shares a node with a holder
            for key in r.cache.gangs_with_spares():
                r.poke(key)


def lease_events(r: Reconciler, events: list[WatchEvent[tuple[str, float | None]]]) -> None:
    for kind, (name, renewal) in events:
        r.cache.set_lease(name, None if kind == "DELETED" else renewal)
        r.node_changed(name)


def leases_observed_since(r: Reconciler, down_since: float, up_at: float) -> None:
    """The Lease watch works again after failing since ``down_since``: after an outage a
    node's silence counts only from now (renewals may not have been possible meanwhile)."""
    since = observation_restarts(r.cache.leases_observed_since, down_since, up_at)
    if since != r.cache.leases_observed_since:
        r.cache.leases_observed_since = since
        plan_all(r)


def plan_all(r: Reconciler) -> None:
    for key in r.cache.gangs:
        r.poke(key)


WatchFactory = Callable[[Reconciler], RawWatch[Any]]  # a watch feeding a reconciler's cache


def raw_watches(r: Reconciler) -> list[RawWatch[Any]]:
    # each watch holds a connection for minutes: their own clients, not the executor's pool
    core, cache = client.CoreV1Api(client.ApiClient()), r.cache
    return [
        RawWatch(
            "pods",
            partial(core.list_pod_for_all_namespaces, label_selector=names.JOBSET_NAME_LABEL),
            decode=pod_entry,
            replace=cache.replace_pods,
            on_events=partial(pod_events, r),
            on_relist=partial(plan_all, r),
            metrics=metrics.METRICS,
        ),
        RawWatch(
            "Jobs",
            partial(
                client.BatchV1Api(client.ApiClient()).list_job_for_all_namespaces,
                label_selector=names.JOBSET_NAME_LABEL,
            ),
            decode=job_entry,
            replace=cache.replace_jobs,
            on_events=partial(job_events, r),
            on_relist=partial(plan_all, r),
            metrics=metrics.METRICS,
        ),
        RawWatch(
            "nodes",
            core.list_node,
            decode=node_entry,
            replace=cache.replace_nodes,
            on_events=partial(node_events, r),
            on_relist=partial(plan_all, r),
            metrics=metrics.METRICS,
        ),
        RawWatch(
            "node Leases",
            partial(
                client.CoordinationV1Api(client.ApiClient()).list_namespaced_lease,
                names.NODE_LEASE_NAMESPACE,
            ),
            decode=lease_renewal,
            replace=cache.replace_leases,
            on_events=partial(lease_events, r),
            on_relist=partial(plan_all, r),
            metrics=metrics.METRICS,
            on_resumed=partial(leases_observed_since, r),
        ),
    ]


def prime(
    r: Reconciler, watches: list[RawWatch[Any]], leases_seen_since: float | None = None
) -> None:
    """Fill the cache with complete lists before any planning pass. Without this, the first
    pass of a gang could run before the pod watch delivered all its pods and mistake the
    missing ones for failures (a spurious recovery after every controller restart).
    ``leases_seen_since``: since when this replica's standby watch saw every node Lease
    renewal (:mod:`.lease_observer`; None: nothing was observed before now)."""
    custom, core = r.executor.custom, r.executor.core
    for js in custom.list_cluster_custom_object("jobset.x-k8s.io", "v1alpha2", "jobsets")["items"]:
        meta = js["metadata"]
        if is_managed(js):
            try:
                r.cache.upsert_jobset(js, parse_policy(meta.get("annotations")), "")
            except PolicyError as e:
                r.cache.upsert_jobset(js, None, str(e))
    # no report heard before this start; no Lease renewal seen unless a standby watch saw it
    now = time.time()
    r.cache.reports_since = now
    r.cache.leases_observed_since = min(now, leases_seen_since or now)
    counts = {w.what: w.prime() for w in watches}
    set_kueue_recovery_timeout(r.cache, read_kueue_config(core))
    log.info(
        "cache primed: %d gangs, %s; node Leases observed for %.1f s; Kueue recoveryTimeout %s",
        len(r.cache.gangs),
        ", ".join(f"{n} {what}" for what, n in counts.items()),
        now - r.cache.leases_observed_since,
        "unknown (its default assumed)"
        if not r.cache.kueue_config_read
        else "none (waitForPodsReady off)"
        if r.cache.kueue_recovery_timeout_s is None
        else f"{r.cache.kueue_recovery_timeout_s:g}s",
    )


def read_kueue_config(core: client.CoreV1Api) -> str | None:
    """Kueue's configuration YAML from its ConfigMap (standard install), if it can be read."""
    try:
        cm = core.read_namespaced_config_map(names.KUEUE_CONFIG_MAP, names.KUEUE_CONFIG_NAMESPACE)
    except client.exceptions.ApiException:
        return None
    text: str | None = (cm.data or {}).get(names.KUEUE_CONFIG_KEY)
    return text


def set_kueue_recovery_timeout(cache: ClusterCache, config_yaml: str | None) -> None:
    """What Kueue's configuration says into the cache; unreadable: its default is assumed."""
    cache.kueue_config_read = False
    if not config_yaml:
        return
    try:
        cache.kueue_recovery_timeout_s = kueue_recovery_timeout(config_yaml)
    except ValueError as e:
        log.warning("Kueue's configuration: %s; its default recoveryTimeout assumed", e)
        return
    cache.kueue_config_read = True


def build_reconciler() -> Reconciler:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return Reconciler(ClusterCache(), Executor(client.ApiClient()))


def run(settings: Settings, extra_watches: Sequence[WatchFactory] = ()) -> None:
    """Run the controller until interrupted (``jobset-inplace run``): the runtime's parts
    (health, webhook, election: :class:`~jobset_inplace.runtime.manager.Manager`) on every
    replica, and the recovery loop on the one that leads (or the only one), with
    ``raw_watches`` and ``extra_watches``."""
    # kopf logs every handled event at INFO: thousands of pods would flood the log.
    logging.getLogger("kopf").setLevel(logging.WARNING)
    reconciler = build_reconciler()
    reconciler.metrics.bind(reconciler.cache)
    observer = None
    if settings.election is not None:  # a candidate: watch the Leases while it waits
        observer = lease_observer(metrics.METRICS)
        observer.start()
    refused = channel_refused(settings)
    manager = Manager(
        settings,
        exposition=metrics.exposition,
        on_leading=metrics.set_leader,
        # a successor acts at once on a released Lease: every report lease this leader's
        # channel granted must have ended by then (docs/guarantees.md, the fence)
        release_after_s=0.0 if refused else names.LEASE_S + names.FENCE_MARGIN_S,
    )
    standby = None
    if settings.election is not None and refused is None:
        try:
            standby = standby_front(os.environ)
        except ValueError as e:
            log.error("report front: not served (%s)", e)
    manager.run(
        partial(
            run_controller,
            reconciler,
            extra_watches,
            observer=observer,
            leads=manager.leads,
            channel_refusal=refused,
            advertise=manager.advertise if settings.election is not None else None,
        ),
        standby=standby,
    )


def channel_refused(settings: Settings) -> str | None:
    """Why the report channel must not be served under these settings (None: it may): an
    election whose successor could act while an agent still holds a lease its predecessor
    granted (:meth:`ElectionTiming.check_fence`). Refusing only the channel, not the start,
    keeps a controller upgraded with such flags out of a crash loop: its agents write their
    reports on their pods, which a successor reads only once it leads."""
    if settings.election is None:
        return None
    try:
        settings.election.timing.check_fence()
    except ValueError as e:
        return str(e)
    return None


def run_controller(
    reconciler: Reconciler,
    extra_watches: Sequence[WatchFactory] = (),
    *,
    observer: LeaseObserver | None = None,
    leads: Callable[[], bool] = lambda: True,
    channel_refusal: str | None = None,
    advertise: Callable[[Mapping[str, str]], None] | None = None,
) -> None:
    """The controller proper (this replica leads, or there is no election); ``observer``: the
    Lease watch it ran while a candidate, handed over at the prime; ``leads``: whether this
    replica can prove it leads at this moment (:meth:`.Manager.leads`); ``channel_refusal``:
    why the report channel is not served (:func:`channel_refused`); ``advertise``: tells the
    other candidates what to know on the election Lease (:meth:`.Manager.advertise`; None: no
    election, and no report fronts)."""
    watches = [
        *raw_watches(reconciler),
        *dra_watches(reconciler),
        *(make(reconciler) for make in extra_watches),
    ]
    registry = kopf.OperatorRegistry()
    access = AgentAccessKeeper(reconciler.executor.api_client)
    budgets = DisruptionBudgetKeeper(reconciler.executor.api_client)
    with _registry(registry):
        setup(reconciler, access, budgets)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        settings.posting.enabled = False  # Events are ours, concise and on the JobSet
        settings.watching.server_timeout = 300
        settings.persistence.diffbase_storage = _NoDiffBase()

    stop = asyncio.Event()  # kopf's stop flag: set at SIGTERM (binds to the loop at first use)
    background: set[asyncio.Task[None]] = set()  # tasks of the loop's lifetime, held

    @kopf.on.startup(registry=registry)
    async def start_watches(**_: Any) -> None:
        await start_report_channel(reconciler, leads, channel_refusal, advertise)
        _stop_at_sigterm(reconciler, stop)
        for keeper in (access, budgets):
            background.add(asyncio.get_running_loop().create_task(keeper.resync_forever()))
        # kopf starts its own watches (JobSets) only when every startup handler is done
        seen_since = None if observer is None else observer.handover()
        await asyncio.to_thread(prime, reconciler, watches, seen_since)
        freeze_heap("controller")  # the primed cache and what made it: collected no more
        for w in watches:
            w.start_on(asyncio.get_running_loop())

    # uvloop: its event loop and sockets are compiled, not Python (chosen at 2000 agents:
    # docs/benchmarks.md). kopf supports it (its CLI uses it if installed).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(
            kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)
        )


def _stop_at_sigterm(reconciler: Reconciler, stop: asyncio.Event) -> None:
    """At SIGTERM the leader stops planning at once, then kopf stops. (This replaces the SIGTERM
    handler kopf installed when it started: its shutdown takes seconds, during which the
    reconciler would go on acting, e.g. finish a recovery its successor should take over.)"""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set signal handlers

    def on_sigterm() -> None:
        log.info("SIGTERM: no new planning pass; stopping")
        reconciler.stop()
        stop.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)


async def start_report_channel(
    r: Reconciler,
    leads: Callable[[], bool],
    refusal: str | None = None,
    advertise: Callable[[Mapping[str, str]], None] | None = None,
) -> None:
    """Serve the report channel before any pass advertises it, answering only while
    ``leads()``; with ``advertise`` (an election), its link for report fronts too, named on
    the election Lease. A channel that cannot start (a port taken, a bad setting,
    ``refusal``) is logged and left off: agents then write their reports on their pods, as
    without it."""
    if refusal is not None:
        log.error("report channel: not served (%s); agents write their reports on pods", refusal)
        return
    try:
        server = report_server_from_env(
            r.cache, r.poke, os.environ, leads=leads, elected=advertise is not None
        )
        if server is not None:
            r.cache.report_endpoint = await server.start()
            link = server.link_address
            if link is not None and advertise is not None:
                advertise(link_annotations(link))
    except (OSError, ValueError) as e:
        log.error("report channel: cannot serve it (%s); agents write their reports on pods", e)


class _NoDiffBase(kopf.DiffBaseStorage):
    """The controller has event handlers only, so kopf's change detection is unused; its
    default storage deep-copies every object on every event (a quarter of the controller's
    CPU during a 1000-pod recovery, measured with py-spy)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class _registry:
    """Make ``kopf.on.*`` decorators register into ``registry`` (kopf's default registry is
    global; a private one keeps tests and repeated runs independent)."""

    def __init__(self, registry: kopf.OperatorRegistry) -> None:
        self.registry = registry

    def __enter__(self) -> None:
        self.previous = kopf.get_default_registry()
        kopf.set_default_registry(self.registry)

    def __exit__(self, *exc: object) -> None:
        kopf.set_default_registry(self.previous)
