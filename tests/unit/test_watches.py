"""The raw watch thread's list/watch protocol, driven by a scripted ``list_*`` call (the
thread's logic only; the controller's integration tests run it against a real apiserver)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from jobset_inplace.runtime.watches import RawWatch, WatchEvent, WatchMetrics, event_time


class _NoMetrics:
    def watch_started(self, what: str) -> None:
        pass

    def watch_restarted(self, what: str, reason: str) -> None:
        pass

    def event_handled(self, what: str, lag_s: float) -> None:
        pass


NO_METRICS = _NoMetrics()


class Response:
    def __init__(
        self, doc: dict[str, Any] | None = None, lines: Sequence[dict[str, Any]] = ()
    ) -> None:
        self.data = json.dumps(doc or {}).encode()
        self.lines = [json.dumps(line).encode() + b"\n" for line in lines]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.lines)

    def release_conn(self) -> None:
        pass


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": {"big": "x" * 100}}


def name(o: dict[str, Any]) -> str:
    """The decode under test: keeps an object's name only."""
    return str(o["metadata"]["name"])


class Scripted:
    """Answers list and watch calls from scripts; records the calls."""

    def __init__(self, lists: list[Response], watches: list[Response]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[dict[str, Any]] = []
        self.watch: RawWatch[Any] | None = None  # halted when the watch script runs out

    def __call__(self, **kwargs: Any) -> Response:
        self.calls.append(kwargs)
        if not kwargs.get("watch"):
            return self.lists.pop(0)
        if not self.watches:
            assert self.watch is not None
            self.watch.halt.set()
            return Response()
        return self.watches.pop(0)


def run_to_the_end(
    call: Scripted,
    what: str,
    *,
    metrics: WatchMetrics = NO_METRICS,
    replace: Callable[[list[str]], None] = lambda _: None,
    on_relist: Callable[[], None] = lambda: None,
) -> tuple[RawWatch[str], list[WatchEvent[str]]]:
    """A watch of ``call``'s script, primed, then run on an event loop until the script ends:
    the watch and the events it handed over."""
    events: list[WatchEvent[str]] = []
    w = RawWatch(
        what,
        call,
        decode=name,
        replace=replace,
        on_events=events.extend,
        on_relist=on_relist,
        metrics=metrics,
    )
    call.watch = w
    w.prime()

    async def run_until_the_script_ends() -> None:
        w.start_on(asyncio.get_running_loop())
        await asyncio.to_thread(w.join, 10)
        await asyncio.sleep(0)  # run what the thread handed over to the loop

    asyncio.run(run_until_the_script_ends())
    return w, events


def test_list_pages_through_continue_tokens_and_keeps_the_first_resource_version() -> None:
    call = Scripted(
        lists=[
            Response(
                {"metadata": {"resourceVersion": "10", "continue": "t1"}, "items": [obj("a", "5")]}
            ),
            Response({"metadata": {"resourceVersion": "10"}, "items": [obj("b", "6")]}),
        ],
        watches=[],
    )
    got: list[list[str]] = []
    events: list[WatchEvent[str]] = []
    w = RawWatch(
        "things",
        call,
        decode=name,
        replace=got.append,
        on_events=events.extend,
        on_relist=lambda: None,
        metrics=NO_METRICS,
    )
    assert w.prime() == 2
    assert got == [["a", "b"]]  # decoded, page by page
    assert w.rv == "10"
    assert call.calls[1]["_continue"] == "t1"


def test_watch_resumes_from_the_last_version_and_relists_after_an_expired_one() -> None:
    relisted: list[str] = []
    replaced: list[list[str]] = []
    call = Scripted(
        lists=[
            Response({"metadata": {"resourceVersion": "10"}, "items": [obj("a", "5")]}),
            Response({"metadata": {"resourceVersion": "40"}, "items": [obj("b", "39")]}),
        ],
        watches=[
            Response(
                lines=[
                    {"type": "MODIFIED", "object": obj("a", "11")},
                    {"type": "BOOKMARK", "object": obj("", "20")},
                ]
            ),
            Response(lines=[{"type": "ERROR", "object": {"message": "too old", "code": 410}}]),
            Response(lines=[{"type": "DELETED", "object": obj("b", "41")}]),
        ],
    )
    w, events = run_to_the_end(
        call, "things", replace=replaced.append, on_relist=lambda: relisted.append("x")
    )
    assert not w.is_alive()
    watch_versions = [c["resource_version"] for c in call.calls if c.get("watch")]
    assert watch_versions == ["10", "20", "40", "41"]  # bookmark, relist, last event
    assert events == [("MODIFIED", "a"), ("DELETED", "b")]  # decoded on the thread
    assert relisted == ["x"]
    assert replaced[1] == ["b"]


def test_event_time_is_the_newest_change_the_object_records() -> None:
    pod = {
        "metadata": {
            "managedFields": [
                {"manager": "kubelet", "time": "2026-11-21T10:00:05Z"},
                {"manager": "agent", "time": "2026-11-21T10:00:09Z"},
                {"manager": "odd", "time": "not a time"},
                {"manager": "none"},
            ]
        }
    }
    assert event_time(pod) == pytest.approx(1_795_255_209.0)
    lease = {
        "metadata": {"managedFields": [{"time": "2026-11-21T10:00:09Z"}]},
        "spec": {"renewTime": "2026-11-21T10:00:09.750000Z"},
    }
    assert event_time(lease) == pytest.approx(1_795_255_209.75)  # the microseconds win
    assert event_time({"metadata": {}}) is None


def test_an_event_after_the_loop_closed_stops_the_watch_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The process is ending (its event loop closed before the watch thread was told): the
    next event has nobody to take it, so the watch stops instead of logging a failed watch
    and retrying (seen at every leader's shutdown in the 10,000-pod runs)."""
    call = Scripted(
        lists=[Response({"metadata": {"resourceVersion": "1"}, "items": []})],
        watches=[Response(lines=[{"type": "ADDED", "object": obj("a", "2")}])] * 3,
    )
    events: list[WatchEvent[str]] = []
    w = RawWatch(
        "things",
        call,
        decode=name,
        replace=lambda _: None,
        on_events=events.extend,
        on_relist=lambda: None,
        metrics=NO_METRICS,
    )
    call.watch = w
    w.prime()
    loop = asyncio.new_event_loop()
    loop.close()
    w.start_on(loop)
    w.join(10)
    assert not w.is_alive()
    assert w.halt.is_set()
    assert events == []
    assert [c for c in call.calls if c.get("watch")] == [call.calls[1]], "no watch again"
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
