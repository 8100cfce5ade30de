"""What an agent reads of its GangState: the status fields it acts on (named once in
:mod:`jobset_inplace.names`, ``STATUS_*``, which the core's writer uses too), parsed into a
typed :class:`GangView`, every malformed field named. Standard library only: the agent parses
with it, and the core's tests read what the core writes back through it."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobset_inplace import names
from jobset_inplace.trainer.checkpoints import MAX_STEP, is_int

__all__ = [
    "FRONTS_MAX",
    "Endpoint",
    "Front",
    "GangView",
    "MalformedStatus",
    "parse_endpoint",
    "parse_front",
    "parse_gangstate",
    "parse_planned_stop",
    "parse_slots",
    "parse_step_recheck",
]


class MalformedStatus(ValueError):
    """The GangState status cannot be acted on (wrong type or range of a field we use)."""


# The most report fronts a status names (docs/design/report-fronts.md): a few standby replicas.
FRONTS_MAX = 8


@dataclass(frozen=True)
class Front:
    """A report front (docs/design/report-fronts.md): a standby replica that takes agents'
    reports for the leader; its URL and its certificate's SHA-256 (pinned as the leader's)."""

    url: str
    cert_sha256: str


@dataclass(frozen=True)
class Endpoint:
    """The leader's report channel as the status names it (docs/architecture.md), and the
    report fronts agents send to first."""

    url: str
    cert_sha256: str  # hex SHA-256 of its certificate (DER): pinned
    leader: str  # a new value: send the report again
    fronts: tuple[Front, ...] = ()

    def same_leader(self, other: Endpoint) -> bool:
        """Whether ``other`` names the same leader's channel (its fronts aside)."""
        return (self.url, self.cert_sha256, self.leader) == (
            other.url,
            other.cert_sha256,
            other.leader,
        )

    def front_for(self, uid: str) -> Endpoint | None:
        """The front the pod ``uid`` sends to (its uid's CRC-32 over the fronts: spread evenly,
        the same one each time), as an endpoint of this leader; None: no fronts."""
        if not self.fronts:
            return None
        front = self.fronts[zlib.crc32(uid.encode()) % len(self.fronts)]
        return Endpoint(front.url, front.cert_sha256, self.leader)


@dataclass(frozen=True)
class GangView:
    """The part of a GangState status the agent acts on."""

    epoch: int
    barrier_open: bool
    resume_step: int | None  # meaningful only while barrier_open
    phase: str = ""
    endpoint: Endpoint | None = None  # None: report on the pod
    # status.plannedStop: (epoch, step) the gang stops at (step None: not decided yet, the
    # controller asks how far the trainers are); None: no planned stop
    planned_stop: tuple[int, int | None] | None = None
    # status.slots (hot spares): slot -> the position holding it, where not its own
    slots: Mapping[str, str] = field(default_factory=dict)
    # status.stepRecheck: (epoch, steps) members lacking any of steps look at theirs again
    step_recheck: tuple[int, frozenset[int]] | None = None


def parse_slots(value: object) -> dict[str, str]:
    """``status.slots``: slot -> position, strings; raises `MalformedStatus` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise MalformedStatus(
            f"status.{names.STATUS_SLOTS} must map slot names to position names, "
            f"got {_short(value)}"
        )
    return dict(value)


def parse_planned_stop(value: object) -> tuple[int, int | None] | None:
    """``status.plannedStop``; None when absent or unusable (advisory: the controller moves
    the member at its deadline whatever the agents did)."""
    if not isinstance(value, Mapping):
        return None
    epoch, step = value.get(names.ASK_EPOCH), value.get(names.PLANNED_STOP_STEP)
    if not is_int(epoch) or not 0 < epoch <= MAX_STEP:
        return None
    if step is not None and (not is_int(step) or not 0 <= step <= MAX_STEP):
        return None
    return epoch, step


def parse_step_recheck(value: object) -> tuple[int, frozenset[int]] | None:
    """``status.stepRecheck`` as (epoch, steps); None when absent or unusable (advisory: the
    barrier opens at the ask's deadline whatever the agents did)."""
    if not isinstance(value, Mapping):
        return None
    epoch, steps = value.get(names.ASK_EPOCH), value.get(names.STEP_RECHECK_STEPS)
    if not is_int(epoch) or not 0 <= epoch <= MAX_STEP or not isinstance(steps, list):
        return None
    if not steps or not all(is_int(s) and 0 <= s <= MAX_STEP for s in steps):
        return None
    return epoch, frozenset(steps)


def parse_front(value: object) -> Front | None:
    """A ``{url, certSHA256}`` object (a front, or the leader's own channel); None when either
    is unusable: an https URL, a SHA-256 in lower-case hex."""
    if not isinstance(value, Mapping):
        return None
    url, pin = value.get(names.ENDPOINT_URL), value.get(names.ENDPOINT_CERT_SHA256)
    if not (isinstance(url, str) and url.startswith("https://")):
        return None
    if not (isinstance(pin, str) and len(pin) == 64 and all(c in "0123456789abcdef" for c in pin)):
        return None
    return Front(url, pin)


def parse_endpoint(value: object) -> Endpoint | None:
    """``status.reportEndpoint``; None when absent or unusable (the agent then writes its
    reports on its pod: a bad endpoint never holds a barrier). Unusable fronts are left out
    (the agent sends to the leader itself); at most FRONTS_MAX are used."""
    own = parse_front(value)
    if own is None:
        return None
    assert isinstance(value, Mapping)
    leader = value.get(names.ENDPOINT_LEADER)
    listed = value.get(names.ENDPOINT_FRONTS)
    fronts = [parse_front(f) for f in listed[:FRONTS_MAX]] if isinstance(listed, list) else []
    return Endpoint(
        own.url,
        own.cert_sha256,
        leader if isinstance(leader, str) else "",
        tuple(f for f in fronts if f is not None),
    )


def parse_gangstate(obj: object) -> GangView | None:
    """The view of a GangState object; None while it has no status epoch yet (the controller
    has not initialised it). Raises `MalformedStatus` naming the offending field."""
    # Not core.gangstate.status_from_dict: the agent imports only the standard library (its
    # start-up budget), and must name a malformed field rather than crash on it.
    if not isinstance(obj, Mapping):
        raise MalformedStatus(f"GangState is not a JSON object: {type(obj).__name__}")
    status = obj.get("status")
    if status is None:
        return None
    if not isinstance(status, Mapping):
        raise MalformedStatus(f"status is not an object: {_short(status)}")
    if status.get(names.STATUS_EPOCH) is None:
        return None
    epoch = status[names.STATUS_EPOCH]
    if not is_int(epoch) or not 0 <= epoch <= MAX_STEP:
        raise MalformedStatus(
            f"status.{names.STATUS_EPOCH} must be an integer >= 0, got {_short(epoch)}"
        )
    barrier = status.get(names.STATUS_BARRIER_OPEN, False)
    if barrier is None:
        barrier = False
    if not isinstance(barrier, bool):
        raise MalformedStatus(
            f"status.{names.STATUS_BARRIER_OPEN} must be a boolean, got {_short(barrier)}"
        )
    step = status.get(names.STATUS_RESUME_STEP)
    if barrier and step is not None and (not is_int(step) or not 0 <= step <= MAX_STEP):
        raise MalformedStatus(
            f"status.{names.STATUS_RESUME_STEP} must be null or an integer 0..{MAX_STEP}, "
            f"got {_short(step)}"
        )
    phase = status.get(names.STATUS_PHASE)
    return GangView(
        epoch=epoch,
        barrier_open=barrier,
        resume_step=step if barrier else None,
        phase=phase if isinstance(phase, str) else "",
        endpoint=parse_endpoint(status.get(names.STATUS_REPORT_ENDPOINT)),
        planned_stop=parse_planned_stop(status.get(names.STATUS_PLANNED_STOP)),
        slots=parse_slots(status.get(names.STATUS_SLOTS)),
        step_recheck=parse_step_recheck(status.get(names.STATUS_STEP_RECHECK)),
    )


def _short(value: object, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."
