"""An agent's report: what it tells the leader of its pod in an epoch, typed, with the one
codec both wires use (the report channel's JSON ``report`` object and the pod's annotations:
annotation name -> string value, the names in :mod:`jobset_inplace.names`) and the rule that
orders two reports of one pod.

Standard library only: the agent, the decision core and the controller import it (the plugin
reads reports through the core's ``core/decode.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Final, TypeVar

from jobset_inplace import names
from jobset_inplace.trainer.checkpoints import (
    MAX_STEP,
    decode_steps,
    encode_steps,
    parse_canonical_int,
    shorten_repr,
)
from jobset_inplace.trainer.progress import ProgressSpan, decode_span, encode_span

T = TypeVar("T")

# A malformed report's value is shown cut to this many characters (of its repr): the message
# becomes the pod view's report_error, an Event and a log line, and is remembered so that it is
# posted once; an agent (or anyone else) can write annotations of hundreds of KB.
REPORT_VALUE_SHOWN: Final = 80
# ... and a whole error at most this long (each part is short; this is the backstop).
REPORT_ERROR_MAX: Final = 1000


@dataclass(frozen=True)
class AgentReport:
    """One pod's agent's report of an epoch: the epoch and its checkpoint steps, and what it
    added while the epoch ran. Each field is None when the report does not say it. The names
    are the planner's (:class:`~jobset_inplace.core.model.PodView` has each)."""

    reported_epoch: int | None = None  # names.REPORT_EPOCH
    reported_steps: tuple[int, ...] | None = None  # ... its checkpoint steps, newest first
    late_for_epoch: int | None = None  # reported into that epoch's open barrier
    exited_in_epoch: int | None = None  # its trainer exited non-zero (process scope)
    hung_in_epoch: int | None = None  # its trainer made no progress
    progress_step: int | None = None  # the newest step of the epoch before
    progress_span: ProgressSpan | None = None  # ... and the span of that progress
    progress_now: tuple[int, ProgressSpan | None] | None = None  # a planned stop's answer
    parked_in_epoch: int | None = None  # its trainers parked at the planned step
    rechecked_epoch: int | None = None  # it looked at its steps again (status.stepRecheck)

    def merged(self, addition: AgentReport) -> AgentReport:
        """This report with what ``addition`` says (an exit, a hang, ...) added."""
        said = {f.name: v for f in fields(addition) if (v := getattr(addition, f.name)) is not None}
        return replace(self, **said)

    def only_its_epoch(self) -> bool:
        """Whether it says no more than its epoch, checkpoint steps and the epoch before's
        progress (what every member reports once the GangState names a new epoch)."""
        return (
            self.late_for_epoch is None
            and self.exited_in_epoch is None
            and self.hung_in_epoch is None
            and self.progress_now is None
            and self.parked_in_epoch is None
            and self.rechecked_epoch is None
        )

    def order(self) -> tuple[int, int]:
        """Where this report stands among its pod's agents' reports (:func:`report_order`)."""
        return report_order(self.reported_epoch, self.exited_in_epoch, self.hung_in_epoch)

    @property
    def epoch(self) -> int:
        """The epoch the report is about: the newest it names (-1: none)."""
        return self.order()[0]

    def rank(self, gang_epoch: int | None) -> tuple[int, int]:
        """Where it ranks at the gang's epoch ``gang_epoch`` (:func:`report_rank`)."""
        return report_rank(self.order(), gang_epoch)


def report_order(
    reported_epoch: int | None, exited_in_epoch: int | None, hung_in_epoch: int | None
) -> tuple[int, int]:
    """Where a report of these fields stands among its pod's agents' reports, in the order they
    were made: by the epoch it is about, then by an exit or hang seen in it. An agent reports an
    exit or hang in epoch N only after its report of epoch N, so such a report is of epoch N at
    least, whether or not it repeats that report (an older agent's fallback wrote only the exit
    on its pod). (Of the fields, not of an AgentReport: the leader orders the reports its views
    hold per report it takes, without making one.)"""
    seen = -1  # (no generator and max(): per report taken)
    for e in (exited_in_epoch, hung_in_epoch):
        if e is not None and e > seen:
            seen = e
    epoch = -1 if reported_epoch is None else reported_epoch
    return (max(epoch, seen), seen)


def report_rank(order: tuple[int, int], gang_epoch: int | None) -> tuple[int, int]:
    """A report's :func:`report_order`, where a report that names an epoch beyond the gang's
    (``gang_epoch``; None: not known) ranks below every other, even an empty one: an agent
    learns epochs only from the GangState, so only a forged or corrupt report (or one about a
    GangState made again since) is ahead, and it must never hide a later, valid report of the
    current epoch."""
    return AHEAD if gang_epoch is not None and order[0] > gang_epoch else order


# Where a report ahead of the gang's epoch ranks (AgentReport.rank).
AHEAD: Final = (-2, -2)
EMPTY: Final = AgentReport()


def newer_report(old: AgentReport | None, new: AgentReport, gang_epoch: int | None) -> bool:
    """Whether ``new`` is as new as ``old`` or newer: a late, older request must not replace
    the report that overtook it; a report ahead of ``gang_epoch`` replaces nothing and is
    replaced by any (:meth:`AgentReport.rank`)."""
    return old is None or new.rank(gang_epoch) >= old.rank(gang_epoch)


# --- the codec: field <-> annotation name; a number of an epoch or step is canonical decimal --
NUMBER_KEYS: Final = {
    "reported_epoch": names.REPORT_EPOCH,
    "late_for_epoch": names.REPORT_LATE,
    "exited_in_epoch": names.REPORT_EXITED,
    "hung_in_epoch": names.REPORT_HUNG,
    "progress_step": names.REPORT_PROGRESS_STEP,
    "parked_in_epoch": names.REPORT_PARKED,
    "rechecked_epoch": names.REPORT_RECHECKED,
}


def encode_report(report: AgentReport) -> dict[str, str]:
    """The report as annotation name -> value (what it does not say: no key)."""
    out = {key: str(v) for f, key in NUMBER_KEYS.items() if (v := getattr(report, f)) is not None}
    if report.reported_steps is not None:
        out[names.REPORT_STEPS] = encode_steps(report.reported_steps)
    if report.progress_span is not None:
        out[names.REPORT_PROGRESS_SPAN] = encode_span(report.progress_span)
    if report.progress_now is not None:
        out[names.REPORT_PROGRESS_NOW] = encode_epoch_span(*report.progress_now)
    return out


def bad_report_number(key: str, raw: str) -> str:
    """The error for a number in a report that is not canonical."""
    return (
        f"{key}={shorten_repr(raw, REPORT_VALUE_SHOWN)} is not an integer from 0 to {MAX_STEP} "
        "in canonical form (ASCII digits only: no sign, spaces, underscores or leading zeros)"
    )


def decode_report(values: Mapping[str, str]) -> tuple[AgentReport | None, str | None]:
    """The report in ``values`` (a pod's annotations, or the channel's ``report`` object;
    other keys are not looked at), or the error that makes it unusable (then no report: a
    report is taken whole or not at all)."""
    errors: list[str] = []

    def number(key: str) -> int | None:
        raw = values.get(key)
        value = None if raw is None else parse_canonical_int(raw)
        if raw is not None and value is None:
            errors.append(bad_report_number(key, raw))
        return value

    numbers = {field: number(key) for field, key in NUMBER_KEYS.items()}
    steps: tuple[int, ...] | None = None
    if (raw := values.get(names.REPORT_STEPS)) is not None:
        try:
            steps = tuple(decode_steps(raw))
        except ValueError as e:
            errors.append(f"{names.REPORT_STEPS}: {e}")
    span = _decoded(
        values,
        names.REPORT_PROGRESS_SPAN,
        decode_span,
        "<first step>@<ms since the epoch>,<newest step>@<ms since the epoch> "
        "(canonical integers, neither going backwards)",
        errors,
    )
    now = _decoded(
        values,
        names.REPORT_PROGRESS_NOW,
        decode_epoch_span,
        "<epoch>:<progress span, or nothing>",
        errors,
    )
    if errors:
        error = "; ".join(errors)
        cut = len(error) > REPORT_ERROR_MAX
        return None, f"{error[: REPORT_ERROR_MAX - 3]}..." if cut else error
    return AgentReport(
        reported_epoch=numbers["reported_epoch"],
        reported_steps=steps,
        late_for_epoch=numbers["late_for_epoch"],
        exited_in_epoch=numbers["exited_in_epoch"],
        hung_in_epoch=numbers["hung_in_epoch"],
        progress_step=numbers["progress_step"],
        progress_span=span,
        progress_now=now,
        parked_in_epoch=numbers["parked_in_epoch"],
        rechecked_epoch=numbers["rechecked_epoch"],
    ), None


def _decoded(
    values: Mapping[str, str],
    key: str,
    decode: Callable[[str], T | None],
    form: str,
    errors: list[str],
) -> T | None:
    """``values[key]`` as ``decode`` reads it (None: absent, or malformed: then an error
    naming the key and its accepted ``form``)."""
    raw = values.get(key)
    if raw is None:
        return None
    value = decode(raw)
    if value is None:
        errors.append(f"{key}={shorten_repr(raw, REPORT_VALUE_SHOWN)} is not {form}")
    return value


# --- the progress note: over the channel only, alone in its request ----------------------------
def encode_epoch_span(epoch: int, span: ProgressSpan | None) -> str:
    """``<epoch>:<progress span>`` (span empty: none)."""
    return f"{epoch}:{'' if span is None else encode_span(span)}"


def decode_epoch_span(raw: str) -> tuple[int, ProgressSpan | None] | None:
    """What :func:`encode_epoch_span` wrote; None when malformed."""
    epoch_text, sep, span_text = raw.partition(":")
    epoch = parse_canonical_int(epoch_text)
    span = decode_span(span_text) if span_text else None
    if not sep or epoch is None or (span_text and span is None):
        return None
    return epoch, span


def decode_progress_note(raw: str) -> tuple[tuple[int, ProgressSpan] | None, str | None]:
    """An agent's note of how far its trainers are in the running epoch
    (``names.REPORT_PROGRESS_NOTE``): ``(epoch, span)``, or the error that makes it unusable."""
    parsed = decode_epoch_span(raw)
    if parsed is None or parsed[1] is None:
        return None, (
            f"{names.REPORT_PROGRESS_NOTE}={shorten_repr(raw, REPORT_VALUE_SHOWN)} is not "
            "<epoch>:<progress span>"
        )
    return (parsed[0], parsed[1]), None
