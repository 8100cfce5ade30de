"""The recovery policy of one JobSet, parsed from its ``jobset-inplace.dev/*`` annotations in
one place (controller, webhook and CLI all use :func:`parse_policy`)."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from jobset_inplace import names
from jobset_inplace.names import RestartScope
from jobset_inplace.strenum import StrEnum
from jobset_inplace.trainer.checkpoints import parse_canonical_int, shorten_repr
from jobset_inplace.trainer.layouts import (
    PATTERN_FORM,
    Layout,
    checkpoint_layout,
    parse_step_pattern,
)

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


class StragglerAction(StrEnum):
    """What a straggler gets: an Event, the GangState status and a metric (``report``), or, on
    top, its pod replaced on another node, the gang restarted in place (``recreate``)."""

    REPORT = "report"
    RECREATE = "recreate"


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
    # the same kind of failure this many times in a row without the gang getting further
    # escalates at once (core/no_progress.py; 0: never)
    no_progress_limit: int = 3
    no_common_checkpoint: NoCommonCheckpoint = NoCommonCheckpoint.ESCALATE
    restart_exit_code: int = names.DEFAULT_RESTART_EXIT_CODE
    checkpoint_dirs: CheckpointDirs = CheckpointDirs()
    # The framework's own checkpoint layout (docs/integrations.md); its step directory names
    # (None: the layout's default).
    checkpoint_layout: Layout = Layout.JOBSET_INPLACE
    checkpoint_step_pattern: str | None = None
    escalation: Escalation = Escalation.RESTART_JOBSET
    # Overrides the recoveryTimeout read from Kueue's configuration (when it is not readable).
    kueue_recovery_timeout_s: float | None = None
    # Taint a Ready node NoSchedule when its device fails a member, before replacing the pod
    # (so that the replacement, and Kueue TAS's node replacement, avoid it).
    taint_on_device_fault: bool = False
    restart_scope: RestartScope = names.DEFAULT_RESTART_SCOPE
    # Process scope: how long a trainer may take to exit on SIGTERM before it is killed.
    trainer_stop_grace_s: float = 1.0
    # Process scope: the next epoch's trainer is started, these modules imported, while the
    # barrier is closed (jobset_inplace.prestart); () : started when the barrier opens.
    prestart_imports: tuple[str, ...] = ()
    # With prestart_imports: the held trainer builds its model and loads the newest checkpoint
    # before its epoch (jobset_inplace.trainer.standby; docs/design/warm-standby.md).
    prestart_warm: bool = False
    # Hang detection (off when None): no new step reported for this long after the first, or
    # no first step this long after the barrier opened, is a hung trainer (docs/annotations.md).
    hang_timeout_s: float | None = None
    startup_timeout_s: float | None = None
    # Straggler detection (off when the factor is None): busy time per step above factor x the
    # gang's median for `straggler_windows` windows of `straggler_window_s` in a row.
    straggler_factor: float | None = None
    straggler_windows: int = 3
    straggler_window_s: float = 300.0
    straggler_action: StragglerAction = StragglerAction.REPORT
    # A member whose node is cordoned (drained) or marked for maintenance is moved once the
    # gang has stopped at one step with a checkpoint of it (its eviction held meanwhile by a
    # PodDisruptionBudget), or at this deadline whatever the trainers did.
    planned_moves: bool = True
    planned_move_timeout_s: float = 600.0


class PolicyError(ValueError):
    """A malformed annotation: names the key, the value and the accepted form."""

    def __init__(self, key: str, value: str, accepted: str) -> None:
        # The value is shown cut (an annotation can be hundreds of KB): the message is a webhook
        # refusal or an InvalidPolicy Event.
        shown = shorten_repr(value, VALUE_SHOWN)
        super().__init__(f"annotation {key}={shown} is invalid: expected {accepted}")
        self.key, self.value, self.accepted = key, value, accepted


VALUE_SHOWN = 80  # characters of a bad value's repr in a PolicyError message


class PolicyErrors(PolicyError):
    """Several malformed annotations, reported at once; ``key``/``value``/``accepted`` are the
    first one's."""

    def __init__(self, errors: Sequence[PolicyError]) -> None:
        first = errors[0]
        ValueError.__init__(self, "; ".join(str(e) for e in errors))
        self.key, self.value, self.accepted = first.key, first.value, first.accepted
        self.errors = list(errors)


def raise_all(errors: Sequence[PolicyError]) -> None:
    """Raise the one error, or all of them as one :class:`PolicyErrors`; nothing if none."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise PolicyErrors(errors)


def is_enabled(annotations: Mapping[str, str] | None) -> bool:
    """Whether a JobSet with these annotations opted in (``enabled: "true"``; any other value,
    or none, is not opted in). :func:`parse_enabled` also refuses a malformed value."""
    return (annotations or {}).get(names.ENABLED) == "true"


def is_managed(jobset: Mapping[str, Any]) -> bool:
    """Whether the controller recovers this JobSet: it opted in and is not being deleted (a
    foreground deletion removes the GangState first: it must not be created again)."""
    meta = jobset.get("metadata") or {}
    return is_enabled(meta.get("annotations")) and not meta.get("deletionTimestamp")


def parse_enabled(annotations: Mapping[str, str] | None) -> bool:
    """:func:`is_enabled`, raising :class:`PolicyError` unless ``enabled`` is absent,
    ``"true"`` or ``"false"``."""
    value = (annotations or {}).get(names.ENABLED)
    return value is not None and _bool(names.ENABLED, value)


# --- accepted ranges (docs/annotations.md) ---------------------------------------------------
# Every number of the policy is bounded: a value the webhook admits must never break a planning
# pass (a barrier deadline of 99999999h is past the year 9999, which RFC 3339 cannot write), and
# values at either end must still make sense.
#
# barrier-timeout: a member's in-place restart (container restart, interpreter and trainer
# start-up, rejoining) takes seconds to tens of seconds; a shorter deadline turns ordinary
# recoveries into recreations, then a full JobSet restart (0s did so in 67 ms). A recovery
# still waiting after a day is stuck: escalate rather than hold the gang's nodes.
BARRIER_TIMEOUT_RANGE_S = (30.0, 24 * 3600.0)
# node-unhealthy-after: the flap filter; 0s turns it off. 5s is the shortest tested setting
# (e2e); an hour is the longest a dead node's members should wait (bench uses it to keep node
# detection out of the way on overloaded simulated nodes).
NODE_UNHEALTHY_AFTER_RANGE_S = (5.0, 3600.0)
# kueue-recovery-timeout (Kueue's waitForPodsReady.recoveryTimeout): barrier deadlines are cut
# to 40 % of it (two of them fit in 80 %), so below 75s the deadline would fall under
# barrier-timeout's 30s minimum. Above 60h it caps nothing (2 x 24h / 80 %); 7 days is room.
KUEUE_RECOVERY_TIMEOUT_RANGE_S = (75.0, 7 * 24 * 3600.0)
# Share of Kueue's recoveryTimeout a recovery may use at most (the rest is the safety margin).
KUEUE_RECOVERY_SHARE = 0.8
# trainer-stop-grace: on the critical path of every recovery for a trainer that ignores
# SIGTERM; 0s kills at once. Its checkpoints are written atomically, so a kill cannot leave a
# half-written step that counts.
TRAINER_STOP_GRACE_RANGE_S = (0.0, 300.0)
# hang-timeout, startup-timeout: off unless set (a trainer that does not report progress must
# never be taken for a hung one). Progress is a file write per step, read by the agent every
# 0.25 s (agent/runner.py PROGRESS_READ_SECONDS): 2s is the shortest of which the poll is at
# most an eighth; past a week nothing is "detected". Whether a short one suits a workload is its
# longest stretch without a step (a checkpoint save, an evaluation), not the product's.
HANG_TIMEOUT_RANGE_S = (2.0, 7 * 24 * 3600.0)
# startup-timeout counts from the barrier's opening: a trainer's start (an interpreter, its
# imports) is in it, so under 10s it would mostly measure that.
STARTUP_TIMEOUT_RANGE_S = (10.0, 7 * 24 * 3600.0)
# straggler-factor: slower than the median by less than 10 % is noise; 100x is a hang.
STRAGGLER_FACTOR_RANGE = (1.1, 100.0)
# straggler-windows: the agent publishes this many windows on its pod (one annotation).
STRAGGLER_WINDOWS_RANGE = (1, 20)
# straggler-window: each window is one pod write per member (5000 members, 5 min: 17 writes/s;
# 30 s: 167/s, the shortest that is still a small share of a control plane's writes).
STRAGGLER_WINDOW_RANGE_S = (30.0, 3600.0)
# planned-move-timeout: how long a drain may wait for the gang's common step; under 10 s the
# agents' answers and the trainers' next step may not be in, past a day no drain waits.
PLANNED_MOVE_TIMEOUT_RANGE_S = (10.0, 24 * 3600.0)
INPLACE_BUDGET_RANGE = (0, 10_000)
RECREATE_BUDGET_RANGE = (0, 10_000)
MEMBER_REPEAT_LIMIT_RANGE = (1, 1000)
NO_PROGRESS_LIMIT_RANGE = (0, 1000)
# 0 is success, 1 a Python crash and 2 a configuration error of the agent: none may mean
# "restart".
RESTART_EXIT_CODE_RANGE = (3, 255)

# Go-style, hours, minutes and seconds (in this order, each optional); ASCII digits only.
_DURATION = re.compile(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+(?:\.[0-9]+)?)s)?")
_DURATION_MAX_LEN = 32  # far more than any sane duration; int() of a huge one is slow or fails
INT_FORM = "plain decimal digits: no sign, spaces, underscores or leading zeros"


def format_duration(seconds: float) -> str:
    """``seconds`` as :func:`parse_duration` reads it: ``75.0`` -> ``1m15s``, ``3600`` -> ``1h``."""
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    frac = round(seconds - whole, 3)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "")
    if s or frac or not out:
        out += f"{s + frac:g}s" if frac else f"{s}s"
    return out


def parse_duration(key: str, value: str) -> float:
    """Go-style durations: ``90s``, ``5m``, ``1h30m``, ``2.5s`` (any length of time: the policy's
    durations are bounded by :func:`_duration`)."""
    m = _DURATION.fullmatch(value) if len(value) <= _DURATION_MAX_LEN else None
    if not m or not any(m.groups()):
        raise PolicyError(key, value, "a duration such as 30s, 5m or 1h30m")
    h, mi, s = m.groups()
    return int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)


def _duration(key: str, value: str, bounds: tuple[float, float], examples: str) -> float:
    """:func:`parse_duration` within ``bounds``; the error states the form and the range."""
    lo, hi = bounds
    accepted = f"a duration such as {examples}, from {format_duration(lo)} to {format_duration(hi)}"
    try:
        seconds = parse_duration(key, value)
    except PolicyError:
        raise PolicyError(key, value, accepted) from None
    if not lo <= seconds <= hi:
        raise PolicyError(key, value, accepted)
    return seconds


def _int(key: str, value: str, bounds: tuple[int, int]) -> int:
    lo, hi = bounds
    n = parse_canonical_int(value, hi)
    if n is None or n < lo:
        raise PolicyError(key, value, f"an integer from {lo} to {hi} ({INT_FORM})")
    return n


# A taint key or a condition type as Kubernetes validates a qualified name: an optional DNS
# subdomain prefix (253 characters at most) and "/", then a name of 63 at most.
_QUALIFIED = re.compile(
    r"^(?:(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# Node conditions that are True on a healthy node: never a sign of trouble.
HEALTHY_WHEN_TRUE = frozenset({"Ready"})


def _names(key: str, value: str) -> frozenset[str]:
    names_ = [v.strip() for v in value.split(",") if v.strip()]
    accepted = (
        "a comma-separated list of taint keys or condition types (Kubernetes qualified names: "
        "an optional DNS prefix and '/', then up to 63 of A-Z a-z 0-9 - _ .)"
    )
    if not names_ or not all(_QUALIFIED.match(n) for n in names_):
        raise PolicyError(key, value, accepted)
    if key == names.UNHEALTHY_CONDITIONS and HEALTHY_WHEN_TRUE & set(names_):
        raise PolicyError(
            key, value, "condition types that are True when a node is unhealthy (not Ready)"
        )
    return frozenset(names_)


def _choice(key: str, value: str, enum: type[E]) -> E:
    try:
        return enum(value.strip())
    except ValueError:
        raise PolicyError(key, value, " or ".join(e.value for e in enum)) from None


PATH_MAX = 4096  # Linux's, with its terminating NUL


def _checkpoint_dirs(key: str, value: str) -> CheckpointDirs:
    """``local=/path,persistent=/path`` (either may be left out)."""
    accepted = "local=/abs/path,persistent=/abs/path (either part may be left out)"
    found: dict[str, str] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        tier, sep, path = part.partition("=")
        if not sep or tier not in ("local", "persistent") or tier in found:
            raise PolicyError(key, value, accepted)
        segments = path.split("/")[1:]
        if (
            not path.startswith("/")
            or path.endswith("/")  # "/" itself included: never the root
            or any(s in ("", ".", "..") for s in segments)
            or len(path) > PATH_MAX
        ):
            raise PolicyError(
                key, value, f"{accepted}; each an absolute path without '.', '..' or '//', not /"
            )
        found[tier] = path
    if not found:
        raise PolicyError(key, value, accepted)
    local, persistent = found.get("local"), found.get("persistent")
    if (
        local
        and persistent
        and (
            local == persistent
            or persistent.startswith(f"{local}/")
            or local.startswith(f"{persistent}/")
        )
    ):
        raise PolicyError(key, value, f"{accepted}; two directories, neither in the other")
    return CheckpointDirs(local, persistent)


def _step_pattern(key: str, value: str) -> str:
    try:
        return parse_step_pattern(value).pattern
    except ValueError:
        raise PolicyError(key, value, PATTERN_FORM) from None


def _factor(key: str, value: str, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    accepted = f"a number such as 1.5 or 2, from {lo:g} to {hi:g}"
    if not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,3})?", value):
        raise PolicyError(key, value, accepted)
    number = float(value)
    if not lo <= number <= hi:
        raise PolicyError(key, value, accepted)
    return number


# A Python module's dotted name (ASCII identifiers), at most PRESTART_IMPORTS_MAX of them.
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
PRESTART_IMPORTS_MAX = 32


def _modules(key: str, value: str) -> tuple[str, ...]:
    """``torch`` or ``torch,numpy,transformers``: modules, comma-separated."""
    accepted = (
        f"Python module names, comma-separated (e.g. torch or torch,numpy), at most "
        f"{PRESTART_IMPORTS_MAX}"
    )
    found = tuple(part.strip() for part in value.split(","))
    if len(found) > PRESTART_IMPORTS_MAX or not all(_MODULE.fullmatch(m) for m in found):
        raise PolicyError(key, value, accepted)
    return found


def _bool(key: str, value: str) -> bool:
    if value not in ("true", "false"):
        raise PolicyError(key, value, '"true" or "false"')
    return value == "true"


_PARSERS: tuple[tuple[str, str, Callable[[str, str], object]], ...] = (
    ("inplace_budget", names.INPLACE_BUDGET, lambda k, v: _int(k, v, INPLACE_BUDGET_RANGE)),
    ("recreate_budget", names.RECREATE_BUDGET, lambda k, v: _int(k, v, RECREATE_BUDGET_RANGE)),
    (
        "barrier_timeout_s",
        names.BARRIER_TIMEOUT,
        lambda k, v: _duration(k, v, BARRIER_TIMEOUT_RANGE_S, "30s, 5m or 1h30m"),
    ),
    (
        "node_unhealthy_after_s",
        names.NODE_UNHEALTHY_AFTER,
        lambda k, v: _duration(k, v, NODE_UNHEALTHY_AFTER_RANGE_S, "5s, 15s or 1m"),
    ),
    ("unhealthy_taints", names.UNHEALTHY_TAINTS, _names),
    ("unhealthy_conditions", names.UNHEALTHY_CONDITIONS, _names),
    ("force_delete", names.FORCE_DELETE, lambda k, v: _choice(k, v, ForceDelete)),
    (
        "member_repeat_limit",
        names.MEMBER_REPEAT_LIMIT,
        lambda k, v: _int(k, v, MEMBER_REPEAT_LIMIT_RANGE),
    ),
    (
        "no_progress_limit",
        names.NO_PROGRESS_LIMIT,
        lambda k, v: _int(k, v, NO_PROGRESS_LIMIT_RANGE),
    ),
    (
        "no_common_checkpoint",
        names.NO_COMMON_CHECKPOINT,
        lambda k, v: _choice(k, v, NoCommonCheckpoint),
    ),
    (
        "restart_exit_code",
        names.RESTART_EXIT_CODE,
        lambda k, v: _int(k, v, RESTART_EXIT_CODE_RANGE),
    ),
    ("checkpoint_dirs", names.CHECKPOINT_DIRS, _checkpoint_dirs),
    ("checkpoint_layout", names.CHECKPOINT_LAYOUT, lambda k, v: _choice(k, v, Layout)),
    ("checkpoint_step_pattern", names.CHECKPOINT_STEP_PATTERN, _step_pattern),
    ("escalation", names.ESCALATION, lambda k, v: _choice(k, v, Escalation)),
    (
        "kueue_recovery_timeout_s",
        names.KUEUE_RECOVERY_TIMEOUT,
        lambda k, v: _duration(k, v, KUEUE_RECOVERY_TIMEOUT_RANGE_S, "3m, 30m or 1h"),
    ),
    ("taint_on_device_fault", names.TAINT_ON_DEVICE_FAULT, _bool),
    ("restart_scope", names.RESTART_SCOPE, lambda k, v: _choice(k, v, RestartScope)),
    (
        "trainer_stop_grace_s",
        names.TRAINER_STOP_GRACE,
        lambda k, v: _duration(k, v, TRAINER_STOP_GRACE_RANGE_S, "0s, 0.5s or 5s"),
    ),
    ("prestart_imports", names.PRESTART_IMPORTS, _modules),
    ("prestart_warm", names.PRESTART_WARM, _bool),
    (
        "hang_timeout_s",
        names.HANG_TIMEOUT,
        lambda k, v: _duration(k, v, HANG_TIMEOUT_RANGE_S, "10m, 30m or 1h"),
    ),
    (
        "startup_timeout_s",
        names.STARTUP_TIMEOUT,
        lambda k, v: _duration(k, v, STARTUP_TIMEOUT_RANGE_S, "10m, 30m or 1h"),
    ),
    (
        "straggler_factor",
        names.STRAGGLER_FACTOR,
        lambda k, v: _factor(k, v, STRAGGLER_FACTOR_RANGE),
    ),
    (
        "straggler_windows",
        names.STRAGGLER_WINDOWS,
        lambda k, v: _int(k, v, STRAGGLER_WINDOWS_RANGE),
    ),
    (
        "straggler_window_s",
        names.STRAGGLER_WINDOW,
        lambda k, v: _duration(k, v, STRAGGLER_WINDOW_RANGE_S, "1m, 5m or 15m"),
    ),
    ("straggler_action", names.STRAGGLER_ACTION, lambda k, v: _choice(k, v, StragglerAction)),
    ("planned_moves", names.PLANNED_MOVES, _bool),
    (
        "planned_move_timeout_s",
        names.PLANNED_MOVE_TIMEOUT,
        lambda k, v: _duration(k, v, PLANNED_MOVE_TIMEOUT_RANGE_S, "2m, 10m or 1h"),
    ),
)


# Keys whose values the webhook writes into the JobSet's spec when it is created (transform:
# the agent's and trainers' env, the launcher, the failure policies): that spec is immutable,
# so a later change of one does not reach the pods. For CREATE_TIME_PRESENCE_KEYS it is whether
# the key is set that is written (straggler-factor: the agents' straggler windows), not its
# value, which the controller reads live.
CREATE_TIME_KEYS: frozenset[str] = frozenset(
    {
        names.CHECKPOINT_DIRS,
        names.CHECKPOINT_LAYOUT,
        names.CHECKPOINT_STEP_PATTERN,
        names.ESCALATION,
        names.PRESTART_IMPORTS,
        names.PRESTART_WARM,
        names.HANG_TIMEOUT,
        names.RESTART_EXIT_CODE,
        names.RESTART_SCOPE,
        names.STARTUP_TIMEOUT,
        names.STRAGGLER_WINDOW,
        names.STRAGGLER_WINDOWS,
        names.TRAINER_STOP_GRACE,
    }
)
CREATE_TIME_PRESENCE_KEYS: frozenset[str] = frozenset({names.STRAGGLER_FACTOR})

# The jobset-inplace.dev/ annotations a JobSet may carry: the policy's, the opt-in and the
# plugin's restart request. Anything else under the prefix is a typo (refused at admission).
KNOWN_KEYS: frozenset[str] = frozenset(
    {
        names.ENABLED,
        names.RESTART_REQUEST,
        *(key for _, key, _ in _PARSERS),
        # the gang's shape, read by core/spares.py (the webhook adds the spares to replicas)
        names.HOT_SPARES,
        names.HOT_SPARES_JOB,
    }
)
# Keys that can never change once the JobSet exists (refused on UPDATE): the webhook made its
# replicas from them, and the controller tells members from spares by them.
IMMUTABLE_KEYS: frozenset[str] = frozenset({names.HOT_SPARES, names.HOT_SPARES_JOB})


def unknown_keys(annotations: Mapping[str, str] | None) -> list[PolicyError]:
    """An error for each ``jobset-inplace.dev/*`` key that is not one of :data:`KNOWN_KEYS`,
    naming the nearest known key when one is close."""
    errors = []
    for key, value in sorted((annotations or {}).items()):
        if key.startswith(names.PREFIX) and key not in KNOWN_KEYS:
            near = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.75)
            hint = f" (did you mean {near[0]}?)" if near else ""
            errors.append(
                PolicyError(
                    key, value, f"one of the {names.PREFIX} keys of docs/annotations.md{hint}"
                )
            )
    return errors


def parse_policy(annotations: Mapping[str, str] | None) -> Policy:
    """Policy from JobSet annotations; absent keys keep their defaults; keys it does not know
    are left to admission (:func:`unknown_keys`).

    Raises :class:`PolicyError`, for every malformed key at once (:class:`PolicyErrors`)."""
    a = annotations or {}
    errors: list[PolicyError] = []
    try:
        parse_enabled(a)
    except PolicyError as e:
        errors.append(e)
    values: dict[str, Any] = {}
    for field_name, key, parse in _PARSERS:
        if key in a:
            try:
                values[field_name] = parse(key, a[key])
            except PolicyError as e:
                errors.append(e)
    raise_all(errors)
    policy = dataclasses.replace(Policy(), **values)
    try:  # the pair: our own layout's step names are fixed
        checkpoint_layout(policy.checkpoint_layout, policy.checkpoint_step_pattern)
    except ValueError:
        key = names.CHECKPOINT_STEP_PATTERN
        raise PolicyError(
            key, a[key], f"no {key} with {names.CHECKPOINT_LAYOUT} jobset-inplace (step-{{step}})"
        ) from None
    return policy


def barrier_within_kueue(barrier_timeout_s: float, recovery_timeout_s: float | None) -> float:
    """The barrier deadline kept inside Kueue's ``recoveryTimeout`` (None: Kueue never evicts
    a recovery): a recovery can take two deadlines (laggards recreated once, then
    escalation), which must fit in :data:`KUEUE_RECOVERY_SHARE` of it. The one rule for the
    planner and the plugin's doctor."""
    if recovery_timeout_s is None:
        return barrier_timeout_s
    return min(barrier_timeout_s, KUEUE_RECOVERY_SHARE * recovery_timeout_s / 2)


def kueue_recovery_timeout_needed(barrier_timeout_s: float) -> float:
    """The shortest ``recoveryTimeout`` that keeps ``barrier_timeout_s`` whole."""
    return 2 * barrier_timeout_s / KUEUE_RECOVERY_SHARE
