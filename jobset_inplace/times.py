"""RFC 3339 times as the Kubernetes API writes them (UTC, ``Z`` suffix), to and from seconds
since the epoch: the package's one format/parse pair. Standard library only, so that the
decision core, the adapters, the plugin and the test infrastructure all use it. (The agent keeps
its own log timestamp: it imports nothing of jobset_inplace but names and trainer.)"""

from __future__ import annotations

import datetime as dt
import time

__all__ = ["format_time", "parse_time", "rfc3339"]

_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"  # the API's MicroTime (Lease renewTime), and GangState times
_SECONDS = "%Y-%m-%dT%H:%M:%SZ"  # the API's Time (condition transition times, as kubelets write)


def format_time(t: float | None = None, *, micro: bool = True) -> str:
    """``t`` (seconds since the epoch; now if None) in UTC: ``2026-11-21T10:00:00.123456Z``,
    or to the whole second with ``micro=False`` (``2026-11-21T10:00:00Z``)."""
    when = dt.datetime.fromtimestamp(time.time() if t is None else t, dt.UTC)
    return when.strftime(_MICRO if micro else _SECONDS)


def rfc3339(t: float | None) -> str | None:
    """:func:`format_time` to the microsecond, passing None through (an unset time)."""
    return None if t is None else format_time(t)


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time; None for None or an empty string."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
