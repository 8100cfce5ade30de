"""A standby replica's watch of the node Leases, from its start until it leads.

A node's silence counts only from when the controller has seen every Lease renewal without a
break (:func:`~jobset_inplace.core.detection.lease_seen`): a renewal made while it could not
watch would not have been seen. A replica that only began watching when it took the lead must
therefore wait a renew interval plus ``node-unhealthy-after`` from its takeover before it may
call any node dead. When the leader dies with a node (its pod was there), that wait came on top
of the takeover: in the lockstep soak the first signal of such a node came 25-28 s after the
gang stopped instead of at most 10 s (docs/benchmarks.md, "The hour in lockstep").

So every candidate watches the Leases from its start (one watch; of the Leases it keeps
nothing, only since when it has worked without a break and when it last heard one) and hands
that time over when it takes the lead; the leader's own watch, primed from a fresh list,
carries on from there. It hands over nothing (the leader counts from its own start, as
without it) when its watch is failing, or has heard no renewal for two renew intervals (a
stalled connection raises nothing; an apiserver that cannot write stops every renewal, and
the old leader's with them), and nothing a second time (a startup retried after a failed
prime: the observer stopped at the first handover and saw nothing since)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from jobset_inplace import names
from jobset_inplace.core.detection import LEASE_RENEW_INTERVAL_S, observation_restarts
from jobset_inplace.runtime.watches import RawWatch, WatchEvent, WatchMetrics

WHAT = "standby node Leases"  # its metrics label: standby_node_leases
# Heard nothing for this long: the watch may be stalled, or nothing could renew.
QUIET_S = 2 * LEASE_RENEW_INTERVAL_S


class LeaseObserver:
    """Watches the node Leases on its own thread; :meth:`handover` stops it and says since
    when it saw every renewal."""

    def __init__(self, list_leases: Callable[..., Any], metrics: WatchMetrics) -> None:
        """``list_leases``: a client ``list_namespaced_lease`` with the node Lease namespace
        bound (see :func:`lease_observer`)."""
        self._lock = threading.Lock()
        self._since: float | None = None  # its first complete list, moved on by outages
        self._heard: float | None = None  # its last list or Lease change
        self._handed = False
        self.watch: RawWatch[None] = RawWatch(
            WHAT,
            list_leases,
            decode=lambda _: None,
            replace=self._listed,
            on_events=self._heard_one,
            on_relist=lambda: None,
            on_resumed=self._resumed,
            metrics=metrics,
        )

    def start(self) -> None:
        self.watch.start_on(None)

    def _listed(self, _: list[None]) -> None:
        with self._lock:
            self._heard = time.time()
            if self._since is None:
                self._since = self._heard

    def _heard_one(self, _: list[WatchEvent[None]]) -> None:
        with self._lock:
            self._heard = time.time()

    def _resumed(self, down_since: float, up_at: float) -> None:
        with self._lock:
            if self._since is not None:
                self._since = observation_restarts(self._since, down_since, up_at)

    def handover(self) -> float | None:
        """Stop watching; since when every Lease renewal was seen without a break (None: the
        watch has not listed yet, is failing now or has heard nothing for ``QUIET_S``, or this
        was handed over before)."""
        self.watch.halt.set()
        with self._lock:
            handed, self._handed = self._handed, True
            quiet = self._heard is None or time.time() - self._heard > QUIET_S
            if handed or quiet or self.watch.down_since is not None:
                return None
            return self._since


def lease_observer(metrics: WatchMetrics) -> LeaseObserver:
    """An observer on its own API client (a watch holds its connection for minutes)."""
    api = client.CoordinationV1Api(client.ApiClient())
    return LeaseObserver(
        lambda **kwargs: api.list_namespaced_lease(names.NODE_LEASE_NAMESPACE, **kwargs), metrics
    )
