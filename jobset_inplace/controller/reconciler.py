"""The per-gang reconciler: it schedules planning passes and runs each one as load -> plan ->
write -> act. It decides nothing: what to do is the planner's (:mod:`jobset_inplace.core`),
doing it is the executor's; this module only decides *when* a gang is planned.

Scheduling: the first event after a quiet spell is planned at once (a failure's first signal
waits for nothing), later ones are coalesced (at most one pass per ``debounce``), and while
events stream in a gang's passes are spaced by ``PASS_SPACING`` times the CPU time of its last
planning; an urgent poke (the last report a barrier waits for) skips both, and a poke with a
delay asks for a pass within it (a deadline the plan named; a report the barrier waited for,
with more to come: within the counts' write interval, :mod:`.report_server`). A pass that fails, for
whatever reason, is retried with exponential backoff.

The GangMembers summary is written apart from the passes (:meth:`Reconciler.members_changed`):
a pass only notes that a member may have changed, in O(1); the rows are made and written by a
timer of their own, at most every ``write_interval``, and a slow write never holds a pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field

from kubernetes import client

from jobset_inplace.backoff import Backoff
from jobset_inplace.controller.cache import ClusterCache, Gang, GangKey
from jobset_inplace.controller.executor import Executor
from jobset_inplace.controller.metrics import METRICS, Metrics
from jobset_inplace.core.gangmembers import member_rows, next_write_at
from jobset_inplace.core.model import Action, Plan, ReadLeases, Snapshot
from jobset_inplace.core.planner import plan, plan_node, refuse_policy
from jobset_inplace.core.telemetry import observe
from jobset_inplace.runtime.clock import Clock, LoopClock, Timer

log = logging.getLogger("jobset_inplace.controller")

# Coalesce bursts of pod events into one planning pass: the first event after a quiet spell is
# planned at once, the ones after it at most every DEBOUNCE_S.
DEBOUNCE_S = 0.1
# While events stream in, passes of a gang are spaced by at least this many times the CPU time
# of its last planning (a 5000-member plan takes ~12 ms): planning takes a bounded share of the
# controller (at the debounce alone, a 5-minute 5000-pod recovery cost ~90 CPU-s in passes).
PASS_SPACING = 20
# A failed pass is retried after 1 s, doubling up to 60 s.
PASS_RETRY = Backoff(1.0, 60.0)
# A plan may ask for fresh Lease reads before it decides; a pass re-plans at most this often.
MAX_PLANS_PER_PASS = 3


@dataclass
class Reconciler:
    cache: ClusterCache
    executor: Executor
    debounce: float = DEBOUNCE_S
    clock: Clock = field(default_factory=LoopClock)
    metrics: Metrics = METRICS  # the process's (one registry, served on /metrics)
    _timers: dict[GangKey, tuple[float, Timer]] = field(default_factory=dict)
    _locks: dict[GangKey, asyncio.Lock] = field(default_factory=dict)
    _not_before: dict[GangKey, float] = field(default_factory=dict)  # scheduling clock
    _fired: dict[GangKey, float] = field(default_factory=dict)  # scheduling time of last pass
    _spacing: dict[GangKey, float] = field(default_factory=dict)  # after its last planning
    _failures: dict[GangKey, int] = field(default_factory=dict)  # failed passes in a row
    _members_timers: dict[GangKey, Timer] = field(default_factory=dict)  # GangMembers writes
    _members_busy: set[GangKey] = field(default_factory=set)  # a write due or in flight
    passes: int = 0
    stopped: bool = False  # this replica is terminating: no pass starts any more

    def stop(self) -> None:
        """Start no pass any more (SIGTERM): a terminating leader stops acting at once, while
        its shutdown may take seconds; the next leader plans from the API (guarantee 6)."""
        self.stopped = True
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for members_timer in self._members_timers.values():
            members_timer.cancel()
        self._members_timers.clear()
        self._members_busy.clear()

    # --- scheduling ---------------------------------------------------------------------------
    def poke(self, key: GangKey, delay: float | None = None, *, urgent: bool = False) -> None:
        """Plan gang ``key`` after ``delay`` and the pass spacing (at 5000 members, without the
        spacing here, a recovery's passes came in pairs 0.1-0.15 s apart: the second one a plan's
        own look again, 2026-11-27); by default as soon
        as the debounce (counted from the last pass) and the pass spacing allow, unless already
        due sooner. ``urgent``: now, whatever the debounce and spacing (the last report a
        barrier waited for; a failing gang still keeps its backoff)."""
        if self.stopped:
            return
        now = self.clock.monotonic()
        if urgent and key not in self._failures:
            when = now
        elif delay is None:
            last = self._fired.get(key)
            debounced = now if last is None else last + self.debounce
            when = max(now, debounced, self._not_before.get(key, 0.0))
        else:  # a deadline the plan asked to look again at: not before the spacing either
            when = max(now + delay, self._not_before.get(key, 0.0))
        have = self._timers.get(key)
        if have is not None and have[0] <= when:
            return
        if have is not None:
            have[1].cancel()
        self._timers[key] = (when, self.clock.call_at(when, lambda: self._fire(key)))

    def forget(self, key: GangKey) -> None:
        """Drop gang ``key``'s scheduling state (its JobSet is gone or opted out)."""
        self.cache.forget_jobset(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        members_timer = self._members_timers.pop(key, None)
        if members_timer is not None:
            members_timer.cancel()
        self._members_busy.discard(key)
        self._not_before.pop(key, None)
        self._fired.pop(key, None)
        self._spacing.pop(key, None)
        self._failures.pop(key, None)
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():  # a running pass keeps it until it ends
            del self._locks[key]

    def _fire(self, key: GangKey) -> None:
        self._timers.pop(key, None)
        if self.stopped:
            return
        now = self._fired[key] = self.clock.monotonic()
        # Until this pass has planned, assume it costs what the last one did: an event during
        # it is not planned right after it (passes came in pairs 0.1 s apart at 5000 members).
        spaced = now + self._spacing.get(key, 0.0)
        self._not_before[key] = max(self._not_before.get(key, 0.0), spaced)
        self.spawn(self.reconcile(key))

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` in the background; a failure is logged, never lost."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(self.log_failure)

    def log_failure(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    # --- a pass -------------------------------------------------------------------------------
    async def reconcile(self, key: GangKey) -> None:
        """One pass of gang ``key``; any error is retried with backoff (nothing else would wake
        a gang that waits on a deadline)."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                await self._reconcile(key)
            except Exception as e:  # retried below, whatever it was
                self.metrics.passed(failed=True)
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                gang = self.cache.gangs.get(key)
                if isinstance(e, client.exceptions.ApiException):
                    if e.status == 404 and gang is not None:
                        # the GangState went away: load or create it again
                        gang.status, gang.announced_epoch = None, 0
                    why = f"API error {e.status} {e.reason}: {(e.body or '')[:300]}"
                    log.warning("%s/%s: %s; retry %d", *key, why, failures)
                else:
                    log.exception("%s/%s: planning pass failed; retry %d", *key, failures)
                if gang is not None:
                    delay = PASS_RETRY.delay(failures)
                    # events must not retry it sooner: the backoff holds until the retry
                    self._not_before[key] = self.clock.monotonic() + delay
                    self.poke(key, delay)
            else:
                self.metrics.passed(failed=False)
                self._failures.pop(key, None)

    async def _reconcile(self, key: GangKey) -> None:
        gang = self.cache.gangs.get(key)
        if gang is None:
            return
        if gang.policy is None:
            await self._act(gang, refuse_policy(gang.policy_error, frozenset(gang.posted)))
            return
        if gang.status is None:
            gang.status = await asyncio.to_thread(self.executor.load_or_create, gang.jobset)
        snap, result = self._plan(gang)
        for _ in range(MAX_PLANS_PER_PASS - 1):
            reads = [a for a in result.actions if isinstance(a, ReadLeases)]
            if not reads:
                break
            await self._read_leases([n for a in reads for n in a.nodes])
            snap, result = self._plan(gang)
        await self._write(gang, result)
        self.metrics.record(observe(snap, result))  # once written: a failed write is retried
        await self._act(gang, [a for a in result.actions if not isinstance(a, ReadLeases)])
        if result.requeue_after is not None:
            self.poke(key, result.requeue_after)
        self.members_changed(gang)

    def _plan(self, gang: Gang) -> tuple[Snapshot, Plan]:
        snap = self.cache.snapshot(gang, self.clock.wall(), self.clock.monotonic())
        if snap is None:  # the caller loaded both; a JobSet update may have dropped the policy
            raise LookupError(f"{gang.key}: no policy or status to plan with")
        started = self.clock.cpu()
        result = plan(snap)
        cpu = self.clock.cpu() - started
        self.passes += 1
        self.metrics.planned(cpu)
        self._spacing[gang.key] = PASS_SPACING * cpu
        self._not_before[gang.key] = self.clock.monotonic() + PASS_SPACING * cpu
        log.debug(
            "%s/%s: pass %d, epoch %d %s, %d/%d reported, %.1f ms CPU, edges %s, again in %s",
            *gang.key,
            self.passes,
            result.status.epoch,
            result.status.phase,
            result.status.reported,
            len(snap.gang.members),
            cpu * 1000,
            ",".join(result.edges) or "-",
            "-" if result.requeue_after is None else f"{result.requeue_after:.2f} s",
        )
        return snap, result

    async def _read_leases(self, nodes: list[str]) -> None:
        fresh = await asyncio.to_thread(self.executor.lease_renewals, nodes)
        read_at = self.clock.wall()
        for node, renewed in fresh.items():
            cached = self.cache.leases.get(node)
            if renewed is not None and cached is not None and renewed > cached + 1:
                log.info("node %s: Lease watch was %.1f s behind", node, renewed - cached)
            self.cache.set_lease(node, renewed, read_at=read_at)

    async def _write(self, gang: Gang, result: Plan) -> None:
        """The status first: a crash after it is recovered from the API without a second
        recovery (the actions are repeated, idempotently)."""
        if result.status == gang.status:
            return
        gang.announced_epoch = max(gang.announced_epoch, result.status.epoch)
        await asyncio.to_thread(self.executor.write_status, *gang.key, result.status)
        gang.status, gang.status_written_at = result.status, self.clock.wall()
        if (
            not gang.endpoint_named_at
            and result.status.report_endpoint == self.cache.report_endpoint
        ):
            gang.endpoint_named_at = gang.status_written_at
            self.cache.presume_heard(gang, gang.endpoint_named_at, self.clock.monotonic())

    # --- GangMembers --------------------------------------------------------------------------
    def members_changed(self, gang: Gang) -> None:
        """After a pass: if a member may have changed since the rows were last made
        (:meth:`.ClusterCache.rows_stamp`), have them made and written once the interval since
        the last write is over (at once if none). O(1): the rows, O(members) to make, sort and
        compare (about 8 ms at 10,000 members), are made at most once per interval, not per
        pass (docs/benchmarks.md, "The GangMembers rows apart from the passes")."""
        key = gang.key
        if (
            self.stopped
            or key in self._members_busy
            or gang.members_stamp == self.cache.rows_stamp(gang)
        ):
            return
        self._members_busy.add(key)
        now = self.clock.monotonic()
        when = next_write_at(gang.members_written, gang.members_written_at, now)
        if when <= now:
            self.spawn(self._write_members(key))
        else:
            self._members_timers[key] = self.clock.call_at(
                when, lambda: self.spawn(self._write_members(key))
            )

    async def _write_members(self, key: GangKey) -> None:
        """What each member reported, for people (:mod:`jobset_inplace.core.gangmembers`),
        written if a row changed. Nothing decides by it, so a failed write fails nothing: it
        is logged and tried again when a row changes; and no pass waits for it (at 10,000
        members each write was refused with 504 after the apiserver's minute, 2026-12-07)."""
        self._members_timers.pop(key, None)
        gang = self.cache.gangs.get(key)
        try:
            if gang is None or self.stopped:
                return
            gang.members_stamp = self.cache.rows_stamp(gang)
            rows = member_rows(self.cache.members(gang).values())
            if rows == gang.members_written:
                return
            gang.members_written, gang.members_written_at = rows, self.clock.monotonic()
            await asyncio.to_thread(
                self.executor.write_members, gang.jobset, rows, self.clock.wall()
            )
        except client.exceptions.ApiException as e:
            log.warning(
                "%s/%s: cannot write its GangMembers (kubectl jobset-inplace status -o wide): "
                "API error %s %s; tried again when a member's report changes",
                *key,
                e.status,
                e.reason,
            )
        finally:
            self._members_busy.discard(key)
        if gang is not None and self.cache.gangs.get(key) is gang:
            self.members_changed(gang)  # a member changed during the write: after the interval

    async def _act(self, gang: Gang, actions: list[Action]) -> None:
        if not actions:
            return
        posted = await asyncio.to_thread(self.executor.run, gang.jobset, actions)
        gang.remember_posted(e.once_key for e in posted if e.once_key)  # not the failed ones

    # --- nodes --------------------------------------------------------------------------------
    def node_changed(self, name: str) -> None:
        """Plan node ``name`` (its Lease was renewed): e.g. our taint comes off once it is back."""
        actions = plan_node(self.cache.nodes.get(name), self.clock.wall())
        if actions:
            self.spawn(asyncio.to_thread(self.executor.run_node, actions))
