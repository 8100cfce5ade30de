"""A clock the tests advance by hand (the reconciler's injectable :class:`Clock`): timers fire
in time order when :meth:`ManualClock.advance` passes them; no real time goes by."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

WALL_OFFSET = 1_700_000_000.0


@dataclass
class ManualTimer:
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    def __init__(self, start: float = 100.0) -> None:
        self.now = start
        self.cpu_s = 0.0
        self.cpu_step = 0.0  # CPU seconds each cpu() reading adds: what a planning pass "costs"
        self._timers: list[tuple[float, int, ManualTimer]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL_OFFSET + self.now

    def cpu(self) -> float:
        self.cpu_s += self.cpu_step
        return self.cpu_s

    def call_at(self, when: float, callback: Callable[[], None]) -> ManualTimer:
        timer = ManualTimer(callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, firing every timer due on the way, in order."""
        until = self.now + seconds
        while self._timers and self._timers[0][0] <= until:
            when, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                timer.callback()
        self.now = until

    @property
    def pending(self) -> list[float]:
        return sorted(when for when, _, t in self._timers if not t.cancelled)
