"""A gang's pods as the benchmark sees them: one paged list and a watch of raw JSON (the generated
client's model objects cost milliseconds per event, which at thousands of pods would slow the
benchmark itself), so that a path's end is the moment the event that ends it arrives, never
the next turn of a poll (a full LIST of 1000 pods cost 0.64 CPU-s on these 2 cores)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from jobset_inplace import names
from jobset_inplace.core.decode import member_key

PodEvent = Callable[[str, dict[str, Any]], None]


# A list is read in pages: at 10,000 pods one list is about 95 MB of JSON, and on the loaded
# 2 cores the apiserver sent such lists so slowly that both of the bench's pod watches sat in
# their relist for over ten minutes while the gang was made (2026-12-06).
LIST_PAGE = 500
WATCH_S = 300  # the apiserver ends each watch after this long; the bench watches on from there
# No byte for this long and a read errs (the list and watch start again): a watch hears a
# bookmark about every minute, a page comes within seconds unless the connection is stuck.
READ_TIMEOUT_S = WATCH_S + 30
CONNECT_TIMEOUT_S = 10


def _pods(core: client.CoreV1Api, namespace: str, selector: str, **kw: Any) -> Any:
    """A list or watch (``kw``) of the selected pods as raw JSON, with the read timeout."""
    return core.list_namespaced_pod(
        namespace,
        label_selector=selector,
        _preload_content=False,
        _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
        **kw,
    )


def list_pods(
    core: client.CoreV1Api, namespace: str, selector: str
) -> tuple[list[dict[str, Any]], str]:
    """The pods ``selector`` selects in ``namespace``, read in pages of :data:`LIST_PAGE`, and
    the resourceVersion of that list (one snapshot: every page is of the first's)."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        resp = _pods(core, namespace, selector, limit=LIST_PAGE, _continue=token)
        page = json.loads(resp.data)
        items += page["items"]
        token = page["metadata"].get("continue")
        if not token:
            return items, page["metadata"]["resourceVersion"]


def _watch_from(
    core: client.CoreV1Api,
    namespace: str,
    selector: str,
    rv: str,
    *,
    on_event: PodEvent,
    halt: threading.Event,
) -> str | None:
    """One watch from ``rv`` until the apiserver ends it (or ``halt``): the last
    resourceVersion it heard (bookmarks too), or None where it must list again (an ERROR
    event: 410, the version too old)."""
    stream = _pods(
        core,
        namespace,
        selector,
        resource_version=rv,
        allow_watch_bookmarks=True,
        watch=True,
        timeout_seconds=WATCH_S,
    )
    for line in stream:
        if halt.is_set():
            stream.close()
            return rv
        if not line.strip():
            continue
        ev = json.loads(line)
        if ev.get("type") == "ERROR":
            stream.close()
            return None
        rv = ev["object"]["metadata"]["resourceVersion"]
        if ev["type"] != "BOOKMARK":
            on_event(ev["type"], ev["object"])
    return rv


def watch_pods(
    core: client.CoreV1Api,
    namespace: str,
    selector: str,
    on_event: PodEvent,
    halt: threading.Event,
    *,
    on_error: Callable[[str], None],
    on_list: Callable[[list[dict[str, Any]]], None] | None = None,
) -> None:
    """List, then watch, the pods of ``namespace`` that ``selector`` selects until ``halt``:
    ``on_event(type, pod)`` for each event; the listed pods go to ``on_list`` (without it, to
    ``on_event`` as ADDED), again after every relist. A watch the apiserver ends is taken up
    again from the last resourceVersion seen (bookmarks too); one that errs, or a read that
    hears nothing for :data:`READ_TIMEOUT_S`, lists again."""
    while not halt.is_set():
        try:
            listed, last = list_pods(core, namespace, selector)
            rv: str | None = last
            if on_list is not None:
                on_list(listed)
            else:
                for p in listed:
                    on_event("ADDED", p)
            while not halt.is_set() and rv is not None:
                rv = _watch_from(core, namespace, selector, rv, on_event=on_event, halt=halt)
        except Exception as e:  # a bench thread must not die silently
            on_error(f"pod watch: {type(e).__name__}: {e}")
            halt.wait(0.5)


@dataclass(frozen=True)
class Seen:
    """What the end of a recovery looks at in one pod."""

    member: str | None
    running: bool  # phase Running and not being deleted
    deleting: bool
    attempt: str | None  # JobSet's restart attempt label
    node: str
    containers: tuple[tuple[str, str], ...]  # (name, image) of each

    @classmethod
    def of(cls, pod: dict[str, Any]) -> Seen:
        meta, status = pod["metadata"], pod.get("status") or {}
        labels = meta.get("labels") or {}
        deleting = bool(meta.get("deletionTimestamp"))
        return cls(
            member=member_key(labels),
            running=status.get("phase") == "Running" and not deleting,
            deleting=deleting,
            attempt=labels.get(names.RESTART_ATTEMPT_LABEL),
            node=(pod.get("spec") or {}).get("nodeName") or "",
            containers=tuple(
                (c["name"], c.get("image", ""))
                for c in (pod.get("spec") or {}).get("containers", [])
            ),
        )


@dataclass(frozen=True)
class Goal:
    """``size`` members running, each in a pod of restart ``attempt`` (None: any) on another
    node than ``avoid``."""

    size: int
    attempt: int | None = None
    avoid: str = ""

    def counts(self, seen: Seen) -> bool:
        return (
            seen.running
            and seen.member is not None
            and (self.attempt is None or seen.attempt == str(self.attempt))
            and not (self.avoid and seen.node == self.avoid)
        )


class GangPods:
    """The pods of gang ``gang`` kept from one watch, and the moment a :class:`Goal` was met:
    counted as each event arrives (O(1) per event), not by listing every pod again."""

    def __init__(self, core: client.CoreV1Api, namespace: str, gang: str) -> None:
        self.pods: dict[str, Seen] = {}
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._halt = threading.Event()
        self._listed = threading.Event()
        self._goal: Goal | None = None
        self._counted: dict[str, set[str]] = {}  # member -> pods that count for the goal
        self._met_at: float | None = None
        self._thread = threading.Thread(
            target=watch_pods,
            args=(
                core,
                namespace,
                f"{names.JOBSET_NAME_LABEL}={gang}",
                self._event,
                self._halt,
            ),
            kwargs={"on_error": self.errors.append, "on_list": self._list},
            daemon=True,
            name=f"pods-{gang}",
        )

    def __enter__(self) -> GangPods:
        self._thread.start()
        if not self._listed.wait(60):
            self._halt.set()
            raise TimeoutError(f"{self._thread.name}: no list within 60s: {self.errors[-3:]}")
        return self

    def __exit__(self, *_: object) -> None:
        self._halt.set()

    def _list(self, items: list[dict[str, Any]]) -> None:
        with self._cond:
            self.pods = {p["metadata"]["name"]: Seen.of(p) for p in items}
            if self._goal is not None:
                self._count(self._goal)
                self._check(time.monotonic())
            self._cond.notify_all()
        self._listed.set()

    def _count(self, goal: Goal) -> None:
        self._counted = {}
        for name, seen in self.pods.items():
            if seen.member is not None and goal.counts(seen):
                self._counted.setdefault(seen.member, set()).add(name)

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        name, now = pod["metadata"]["name"], time.monotonic()
        with self._cond:
            if kind == "DELETED":
                old = self.pods.pop(name, None)
            else:
                old, self.pods[name] = self.pods.get(name), Seen.of(pod)
            if self._goal is not None:
                if old is not None and old.member is not None:
                    self._counted.get(old.member, set()).discard(name)
                new = self.pods.get(name)
                if new is not None and new.member is not None and self._goal.counts(new):
                    self._counted.setdefault(new.member, set()).add(name)
                self._check(now)
            self._cond.notify_all()

    def _check(self, now: float) -> None:
        assert self._goal is not None
        if self._met_at is None and sum(1 for p in self._counted.values() if p) >= self._goal.size:
            self._met_at = now

    def aim(self, goal: Goal) -> None:
        """Count towards ``goal`` from now on (from the pods as they are: it may hold at once)."""
        with self._cond:
            self._goal, self._met_at = goal, None
            self._count(goal)
            self._check(time.monotonic())

    def met(self, timeout: float) -> float | None:
        """The monotonic time the goal was met (the arrival of the event that met it), waiting
        at most ``timeout`` seconds; None if it was not met by then."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._met_at is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))
            return self._met_at

    def counted(self) -> int:
        """Members counted towards the goal so far."""
        with self._cond:
            return sum(1 for p in self._counted.values() if p)

    def terminating_on(self, node: str) -> list[str]:
        with self._cond:
            return sorted(n for n, s in self.pods.items() if s.node == node and s.deleting)
