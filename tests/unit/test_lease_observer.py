"""A candidate's node Lease watch hands over since when it saw every renewal without a break:
its first complete list, moved on by an outage of a renew interval or more, nothing while it
has not listed or is failing (the watch's thread driven by a scripted ``list_*`` call on a
fake wall clock; tests/unit/test_watches.py covers the watch itself)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from jobset_inplace.controller.lease_observer import LeaseObserver
from tests.unit.test_watches import NO_METRICS, Response, obj

Step = Callable[[], Response]  # one watch call: sets the clock, answers or raises


class Script:
    """The list answers at ``listed_at`` (or raises when None); each watch call runs the next
    step; when the steps run out the watch is halted."""

    def __init__(self, clock: list[float], listed_at: float | None, steps: list[Step]) -> None:
        self.clock, self.listed_at, self.steps = clock, listed_at, steps
        self.observer: LeaseObserver | None = None

    def __call__(self, **kwargs: Any) -> Response:
        assert self.observer is not None
        if not kwargs.get("watch"):
            if self.listed_at is None:
                self.observer.watch.halt.set()
                raise OSError("apiserver unreachable")
            self.clock[0] = self.listed_at
            return Response({"metadata": {"resourceVersion": "1"}, "items": [obj("node-a", "1")]})
        if not self.steps:
            self.observer.watch.halt.set()
            return Response()
        return self.steps.pop(0)()


def answer(clock: list[float], at: float) -> Step:
    def step() -> Response:
        clock[0] = at
        return Response(lines=[{"type": "MODIFIED", "object": obj("node-a", "2")}])

    return step


def fail(
    clock: list[float], at: float, observer: Callable[[], LeaseObserver], *, last: bool
) -> Step:
    def step() -> Response:
        clock[0] = at
        if last:  # the watch is failing when the lead is taken: stop the thread here
            observer().watch.halt.set()
        raise OSError("connection refused")

    return step


def handed_over(
    monkeypatch: pytest.MonkeyPatch,
    listed_at: float | None,
    steps: Callable[[list[float], Callable[[], LeaseObserver]], list[Step]],
) -> float | None:
    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    holder: list[LeaseObserver] = []
    script = Script(clock, listed_at, steps(clock, lambda: holder[0]))
    observer = LeaseObserver(script, NO_METRICS)
    holder.append(observer)
    script.observer = observer
    observer.start()
    observer.watch.join(10)
    assert not observer.watch.is_alive()
    return observer.handover()


def test_unbroken_since_the_first_list(monkeypatch: pytest.MonkeyPatch) -> None:
    got = handed_over(monkeypatch, 50.0, lambda c, _: [answer(c, 60.0), answer(c, 70.0)])
    assert got == 50.0


def test_an_outage_of_a_renew_interval_or_more_counts_again_from_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = handed_over(
        monkeypatch, 50.0, lambda c, o: [fail(c, 100.0, o, last=False), answer(c, 110.0)]
    )
    assert got == 110.0


def test_a_shorter_gap_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    got = handed_over(
        monkeypatch, 50.0, lambda c, o: [fail(c, 100.0, o, last=False), answer(c, 109.0)]
    )
    assert got == 50.0


def test_nothing_while_failing_or_before_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    assert handed_over(monkeypatch, 50.0, lambda c, o: [fail(c, 100.0, o, last=True)]) is None
    assert handed_over(monkeypatch, None, lambda c, o: []) is None
