"""Straggler detection's signal, free of I/O: this pod's busy time per step, averaged over
fixed windows of the agent's clock, from the trainers' progress records (their ``busyS``, the
busy seconds summed over their steps). The monitor publishes the last windows on the pod
(``jobset-inplace.dev/busy-ms-per-step``, newest first) once per window: with W-second windows
that is one pod patch per member per W seconds (5000 members, 5 min: 17 writes/s). The
controller compares the members (`jobset_inplace.core.stragglers`).
"""

from __future__ import annotations

from collections.abc import Mapping

from jobset_inplace.trainer.progress import MAX_BUSY_MS, Progress

__all__ = ["BusyWindows"]


class BusyWindows:
    """Busy milliseconds per step in each closed window, newest first (at most ``keep``)."""

    def __init__(self, window: float, keep: int) -> None:
        self.window, self.keep = window, keep
        self.start: float | None = None
        self.base: dict[str, Progress] = {}
        self.history: tuple[int, ...] = ()

    def opened(self) -> None:
        """A new epoch's trainers start: windows start over (the controller compares members
        of one epoch; the agent's report of an epoch removes the old annotation)."""
        self.start, self.base, self.history = None, {}, ()

    def observe(self, now: float, records: Mapping[str, Progress]) -> tuple[int, ...] | None:
        """Fold in the records just read; the new history when a window closed with steps in
        it (the slowest trainer of the pod counts), else None."""
        measured = {n: r for n, r in records.items() if r.busy is not None}
        if self.start is None:
            if measured:
                self.start, self.base = now, measured
            return None
        if now - self.start < self.window:
            return None
        per_step = [
            (r.busy - b.busy) / (r.step - b.step)
            for n, r in measured.items()
            if (b := self.base.get(n)) is not None
            and b.busy is not None
            and r.busy is not None
            and r.step > b.step
        ]
        self.start, self.base = now, measured
        if not per_step:
            return None  # no step in the window (a hang is hang detection's business)
        ms = min(MAX_BUSY_MS, max(0, round(max(per_step) * 1000)))
        self.history = (ms, *self.history)[: self.keep]
        return self.history
