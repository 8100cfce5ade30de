"""The benchmarks' ratio intervals (bench/stats.py)."""

from __future__ import annotations

import pytest

from bench.stats import median_interval, ratio_of_medians


def test_the_interval_holds_the_ratio_and_narrows_with_more_samples() -> None:
    a = [5.0, 5.5, 6.0, 6.2, 7.0]
    b = [10.0, 11.0, 12.0, 13.0, 20.0]
    few = ratio_of_medians(a, b)
    assert few.ratio == 0.5
    assert few.low < few.ratio < few.high
    many = ratio_of_medians(a * 4, b * 4)
    assert many.high - many.low < few.high - few.low
    assert ratio_of_medians(a, b) == few, "a fixed seed: the same results, the same interval"


def test_identical_samples_give_a_point() -> None:
    r = ratio_of_medians([2.0, 2.0, 2.0], [4.0, 4.0])
    assert (r.ratio, r.low, r.high) == (0.5, 0.5, 0.5)
    assert r.text() == "0.50x (95% interval 0.50-0.50; n = 3, 2)"


@pytest.mark.parametrize(
    ("a", "b", "what"),
    [([1.0], [1.0, 2.0], "2 or more"), ([1.0, 2.0], [0.0, 1.0], "> 0")],
)
def test_too_few_values_or_a_zero_denominator_are_refused(
    a: list[float], b: list[float], what: str
) -> None:
    with pytest.raises(ValueError, match=what):
        ratio_of_medians(a, b)


def test_a_medians_interval_holds_the_median_and_needs_two_values() -> None:
    low, high = median_interval([4.0, 5.0, 6.0, 5.5, 4.5])
    assert low <= 5.0 <= high
    assert median_interval([3.0, 3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="2 or more"):
        median_interval([1.0])
