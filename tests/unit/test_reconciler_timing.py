"""When the reconciler plans a gang after events: the first event after a quiet spell at once
(a failure's first signal waits for nothing), a burst after it coalesced at most every debounce,
never sooner than the pass spacing. Passes are recorded instead of run."""

from __future__ import annotations

import asyncio

from jobset_inplace.controller.cache import ClusterCache, GangKey
from jobset_inplace.controller.operator import Reconciler

KEY: GangKey = ("ns", "gang")


class Recording(Reconciler):
    """A reconciler whose passes only record their loop time."""

    def __init__(self, debounce: float) -> None:
        super().__init__(ClusterCache(), executor=None, debounce=debounce)  # type: ignore[arg-type]
        self.ran: list[float] = []

    async def reconcile(self, key: GangKey) -> None:
        self.ran.append(asyncio.get_running_loop().time())


async def test_first_event_after_quiet_is_planned_at_once() -> None:
    r = Recording(debounce=0.5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r.poke(KEY)
    await asyncio.sleep(0.05)
    assert len(r.ran) == 1
    assert r.ran[0] - t0 < 0.05  # not after the 0.5 s debounce


async def test_burst_after_a_pass_is_coalesced_into_one_pass_a_debounce_later() -> None:
    r = Recording(debounce=0.3)
    loop = asyncio.get_running_loop()
    r.poke(KEY)
    await asyncio.sleep(0.02)
    first = r.ran[0]
    for _ in range(20):  # a burst of events right after the first pass
        r.poke(KEY)
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.4)
    assert len(r.ran) == 2
    assert r.ran[1] - first >= 0.3 - 0.01
    assert loop.time() - first >= 0.4


async def test_pass_spacing_still_applies_to_the_first_event() -> None:
    r = Recording(debounce=0.05)
    loop = asyncio.get_running_loop()
    r._not_before[KEY] = loop.time() + 0.3  # the last pass's planning was expensive
    t0 = loop.time()
    r.poke(KEY)
    await asyncio.sleep(0.1)
    assert r.ran == []
    await asyncio.sleep(0.3)
    assert len(r.ran) == 1
    assert r.ran[0] - t0 >= 0.3 - 0.01


async def test_explicit_delay_is_kept() -> None:
    r = Recording(debounce=0.0)
    t0 = asyncio.get_running_loop().time()
    r.poke(KEY, 0.2)
    await asyncio.sleep(0.1)
    assert r.ran == []
    await asyncio.sleep(0.2)
    assert len(r.ran) == 1
    assert r.ran[0] - t0 >= 0.2 - 0.01


async def test_forget_cancels_the_pending_pass_and_drops_the_gangs_state() -> None:
    r = Recording(debounce=0.0)
    loop = asyncio.get_running_loop()
    r.poke(KEY)
    await asyncio.sleep(0.01)
    r._not_before[KEY] = loop.time() + 0.1
    r._locks[KEY] = asyncio.Lock()
    r.poke(KEY, 0.1)  # a pass is due
    r.forget(KEY)  # the JobSet was deleted
    await asyncio.sleep(0.2)
    assert len(r.ran) == 1  # only the pass before the deletion
    assert (r._timers, r._not_before, r._fired, r._locks) == ({}, {}, {}, {})


async def test_forget_keeps_a_lock_held_by_a_running_pass() -> None:
    r = Recording(debounce=0.0)
    lock = r._locks.setdefault(KEY, asyncio.Lock())
    async with lock:
        r.forget(KEY)
        assert r._locks[KEY] is lock  # a new pass must still wait for the running one
