"""Straggler detection's rule: which members are slower than the gang, window after window.

In synchronous training every member's wall-clock step time is the slowest member's, so the
signal is each member's *busy* time per step (not waiting in collectives), which its agent
averages over fixed windows and publishes on the pod, newest first
(``jobset-inplace.dev/busy-ms-per-step``). A member is a straggler when, in each of its last
``windows`` windows, its busy time exceeds ``factor`` times the gang's median of the same
window (the i-th newest of every member that has one). Windows of different members are not
exactly simultaneous (each agent's clock runs from its own barrier opening); a straggler is
slow for many windows in a row, so the comparison does not need them to be.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

__all__ = ["MIN_MEMBERS", "stragglers"]

# A median of fewer than 3 members says nothing: of 2 members, either could be the slow one.
MIN_MEMBERS = 3


def stragglers(
    busy: Mapping[str, tuple[int, ...]], factor: float, windows: int
) -> dict[str, float]:
    """Each straggler's busy time in its newest window relative to that window's gang median
    (``busy``: member -> busy milliseconds per step, newest window first)."""
    medians: list[float] = []
    for i in range(windows):
        values = [h[i] for h in busy.values() if len(h) > i]
        if len(values) < MIN_MEMBERS:
            return {}
        medians.append(statistics.median(values))
    return {
        member: round(h[0] / max(medians[0], 1.0), 2)  # (a median of 0 ms: per 1 ms)
        for member, h in sorted(busy.items())
        if len(h) >= windows and all(h[i] > factor * medians[i] for i in range(windows))
    }
