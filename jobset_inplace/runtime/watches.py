"""Raw JSON list+watch threads for the high-volume kinds (pods, nodes, node Leases).

At thousands of pods kopf's per-event pipeline (about a millisecond and an asyncio worker per
object) was most of the controller's CPU and memory; the controller needs a few fields of
each object. Here a thread lists (paged), then watches from the list's resourceVersion, decodes
each object with ``json`` and at once into the few fields the cache keeps (``decode``; a listed
page's or a queued event's JSON is never kept: decoded, 5000 pods or nodes take ~100 MiB), and
hands the result to the event loop, which owns the cache. A watch that times out resumes from the
last resourceVersion seen (bookmarks keep it fresh); a watch the apiserver expired (410) is
followed by a full list, handed over as a resync so objects deleted in the gap are dropped. A
watch that failed (apiserver unreachable, an outage) reports when it watches again, and since
when it could not (``on_resumed``). Each restart and each handled event's lag (the delay from
the change the object records to its handling on the loop) go to the metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from jobset_inplace.backoff import Backoff, Retries
from jobset_inplace.times import parse_time

log = logging.getLogger("jobset_inplace.controller")

T = TypeVar("T")  # what ``decode`` keeps of an object
WatchEvent = tuple[str, T]  # ("ADDED" | "MODIFIED" | "DELETED", decoded object)
PAGE_SIZE = 500
WATCH_RETRY = Backoff(0.5, 10.0)  # a failed list or watch is tried again after this
# Why a watch started again: the watch or list failed (retried with backoff), or the apiserver
# ended it with an ERROR event (410: resourceVersion expired; relisted)
WATCH_FAILED, WATCH_EXPIRED = "error", "expired"
WATCH_REASONS = (WATCH_FAILED, WATCH_EXPIRED)


class WatchMetrics(Protocol):
    """What a watch tells the metrics (the controller's :class:`~.metrics.Metrics`)."""

    def watch_started(self, what: str) -> None: ...

    def watch_restarted(self, what: str, reason: str) -> None: ...

    def event_handled(self, what: str, lag_s: float) -> None: ...


class RawWatch(threading.Thread, Generic[T]):
    """List then watch with ``call`` (a client ``list_*`` method, arguments bound); every
    object goes through ``decode`` on this thread.

    ``replace`` puts a complete list into the cache: :meth:`prime` calls it synchronously
    before any planning pass; after a relist it runs on the loop, followed by ``on_relist``.
    Watch events go to ``on_events`` on the loop. :meth:`start_on` watches from the prime;
    with no loop (a watch whose callbacks only note things, thread-safely), everything is
    called on the watch's own thread."""

    def __init__(
        self,
        what: str,
        call: Callable[..., Any],
        *,
        decode: Callable[[dict[str, Any]], T],
        replace: Callable[[list[T]], None],
        on_events: Callable[[list[WatchEvent[T]]], None],
        on_relist: Callable[[], None],
        on_resumed: Callable[[float, float], None] | None = None,
        metrics: WatchMetrics,
        timeout_s: int = 300,
    ) -> None:
        super().__init__(daemon=True, name=f"watch-{what}")
        self.what, self.call, self.decode, self.timeout_s = what, call, decode, timeout_s
        self.replace, self.on_events, self.on_relist = replace, on_events, on_relist
        self.on_resumed, self.metrics = on_resumed, metrics
        self.down_since: float | None = None  # when listing or watching began to fail
        self.loop: asyncio.AbstractEventLoop | None = None
        self.rv: str | None = None  # None: list (again) before watching
        self.halt = threading.Event()
        # each object's newest change stamp (event_time) as last listed or seen, by uid: an
        # event whose change moved none (a removed field moves no managedFields time) has no lag
        self.stamps: dict[str, float] = {}
        metrics.watch_started(what)

    def list_now(self) -> list[T]:
        """A complete list, page by page, decoded; remembers its resourceVersion for the
        watch."""
        items: list[T] = []
        stamps: dict[str, float] = {}
        token: str | None = None
        rv = ""
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            doc = json.loads(self.call(**kwargs).data)
            for raw in doc.get("items") or ():
                items.append(self.decode(raw))
                if (stamp := event_time(raw)) is not None:
                    stamps[_uid(raw)] = stamp
            meta = doc.get("metadata") or {}
            del doc  # one page's JSON in memory at a time
            rv = rv or str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                break
        self.rv, self.stamps = rv, stamps
        return items

    def prime(self) -> int:
        """List and put the list into the cache now; the number of objects."""
        items = self.list_now()
        self.replace(items)
        return len(items)

    def _relisted(self, items: list[T]) -> None:
        self.replace(items)
        self.on_relist()

    def start_on(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.start()

    def _hand(self, call: Callable[..., None], *args: Any) -> None:
        """Run ``call`` on the loop, or here when there is none. A closed loop means the
        process is ending: nothing will take what this watch hears, so it stops (an event
        after the loop closed was logged as a failed watch and retried, at every leader's
        shutdown)."""
        if self.loop is None:
            call(*args)
            return
        try:
            self.loop.call_soon_threadsafe(call, *args)
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            self.halt.set()

    def run(self) -> None:
        retries = Retries(WATCH_RETRY)
        while not self.halt.is_set():
            try:
                if self.rv is None:
                    self._hand(self._relisted, self.list_now())
                self._watch()
                retries.succeeded()
            except Exception as e:  # a dead watch thread would blind the controller
                if self.down_since is None:
                    self.down_since = time.time()
                self.metrics.watch_restarted(self.what, WATCH_FAILED)
                wait = retries.failed()
                log.warning("%s watch: %r; retrying in %.1f s", self.what, e, wait)
                self.halt.wait(wait)

    def _watch(self) -> None:
        stream = self.call(
            watch=True,
            resource_version=self.rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_s,
            _preload_content=False,
        )
        if self.down_since is not None:
            down = self.down_since
            log.info("%s watch: watching again after %.1f s", self.what, time.time() - down)
            if self.on_resumed is not None:
                self._hand(self.on_resumed, down, time.time())
            # (after: a reader on another thread sees the watch failing until it was told)
            self.down_since = None
        try:
            for line in stream:
                if self.halt.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # e.g. 410 Gone: the resourceVersion expired
                    log.info("%s watch: %s; listing again", self.what, obj.get("message"))
                    self.metrics.watch_restarted(self.what, WATCH_EXPIRED)
                    self.rv = None
                    return
                self.rv = (obj.get("metadata") or {}).get("resourceVersion") or self.rv
                if kind != "BOOKMARK":
                    decoded = self.decode(obj)
                    changed = self._changed(str(kind), obj)
                    self._hand(self._handle, [(str(kind), decoded)], changed)
        finally:
            stream.release_conn()

    def _changed(self, kind: str, obj: Mapping[str, Any]) -> float | None:
        """When the change an event carries was made, if the object says so: its newest stamp,
        when that moved since the object was last listed or seen. A deletion is not stamped,
        nor is a change that only removed fields (the apiserver moves a managedFields time only
        for the fields an update set): such events have no lag."""
        uid = _uid(obj)
        if kind == "DELETED":
            self.stamps.pop(uid, None)
            return None
        stamp = event_time(obj)
        if stamp is None:
            return None
        before = self.stamps.get(uid)
        self.stamps[uid] = stamp
        return stamp if before is None or stamp > before else None

    def _handle(self, events: list[WatchEvent[T]], changed: float | None) -> None:
        """On the loop: hand ``events`` over; record the lag from ``changed`` (when the object
        says it changed) to now, when the cache has them."""
        self.on_events(events)
        if changed is not None:
            self.metrics.event_handled(self.what, time.time() - changed)


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def event_time(obj: Mapping[str, Any]) -> float | None:
    """When an API object (JSON) says it last changed: the newest time of its managedFields
    (the apiserver stamps each writer's entry when it changes the object; whole seconds) and,
    for a Lease, its renewTime (microseconds). None when it records neither."""
    meta = obj.get("metadata") or {}
    stamps = [entry.get("time") for entry in meta.get("managedFields") or ()]
    stamps.append((obj.get("spec") or {}).get("renewTime"))
    newest: float | None = None
    for stamp in stamps:
        if not isinstance(stamp, str):
            continue
        try:
            t = parse_time(stamp)
        except ValueError:  # not a time: no lag from this one
            continue
        if t is not None and (newest is None or t > newest):
            newest = t
    return newest
