"""Checkpoint layouts the agent reads and prepares for resume, so that a trainer written only
against its framework needs no code change (docs/integrations.md).

Each layout answers three questions about one checkpoint root:

* which steps are **complete** (never a partial write: the framework's own commit rule);
* how to make the framework's own "resume from the latest checkpoint" pick the gang's step
  (:meth:`CheckpointLayout.prepare_resume`: every step entry newer than it, complete or not, is
  moved into ``<root>/.jobset-inplace-set-aside/epoch-<E>/``, on the same filesystem, by one
  ``rename``; a tracker file is rewritten where the framework has one);
* how to undo that (:meth:`CheckpointLayout.restore`).

The set-aside directory sits inside the root (a root is often a volume's mount point: a sibling
could be another filesystem) under a name no framework reads: Orbax takes only entries whose
whole name is a step, torchtitan only names containing ``step-<digits>``, the Hugging Face
Trainer (its resume and its ``save_total_limit`` rotation) only ``checkpoint-*``, Megatron-LM
only its tracker file. A suffix rename (``step-600.old``) would not do: torchtitan would still
match it, then fail to load ``step-600``, and the Trainer's rotation could delete it.

Standard library only: the agent imports this on its start-up critical path.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from jobset_inplace.strenum import StrEnum

from .checkpoints import COMPLETE_MARKER, MAX_STEP, RETIRED_MARKER, retire_steps_after, scan_tier

__all__ = [
    "MEGATRON_TRACKER",
    "SET_ASIDE_DIR",
    "CheckpointLayout",
    "Layout",
    "StepNames",
    "checkpoint_layout",
    "parse_step_pattern",
]

SET_ASIDE_DIR = ".jobset-inplace-set-aside"
"""Where :meth:`CheckpointLayout.prepare_resume` moves newer steps: ``<root>/<this>/epoch-<E>/``."""

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
"""Megatron-LM's tracker: the iteration it resumes from, written by rank 0 after every rank
saved (megatron/training/checkpointing.py, get_checkpoint_tracker_filename)."""

ORBAX_TMP_MARK = ".orbax-checkpoint-tmp"  # an Orbax step still being written (atomicity.py)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint: written last, by the coordinator
HF_TRAINER_STATE = "trainer_state.json"  # transformers Trainer: the last file of a save


class Layout(StrEnum):
    """The checkpoint layouts the agent knows (annotation ``checkpoint-layout``)."""

    JOBSET_INPLACE = "jobset-inplace"  # step-<S>/ + COMPLETE (docs/trainer-contract.md)
    ORBAX = "orbax"  # <S>/, committed by an atomic rename from <S>.orbax-checkpoint-tmp
    TORCH_DCP = "torch-dcp"  # step-<S>/ complete once .metadata is written (torchtitan's names)
    HF_TRAINER = "hf-trainer"  # checkpoint-<S>/, trainer_state.json written last
    MEGATRON = "megatron"  # iter_<S:07d>/ + latest_checkpointed_iteration.txt


DEFAULT_PATTERN = {
    Layout.JOBSET_INPLACE: "step-{step}",
    Layout.ORBAX: "{step}",
    Layout.TORCH_DCP: "step-{step}",
    Layout.HF_TRAINER: "checkpoint-{step}",
    Layout.MEGATRON: "iter_{step}",
}

PATTERN_FORM = (
    "a directory name with one {step} in it, e.g. step-{step}, ckpt_{step} or {step} "
    "(letters, digits, '.', '_' and '-' around it; no '/')"
)
_PATTERN = re.compile(r"([A-Za-z0-9._-]*)\{step\}([A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class StepNames:
    """A step directory's name: ``prefix`` + the step in decimal (leading zeros allowed, as
    Orbax's fixed-length and Megatron's 7-digit names have them) + ``suffix``."""

    prefix: str
    suffix: str

    @property
    def pattern(self) -> str:
        return f"{self.prefix}{{step}}{self.suffix}"

    def step_of(self, name: str) -> int | None:
        """The step of the entry called ``name``, or None if it is no step's name."""
        if not (name.startswith(self.prefix) and name.endswith(self.suffix)):
            return None
        digits = name[len(self.prefix) : len(name) - len(self.suffix)]
        if not 0 < len(digits) <= 19 or not digits.isascii() or not digits.isdigit():
            return None
        step = int(digits)
        return step if step <= MAX_STEP else None


def parse_step_pattern(text: str) -> StepNames:
    """The :class:`StepNames` of ``text`` (e.g. ``step-{step}``); ValueError naming the form."""
    m = _PATTERN.fullmatch(text) if len(text) <= 200 else None
    if m is None or m.group(1) in (".", ".."):
        raise ValueError(f"step pattern {text[:80]!r} is invalid: expected {PATTERN_FORM}")
    return StepNames(m.group(1), m.group(2))


@dataclass(frozen=True)
class CheckpointLayout:
    """One layout with its step names; every method takes a checkpoint root."""

    kind: Layout
    names: StepNames

    # --- complete steps --------------------------------------------------------------------

    def steps(self, root: Path) -> set[int]:
        """The complete steps under ``root`` (a missing root has none). Raises OSError if the
        root cannot be read and ValueError if Megatron's tracker is malformed: reporting
        "nothing" then could discard progress."""
        if self.kind is Layout.JOBSET_INPLACE:
            return scan_tier(root)
        if self.kind is Layout.MEGATRON:
            newest = self._tracked(root)
            if newest is None:
                return set()
            return {s for s, p in self._entries(root).items() if s <= newest and p.is_dir()}
        return {s for s, p in self._entries(root).items() if self._complete(p)}

    def _complete(self, path: Path) -> bool:
        try:
            if not path.is_dir():
                return False
            if self.kind is Layout.ORBAX:
                # Orbax's own rule on a local filesystem: a step is committed by the rename to
                # its final name (the entry's whole name is a step: no tmp suffix).
                return ORBAX_TMP_MARK not in path.name
            if self.kind is Layout.TORCH_DCP:
                return (path / DCP_METADATA).is_file()
            return (path / HF_TRAINER_STATE).is_file()
        except OSError:
            return False  # vanished or unreadable meanwhile: not a step to resume from

    def _entries(self, root: Path) -> dict[int, Path]:
        """Every entry under ``root`` named like a step, by step (if two names spell one step,
        ``0100`` and ``100``, the first listed)."""
        found: dict[int, Path] = {}
        for step, path in self._named(root):
            found.setdefault(step, path)
        return found

    def _named(self, root: Path) -> list[tuple[int, Path]]:
        """(step, path) of every entry under ``root`` named like a step."""
        try:
            entries = os.scandir(root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        with entries:
            named = [(self.names.step_of(e.name), Path(e.path)) for e in entries]
        return [(s, p) for s, p in named if s is not None]

    @staticmethod
    def _tracked(root: Path) -> int | None:
        """Megatron's tracked iteration; None without a tracker or for a ``release`` one."""
        try:
            text = (root / MEGATRON_TRACKER).read_text().strip()
        except FileNotFoundError:
            return None
        if text == "release":
            return None
        if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
            raise ValueError(
                f"{root / MEGATRON_TRACKER}: {text[:40]!r} is not an iteration number "
                "(Megatron-LM writes one, or 'release')"
            )
        return int(text)

    # --- resume ----------------------------------------------------------------------------

    def prepare_resume(self, root: Path, step: int | None, epoch: int) -> list[int]:
        """Make ``step`` (None: nothing, a fresh start) the newest step the framework finds
        under ``root``; return the steps set aside (or retired), newest first. Safe to run by
        every member at once on a shared root (each move is one rename; a lost race is
        skipped) and again (idempotent)."""
        if self.kind is Layout.JOBSET_INPLACE:
            return retire_steps_after(root, step)
        moved: set[int] = set()
        for s, path in self._named(root):
            if (step is None or s > step) and _move(path, self.set_aside_dir(root, epoch)):
                moved.add(s)
        if self.kind is Layout.MEGATRON:
            self._track(root, step, epoch)
        return sorted(moved, reverse=True)

    @staticmethod
    def set_aside_dir(root: Path, epoch: int) -> Path:
        return root / SET_ASIDE_DIR / f"epoch-{epoch}"

    def _track(self, root: Path, step: int | None, epoch: int) -> None:
        """Megatron resumes from its tracker only: point it at ``step`` (remove it for a fresh
        start), keeping the old tracker beside the set-aside steps."""
        tracker = root / MEGATRON_TRACKER
        try:
            old = tracker.read_text()
        except FileNotFoundError:
            old = None
        if step is not None and old is not None and old.strip() == str(step):
            return
        keep = self.set_aside_dir(root, epoch)
        if old is not None:
            keep.mkdir(parents=True, exist_ok=True)
            try:  # the first member to get here keeps the original
                with open(keep / MEGATRON_TRACKER, "x") as f:
                    f.write(old)
            except FileExistsError:
                pass
        if step is None:
            tracker.unlink(missing_ok=True)
            return
        tmp = root / f".{MEGATRON_TRACKER}.{os.getpid()}.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, tracker)

    def restore(self, root: Path, epoch: int | None = None) -> tuple[list[str], list[str]]:
        """Undo :meth:`prepare_resume` of ``epoch`` (None: the latest set aside): move its
        entries back (and Megatron's tracker); return (restored names, names left set aside
        because the root has an entry of that name again)."""
        if self.kind is Layout.JOBSET_INPLACE:
            return _unretire(root), []
        base = root / SET_ASIDE_DIR
        if epoch is None:
            epochs = _set_aside_epochs(base)
            if not epochs:
                return [], []
            epoch = max(epochs)
        source = self.set_aside_dir(root, epoch)
        restored: list[str] = []
        kept: list[str] = []
        for entry in sorted(os.listdir(source)) if source.is_dir() else []:
            target = root / entry
            if entry == MEGATRON_TRACKER:
                os.replace(source / entry, target)
                restored.append(entry)
            elif target.exists():
                kept.append(entry)
            else:
                os.rename(source / entry, target)
                restored.append(entry)
        if not kept and source.is_dir():
            source.rmdir()
        return restored, kept


def _move(path: Path, into: Path) -> bool:
    """Rename ``path`` into directory ``into``; False if it is gone or the name is taken."""
    into.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(path, into / path.name)
    except FileNotFoundError:
        return False  # another member moved it first
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):  # the name is taken
            return False
        raise
    return True


def _set_aside_epochs(base: Path) -> list[int]:
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    return [int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit()]


def _unretire(root: Path) -> list[str]:
    """Our layout's undo: ``RETIRED`` back to ``COMPLETE`` where the step has no marker."""
    restored: list[str] = []
    for entry in sorted(os.listdir(root)) if root.is_dir() else []:
        d = root / entry
        if (d / RETIRED_MARKER).is_file() and not (d / COMPLETE_MARKER).exists():
            os.replace(d / RETIRED_MARKER, d / COMPLETE_MARKER)
            restored.append(entry)
    return restored


def checkpoint_layout(kind: Layout | str, pattern: str | None = None) -> CheckpointLayout:
    """The layout ``kind`` with its default step names, or ``pattern``'s. ValueError names
    the accepted forms (ours has one fixed name: ``step-{step}``)."""
    try:
        layout = Layout(kind)
    except ValueError:
        accepted = ", ".join(k.value for k in Layout)
        raise ValueError(
            f"checkpoint layout {str(kind)[:40]!r} is unknown: expected {accepted}"
        ) from None
    names = parse_step_pattern(pattern or DEFAULT_PATTERN[layout])
    if layout is Layout.JOBSET_INPLACE and names.pattern != DEFAULT_PATTERN[layout]:
        raise ValueError(
            f"step pattern {pattern!r}: the jobset-inplace layout's steps are always "
            "step-{step} (set checkpoint-layout to use another)"
        )
    return CheckpointLayout(layout, names)
