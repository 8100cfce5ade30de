"""The recovery policy of one JobSet, parsed from its ``jobset-inplace.dev/*`` annotations in
one place (controller, webhook and CLI all use :func:`parse_policy`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from jobset_inplace import names

E = TypeVar("E", bound=StrEnum)


class ForceDelete(StrEnum):
    """Whether pods on an unreachable node may be force-deleted (no kubelet confirmation).

    Force deletion assumes the node is fenced (powered off or isolated): otherwise the old
    container may keep running beside its replacement. ``never`` waits for the node to come
    back or be removed; ``unreachable`` force-deletes once the node is unhealthy."""

    NEVER = "never"
    UNREACHABLE = "unreachable"


class NoCommonCheckpoint(StrEnum):
    """What to do when the members share no checkpoint step."""

    ESCALATE = "escalate"
    SCRATCH = "scratch"


class Escalation(StrEnum):
    """Where an exhausted recovery goes: a full JobSet restart through JobSet's failure
    policy (then failure when its maxRestarts are used), or straight to JobSet failure."""

    RESTART_JOBSET = "restart-jobset"
    FAIL_JOBSET = "fail-jobset"


@dataclass(frozen=True)
class CheckpointDirs:
    """Checkpoint tier roots inside the member containers (docs/trainer-contract.md)."""

    local: str | None = None
    persistent: str | None = None


@dataclass(frozen=True)
class Policy:
    inplace_budget: int = 10
    recreate_budget: int = 5
    barrier_timeout_s: float = 300.0
    node_unhealthy_after_s: float = 15.0
    unhealthy_taints: frozenset[str] = frozenset()
    unhealthy_conditions: frozenset[str] = frozenset()
    force_delete: ForceDelete = ForceDelete.UNREACHABLE
    member_repeat_limit: int = 3
    no_common_checkpoint: NoCommonCheckpoint = NoCommonCheckpoint.ESCALATE
    restart_exit_code: int = names.DEFAULT_RESTART_EXIT_CODE
    checkpoint_dirs: CheckpointDirs = CheckpointDirs()
    escalation: Escalation = Escalation.RESTART_JOBSET
    # Overrides the recoveryTimeout read from Kueue's configuration (when it is not readable).
    kueue_recovery_timeout_s: float | None = None
    # Taint a Ready node NoSchedule when its device fails a member, before replacing the pod
    # (so that the replacement, and Kueue TAS's node replacement, avoid it).
    taint_on_device_fault: bool = False


class PolicyError(ValueError):
    """A malformed annotation: names the key, the value and the accepted form."""

    def __init__(self, key: str, value: str, accepted: str) -> None:
        super().__init__(f"annotation {key}={value!r} is invalid: expected {accepted}")
        self.key, self.value, self.accepted = key, value, accepted


def is_enabled(annotations: Mapping[str, str] | None) -> bool:
    """Whether a JobSet with these annotations opted in (``enabled: "true"``; any other value,
    or none, is not opted in). :func:`parse_enabled` also refuses a malformed value."""
    return (annotations or {}).get(names.ENABLED) == "true"


def parse_enabled(annotations: Mapping[str, str] | None) -> bool:
    """:func:`is_enabled`, raising :class:`PolicyError` unless ``enabled`` is absent,
    ``"true"`` or ``"false"``."""
    value = (annotations or {}).get(names.ENABLED)
    return value is not None and _bool(names.ENABLED, value)


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")


def parse_duration(key: str, value: str) -> float:
    """Go-style durations: ``90s``, ``5m``, ``1h30m``, ``2.5s``."""
    m = _DURATION.match(value.strip())
    if not value.strip() or not m or not any(m.groups()):
        raise PolicyError(key, value, "a duration such as 30s, 5m or 1h30m")
    h, mi, s = m.groups()
    return int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)


def _int(key: str, value: str, lo: int, hi: int) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise PolicyError(key, value, f"an integer from {lo} to {hi}")
    return n


def _names(key: str, value: str) -> frozenset[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names or not all(_NAME.match(n) for n in names):
        raise PolicyError(key, value, "a comma-separated list of taint keys or condition types")
    return frozenset(names)


def _choice(key: str, value: str, enum: type[E]) -> E:
    try:
        return enum(value.strip())
    except ValueError:
        raise PolicyError(key, value, " or ".join(e.value for e in enum)) from None


def _checkpoint_dirs(key: str, value: str) -> CheckpointDirs:
    """``local=/path,persistent=/path`` (either may be left out)."""
    accepted = "local=/abs/path,persistent=/abs/path (either part may be left out)"
    found: dict[str, str] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        tier, sep, path = part.partition("=")
        if not sep or tier not in ("local", "persistent") or not path.startswith("/"):
            raise PolicyError(key, value, accepted)
        if tier in found:
            raise PolicyError(key, value, accepted)
        found[tier] = path
    if not found:
        raise PolicyError(key, value, accepted)
    return CheckpointDirs(found.get("local"), found.get("persistent"))


def _bool(key: str, value: str) -> bool:
    if value not in ("true", "false"):
        raise PolicyError(key, value, '"true" or "false"')
    return value == "true"


_PARSERS: tuple[tuple[str, str, Callable[[str, str], object]], ...] = (
    ("inplace_budget", names.INPLACE_BUDGET, lambda k, v: _int(k, v, 0, 10_000)),
    ("recreate_budget", names.RECREATE_BUDGET, lambda k, v: _int(k, v, 0, 10_000)),
    ("barrier_timeout_s", names.BARRIER_TIMEOUT, parse_duration),
    ("node_unhealthy_after_s", names.NODE_UNHEALTHY_AFTER, parse_duration),
    ("unhealthy_taints", names.UNHEALTHY_TAINTS, _names),
    ("unhealthy_conditions", names.UNHEALTHY_CONDITIONS, _names),
    ("force_delete", names.FORCE_DELETE, lambda k, v: _choice(k, v, ForceDelete)),
    ("member_repeat_limit", names.MEMBER_REPEAT_LIMIT, lambda k, v: _int(k, v, 1, 1000)),
    (
        "no_common_checkpoint",
        names.NO_COMMON_CHECKPOINT,
        lambda k, v: _choice(k, v, NoCommonCheckpoint),
    ),
    # 1 is a Python crash and 2 a configuration error of the agent: neither may mean "restart".
    ("restart_exit_code", names.RESTART_EXIT_CODE, lambda k, v: _int(k, v, 3, 255)),
    ("checkpoint_dirs", names.CHECKPOINT_DIRS, _checkpoint_dirs),
    ("escalation", names.ESCALATION, lambda k, v: _choice(k, v, Escalation)),
    ("kueue_recovery_timeout_s", names.KUEUE_RECOVERY_TIMEOUT, parse_duration),
    ("taint_on_device_fault", names.TAINT_ON_DEVICE_FAULT, _bool),
)


def parse_policy(annotations: Mapping[str, str] | None) -> Policy:
    """Policy from JobSet annotations; absent keys keep their defaults.

    Raises :class:`PolicyError` for the first malformed key (in a stable order)."""
    a = annotations or {}
    parse_enabled(a)
    values: dict[str, Any] = {f: parse(k, a[k]) for f, k, parse in _PARSERS if k in a}
    return dataclasses.replace(Policy(), **values)
