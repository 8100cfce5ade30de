"""When the reconciler plans a gang, on a clock the tests advance by hand (no real sleeps): the
first event after a quiet spell at once (a failure's first signal waits for nothing), a burst
after it coalesced at most every debounce, never sooner than the pass spacing; a failed pass,
whatever the error, retried with backoff. And what one pass does, in order: load, plan (with
fresh Lease reads when the plan asks for them), write the status, act."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from jobset_inplace.controller.cache import POSTED_MAX, ClusterCache, GangKey, JobEntry, PodEntry
from jobset_inplace.controller.reconciler import PASS_RETRY, PASS_SPACING, Reconciler
from jobset_inplace.core import gangmembers
from jobset_inplace.core.gangmembers import MemberRow
from jobset_inplace.core.model import (
    Action,
    Cause,
    Event,
    GangStatus,
    NodeView,
    Recovery,
    ReplacePod,
    ReportEndpoint,
    UntaintNode,
)
from jobset_inplace.core.planner import REPORT_AGAIN_S
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Phase
from jobset_inplace.names import UNHEALTHY_TAINT

from .clocks import ManualClock
from .gangs import member, pods, running

KEY: GangKey = ("ns", "gang")
JOB = "job-uid"  # one Job of the JobSet owns every member pod here (membership is by owner)


async def settle() -> None:
    """Let the tasks the timers started run (yields only; no time goes by)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Recording(Reconciler):
    """A reconciler whose passes only record the clock's time (and may fail)."""

    def __init__(self, debounce: float, fail: int = 0) -> None:
        self.manual = ManualClock()
        super().__init__(ClusterCache(), executor=None, debounce=debounce, clock=self.manual)  # type: ignore[arg-type]
        self.ran: list[float] = []
        self.fail = fail

    async def _reconcile(self, key: GangKey) -> None:
        self.ran.append(self._fired[key])  # when its timer fired
        if self.fail:
            self.fail -= 1
            raise RuntimeError("not an ApiException")


async def test_first_event_after_quiet_is_planned_at_once() -> None:
    r = Recording(debounce=0.5)
    t0 = r.manual.now
    r.poke(KEY)
    r.manual.advance(0)
    await settle()
    assert r.ran == [t0]  # not after the 0.5 s debounce


async def test_burst_after_a_pass_is_coalesced_into_one_pass_a_debounce_later() -> None:
    r = Recording(debounce=0.3)
    t0 = r.manual.now
    r.poke(KEY)
    r.manual.advance(0)
    await settle()
    for _ in range(20):  # a burst of events right after the first pass
        r.poke(KEY)
        r.manual.advance(0.005)
        await settle()
    assert r.ran == [t0]
    r.manual.advance(0.4)
    await settle()
    assert r.ran == [t0, pytest.approx(t0 + 0.3)]


async def test_pass_spacing_still_applies_to_the_first_event() -> None:
    r = Recording(debounce=0.05)
    t0 = r.manual.now
    r._not_before[KEY] = t0 + 0.3  # the last pass's planning was expensive
    r.poke(KEY)
    r.manual.advance(0.1)
    await settle()
    assert r.ran == []
    r.manual.advance(0.3)
    await settle()
    assert r.ran == [pytest.approx(t0 + 0.3)]


async def test_an_event_during_a_pass_waits_for_the_last_passes_spacing() -> None:
    r = Recording(debounce=0.1)
    r._spacing[KEY] = 0.9  # the last pass's planning took 45 ms
    t0 = r.manual.now
    r.poke(KEY)
    r.manual.advance(0)
    await settle()
    assert r.ran == [t0]
    r.poke(KEY)  # while that pass runs (it has not planned yet): not 0.1 s after it
    r.manual.advance(0.5)
    await settle()
    assert r.ran == [t0]
    r.manual.advance(0.5)
    await settle()
    assert r.ran == [t0, pytest.approx(t0 + 0.9)]


async def test_a_deadline_to_look_again_at_waits_for_the_pass_spacing() -> None:
    r = Recording(debounce=0.0)
    t0 = r.manual.now
    r._not_before[KEY] = t0 + 0.9  # the last pass's planning took 45 ms
    r.poke(KEY, 0.1)  # the plan asked to look again in 0.1 s
    r.manual.advance(0.5)
    await settle()
    assert r.ran == []
    r.manual.advance(0.5)
    await settle()
    assert r.ran == [pytest.approx(t0 + 0.9)]
    later = r.manual.now
    r._not_before[KEY] = later + 0.9
    r.poke(KEY, 2.0)  # a deadline beyond the spacing keeps its time
    r.manual.advance(1.9)
    await settle()
    assert len(r.ran) == 1
    r.manual.advance(0.2)
    await settle()
    assert r.ran[1] == pytest.approx(later + 2.0)


async def test_an_urgent_poke_skips_debounce_and_spacing_but_not_a_failures_backoff() -> None:
    r = Recording(debounce=0.5)
    r.poke(KEY)
    r.manual.advance(0)
    await settle()
    r._not_before[KEY] = r.manual.now + 0.3  # expensive planning
    r.poke(KEY)  # a pass is due in 0.5 s (debounce)
    t1 = r.manual.now
    r.poke(KEY, urgent=True)  # the last report the barrier waited for
    r.manual.advance(0)
    await settle()
    assert r.ran[1:] == [t1]
    r.manual.advance(1)
    await settle()
    assert len(r.ran) == 2, "the due pass was replaced, not added"
    failing = Recording(debounce=0.0, fail=1)
    failing.cache.upsert_jobset(jobset(), Policy(), "")
    failing.poke(KEY)
    failing.manual.advance(0)
    await settle()  # failed: retried after its backoff
    failing.poke(KEY, urgent=True)
    failing.manual.advance(0)
    await settle()
    assert len(failing.ran) == 1
    failing.manual.advance(PASS_RETRY.delay(1))
    await settle()
    assert len(failing.ran) == 2


async def test_a_stopped_reconciler_starts_no_pass() -> None:
    r = Recording(debounce=0.0)
    r.poke(KEY, 0.2)  # a pass is due
    r.stop()  # SIGTERM
    r.poke(KEY)
    r.poke(KEY, urgent=True)
    r.manual.advance(1)
    await settle()
    assert r.ran == []
    assert r._timers == {}


async def test_explicit_delay_is_kept() -> None:
    r = Recording(debounce=0.0)
    t0 = r.manual.now
    r.poke(KEY, 0.2)
    r.manual.advance(0.1)
    await settle()
    assert r.ran == []
    r.manual.advance(0.2)
    await settle()
    assert r.ran == [pytest.approx(t0 + 0.2)]


async def test_forget_cancels_the_pending_pass_and_drops_the_gangs_state() -> None:
    r = Recording(debounce=0.0)
    r.poke(KEY)
    r.manual.advance(0)
    await settle()
    r._not_before[KEY] = r.manual.now + 0.1
    r._locks[KEY] = asyncio.Lock()
    r.poke(KEY, 0.1)  # a pass is due
    r.forget(KEY)  # the JobSet was deleted
    r.manual.advance(0.2)
    await settle()
    assert len(r.ran) == 1  # only the pass before the deletion
    assert (r._timers, r._not_before, r._fired, r._locks) == ({}, {}, {}, {})


async def test_forget_keeps_a_lock_held_by_a_running_pass() -> None:
    r = Recording(debounce=0.0)
    lock = r._locks.setdefault(KEY, asyncio.Lock())
    async with lock:
        r.forget(KEY)
        assert r._locks[KEY] is lock  # a new pass must still wait for the running one


async def test_a_failed_pass_is_retried_with_backoff_whatever_the_error() -> None:
    r = Recording(debounce=0.0, fail=3)
    r.cache.upsert_jobset(jobset(), Policy(), "")
    t0 = r.manual.now
    r.poke(KEY)
    for step in (0, PASS_RETRY.delay(1), PASS_RETRY.delay(2), PASS_RETRY.delay(3)):
        r.manual.advance(step)
        await settle()
    assert r.ran == [t0, t0 + 1, t0 + 3, t0 + 7]  # 1, 2, 4 s apart
    assert r._failures == {}, "a pass that worked resets the backoff"
    assert r.manual.pending == []
    assert PASS_RETRY.delay(100) == 60.0


# --- one pass, with a recording executor ---------------------------------------------------------
def jobset(members: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"namespace": KEY[0], "name": KEY[1], "uid": "js-uid", "annotations": {}},
        "spec": {
            "replicatedJobs": [
                {"name": "workers", "replicas": members, "template": {"spec": {"parallelism": 1}}}
            ]
        },
    }


@dataclass
class RecordingExecutor:
    status: GangStatus
    leases: dict[str, float | None] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    members: list[tuple[float, tuple[MemberRow, ...]]] = field(default_factory=list)

    def load_or_create(self, jobset: dict[str, Any]) -> GangStatus:
        self.calls.append("load")
        return self.status

    def lease_renewals(self, nodes: list[str]) -> dict[str, float | None]:
        self.calls.append(f"read leases {','.join(nodes)}")
        return {n: self.leases.get(n) for n in nodes}

    def write_status(self, namespace: str, name: str, status: GangStatus) -> None:
        self.calls.append(f"write epoch {status.epoch} {status.phase}")

    def write_members(self, jobset: dict[str, Any], rows: Sequence[MemberRow], now: float) -> None:
        self.members.append((now, tuple(rows)))

    def run(self, jobset: dict[str, Any], actions: list[Action]) -> list[Event]:
        self.calls.append("act")
        self.actions += actions
        return [a for a in actions if isinstance(a, Event)]

    def run_node(self, actions: list[Action]) -> None:
        self.calls += [f"untaint {a.node}" for a in actions if isinstance(a, UntaintNode)]


def gang(
    executor: RecordingExecutor, clock: ManualClock | None = None, **pod_changes: Any
) -> tuple[Reconciler, ManualClock, ClusterCache]:
    clock = clock or ManualClock()
    cache = ClusterCache()
    cache.upsert_jobset(jobset(), Policy(), "")
    cache.upsert_job(JobEntry(JOB, "js-uid"))
    for pod in pods(2, epoch=2):
        view = pod if pod.member != member(1) else dataclasses.replace(pod, **pod_changes)
        cache.upsert_pod(PodEntry(pod.uid, KEY, view, JOB))
    for i in range(2):
        cache.upsert_node(NodeView(f"n{i}"))
        cache.set_lease(f"n{i}", clock.wall() - 1)
    r = Reconciler(cache, executor, clock=clock)  # type: ignore[arg-type]
    return r, clock, cache


async def test_a_pass_writes_the_status_before_it_acts_and_spaces_the_next_pass() -> None:
    ex = RecordingExecutor(running(2))
    r, clock, _ = gang(ex, trainer_failed=True)
    clock.cpu_step = 0.01  # the planning "costs" 10 ms of CPU
    await r.reconcile(KEY)
    assert ex.calls == ["load", "write epoch 3 Recovering", "act"]
    assert r._not_before[KEY] == pytest.approx(clock.now + PASS_SPACING * 0.01)


async def test_a_once_only_event_is_posted_once_per_pod_and_memory_stays_bounded() -> None:
    ex = RecordingExecutor(running(2))
    r, _, cache = gang(ex, report_error="bad epoch")
    await r.reconcile(KEY)
    pod = cache.gangs[KEY].pods["uid-1"]
    garbage = dataclasses.replace(pod, report_error="another kind of garbage")
    cache.upsert_pod(PodEntry("uid-1", KEY, garbage, JOB))  # the same pod writes other garbage
    await r.reconcile(KEY)
    malformed = [a for a in ex.actions if isinstance(a, Event) and a.reason == "MalformedReport"]
    assert len(malformed) == 1, "rate-limited per pod"
    assert list(cache.gangs[KEY].posted) == ["Malformed/uid-1"]
    cache.gangs[KEY].remember_posted(f"k{i}" for i in range(POSTED_MAX + 5))
    assert len(cache.gangs[KEY].posted) == POSTED_MAX
    assert "Malformed/uid-1" not in cache.gangs[KEY].posted, "the oldest go first"


async def test_a_lease_stale_in_the_cache_is_read_before_a_pod_is_replaced() -> None:
    ex = RecordingExecutor(running(2, expected=2, ready=2, reported=2))
    r, clock, cache = gang(ex)
    cache.set_lease("n1", None)
    cache.set_lease("n1", clock.wall() - 30)  # what the lagging watch says
    ex.leases = {"n1": clock.wall() - 2}  # the API: renewed 2 s ago
    await r.reconcile(KEY)
    assert ex.calls == ["load", "read leases n1"]  # nothing replaced, nothing written
    assert cache.leases["n1"] == clock.wall() - 2
    cache.set_lease("n1", clock.wall() - 20)  # the watch catches up late: never backwards
    assert cache.leases["n1"] == clock.wall() - 2
    ex.calls.clear()
    clock.advance(40)  # n1 really went silent; n0 renews
    cache.set_lease("n0", clock.wall() - 1)
    await r.reconcile(KEY)
    assert ex.calls[:2] == ["read leases n1", "write epoch 3 Recovering"]
    assert [a.member for a in ex.actions if isinstance(a, ReplacePod)] == [member(1)]
    assert cache.nodes["n1"].lease_read_at == clock.wall()


async def test_counts_alone_are_written_later() -> None:
    ex = RecordingExecutor(running(2))
    r, clock, cache = gang(ex)
    await r.reconcile(KEY)  # the counts (expected, ready, reported) change: first write
    assert ex.calls == ["load", "write epoch 2 Running"]
    pod = cache.gangs[KEY].pods["uid-1"]
    cache.upsert_pod(
        PodEntry("uid-1", KEY, dataclasses.replace(pod, phase="Pending"), JOB)
    )  # ready 2 -> 1
    await r.reconcile(KEY)
    assert ex.calls == ["load", "write epoch 2 Running"], "counts alone: not yet"
    assert [when - clock.now for when in clock.pending] == [pytest.approx(1.0)]
    clock.advance(1.0)  # the pass the planner asked for, by its timer alone
    await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}))
    assert ex.calls == ["load", "write epoch 2 Running", "write epoch 2 Running"]


async def test_a_node_that_is_back_loses_our_taint() -> None:
    ex = RecordingExecutor(running(2))
    r, clock, cache = gang(ex)
    cache.upsert_node(NodeView("n1", taints=((UNHEALTHY_TAINT, clock.wall() - 60),)))
    r.node_changed("n0")  # renewed, but never tainted: nothing to do
    cache.set_lease("n1", clock.wall())  # its kubelet renewed the Lease again
    r.node_changed("n1")
    await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}))
    assert ex.calls == ["untaint n1"]


async def test_events_do_not_retry_a_failing_gang_sooner_than_its_backoff() -> None:
    r = Recording(debounce=0.0, fail=1)
    r.cache.upsert_jobset(jobset(), Policy(), "")
    t0 = r.manual.now
    r.poke(KEY)
    r.manual.advance(0)
    await settle()  # the pass failed: retry in 1 s
    for _ in range(5):  # pod events meanwhile
        r.poke(KEY)
        r.manual.advance(0.1)
        await settle()
    assert r.ran == [t0], "not at the event rate"
    r.manual.advance(0.6)
    await settle()
    assert r.ran == [t0, pytest.approx(t0 + 1)]


async def finished() -> None:
    """Let every task the reconciler started end (a GangMembers write runs in a thread)."""
    await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}))


async def test_member_rows_are_written_when_one_changes_at_most_every_interval() -> None:
    """GangMembers (core/gangmembers.py): the first pass has the rows written; a report that
    changes a row within the interval is written once the interval is over, by a timer of its
    own, with no planning pass; passes that change no member make no rows."""
    ex = RecordingExecutor(running(2, expected=2, ready=2, reported=2))
    r, clock, cache = gang(ex)
    await r.reconcile(KEY)
    await finished()
    [(_, rows)] = ex.members
    assert [(m.pod, m.epoch, m.step) for m in rows] == [("p0", 2, 200), ("p1", 2, 200)]
    await r.reconcile(KEY)
    await finished()
    assert len(ex.members) == 1, "nothing changed: nothing written"
    clock.advance(1)
    pod = cache.gangs[KEY].pods["uid-1"]
    newer = dataclasses.replace(pod, newest_step=300, busy_epoch=2, busy_ms=(100,))
    cache.upsert_pod(PodEntry("uid-1", KEY, newer, JOB))
    await r.reconcile(KEY)
    await finished()
    assert len(ex.members) == 1, "within the interval: not yet"
    passes = r.passes
    clock.advance(4)  # the interval (5 s for 2 members) is over: its timer fires
    await finished()
    assert r.passes == passes, "no planning pass for it"
    assert [(m.pod, m.step) for m in ex.members[-1][1]] == [("p0", 200), ("p1", 300)]


async def test_passes_that_change_no_member_make_no_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows (O(members) to make and compare) are made only after a member's view, its pods
    or its Jobs changed (ClusterCache.rows_stamp), whatever the passes: a pass itself is O(1)
    for them."""
    made: list[int] = []
    real = gangmembers.member_rows

    def counted(pods: Any) -> tuple[MemberRow, ...]:
        rows = real(pods)
        made.append(len(rows))
        return rows

    monkeypatch.setattr("jobset_inplace.controller.reconciler.member_rows", counted)
    ex = RecordingExecutor(running(2, expected=2, ready=2, reported=2))
    r, clock, cache = gang(ex)
    await r.reconcile(KEY)
    await finished()
    assert made == [2]
    for _ in range(3):
        clock.advance(10)
        await r.reconcile(KEY)
        await finished()
    assert made == [2], "no member changed: no rows made"
    cache.upsert_job(JobEntry("another-job", "js-uid"))  # a Job seen: membership may change
    clock.advance(10)
    await r.reconcile(KEY)
    await finished()
    assert made == [2, 2], "made again"
    assert len(ex.members) == 1, "unchanged: not written"
    cache.upsert_pod(PodEntry("uid-1", KEY, cache.gangs[KEY].pods["uid-1"], JOB), deleted=True)
    await r.reconcile(KEY)
    await finished()
    assert made == [2, 2, 1], "a pod gone"
    assert [m.pod for m in ex.members[-1][1]] == ["p0"]


async def test_a_slow_member_rows_write_holds_no_pass() -> None:
    """At 10,000 members each GangMembers write took the apiserver's minute and failed (504):
    a pass must not wait for it (the barrier's opening would), and no second write starts
    while one is in flight; a change made during it is written after it, once the interval
    is over."""
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    class Slow(RecordingExecutor):
        def write_members(
            self, jobset: dict[str, Any], rows: Sequence[MemberRow], now: float
        ) -> None:
            super().write_members(jobset, rows, now)
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result()

    ex = Slow(running(2, expected=2, ready=2, reported=2))
    r, clock, cache = gang(ex)
    await r.reconcile(KEY)
    await settle()
    while not ex.members:  # the write has begun, in its thread
        await asyncio.sleep(0.001)
    pod = cache.gangs[KEY].pods["uid-1"]
    cache.upsert_pod(PodEntry("uid-1", KEY, dataclasses.replace(pod, newest_step=300), JOB))
    passes = r.passes
    await asyncio.wait_for(r.reconcile(KEY), 5)  # not held by the write in flight
    assert r.passes == passes + 1
    assert len(ex.members) == 1, "no second write while one runs"
    release.set()
    await finished()
    assert len(ex.members) == 1, "the change waits for the interval"
    clock.advance(5)
    await finished()
    assert [(m.pod, m.step) for m in ex.members[-1][1]] == [("p0", 200), ("p1", 300)]


async def test_a_failed_member_rows_write_fails_nothing_and_waits_for_a_change() -> None:
    class Refused(RecordingExecutor):
        def write_members(
            self, jobset: dict[str, Any], rows: Sequence[MemberRow], now: float
        ) -> None:
            super().write_members(jobset, rows, now)
            raise ApiException(status=404, reason="Not Found")  # e.g. the CRD not installed

    ex = Refused(running(2, expected=2, ready=2, reported=2))
    r, clock, cache = gang(ex)
    await r.reconcile(KEY)
    await finished()
    assert len(ex.members) == 1
    assert KEY not in r._failures, "the pass did not fail"
    clock.advance(60)
    await r.reconcile(KEY)
    await finished()
    assert len(ex.members) == 1, "not tried again until a row changes"
    pod = cache.gangs[KEY].pods["uid-1"]
    cache.upsert_pod(PodEntry("uid-1", KEY, dataclasses.replace(pod, newest_step=300), JOB))
    await r.reconcile(KEY)
    await finished()
    assert len(ex.members) == 2, "a row changed, the interval long over: tried at once"


async def test_a_new_leaders_wait_for_reports_counts_from_when_its_channel_is_named() -> None:
    """A leader that started long ago (its cache primed a minute before) meets a recovery past
    its barrier deadline whose status still names the previous leader's channel: the agents
    can send their reports again only once this leader's status names its own. Nobody is
    replaced until REPORT_AGAIN_S after that write, whenever the leader started."""
    old = ReportEndpoint("https://10.0.0.1:9444/v1/reports", "a" * 64, "leader-1")
    new = ReportEndpoint("https://10.0.0.2:9444/v1/reports", "b" * 64, "leader-2")
    clock = ManualClock()
    now = clock.wall()
    recovery = Recovery(
        epoch=3, started=now - 100, deadline=now - 10, causes={member(0): Cause.TRAINER_EXITED}
    )
    status = GangStatus(epoch=3, phase=Phase.RECOVERING, recovery=recovery, report_endpoint=old)
    ex = RecordingExecutor(status)
    r, clock, cache = gang(ex, clock=clock)  # every member reported epoch 2 only
    cache.report_endpoint, cache.reports_since = new, now - 60
    await r.reconcile(KEY)
    assert ex.calls[:2] == ["load", "write epoch 3 Recovering"], "its channel named"
    assert not [a for a in ex.actions if isinstance(a, ReplacePod)]
    clock.advance(REPORT_AGAIN_S - 1)
    await r.reconcile(KEY)
    assert not [a for a in ex.actions if isinstance(a, ReplacePod)], "still within the wait"
    clock.advance(2)
    for i in range(2):  # the nodes still renew their Leases
        cache.set_lease(f"n{i}", clock.wall() - 1)
    await r.reconcile(KEY)
    assert len([a for a in ex.actions if isinstance(a, ReplacePod)]) == 2, "then it acts"
