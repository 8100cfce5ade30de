"""Trainer side of the contract: which step to resume from, and how to save checkpoints.

The agent sidecar and the trainer share a volume at ``$JSI_STATE_DIR``. Before opening the
barrier for an epoch the agent writes ``resume.json`` there (`write_resume`); the trainer reads
it (`read_resume`, `wait_for_resume`) and saves checkpoints with `save_checkpoint`, which the
agent then reports. See docs/trainer-contract.md. Standard library only.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jobset_inplace.launcher import DEFAULT_STATE_DIR as _DEFAULT_STATE_DIR
from jobset_inplace.launcher import (
    ENV_CHECKPOINT_LOCAL_DIR,
    ENV_CHECKPOINT_PERSISTENT_DIR,
    ENV_STATE_DIR,
    RESUME_FILE,
)
from jobset_inplace.trainer.checkpoints import (
    COMPLETE_MARKER,
    RETIRED_MARKER,
    check_step,
    is_complete,
    is_int,
    mark_complete,
    step_dir,
)
from jobset_inplace.trainer.progress import ProgressReporter, park, report_progress

__all__ = [
    "DEFAULT_STATE_DIR",
    "ENV_CHECKPOINT_LOCAL_DIR",
    "ENV_CHECKPOINT_PERSISTENT_DIR",
    "ENV_STATE_DIR",
    "RESUME_FILE",
    "ProgressReporter",
    "ResumeInfo",
    "Tier",
    "checkpoint_path",
    "clear_resume",
    "park",
    "read_resume",
    "report_progress",
    "resolve_state_dir",
    "save_checkpoint",
    "staged_checkpoint",
    "tier_roots",
    "wait_for_resume",
    "write_resume",
]

DEFAULT_STATE_DIR = Path(_DEFAULT_STATE_DIR)

Tier = Literal["local", "persistent", "both"]
_TIERS: tuple[Tier, ...] = ("local", "persistent", "both")
_GANG_RE = re.compile(r"[^/\s]+/[^/\s]+")


@dataclass(frozen=True)
class ResumeInfo:
    """What the agent tells the trainer before the barrier opens for `epoch`."""

    epoch: int
    resume_step: int | None  # None: start from scratch
    gang: str  # "<namespace>/<jobset>"
    # the epoch's environment for the trainer's command, which the launcher adds (a hot
    # spare's slot: JSI_SLOT, PET_NODE_RANK, ...); empty without spares
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not is_int(self.epoch) or self.epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {self.epoch!r}")
        if self.resume_step is not None:
            if not is_int(self.resume_step):
                raise ValueError(f"resumeStep must be an integer or null, got {self.resume_step!r}")
            check_step(self.resume_step)
        if not isinstance(self.gang, str) or _GANG_RE.fullmatch(self.gang) is None:
            raise ValueError(f"gang must be '<namespace>/<jobset>', got {self.gang!r}")

    def to_json(self) -> str:
        """The ``resume.json`` text."""
        doc: dict[str, Any] = {
            "epoch": self.epoch,
            "resumeStep": self.resume_step,
            "gang": self.gang,
        }
        if self.env:
            doc["env"] = dict(self.env)
        return json.dumps(doc) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ResumeInfo:
        """Parse ``resume.json``; unknown keys are ignored, malformed input raises ValueError."""
        try:
            doc: Any = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"malformed {RESUME_FILE}: not JSON ({e})") from e
        if not isinstance(doc, dict):
            raise ValueError(f"malformed {RESUME_FILE}: expected a JSON object")
        missing = [k for k in ("epoch", "resumeStep", "gang") if k not in doc]
        if missing:
            raise ValueError(f"malformed {RESUME_FILE}: missing {', '.join(missing)}")
        try:
            return cls(epoch=doc["epoch"], resume_step=doc["resumeStep"], gang=doc["gang"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed {RESUME_FILE}: {e}") from e


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def resolve_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$JSI_STATE_DIR``, or the default ``/var/run/jobset-inplace``."""
    value = _env(env).get(ENV_STATE_DIR, "")
    return Path(value) if value else DEFAULT_STATE_DIR


def tier_roots(env: Mapping[str, str] | None = None) -> tuple[Path | None, Path | None]:
    """(local, persistent) checkpoint roots from the environment; unset or empty is None."""
    e = _env(env)
    local = e.get(ENV_CHECKPOINT_LOCAL_DIR, "")
    persistent = e.get(ENV_CHECKPOINT_PERSISTENT_DIR, "")
    return (Path(local) if local else None, Path(persistent) if persistent else None)


def _resume_file(state_dir: Path | str | None) -> Path:
    base = resolve_state_dir() if state_dir is None else Path(state_dir)
    return base / RESUME_FILE


def read_resume(state_dir: Path | str | None = None) -> ResumeInfo | None:
    """The current ``resume.json``, or None if the agent has not written it (yet)."""
    try:
        text = _resume_file(state_dir).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return ResumeInfo.from_json(text)


def wait_for_resume(
    timeout: float | None = None, poll: float = 0.1, *, state_dir: Path | str | None = None
) -> ResumeInfo:
    """Wait until ``resume.json`` exists and return it; TimeoutError after `timeout` seconds.

    A safety net: the agent's startupProbe normally keeps the trainer from starting before the
    file is written. The agent removes the previous epoch's file when it starts.
    """
    if poll <= 0:
        raise ValueError(f"poll must be > 0, got {poll}")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = read_resume(state_dir)
        if info is not None:
            return info
        if deadline is None:
            time.sleep(poll)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"no {_resume_file(state_dir)} after {timeout} s: is the jobset-inplace agent "
                f"running and sharing ${ENV_STATE_DIR} with this container?"
            )
        time.sleep(min(poll, left))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_resume(info: ResumeInfo, state_dir: Path | str) -> Path:
    """Atomically write ``resume.json`` (temporary file, fsync, rename); used by the agent.

    The file is world-readable: the trainer container may run as another user.
    """
    directory = Path(state_dir)
    target = directory / RESUME_FILE
    tmp = directory / f".{RESUME_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(info.to_json())
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    return target


def clear_resume(state_dir: Path | str) -> bool:
    """Remove ``resume.json`` (the agent does this at start-up); whether it existed."""
    try:
        (Path(state_dir) / RESUME_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        (path / COMPLETE_MARKER).unlink(missing_ok=True)  # stop it being reported first
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def staged_checkpoint(root: Path | str, step: int, *, durable: bool = True) -> Iterator[Path]:
    """Yield an empty staging directory to write into; commit it as ``step-<S>`` on success.

    On normal exit the directory is marked ``COMPLETE`` and then renamed to ``step-<S>``
    (replacing one of that step: an older save, a retired or a partial one), so the step is
    complete whenever it is there. The staging name is this thread's own
    (``step-<S>.tmp-<host>-<pid>-<thread>``): members that share one root (replicated state,
    docs/trainer-contract.md "One root for a replicated gang") may save the same step at once,
    and the last save stands. On an exception the staging directory is removed and nothing
    is committed; the leftovers of this host's crashed saves are removed at the next save.
    """
    final = step_dir(Path(root), step)
    host, tag = socket.gethostname(), f"{os.getpid()}-{threading.get_native_id()}"
    tmp = final.with_name(f"{final.name}.tmp-{host}-{tag}")
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(final, host)
    if tmp.exists() or tmp.is_symlink():
        _remove(tmp)  # left over from a crash of a process that had our PID
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    mark_complete(tmp, durable=durable)
    _publish(tmp, final, f"{host}-{tag}", durable=durable)


PUBLISH_TRIES = 16  # renames lost to other members saving the same step at that moment


def _publish(tmp: Path, final: Path, tag: str, *, durable: bool) -> None:
    """Rename the complete ``tmp`` to ``final``; whatever is there is renamed aside first
    (one rename each: a member saving the same step meanwhile only makes us try again)."""
    for _ in range(PUBLISH_TRIES):
        try:
            os.rename(tmp, final)
            break
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
        aside = final.with_name(f".{final.name}.old-{tag}")
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            continue  # moved aside by another member meanwhile
        _remove(aside)
    else:
        if not is_complete(final):
            raise OSError(f"{final}: not published after {PUBLISH_TRIES} tries")
        shutil.rmtree(tmp, ignore_errors=True)  # (another member's save of the step stands)
        return
    if durable:
        _fsync_dir(final.parent)


def _remove_dead_staging(final: Path, host: str) -> None:
    """Remove staging directories of ``final``'s step left by processes of this host that
    are gone (a crash mid-save; another host's are not ours to judge), and the one name
    earlier versions staged in (``step-<S>.tmp``)."""
    legacy = final.with_name(f"{final.name}.tmp")
    if legacy.exists() or legacy.is_symlink():
        _remove(legacy)
    prefix = f"{final.name}.tmp-{host}-"
    for entry in final.parent.glob(f"{glob.escape(prefix)}*"):
        pid = entry.name[len(prefix) :].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            _remove(entry)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _roots_for(tier: Tier, env: Mapping[str, str] | None) -> list[Path]:
    if tier not in _TIERS:
        raise ValueError(f"tier must be one of {', '.join(_TIERS)}; got {tier!r}")
    local, persistent = tier_roots(env)
    wanted: list[tuple[Path | None, str]] = []
    if tier in ("local", "both"):
        wanted.append((local, ENV_CHECKPOINT_LOCAL_DIR))
    if tier in ("persistent", "both"):
        wanted.append((persistent, ENV_CHECKPOINT_PERSISTENT_DIR))
    roots: list[Path] = []
    for root, var in wanted:
        if root is None:
            raise ValueError(f"checkpoint tier {tier!r} needs ${var} to be set")
        roots.append(root)
    return roots


_MARKERS = frozenset({COMPLETE_MARKER, RETIRED_MARKER, f".{COMPLETE_MARKER}.tmp"})


def _copy_checkpoint(src: Path, dst: Path) -> None:
    """Copy a committed step directory's contents, without its top-level markers."""

    def markers(directory: str, names: list[str]) -> set[str]:
        return set(_MARKERS.intersection(names)) if Path(directory) == src else set()

    shutil.copytree(src, dst, ignore=markers, dirs_exist_ok=True)


def save_checkpoint(
    step: int,
    write_fn: Callable[[Path], object],
    tier: Tier = "local",
    *,
    env: Mapping[str, str] | None = None,
    durable: bool = True,
) -> list[Path]:
    """Save the checkpoint of `step` to `tier`; return the committed step directories.

    `write_fn(directory)` writes the checkpoint files into an empty staging directory. With
    ``tier="both"`` it is called once, for the local tier, and the result is copied to the
    persistent tier. `durable` fsyncs the files before the ``COMPLETE`` marker is written.
    """
    check_step(step)
    roots = _roots_for(tier, env)
    committed: list[Path] = []
    for root in roots:
        with staged_checkpoint(root, step, durable=durable) as staging:
            if committed:
                _copy_checkpoint(committed[0], staging)
            else:
                write_fn(staging)
        committed.append(step_dir(root, step))
    return committed


def checkpoint_path(step: int, *, env: Mapping[str, str] | None = None) -> Path:
    """The complete checkpoint directory of `step`, preferring the local tier."""
    roots = [r for r in tier_roots(env) if r is not None]
    for root in roots:
        directory = step_dir(root, step)
        if is_complete(directory):
            return directory
    searched = ", ".join(str(r) for r in roots) or "no tier configured"
    raise FileNotFoundError(f"no complete checkpoint of step {step} (searched: {searched})")
