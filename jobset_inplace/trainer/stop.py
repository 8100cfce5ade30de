"""A planned stop: the gang stops at one step, every member with a checkpoint of it, so that a
member can be moved (its node drained or cordoned) with no step lost.

The controller picks the step (a little ahead of the newest any member reached); each agent
writes it to ``$JSI_STATE_DIR/stop.json`` = ``{"epoch": E, "step": S}``. The trainer's
:func:`~jobset_inplace.trainer.report_progress` answers True at step S (or past it); the trainer
then saves a checkpoint of that step (to the persistent tier too: the moved member's new pod
reads it there) and calls :func:`park`: its progress record says it is parked at S, and it waits
to be stopped (the recovery that follows restarts every trainer, resuming at S). A trainer that
never looks is moved anyway at the planned-move deadline (docs/trainer-contract.md).

Standard library only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from jobset_inplace.launcher import DEFAULT_STATE_DIR, ENV_STATE_DIR, STOP_FILE
from jobset_inplace.trainer.checkpoints import MAX_STEP, is_int

__all__ = ["StopAt", "clear_stop", "read_stop", "write_stop"]


@dataclass(frozen=True)
class StopAt:
    epoch: int
    step: int


def _state_dir(state_dir: Path | None) -> Path:
    return state_dir or Path(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR)


def read_stop(state_dir: Path | None = None) -> StopAt | None:
    """The planned stop the agent wrote (None: none, or not in the form above)."""
    try:
        doc = json.loads((_state_dir(state_dir) / STOP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    epoch, step = doc.get("epoch"), doc.get("step")
    if not (is_int(epoch) and is_int(step) and epoch > 0 and 0 <= step <= MAX_STEP):
        return None
    return StopAt(epoch, step)


def write_stop(stop: StopAt, state_dir: Path) -> None:
    """Atomically write ``stop.json`` (the agent does; world-readable, like ``resume.json``)."""
    target = state_dir / STOP_FILE
    tmp = state_dir / f".{STOP_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"epoch": stop.epoch, "step": stop.step}), encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def clear_stop(state_dir: Path) -> None:
    """Remove ``stop.json`` (the agent does, before a barrier opens: a stop is one epoch's)."""
    (state_dir / STOP_FILE).unlink(missing_ok=True)


class StopWatch:
    """Whether the trainer must stop at a step: reads ``stop.json`` again only when it changed
    (one ``stat`` per call otherwise), so calling it every step costs microseconds."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.path = _state_dir(state_dir) / STOP_FILE
        self.seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file read
        self.stop: StopAt | None = None

    def due(self, step: int) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            self.seen, self.stop = None, None
            return False
        key = (st.st_mtime_ns, st.st_size)
        if key != self.seen:
            self.seen, self.stop = key, read_stop(self.path.parent)
        return self.stop is not None and step >= self.stop.step


def park_forever() -> NoReturn:
    """Wait to be stopped (the recovery's restart sends SIGTERM, as to any trainer)."""
    while True:
        time.sleep(3600)
