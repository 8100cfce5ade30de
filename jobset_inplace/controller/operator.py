"""The controller's adapters: watch events feed the cache, and a debounced per-gang reconciler
runs the pure planner and the executor. Nothing here decides anything.

Watches: JobSets (opt-in by annotation) and Kueue Workloads through kopf; pods labelled with a
JobSet name, nodes and node Leases through raw JSON watch threads (``watches.py``: thousands of
objects, a few fields each). Lease renewals only refresh the cache: the planner asks to be woken
when a Lease would go stale, so a silently dead node is noticed without any event."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import kopf
from kubernetes import client, config

from jobset_inplace import names
from jobset_inplace.controller.webhook_server import settings_from_env
from jobset_inplace.core.decode import (
    kueue_recovery_timeout,
    kueue_stand_down,
    lease_renewal,
    workload_owner,
)
from jobset_inplace.core.gangstate import progress_only, progress_write_interval
from jobset_inplace.core.model import Event, NodeView
from jobset_inplace.core.planner import may_untaint, plan, stale_lease_nodes
from jobset_inplace.core.policy import PolicyError, is_enabled, parse_policy

from .cache import ClusterCache, Gang, GangKey, PodEntry, node_entry, pod_entry
from .executor import Executor
from .watches import RawWatch, WatchEvent
from .webhook_server import register_webhooks, server_from_env

log = logging.getLogger("jobset_inplace.controller")

# Coalesce bursts of pod events into one planning pass: the first event after a quiet spell is
# planned at once (a failure's first signal waits for nothing), the ones after it at most
# every DEBOUNCE_S.
DEBOUNCE_S = 0.1
# While events stream in, passes of a gang are spaced by at least this many times the CPU time
# of its last planning (a 5000-member plan takes ~12 ms): planning takes a bounded share of the
# controller (at the debounce alone, a 5-minute 5000-pod recovery cost ~90 CPU-s in passes).
PASS_SPACING = 20


@dataclass
class Reconciler:
    cache: ClusterCache
    executor: Executor
    debounce: float = DEBOUNCE_S
    _timers: dict[GangKey, tuple[float, asyncio.TimerHandle]] = field(default_factory=dict)
    _locks: dict[GangKey, asyncio.Lock] = field(default_factory=dict)
    _not_before: dict[GangKey, float] = field(default_factory=dict)  # loop time
    _fired: dict[GangKey, float] = field(default_factory=dict)  # loop time of the last pass
    passes: int = 0

    def poke(self, key: GangKey, delay: float | None = None) -> None:
        """Plan gang ``key`` after ``delay``; by default as soon as the debounce (counted from
        the last pass) and the pass spacing allow, unless already due sooner."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if delay is None:
            last = self._fired.get(key)
            debounced = now if last is None else last + self.debounce
            when = max(now, debounced, self._not_before.get(key, 0.0))
        else:
            when = now + delay
        have = self._timers.get(key)
        if have is not None and have[0] <= when:
            return
        if have is not None:
            have[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

    def forget(self, key: GangKey) -> None:
        """Drop gang ``key``'s scheduling state (its JobSet is gone or opted out)."""
        self.cache.forget_jobset(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._not_before.pop(key, None)
        self._fired.pop(key, None)
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():  # a running pass keeps it until it ends
            del self._locks[key]

    def _fire(self, key: GangKey) -> None:
        self._timers.pop(key, None)
        self._fired[key] = asyncio.get_running_loop().time()
        task = asyncio.ensure_future(self.reconcile(key))
        task.add_done_callback(self.log_failure)

    def log_failure(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("planning pass failed", exc_info=task.exception())

    async def reconcile(self, key: GangKey) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                await self._reconcile(key)
            except client.exceptions.ApiException as e:
                gang = self.cache.gangs.get(key)
                if e.status == 404 and gang is not None:
                    gang.status = None  # the GangState went away: load or create it again
                log.warning(
                    "%s/%s: API error %s %s: %s; retrying",
                    *key,
                    e.status,
                    e.reason,
                    (e.body or "")[:300],
                )
                self.poke(key, 2.0)

    async def _reconcile(self, key: GangKey) -> None:
        gang = self.cache.gangs.get(key)
        if gang is None:
            return
        if gang.policy is None:
            await self._post_once(gang, Event("InvalidPolicy", gang.policy_error, warning=True))
            return
        if gang.status is None:
            gang.status = await asyncio.to_thread(self.executor.load_or_create, gang.jobset)
        snap = self.cache.snapshot(gang, time.time())
        if snap is None:
            return
        stale = stale_lease_nodes(snap)
        if stale:
            # Confirm with a fresh read: the Lease watch may lag behind on a busy apiserver.
            fresh = await asyncio.to_thread(self.executor.lease_renewals, stale)
            for node, renewed in fresh.items():
                cached = self.cache.leases.get(node)
                if renewed is not None and cached is not None and renewed > cached + 1:
                    log.info("node %s: Lease watch was %.1f s behind", node, renewed - cached)
                self.cache.set_lease(node, renewed)
            snap = self.cache.snapshot(gang, time.time())
            if snap is None:
                return
        started = time.thread_time()  # CPU time: on a busy machine wall time would overstate it
        result = plan(snap)
        self.passes += 1
        cpu = time.thread_time() - started
        self._not_before[key] = asyncio.get_running_loop().time() + PASS_SPACING * cpu
        write = "unchanged"
        if result.status != gang.status:
            now = time.monotonic()
            due = gang.progress_written + progress_write_interval(len(snap.gang.members))
            if progress_only(gang.status, result.status) and now < due:
                self.poke(key, due - now)  # counts only: write them a little later
                write = f"counts deferred {due - now:.2f} s"
            else:
                await asyncio.to_thread(self.executor.write_status, *key, result.status)
                gang.status, gang.progress_written = result.status, now
                write = f"written in {time.monotonic() - now:.3f} s"
        log.debug(
            "%s/%s: pass %d, epoch %d %s, %d/%d reported, %.1f ms CPU, status %s",
            *key,
            self.passes,
            result.status.epoch,
            result.status.phase,
            result.status.reported,
            len(snap.gang.members),
            cpu * 1000,
            write,
        )
        actions = []
        for a in result.actions:
            if isinstance(a, Event) and a.reason == "MalformedReport":
                if a.message in gang.reported:
                    continue
                gang.reported.add(a.message)
            actions.append(a)
        if actions:
            await asyncio.to_thread(self.executor.run, gang.jobset, actions)
        if result.requeue_after is not None:
            self.poke(key, result.requeue_after)

    async def _post_once(self, gang: Gang, e: Event) -> None:
        if e.message not in gang.reported:
            gang.reported.add(e.message)
            await asyncio.to_thread(self.executor.run, gang.jobset, [e])


def _jobset_event(r: Reconciler, body: dict[str, Any], deleted: bool) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    if deleted or not is_enabled(meta.get("annotations")):
        r.forget(key)
        return
    try:
        policy, error = parse_policy(meta.get("annotations")), ""
    except PolicyError as e:
        policy, error = None, str(e)
    r.cache.upsert_jobset(body, policy, error)
    r.poke(key)


def setup(reconciler: Reconciler) -> None:
    """Register the kopf handlers that feed ``reconciler``."""

    @kopf.on.event("jobset.x-k8s.io", "v1alpha2", "jobsets")
    async def jobset_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        _jobset_event(reconciler, dict(body), type == "DELETED")

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


def node_events(r: Reconciler, events: list[WatchEvent[NodeView]]) -> None:
    for kind, node in events:
        if r.cache.upsert_node(node, deleted=kind == "DELETED"):
            # status heartbeats change nothing the planner looks at: no pass for those
            for key in r.cache.gangs_on_node(node.name):
                r.poke(key)


def lease_events(r: Reconciler, events: list[WatchEvent[tuple[str, float | None]]]) -> None:
    now = time.time()
    for kind, (name, renewal) in events:
        renewed = None if kind == "DELETED" else renewal
        r.cache.set_lease(name, renewed)
        if may_untaint(r.cache.nodes.get(name), renewed, now):
            # The node's kubelet is back: let the scheduler use it again.
            task = asyncio.ensure_future(
                asyncio.to_thread(r.executor.set_unhealthy_taint, name, False)
            )
            task.add_done_callback(r.log_failure)


def plan_all(r: Reconciler) -> None:
    for key in r.cache.gangs:
        r.poke(key)


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
        ),
        RawWatch(
            "nodes",
            core.list_node,
            decode=node_entry,
            replace=cache.replace_nodes,
            on_events=partial(node_events, r),
            on_relist=partial(plan_all, r),
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
        ),
    ]


def prime(r: Reconciler, watches: list[RawWatch[Any]]) -> None:
    """Fill the cache with complete lists before any planning pass. Without this, the first
    pass of a gang could run before the pod watch delivered all its pods and mistake the
    missing ones for failures (a spurious recovery after every controller restart)."""
    custom, core = r.executor.custom, r.executor.core
    for js in custom.list_cluster_custom_object("jobset.x-k8s.io", "v1alpha2", "jobsets")["items"]:
        meta = js["metadata"]
        if is_enabled(meta.get("annotations")):
            try:
                r.cache.upsert_jobset(js, parse_policy(meta.get("annotations")), "")
            except PolicyError as e:
                r.cache.upsert_jobset(js, None, str(e))
    counts = {w.what: w.prime() for w in watches}
    r.cache.kueue_recovery_timeout_s = read_kueue_recovery_timeout(core)
    log.info(
        "cache primed: %d gangs, %s; Kueue recoveryTimeout %s",
        len(r.cache.gangs),
        ", ".join(f"{n} {what}" for what, n in counts.items()),
        r.cache.kueue_recovery_timeout_s or "unknown",
    )


def read_kueue_recovery_timeout(core: client.CoreV1Api) -> float | None:
    """Kueue's recoveryTimeout from its configuration ConfigMap (standard install), if any."""
    try:
        cm = core.read_namespaced_config_map(names.KUEUE_CONFIG_MAP, names.KUEUE_CONFIG_NAMESPACE)
    except client.exceptions.ApiException:
        return None
    text = (cm.data or {}).get(names.KUEUE_CONFIG_KEY)
    return kueue_recovery_timeout(text) if text else None


def build_reconciler() -> Reconciler:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return Reconciler(ClusterCache(), Executor(client.ApiClient()))


def run(*, liveness: str | None = None) -> None:
    """Run the controller until interrupted (``jobset-inplace run``)."""
    # kopf logs every handled event at INFO: thousands of pods would flood the log.
    logging.getLogger("kopf").setLevel(logging.WARNING)
    reconciler = build_reconciler()
    watches = raw_watches(reconciler)
    registry = kopf.OperatorRegistry()
    with _registry(registry):
        setup(reconciler)
    # Admission webhook (docs/webhook.md): served only when the serving cert is mounted
    # ($JSI_WEBHOOK_CERT_DIR, default /etc/jobset-inplace/webhook-certs, tls.crt + tls.key).
    webhook_server = server_from_env()
    if webhook_server is not None:
        register_webhooks(registry, settings_from_env())

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        settings.posting.enabled = False  # Events are ours, concise and on the JobSet
        settings.watching.server_timeout = 300
        settings.persistence.diffbase_storage = _NoDiffBase()
        settings.admission.server = webhook_server
        settings.admission.managed = None  # the configurations are manifests/webhook/

    @kopf.on.startup(registry=registry)
    async def start_watches(**_: Any) -> None:
        # kopf starts its own watches (JobSets) only when every startup handler is done
        await asyncio.to_thread(prime, reconciler, watches)
        for w in watches:
            w.start_on(asyncio.get_running_loop())

    asyncio.run(
        kopf.operator(
            registry=registry, clusterwide=True, standalone=True, liveness_endpoint=liveness
        )
    )


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
