"""Node Lease renewals into the cache, without kopf: every node renews its Lease about every
10 s, hundreds of events a second on a large cluster, of which the controller needs two fields.
A raw watch decoded with ``json`` costs tens of microseconds per event where kopf's pipeline
costs about a millisecond."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from .. import api
from ..views import ts

log = logging.getLogger("jobset_inplace.controller")

Renewal = tuple[str, float | None]  # node name, last renewal (None: the Lease is gone)


class LeaseWatch(threading.Thread):
    """List then watch ``kube-node-lease``; hand each batch of renewals to ``apply`` on
    ``loop`` (the controller's event loop owns the cache)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        loop: asyncio.AbstractEventLoop,
        apply: Callable[[list[Renewal]], None],
        timeout_s: int = 300,
    ) -> None:
        super().__init__(daemon=True, name="lease-watch")
        self.coordination = client.CoordinationV1Api(api_client)
        self.loop, self.apply, self.timeout_s = loop, apply, timeout_s
        self.halt = threading.Event()

    def run(self) -> None:
        backoff = 0.5
        while not self.halt.is_set():
            try:
                rv = self._list()
                self._watch(rv)
                backoff = 0.5
            except Exception as e:  # a dead watch thread would blind node-failure detection
                log.warning("node Lease watch: %r; retrying in %.1f s", e, backoff)
                self.halt.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self) -> str:
        resp = self.coordination.list_namespaced_lease(
            api.NODE_LEASE_NAMESPACE, _preload_content=False
        )
        doc = json.loads(resp.data)
        self._hand_over([_renewal(item) for item in doc.get("items") or []])
        return str(doc["metadata"]["resourceVersion"])

    def _watch(self, rv: str) -> None:
        stream = self.coordination.list_namespaced_lease(
            api.NODE_LEASE_NAMESPACE,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_s,
            _preload_content=False,
        )
        try:
            for line in stream:
                if self.halt.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return  # e.g. 410 Gone: list again
                if kind == "BOOKMARK":
                    continue
                name, renewed = _renewal(obj)
                self._hand_over([(name, None if kind == "DELETED" else renewed)])
        finally:
            stream.release_conn()

    def _hand_over(self, batch: list[Renewal]) -> None:
        self.loop.call_soon_threadsafe(self.apply, batch)


def _renewal(lease: dict[str, Any]) -> Renewal:
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    renew = spec.get("renewTime")
    return str(meta.get("name")), ts(renew) if isinstance(renew, str) and renew else None
