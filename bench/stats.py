"""Intervals for the benchmarks' ratios.

A ratio of two paths' medians from one run, with a 95 % percentile-bootstrap interval: both
samples resampled with replacement, independently, ``RESAMPLES`` times from a fixed seed (the
same results give the same interval). Hand-written: scipy's ``stats.bootstrap`` does the same
and more, but would add scipy (~40 MB) to the dev environment that renders the pages, for
these few lines.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

RESAMPLES = 10_000
LEVEL = 0.95


@dataclass(frozen=True)
class Ratio:
    """``median(a) / median(b)`` and its interval, with each sample's size."""

    ratio: float
    low: float
    high: float
    n_a: int
    n_b: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """``0.48x (95% interval 0.44-0.53; n = 10, 10)``"""
        return (
            f"{self.ratio:.2f}x ({LEVEL:.0%} interval {self.low:.2f}-{self.high:.2f}; "
            f"n = {self.n_a}, {self.n_b})"
        )


def ratio_of_medians(a: list[float], b: list[float], seed: int = 0) -> Ratio:
    """The ratio of ``a``'s median to ``b``'s, with its percentile-bootstrap interval."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(
            f"a ratio's interval needs 2 or more values a side (n = {len(a)}, {len(b)})"
        )
    if min(b) <= 0:
        raise ValueError("the denominator's values must be > 0")
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(RESAMPLES)
    )
    tail = (1 - LEVEL) / 2
    return Ratio(
        statistics.median(a) / statistics.median(b),
        ratios[int(tail * RESAMPLES)],
        ratios[min(RESAMPLES - 1, int((1 - tail) * RESAMPLES))],
        len(a),
        len(b),
    )


def median_interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """The percentile-bootstrap 95 % interval of ``values``' median."""
    if len(values) < 2:
        raise ValueError(f"a median's interval needs 2 or more values (n = {len(values)})")
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(RESAMPLES)
    )
    tail = (1 - LEVEL) / 2
    return medians[int(tail * RESAMPLES)], medians[min(RESAMPLES - 1, int((1 - tail) * RESAMPLES))]


def mean_interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """The percentile-bootstrap 95 % interval of ``values``' mean."""
    if len(values) < 2:
        raise ValueError(f"a mean's interval needs 2 or more values (n = {len(values)})")
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(RESAMPLES))
    tail = (1 - LEVEL) / 2
    return means[int(tail * RESAMPLES)], means[min(RESAMPLES - 1, int((1 - tail) * RESAMPLES))]


def stratified_sum_interval(groups: list[list[float]], seed: int = 0) -> tuple[float, float]:
    """The percentile-bootstrap 95 % interval of the total of ``groups``' values, each group
    resampled with replacement within itself (stratified: every resample keeps each group's
    size, as a run that injects its kinds in turn keeps its mix)."""
    if not groups or any(len(g) < 2 for g in groups):
        raise ValueError(
            f"a stratified interval needs 2 or more values a group (n = {[len(g) for g in groups]})"
        )
    rng = random.Random(seed)
    totals = sorted(sum(sum(rng.choices(g, k=len(g))) for g in groups) for _ in range(RESAMPLES))
    tail = (1 - LEVEL) / 2
    return totals[int(tail * RESAMPLES)], totals[min(RESAMPLES - 1, int((1 - tail) * RESAMPLES))]
