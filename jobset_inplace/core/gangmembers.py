"""What each member of a gang reported, for people (``kubectl jobset-inplace status -o wide``):
its pod, the epoch it reported and its newest reported checkpoint step.

Agents report over the channel to the leader's memory, so the controller writes a summary: one
GangMembers object per gang (same name, owned by the JobSet), apart from the GangState. Every
agent watches its GangState, so N rows there would go to N watchers on every write (N^2 bytes:
~750 MB per write at 5000 members); nobody watches GangMembers (EndpointSlices are kept apart
from Services for the same reason). Written when a row changed, at most every
``write_interval(members)``; the rows are made only then, not at every planning pass.

A member's in-place restarts are not stored: they are the recoveries (the GangState's history
and the one in progress) that began after its pod was created (:func:`inplace_restarts`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from jobset_inplace import names
from jobset_inplace.core.gangstate import jobset_owner
from jobset_inplace.core.model import HISTORY_LIMIT, GangStatus, PodView
from jobset_inplace.times import parse_time, rfc3339

WRITE_INTERVAL_S = 5.0
WRITE_S_PER_MEMBER = 0.002  # 10 s at 5000 members (a 250 kB object)


class MemberRow(NamedTuple):
    """A tuple, not a dataclass: made for every member at every planning pass and compared
    with the rows last written, both in C (a frozen dataclass's ``__init__`` and ``__eq__``
    run Python per row; a pass's rows at 2000 members took 1.39 ms, now 0.64 ms, in a
    micro-benchmark)."""

    member: str
    pod: str
    epoch: int | None  # the epoch its agent reported (None: no report yet)
    step: int | None  # the newest checkpoint step its agent reported (None: none)


def member_rows(pods: Iterable[PodView]) -> tuple[MemberRow, ...]:
    """One row per member pod that is not being deleted, by member."""
    rows = []
    for p in pods:
        if p.deleting:
            continue
        step, steps = p.newest_step, p.reported_steps
        if steps:
            top = max(steps)
            step = top if step is None or step < top else step
        rows.append(MemberRow(p.member, p.name, p.reported_epoch, step))
    # by (member, pod), the tuples' own order: a pod is in one row, so the epochs and steps
    # (maybe None, which does not order) are never compared; no key function, whose Python
    # call per row was 6 of member_rows' 35 samples in the 10,000-pod profiles behind a front
    rows.sort()
    return tuple(rows)


def write_interval(members: int) -> float:
    return max(WRITE_INTERVAL_S, members * WRITE_S_PER_MEMBER)


def next_write_at(
    written: Sequence[MemberRow] | None, written_at: float | None, now: float
) -> float:
    """When rows that may have changed since ``written`` was written at ``written_at`` (None:
    nothing written by this process) are to be made and written, on the clock of ``now``: at
    once if nothing was, else once the interval for that many rows is over. (Whether a row
    changed is known only once they are made: O(members), at most once per interval.)"""
    if written_at is None:
        return now
    return max(now, written_at + write_interval(len(written or ())))


def members_object(
    jobset: Mapping[str, Any], rows: Sequence[MemberRow], now: float
) -> dict[str, Any]:
    """The GangMembers object of ``jobset`` (server-side apply: it creates or replaces)."""
    meta = jobset["metadata"]
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GANGMEMBERS_KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {names.JOBSET_NAME_LABEL: meta["name"]},
            "ownerReferences": [jobset_owner(jobset)],
        },
        "observedAt": rfc3339(now),
        "members": [
            {
                "member": r.member,
                "pod": r.pod,
                **({} if r.epoch is None else {"epoch": r.epoch}),
                **({} if r.step is None else {"step": r.step}),
            }
            for r in rows
        ],
    }


def rows_by_pod(obj: Mapping[str, Any] | None) -> dict[str, MemberRow]:
    """The rows of a GangMembers object as read, by pod name (malformed rows are skipped)."""
    out = {}
    for m in (obj or {}).get("members") or []:
        try:
            row = MemberRow(
                str(m["member"]),
                str(m["pod"]),
                None if m.get("epoch") is None else int(m["epoch"]),
                None if m.get("step") is None else int(m["step"]),
            )
        except (KeyError, TypeError, ValueError):
            continue
        out[row.pod] = row
    return out


def inplace_restarts(created: float, status: GangStatus) -> tuple[int, bool]:
    """How often a pod created at ``created`` was restarted in place: the recoveries that began
    after it (each restarts every member it does not recreate), from the GangState's history and
    the recovery in progress; and whether that is a lower bound (the history keeps the last
    ``HISTORY_LIMIT`` recoveries, and all of them count)."""
    started = [parse_time(h.get("startedAt")) for h in status.history]
    in_history = sum(1 for t in started if t is not None and t > created)
    rec = status.recovery
    ongoing = rec is not None and rec.opened is None and bool(rec.causes) and rec.started > created
    saturated = len(status.history) >= HISTORY_LIMIT and in_history == len(status.history)
    return in_history + ongoing, saturated
