"""The bench's pod watch (bench/podwatch.py) reads its list in pages and watches on from the
last resourceVersion it heard; it lists again only where the watch errs (a 10,000-pod list in
one piece had hung both of the bench's pod watches for minutes)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from bench import podwatch


class Answer:
    def __init__(
        self, body: dict[str, Any] | None = None, lines: tuple[dict[str, Any], ...] = ()
    ) -> None:
        self.data = json.dumps(body or {}).encode()
        self.lines = [json.dumps(x).encode() for x in lines]
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.lines)

    def close(self) -> None:
        self.closed = True


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class Apiserver:
    """Two pages of pods, then the scripted watches; then halts the watcher."""

    def __init__(self, watches: list[list[dict[str, Any]]], halt: threading.Event) -> None:
        self.watches, self.halt = watches, halt
        self.calls: list[dict[str, Any]] = []

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Answer:
        """(A failed check halts the watcher too: it would retry forever otherwise.)"""
        try:
            return self._answer(kw)
        except AssertionError:
            self.halt.set()
            raise

    def _answer(self, kw: dict[str, Any]) -> Answer:
        self.calls.append(kw)
        assert kw["_request_timeout"] == (podwatch.CONNECT_TIMEOUT_S, podwatch.READ_TIMEOUT_S)
        if kw.get("watch"):
            if not self.watches:
                self.halt.set()
                return Answer()
            return Answer(lines=tuple(self.watches.pop(0)))
        assert kw["limit"] == podwatch.LIST_PAGE
        if kw["_continue"] is None:
            return Answer(
                {"items": [pod("a", "1")], "metadata": {"resourceVersion": "10", "continue": "t"}}
            )
        assert kw["_continue"] == "t"
        return Answer({"items": [pod("b", "2")], "metadata": {"resourceVersion": "10"}})


def test_pages_are_one_list_and_a_watch_goes_on_from_what_it_heard() -> None:
    halt = threading.Event()
    api = Apiserver(
        [
            [
                {"type": "ADDED", "object": pod("c", "11")},
                {"type": "BOOKMARK", "object": pod("", "15")},
            ],
            [{"type": "MODIFIED", "object": pod("c", "16")}],
            [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
        ],
        halt,
    )
    lists: list[list[str]] = []
    events: list[tuple[str, str]] = []
    errors: list[str] = []
    podwatch.watch_pods(
        api,
        "ns",
        "sel",
        lambda kind, p: events.append((kind, p["metadata"]["name"])),
        halt,
        on_error=errors.append,
        on_list=lambda items: lists.append([p["metadata"]["name"] for p in items]),
    )
    assert errors == []
    assert lists == [["a", "b"], ["a", "b"]], "listed at the start and after the ERROR only"
    assert events == [("ADDED", "c"), ("MODIFIED", "c")], "bookmarks are not events"
    watches = [c["resource_version"] for c in api.calls if c.get("watch")]
    assert watches == ["10", "15", "16", "10"], "each watch from the last version heard"
    assert all(c["allow_watch_bookmarks"] for c in api.calls if c.get("watch"))
