"""The controller's sense of time, injectable: scheduling time (the event loop's monotonic clock
and its timers), wall time (what snapshots and the API use) and the planner's CPU time (what pass
spacing is measured in). Tests give the reconciler a clock they advance by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on the scheduling clock (what :meth:`call_at` counts in)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch."""
        ...

    def cpu(self) -> float:
        """CPU seconds of the calling thread."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once the scheduling clock reaches ``when``."""
        ...


class LoopClock:
    """The running event loop's clock and timers, ``time.time`` and ``time.thread_time``."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        return time.time()

    def cpu(self) -> float:
        # CPU time: on a busy machine, wall time would overstate what a pass cost
        return time.thread_time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_at(when, callback)
