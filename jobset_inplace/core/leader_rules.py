"""Leader election over a ``coordination.k8s.io`` Lease, decided the way client-go's
``leaderelection`` package decides it (the adapter that reads and writes the Lease is
:mod:`jobset_inplace.runtime.leader_election`).

- A candidate holds the Lease by writing its identity and a fresh ``renewTime`` every
  ``retry_period``; every write carries the ``resourceVersion`` it read, so two candidates
  never both win.
- Another holder's Lease is free when it is released (no holder) or has not changed for
  ``leaseDurationSeconds`` *as this candidate observed it* (its own monotonic clock from the
  moment it saw the record change, never the holder's ``renewTime``: clocks may disagree).
- A leader that could not renew for ``renew_deadline`` must stop acting at once: by then
  another candidate may be about to take over (``renew_deadline < lease_duration``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jobset_inplace import names
from jobset_inplace.strenum import StrEnum
from jobset_inplace.times import format_time, parse_time

# client-go's JitterFactor: candidates retry at retry_period x [1, 1.2).
JITTER = 1.2


@dataclass(frozen=True)
class ElectionTiming:
    """client-go's and kube-controller-manager's defaults."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def check(self) -> None:
        """Refuse settings that would let two leaders act at once (client-go's rules)."""
        if self.lease_duration_s < 1 or self.lease_duration_s != int(self.lease_duration_s):
            raise ValueError(
                f"--leader-elect-lease-duration {self.lease_duration_s:g}s: expected whole"
                " seconds, at least 1s (it is the Lease's leaseDurationSeconds)"
            )
        if self.renew_deadline_s >= self.lease_duration_s:
            raise ValueError(
                f"--leader-elect-renew-deadline {self.renew_deadline_s:g}s must be shorter than"
                f" --leader-elect-lease-duration {self.lease_duration_s:g}s"
            )
        if self.retry_period_s <= 0 or self.renew_deadline_s <= JITTER * self.retry_period_s:
            raise ValueError(
                f"--leader-elect-renew-deadline {self.renew_deadline_s:g}s must be longer than"
                f" {JITTER:g} x --leader-elect-retry-period {self.retry_period_s:g}s (> 0)"
            )

    def check_fence(self) -> None:
        """With the report channel, refuse settings under which a successor could act while
        an agent still holds a lease its predecessor granted: the predecessor answers until
        its renewal is ``renew_deadline`` old, an answer's lease lasts ``names.LEASE_S`` and
        the launcher's stop ``names.FENCE_MARGIN_S``; the successor acts ``lease_duration``
        after the last renewal it could have missed (docs/guarantees.md)."""
        least = self.renew_deadline_s + names.LEASE_S + names.FENCE_MARGIN_S
        if self.lease_duration_s < least:
            raise ValueError(
                f"--leader-elect-lease-duration {self.lease_duration_s:g}s must be at least"
                f" --leader-elect-renew-deadline {self.renew_deadline_s:g}s +"
                f" {names.LEASE_S + names.FENCE_MARGIN_S:g}s ({least:g}s) while the report"
                f" channel is on: an agent's lease ({names.LEASE_S:g}s) and its trainer's stop"
                f" ({names.FENCE_MARGIN_S:g}s) must end before a successor acts"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease's spec (times in seconds since the epoch)."""

    holder: str = ""  # empty: released
    duration_s: int = 0
    acquired: float | None = None
    renewed: float | None = None
    transitions: int = 0


class Step(StrEnum):
    CREATE = "create"  # no Lease yet: create it, holding it
    TAKE = "take"  # released or expired: write ourselves as holder
    RENEW = "renew"  # ours: write a fresh renewTime
    WAIT = "wait"  # someone else holds it


def next_step(record: LeaseRecord | None, me: str, *, now: float, observed_since: float) -> Step:
    """What candidate ``me`` does with the Lease it just read. ``observed_since``: when (on
    the candidate's monotonic clock, like ``now``) it first saw the record as it is now."""
    if record is None:
        return Step.CREATE
    if record.holder == me:
        return Step.RENEW
    if not record.holder or now >= observed_since + record.duration_s:
        return Step.TAKE
    return Step.WAIT


def claim(record: LeaseRecord | None, me: str, *, wall: float, duration_s: int) -> LeaseRecord:
    """The record to write for :data:`Step.CREATE`, :data:`Step.TAKE` or :data:`Step.RENEW`
    (``wall``: now, seconds since the epoch)."""
    if record is not None and record.holder == me:
        return replace(record, duration_s=duration_s, renewed=wall)
    transitions = 0 if record is None else record.transitions + 1
    return LeaseRecord(me, duration_s, acquired=wall, renewed=wall, transitions=transitions)


def released(record: LeaseRecord, *, wall: float) -> LeaseRecord:
    """What a leader writes when it stops on purpose: no holder, a 1 s duration (client-go's
    ``ReleaseOnCancel``), so the next candidate takes over at its next try."""
    return replace(record, holder="", duration_s=1, acquired=wall, renewed=wall)


def must_stop(last_renewal: float, now: float, timing: ElectionTiming) -> bool:
    """A leader whose last successful write (monotonic) is ``renew_deadline`` old stops."""
    return now - last_renewal >= timing.renew_deadline_s


def record_of(lease: Mapping[str, Any]) -> LeaseRecord:
    """The election fields of a Lease as the API returns it (JSON)."""
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=int(spec.get("leaseDurationSeconds") or 0),
        acquired=parse_time(spec.get("acquireTime")),
        renewed=parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_body(
    name: str,
    namespace: str,
    record: LeaseRecord,
    resource_version: str | None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Lease to create (``resource_version`` None) or to replace: the replace fails with a
    conflict if anyone wrote the Lease since ``resource_version`` was read. ``annotations``:
    what the holder tells the candidates (the replace drops any others: a new holder's Lease
    carries nothing of its predecessor's)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": record.holder or None,
            "leaseDurationSeconds": record.duration_s,
            "acquireTime": None if record.acquired is None else format_time(record.acquired),
            "renewTime": None if record.renewed is None else format_time(record.renewed),
            "leaseTransitions": record.transitions,
        },
    }
