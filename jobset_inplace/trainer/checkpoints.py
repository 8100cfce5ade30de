"""Checkpoint layout shared by the trainer and the agent: scanning, reporting, marking.

A checkpoint of step ``S`` lives in ``<tier root>/step-<S>/`` and counts only once the file
``COMPLETE`` exists inside it (written last). Everything else in a tier root is ignored.

Standard library only: the agent imports this on its start-up critical path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (typing has it from 3.10; the kubectl plugin runs on 3.9: strenum.py)
    from typing import TypeGuard

__all__ = [
    "COMPLETE_MARKER",
    "DEFAULT_PERSISTENT_RESERVE",
    "DEFAULT_REPORT_LIMIT",
    "MAX_STEP",
    "RETIRED_MARKER",
    "available_steps",
    "check_step",
    "decode_steps",
    "encode_steps",
    "is_complete",
    "is_int",
    "mark_complete",
    "parse_canonical_int",
    "retire_steps_after",
    "scan_tier",
    "select_steps",
    "shorten_repr",
    "step_dir",
]

COMPLETE_MARKER = "COMPLETE"
"""File whose presence makes a step directory a complete checkpoint."""

RETIRED_MARKER = "RETIRED"
"""``COMPLETE`` is renamed to this when a step is retired (see `retire_steps_after`)."""

STEP_DIR_PREFIX = "step-"

MAX_STEP = 2**63 - 1
"""Largest step number: steps must fit a signed 64-bit integer (JSON, Go, CRD status)."""

DEFAULT_REPORT_LIMIT = 16
DEFAULT_PERSISTENT_RESERVE = 4

_MAX_STEP_DIGITS = len(str(MAX_STEP))
_STEP_DIR_RE = re.compile(STEP_DIR_PREFIX + r"(0|[1-9][0-9]{0,18})")
_ACCEPTED_FORM = (
    "expected decimal integers 0..2^63-1 without spaces or leading zeros, comma-separated, "
    "strictly decreasing (newest first), e.g. '300,200,100', or an empty string for none"
)


def parse_canonical_int(text: str, high: int = MAX_STEP) -> int | None:
    """The value of `text` if it is a decimal integer from 0 to `high` in canonical form, else
    None. The one parse of the numbers people and agents write as text (policy annotations,
    the agents' reports, the agent's environment).

    Canonical: ASCII digits only, no sign, no leading zero (but "0" itself), no spaces or
    underscores. Python's ``int()`` also takes " 1", "+1", "01", "1_0", full-width ("\\uff11")
    and Arabic-Indic ("\\u0661") digits: several spellings of one number, none of which a
    well-behaved writer produces. The length is checked first, so a huge value costs nothing
    (``int()`` refuses more than 4300 digits with a ValueError)."""
    digits = _MAX_STEP_DIGITS if high == MAX_STEP else len(str(high))
    if not isinstance(text, str) or not 0 < len(text) <= digits or not _canonical_digits(text):
        return None
    value = int(text)
    return value if value <= high else None


def _canonical_digits(text: str) -> bool:
    """Whether ``text`` is canonical decimal ("0", "17"; not "017", "+1", " 1", ""): one
    number, one spelling (and one step directory). ASCII only: ``str.isdigit`` and ``int()``
    also take other scripts' digits ("\\u0661") and superscripts. (Not a regular expression:
    the leader parses a report's numbers per member per recovery, and a match costs several
    times these string tests: timeit, unrecorded.)"""
    return text.isascii() and text.isdigit() and (text[0] != "0" or len(text) == 1)


def is_int(value: object) -> TypeGuard[int]:
    """Whether `value` is an int and not a bool (JSON ``true`` is no step, epoch or count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_step(step: int) -> int:
    """Return `step` if it is a valid step number (int in ``0..MAX_STEP``), else raise."""
    if not is_int(step):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be between 0 and {MAX_STEP}, got {step}")
    return step


def step_dir(root: Path, step: int) -> Path:
    """Directory of the checkpoint for `step` under tier `root`."""
    return root / f"{STEP_DIR_PREFIX}{check_step(step)}"


def _parse_step_dir_name(name: str) -> int | None:
    m = _STEP_DIR_RE.fullmatch(name)
    if m is None:
        return None
    step = int(m.group(1))
    return step if step <= MAX_STEP else None


def is_complete(directory: Path) -> bool:
    """Whether `directory` carries the ``COMPLETE`` marker (a regular file)."""
    return (directory / COMPLETE_MARKER).is_file()


def scan_tier(root: Path) -> set[int]:
    """Steps with a complete checkpoint directly under `root`.

    A missing root is an empty tier. Entries that vanish during the scan (a trainer pruning
    old steps) are skipped. Any other error reading `root` itself (e.g. permission denied)
    propagates: reporting "nothing" for an unreadable tier could wrongly discard progress.
    """
    try:
        entries = os.scandir(root)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    found: set[int] = set()
    with entries:
        for entry in entries:
            step = _parse_step_dir_name(entry.name)
            if step is None:
                continue
            try:
                if entry.is_dir() and is_complete(Path(entry.path)):
                    found.add(step)
            except OSError:
                continue
    return found


def available_steps(
    local: Path | None,
    persistent: Path | None,
    limit: int = DEFAULT_REPORT_LIMIT,
    *,
    persistent_reserve: int = DEFAULT_PERSISTENT_RESERVE,
) -> list[int]:
    """Complete steps of both tiers (either may be None), newest first; see `select_steps`."""
    return select_steps(
        scan_tier(local) if local is not None else set(),
        scan_tier(persistent) if persistent is not None else set(),
        limit,
        persistent_reserve=persistent_reserve,
    )


def select_steps(
    local: Iterable[int],
    persistent: Iterable[int],
    limit: int = DEFAULT_REPORT_LIMIT,
    *,
    persistent_reserve: int = DEFAULT_PERSISTENT_RESERVE,
) -> list[int]:
    """The steps to report: at most `limit`, newest first.

    The newest `persistent_reserve` persistent steps (capped to `limit`) are always included;
    the remaining slots
    go to the newest steps of the union. Without the reserve, a member whose local tier runs
    far ahead would report only local steps and share none with a replacement pod that sees
    only the persistent tier. When the persistent steps are among the newest anyway, the
    result is simply the newest `limit` steps of the union.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if persistent_reserve < 0:
        raise ValueError(f"persistent_reserve must be >= 0, got {persistent_reserve}")
    persistent_steps = set(persistent)
    chosen = set(sorted(persistent_steps, reverse=True)[: min(persistent_reserve, limit)])
    for step in sorted(persistent_steps.union(local), reverse=True):
        if len(chosen) >= limit:
            break
        chosen.add(step)
    return sorted(chosen, reverse=True)


def encode_steps(steps: Iterable[int]) -> str:
    """Annotation value for `steps`: distinct steps, newest first, comma-separated."""
    return ",".join(str(s) for s in sorted({check_step(s) for s in steps}, reverse=True))


def shorten_repr(text: str, width: int = 80) -> str:
    """`text`'s repr, cut to `width` characters (escapes count: the result stays short) and
    followed by the length of `text` when cut: how messages show a value that may be huge."""
    shown = repr(text)
    return shown if len(shown) <= width else shown[:width] + f"... ({len(text)} chars)"


def decode_steps(text: str) -> list[int]:
    """Parse an annotation value written by `encode_steps`; newest first.

    Raises ValueError naming the offending element and the accepted form.
    """
    if text == "":
        return []
    steps: list[int] = []
    for index, item in enumerate(text.split(",")):
        if not _canonical_digits(item):
            what = "is empty" if item == "" else f"({shorten_repr(item, 24)}) is not a step number"
            raise _malformed(text, index, what)
        step = int(item) if len(item) <= _MAX_STEP_DIGITS else None
        if step is None or step > MAX_STEP:
            raise _malformed(text, index, f"({shorten_repr(item, 24)}) exceeds {MAX_STEP}")
        if steps and step >= steps[-1]:
            raise _malformed(text, index, f"({step}) is not below the one before ({steps[-1]})")
        steps.append(step)
    return steps


def _malformed(text: str, index: int, what: str) -> ValueError:
    return ValueError(
        f"malformed checkpoint step list {shorten_repr(text)}: element {index + 1} {what}; "
        f"{_ACCEPTED_FORM}"
    )


def _fsync_path(path: Path, *, directory: bool) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_complete(directory: Path, *, durable: bool = True) -> None:
    """Mark `directory` as a complete checkpoint by writing ``COMPLETE`` last.

    With `durable`, every file and directory below `directory` is fsynced first, so a marker
    that survives a crash never points to data that did not. The marker appears atomically
    (temporary file + rename). Idempotent.
    """
    if durable:
        for dirpath, _dirnames, filenames in os.walk(directory):
            for name in filenames:
                file = Path(dirpath, name)
                if not file.is_symlink():
                    _fsync_path(file, directory=False)
            _fsync_path(Path(dirpath), directory=True)
    tmp = directory / f".{COMPLETE_MARKER}.tmp"
    with open(tmp, "wb") as f:
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, directory / COMPLETE_MARKER)
    if durable:
        _fsync_path(directory, directory=True)
        _fsync_path(directory.parent, directory=True)


def retire_steps_after(root: Path, resume_step: int | None) -> list[int]:
    """Un-mark complete steps newer than `resume_step` (all of them if None); newest first.

    Those steps belong to the abandoned run: left complete, they could be reported again
    after the next failure and mix two runs in one "consistent" resume. The agent calls this
    for both tiers before writing ``resume.json``. ``COMPLETE`` is renamed to ``RETIRED``
    (data is kept for inspection; the trainer overwrites the directory when it saves that
    step again). Safe to run concurrently on a shared root.
    """
    if resume_step is not None:
        check_step(resume_step)
    retired: list[int] = []
    for step in sorted(scan_tier(root), reverse=True):
        if resume_step is not None and step <= resume_step:
            continue
        directory = step_dir(root, step)
        try:
            os.replace(directory / COMPLETE_MARKER, directory / RETIRED_MARKER)
            _fsync_path(directory, directory=True)
        except FileNotFoundError:
            continue  # retired or pruned by someone else meanwhile
        retired.append(step)
    return retired
