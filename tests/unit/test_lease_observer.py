"""A candidate's node Lease watch hands over since when it saw every renewal without a break:
its first complete list, moved on by an outage of a renew interval or more, nothing while it
has not listed or is failing (the watch's thread driven by a scripted ``list_*`` call on a
fake wall clock; tests/unit/test_watches.py covers the watch itself)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from jobset_inplace.controller.lease_observer import QUIET_S, LeaseObserver
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


def run_out(
    monkeypatch: pytest.MonkeyPatch,
    listed_at: float | None,
    steps: Callable[[list[float], Callable[[], LeaseObserver]], list[Step]],
) -> tuple[LeaseObserver, list[float]]:
    """An observer whose watch ran its script to the end on the fake clock (returned)."""
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
    return observer, clock


def handed_over(
    monkeypatch: pytest.MonkeyPatch,
    listed_at: float | None,
    steps: Callable[[list[float], Callable[[], LeaseObserver]], list[Step]],
) -> float | None:
    return run_out(monkeypatch, listed_at, steps)[0].handover()


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


def test_nothing_after_hearing_no_renewal_for_two_renew_intervals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stalled connection raises nothing, and an apiserver that cannot write stops every
    renewal: a quiet watch vouches for nothing."""
    observer, clock = run_out(monkeypatch, 50.0, lambda c, _: [answer(c, 60.0)])
    clock[0] = 60.0 + QUIET_S + 0.1
    assert observer.handover() is None


def test_handed_over_once() -> None:
    """A startup retried after a failed prime must not get the time again: the observer
    stopped at the first handover and saw nothing since."""
    observer = LeaseObserver(lambda **_: Response(), NO_METRICS)
    observer._listed([])
    assert observer.handover() is not None
    assert observer.handover() is None


def test_a_reader_sees_the_watch_failing_until_the_outage_is_accounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float | None] = []
    resumed = LeaseObserver._resumed

    def spy(self: LeaseObserver, down_since: float, up_at: float) -> None:
        seen.append(self.watch.down_since)
        resumed(self, down_since, up_at)

    monkeypatch.setattr(LeaseObserver, "_resumed", spy)
    got = handed_over(
        monkeypatch, 50.0, lambda c, o: [fail(c, 100.0, o, last=False), answer(c, 110.0)]
    )
    assert seen == [100.0], "down_since cleared only after the outage was accounted"
    assert got == 110.0
