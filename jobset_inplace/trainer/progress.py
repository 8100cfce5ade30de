"""The trainer's progress record: which step it reached and when, the signal of hang detection.

A trainer calls :func:`report_progress` once per step (or keeps a :class:`ProgressReporter`).
Each new step rewrites one small file in the shared state directory,
``$JSI_STATE_DIR/progress-<name>.json`` = ``{"step": <int>, "at": <unix seconds>}`` (and
``"busyS"``: busy seconds summed over the steps, for straggler detection; ``"firstStep"`` and
``"firstAt"``: the first step this trainer reported and when, for goodput), atomically
(a temporary file renamed over it); ``<name>`` is ``$JSI_CONTAINER_NAME`` (set on every main
container), so several trainer containers of one pod keep one record each. No API request, no
lock: a rename on the pod's local volume. The agent reads the records (:func:`read_progress`)
and calls a trainer hung when its step stops advancing (docs/trainer-contract.md). A trainer in
another language writes the same file the same way.

Standard library only.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from jobset_inplace.launcher import DEFAULT_STATE_DIR, ENV_CONTAINER, ENV_STATE_DIR
from jobset_inplace.trainer.checkpoints import MAX_STEP, is_int, parse_canonical_int
from jobset_inplace.trainer.stop import StopWatch, park_forever

__all__ = [
    "DEFAULT_NAME",
    "Progress",
    "ProgressReporter",
    "ProgressSpan",
    "clear_progress",
    "decode_busy",
    "decode_span",
    "encode_busy",
    "encode_span",
    "park",
    "progress_file",
    "read_progress",
    "report_progress",
    "span_of",
]

PREFIX, SUFFIX = "progress-", ".json"
DEFAULT_NAME = "trainer"  # without $JSI_CONTAINER_NAME (a trainer run by hand)


@dataclass(frozen=True)
class Progress:
    step: int
    at: float  # when the trainer reached ``step`` (its clock: for people, not for detection)
    # Seconds the trainer was busy (not waiting in collectives) over all the steps it reported
    # so far; None if it does not say (straggler detection needs it).
    busy: float | None = None
    # The first step this trainer reported and when (None: its writer does not say): with
    # ``step`` and ``at``, the trainer's pace over its epoch (goodput accounting).
    first_step: int | None = None
    first_at: float | None = None
    parked: bool = False  # the trainer stopped at ``step`` for a planned stop (trainer.stop)


def progress_file(state_dir: Path, name: str) -> Path:
    return state_dir / f"{PREFIX}{name}{SUFFIX}"


def read_progress(state_dir: Path) -> dict[str, Progress]:
    """Every readable progress record in ``state_dir``, by name. A record that is not
    ``{"step": 0..MAX_STEP, "at": number}`` is left out (the writer renames whole files, so a
    partial one is never seen)."""
    out: dict[str, Progress] = {}
    try:
        entries = list(state_dir.iterdir())
    except OSError:
        return out
    for path in entries:
        name = path.name
        if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        step, at = doc.get("step"), doc.get("at")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            continue
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            continue
        busy = doc.get("busyS")
        if isinstance(busy, bool) or not isinstance(busy, (int, float)) or not 0 <= busy < 1e15:
            busy = None  # absent or malformed: the record still counts as progress
        first_step, first_at = doc.get("firstStep"), doc.get("firstAt")
        if not (
            isinstance(first_step, int)
            and not isinstance(first_step, bool)
            and 0 <= first_step <= step
            and not isinstance(first_at, bool)
            and isinstance(first_at, (int, float))
            and first_at <= at
        ):
            first_step = first_at = None  # absent or inconsistent: no pace from this record
        out[name[len(PREFIX) : -len(SUFFIX)]] = Progress(
            step,
            float(at),
            None if busy is None else float(busy),
            first_step,
            None if first_at is None else float(first_at),
            doc.get("parked") is True,
        )
    return out


def clear_progress(state_dir: Path) -> None:
    """Remove every progress record (the agent does, before a barrier opens: an epoch's records
    are its trainers' only)."""
    try:
        entries = list(state_dir.iterdir())
    except FileNotFoundError:
        return
    for path in entries:
        if path.name.startswith(PREFIX) and path.name.endswith(SUFFIX):
            path.unlink(missing_ok=True)


# The agent's report of its windows (``jobset-inplace.dev/busy-ms-per-step``): busy
# milliseconds per step, newest window first, comma-separated canonical integers.
MAX_BUSY_WINDOWS = 20
MAX_BUSY_MS = 10**9


def encode_busy(history: tuple[int, ...]) -> str:
    return ",".join(map(str, history))


def decode_busy(text: str) -> tuple[int, ...] | None:
    """The windows of a report; None if it is not in the form above."""
    parts = text.split(",")
    if len(parts) > MAX_BUSY_WINDOWS:
        return None
    values = [parse_canonical_int(p, MAX_BUSY_MS) for p in parts]
    return None if any(v is None for v in values) else tuple(v for v in values if v is not None)


@dataclass(frozen=True)
class ProgressSpan:
    """How far a pod's trainers got in one epoch and at what pace, as its agent reports it
    with its next epoch (``jobset-inplace.dev/progress-span``): the first step they reported
    and when, the newest and when (seconds since the epoch, to the millisecond)."""

    first_step: int
    first_at: float
    last_step: int
    last_at: float

    @property
    def step_seconds(self) -> float | None:
        """Seconds per step over the span (None: a single step, no pace)."""
        if self.last_step <= self.first_step:
            return None
        return (self.last_at - self.first_at) / (self.last_step - self.first_step)


def span_of(records: Mapping[str, Progress]) -> ProgressSpan | None:
    """The pod's span from its trainers' records (those that say where they started): from
    the earliest first step to the newest step (None: no such record)."""
    spanned = [r for r in records.values() if r.first_step is not None and r.first_at is not None]
    if not spanned:
        return None
    first = min(spanned, key=lambda r: (r.first_at, r.first_step))
    last = max(spanned, key=lambda r: (r.step, r.at))
    assert first.first_step is not None
    assert first.first_at is not None
    if last.step < first.first_step or last.at < first.first_at:
        return None  # trainers that disagree (a clock step): no pace rather than a wrong one
    return ProgressSpan(first.first_step, first.first_at, last.step, last.at)


# The span's encoding: "<first step>@<first at ms>,<last step>@<last at ms>", canonical
# integers, times in milliseconds since the epoch.
MAX_SPAN_MS = 10**14  # year 5138: bounds what a report may claim


def encode_span(span: ProgressSpan) -> str:
    first_ms, last_ms = round(span.first_at * 1000), round(span.last_at * 1000)
    return f"{span.first_step}@{first_ms},{span.last_step}@{last_ms}"


def decode_span(text: str) -> ProgressSpan | None:
    """The span of a report; None if it is not in the form above, or runs backwards."""
    ends = text.split(",")
    if len(ends) != 2:
        return None
    parsed: list[tuple[int, int]] = []
    for end in ends:
        parts = end.split("@")
        if len(parts) != 2:
            return None
        step, ms = parse_canonical_int(parts[0]), parse_canonical_int(parts[1], MAX_SPAN_MS)
        if step is None or ms is None:
            return None
        parsed.append((step, ms))
    (first_step, first_ms), (last_step, last_ms) = parsed
    if last_step < first_step or last_ms < first_ms:
        return None
    return ProgressSpan(first_step, first_ms / 1000, last_step, last_ms / 1000)


class ProgressReporter:
    """Writes the progress record when the step changes (calls with the same step are free,
    but for adding their ``busy_s``); answers whether a planned stop is due at the step."""

    def __init__(self, state_dir: Path | None = None, name: str | None = None) -> None:
        directory = state_dir or Path(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR)
        self.path = progress_file(directory, name or os.environ.get(ENV_CONTAINER) or DEFAULT_NAME)
        self.stops = StopWatch(directory)
        self.step: int | None = None
        self.busy: float | None = None  # the sum of the busy_s given so far
        self.first: tuple[int, float] | None = None  # the first step written, and when

    def __call__(self, step: int, busy_s: float | None = None) -> bool:
        if not is_int(step) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"step must be an integer 0..{MAX_STEP}, got {step!r}")
        if busy_s is not None:
            if isinstance(busy_s, bool) or not isinstance(busy_s, (int, float)):
                raise ValueError(f"busy_s must be seconds (a number >= 0), got {busy_s!r}")
            if not 0 <= busy_s < 1e9:  # also refuses nan
                raise ValueError(f"busy_s must be seconds (a number >= 0), got {busy_s!r}")
            self.busy = (self.busy or 0.0) + busy_s
        if step != self.step:
            self._write(step)
        return self.stops.due(step)

    def _write(self, step: int, *, parked: bool = False) -> None:
        at = round(time.time(), 3)
        if self.first is None:
            self.first = (step, at)
        doc: dict[str, float | bool] = {"step": step, "at": at}
        doc["firstStep"], doc["firstAt"] = self.first
        if self.busy is not None:
            doc["busyS"] = round(self.busy, 6)
        if parked:
            doc["parked"] = True
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, self.path)
        self.step = step

    def park(self, step: int) -> NoReturn:
        """Stopped at ``step`` for a planned stop, its checkpoint saved: say so in the progress
        record (the agent reports it; the gang's recovery follows) and wait to be stopped."""
        self._write(step, parked=True)
        park_forever()


@functools.cache
def _reporter() -> ProgressReporter:
    return ProgressReporter()


def report_progress(step: int, busy_s: float | None = None) -> bool:
    """Record that the trainer reached ``step`` (call it once per step; cheap when the step did
    not change), and optionally how long the step kept it busy, not counting the time it
    waited for the other members in collectives (``busy_s``: straggler detection's signal).
    Read by hang and straggler detection and goodput accounting (docs/annotations.md).

    True when a planned stop is due at ``step`` (a member's node is being drained): save a
    checkpoint of ``step`` (to the persistent tier too) and call :func:`park`."""
    return _reporter()(step, busy_s)


def park(step: int) -> NoReturn:
    """After a planned stop's checkpoint of ``step``: wait to be stopped (trainer.stop)."""
    _reporter().park(step)
