"""This process's resources, for a server of many connections: its resident memory, giving the
heap's free pages back to the system, the garbage collector's share, and its open files
limit."""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import resource
import time
from typing import Any

log = logging.getLogger("jobset_inplace.process")


@functools.cache
def glibc() -> Any | None:
    """The C library if it is glibc (``malloc_trim``); None otherwise."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim  # noqa: B018 (AttributeError: not glibc)
    except (OSError, AttributeError):
        return None
    return libc


def rss_mib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return 0.0


def release_free_memory(who: str) -> None:
    """Give the heap's free pages back to the system (``malloc_trim``). A burst of TLS
    handshakes (every agent connecting at a gang's start, or to a new leader) leaves most of
    what they used free but scattered among live blocks, which glibc keeps: measured with 5000
    connections, 216 MiB before, 125 MiB after. Runs off the event loop (ctypes releases the
    GIL); ``who`` names the server in the log."""
    libc = glibc()
    if libc is None:
        return
    before, started = rss_mib(), time.monotonic()
    libc.malloc_trim(0)
    after = rss_mib()
    if before - after >= 1:
        log.info(
            "%s: free memory given back: RSS %.0f -> %.0f MiB (%.0f ms)",
            who,
            before,
            after,
            (time.monotonic() - started) * 1000,
        )


def freeze_heap(who: str) -> None:
    """Leave what this process holds now (its modules, clients, a primed cache) out of every
    garbage collection from now on (``gc.freeze``): a full collection walks every tracked
    object, and a leader's recovery makes enough new ones to run one every other recovery.
    With the leader's report server, cache and reconciler and 2000 agents (``python -m
    bench.leader_loop``, docs/bench/leader-cost-2026-12-04/leader-loop-2000.json), the
    collector took 42 ms of CPU per recovery at the median before the freeze (and before each
    member's view was made once per report), 9 ms after. What is frozen and later dropped is
    freed as usual unless it is in a cycle."""
    gc.collect()
    gc.freeze()
    log.info("%s: %d objects left out of garbage collection", who, gc.get_freeze_count())


def raise_open_files_limit(who: str) -> int:
    """For a server keeping a connection per client (the report channel: one per agent;
    ``who`` names it in the log): allow as many open files as the hard limit does (the soft
    limit is often 1024). The limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("%s: open files limit %d -> %d", who, soft, hard)
        soft = hard
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft
