"""The trainer's progress record: which step it reached and when, the signal of hang detection.

A trainer calls :func:`report_progress` once per step (or keeps a :class:`ProgressReporter`).
Each new step rewrites one small file in the shared state directory,
``$JSI_STATE_DIR/progress-<name>.json`` = ``{"step": <int>, "at": <unix seconds>}``, atomically
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
from dataclasses import dataclass
from pathlib import Path

from jobset_inplace.launcher import DEFAULT_STATE_DIR, ENV_CONTAINER, ENV_STATE_DIR
from jobset_inplace.trainer.checkpoints import MAX_STEP, is_int

__all__ = [
    "DEFAULT_NAME",
    "Progress",
    "ProgressReporter",
    "clear_progress",
    "progress_file",
    "read_progress",
    "report_progress",
]

PREFIX, SUFFIX = "progress-", ".json"
DEFAULT_NAME = "trainer"  # without $JSI_CONTAINER_NAME (a trainer run by hand)


@dataclass(frozen=True)
class Progress:
    step: int
    at: float  # when the trainer reached ``step`` (its clock: for people, not for detection)


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
        if isinstance(at, bool) or not isinstance(at, int | float):
            continue
        out[name[len(PREFIX) : -len(SUFFIX)]] = Progress(step, float(at))
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


class ProgressReporter:
    """Writes the progress record when the step changes (calls with the same step are free)."""

    def __init__(self, state_dir: Path | None = None, name: str | None = None) -> None:
        directory = state_dir or Path(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR)
        self.path = progress_file(directory, name or os.environ.get(ENV_CONTAINER) or DEFAULT_NAME)
        self.step: int | None = None

    def __call__(self, step: int) -> None:
        if not is_int(step) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"step must be an integer 0..{MAX_STEP}, got {step!r}")
        if step == self.step:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"step": step, "at": round(time.time(), 3)}), encoding="utf-8")
        os.replace(tmp, self.path)
        self.step = step


@functools.cache
def _reporter() -> ProgressReporter:
    return ProgressReporter()


def report_progress(step: int) -> None:
    """Record that the trainer reached ``step`` (call it once per step; cheap when the step did
    not change). Needed only with ``hang-timeout`` or ``startup-timeout`` set."""
    _reporter()(step)
