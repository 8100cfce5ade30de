"""Keeping objects in the API in line with what the controller decided, per key (a namespace,
a JobSet): each scheduled key is synced on a thread (the API client blocks), one sync at a time
per key and again if it was scheduled meanwhile; a failure is retried with backoff; every key
is synced again every ``resync_s`` (an object deleted by hand comes back)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from jobset_inplace.backoff import Backoff, Retries

log = logging.getLogger("jobset_inplace.controller")

RESYNC_S = 300.0
RETRY = Backoff(1.0, 60.0)


class KeyedSync:
    def __init__(
        self,
        what: str,
        sync: Callable[[str], None],
        keys: Callable[[], Iterable[str]],
        resync_s: float = RESYNC_S,
    ) -> None:
        self.what, self.sync, self.keys, self.resync_s = what, sync, keys, resync_s
        self._due: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}

    def schedule(self, key: str) -> None:
        """Sync ``key`` soon (on the loop)."""
        self._due.add(key)
        if key not in self._running:
            self._running[key] = asyncio.get_running_loop().create_task(self._keep(key))

    async def resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            for key in list(self.keys()):
                self.schedule(key)

    async def _keep(self, key: str) -> None:
        retries = Retries(RETRY, jitter=True)
        try:
            while key in self._due:
                self._due.discard(key)
                try:
                    await asyncio.to_thread(self.sync, key)
                except Exception as e:  # any failure: read again and retry, with backoff
                    delay = retries.failed()
                    log.warning("%s: %s: %s (retrying in %.1f s)", key, self.what, e, delay)
                    self._due.add(key)
                    await asyncio.sleep(delay)
                else:
                    retries.succeeded()
        finally:
            del self._running[key]
