"""A warm standby (``jobset-inplace.dev/prestart-warm``): the next epoch's trainer builds its
model and loads the newest checkpoint *before* its epoch, so that after the barrier only the
process group, a reload if the gang's step differs, and the first step remain.

The script's few lines (docs/trainer-contract.md, "Warm standby"; the design and its
reasons: docs/design/warm-standby.md)::

    model, optim = build()                     # nothing that needs the rank or the device
    run = standby.wait(load, newest=lambda: newest_step(root), marker=metadata_of)
    dist.init_process_group("gloo")            # only now: RANK, MASTER_ADDR, ... exist
    ddp = DistributedDataParallel(model, **standby.ddp_kwargs(run))

:func:`wait` is the same call for every start. In a warm standby (held by the pre-start hook,
:mod:`jobset_inplace.prestart`) it loads ``newest()`` unless the word came already, logs
``warm: held at step S``, and waits for the word, loading again when ``newest()`` moves (at
most every ``refresh_s``; where it held none, as soon as there is one); at the word it has the
epoch's environment back and calls ``load(resume_step)`` unless that step is the one loaded
and its ``marker`` file is the one seen then (a step saved again is loaded again). In any
other start (cold, or a standby held before the script) it calls ``load(resume_step)``
unless that is None. ``load(None)`` means "from scratch": it must undo a speculative load.

Before its word a warm standby runs on one intra-op thread (the running epoch has the cores),
and must not start CUDA or a process group: the hook makes both raise, and a standby found
with either is ended (``EXIT_TORCH_STARTED``; the launcher starts that epoch cold).
Standard library only.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from jobset_inplace.launcher import ENV_EPOCH, ENV_RESUME_STEP

HOOK_MODULE = "jobset_inplace_prestart_hook"  # jobset_inplace.prestart.MODULE
EXIT_TORCH_STARTED = 86  # jobset_inplace.prestart.EXIT_CUDA: the launcher starts cold
REFRESH_S = 30.0  # a held standby loads a newer checkpoint at most this often
POLL_S = 0.02  # how often a held standby looks for its word (as the launcher polls)
CHECK_S = 1.0  # how often it looks for CUDA or a process group it must not have, and newest()
HELD = "warm: held at step"  # its log line once loaded (the bench waits for it)
# Memory (docs/design/warm-standby.md, section 4): a step is loaded while held only where the
# container's free memory is at least its bytes x LOAD_MARGIN (one item's temporary while it
# is read, the page cache the container is charged); a held standby whose container has less
# than FREE_FLOOR of its limit free ends (the running epoch must never be the one the OOM
# killer meets), and the epoch starts cold.
LOAD_MARGIN = 1.25
FREE_FLOOR = 0.10
CGROUP = Path("/sys/fs/cgroup")  # the container's own (cgroup v2, or v1's memory controller)
EXIT_SHORT_OF_MEMORY = 89
LOADED_AGAIN = "loaded again"  # its log line's end at the word when the step held was not it

Load = Callable[[int | None], object]
Marker = Callable[[int], str | os.PathLike[str]]


@dataclass(frozen=True)
class Released:
    """How :func:`wait` let the script go: its epoch, the gang's resume step, the step its
    tensors hold (None: as built), and whether it was a warm standby."""

    epoch: str
    resume_step: int | None
    loaded_step: int | None
    warm: bool


def _log(message: str) -> None:
    sys.stderr.write(f"jobset-inplace standby[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


def _step(text: str) -> int | None:
    return int(text) if text.strip() else None


def _identity(marker: Marker | None, step: int | None) -> tuple[int, int, int] | None:
    """What tells a step saved again from the one loaded: its marker file's device, inode and
    modification time (None: no marker, or none there)."""
    if marker is None or step is None:
        return None
    try:
        st = os.stat(marker(step))
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def _hook() -> ModuleType | None:
    """The pre-start hook of a warm standby still waiting for its word; None otherwise."""
    hook = sys.modules.get(HOOK_MODULE)
    return hook if hook is not None and hook.warm_held() else None


class _Threads:
    """One intra-op thread while held (torch's, if imported), the count before at the word."""

    def __init__(self) -> None:
        torch = sys.modules.get("torch")
        self.get = getattr(torch, "get_num_threads", None)
        self.set = getattr(torch, "set_num_threads", None)
        self.before = self.get() if callable(self.get) and callable(self.set) else None
        if self.before is not None:
            self.set(1)  # type: ignore[misc]

    def restore(self) -> None:
        if self.before is not None:
            self.set(self.before)  # type: ignore[misc]


def memory(cgroup: Path | None = None) -> tuple[int, int] | None:
    """The container's memory limit and what is free under it, in bytes (the usage less the
    inactive file cache, as the kubelet's working set): cgroup v2 (``memory.max``,
    ``memory.current``) or v1 (``memory/memory.limit_in_bytes``, ``usage_in_bytes``). None: no
    limit, or not readable."""
    root = CGROUP if cgroup is None else cgroup
    layouts = (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),
        (
            "memory/memory.limit_in_bytes",
            "memory/memory.usage_in_bytes",
            "memory/memory.stat",
            "total_inactive_file",
        ),
    )
    for limit_file, usage_file, stat_file, inactive_key in layouts:
        try:
            limit_text = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 1 << 60:
            return None  # (v1 says "no limit" with a page-rounded 2**63 - 1)
        inactive = 0
        try:
            for line in (root / stat_file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key and value.strip().isdigit():
                    inactive = int(value)
        except OSError:
            pass
        limit = int(limit_text)
        return limit, limit - max(0, usage - inactive)
    return None


def step_bytes(marker: Marker | None, step: int) -> int | None:
    """The bytes of ``step``'s files: those in its marker's directory (None: no marker)."""
    if marker is None:
        return None
    total = 0
    for path in Path(marker(step)).parent.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


class _Held:
    """What a standby holds while it waits: the step loaded (None: as built), its marker's
    identity seen before the load, when the load ended, and whether a load failed part way
    (the tensors are then neither as built nor any step's: the word's step is loaded whatever
    it is)."""

    def __init__(self, load: Load, marker: Marker | None) -> None:
        self.load, self.marker = load, marker
        self.step: int | None = None
        self.seen: tuple[int, int, int] | None = None
        self.at = time.monotonic()
        self.dirty = False
        self.short = False  # the newest step did not fit in the container's memory

    def speculate(self, step: int | None) -> None:
        """Load ``step`` (the newest) while held, where the container has the memory; a
        failure (a step pruned or saved again while read) is logged, and the word's step
        loaded at the word."""
        self.short = step is not None and not _room_for(self.marker, step)
        if self.short:
            self.at = time.monotonic()  # (looked at again after refresh_s)
            return
        seen = _identity(self.marker, step)
        began = time.monotonic()
        try:
            if step is not None:
                self.load(step)
        except Exception as e:  # the running epoch's files: anything may happen to them
            self.step, self.seen, self.at, self.dirty = None, None, time.monotonic(), True
            _log(f"warm: loading step {step} failed ({type(e).__name__}: {e}): at the word")
            return
        self.step, self.seen, self.at, self.dirty = step, seen, time.monotonic(), False
        took = self.at - began
        _log(f"{HELD} {step}" + ("" if step is None else f" (loaded in {took:.2f} s)"))

    def due(self, now: float, refresh_s: float) -> bool:
        """Whether to look for a newer step: where it holds none (and no load failed), at
        once; else every ``refresh_s``."""
        first = self.step is None and not (self.dirty or self.short)
        return first or now - self.at >= refresh_s

    def stale(self, step: int | None) -> bool:
        """Whether ``step`` is not what it holds (another step, or saved again since)."""
        if self.dirty or step != self.step:
            return True
        return step is not None and _identity(self.marker, step) != self.seen


def _room_for(marker: Marker | None, step: int) -> bool:
    """Whether the container has the memory to load ``step`` while held (no limit, or no
    marker to size the step by: yes)."""
    found = memory()
    need = step_bytes(marker, step)
    if found is None or need is None:
        return True
    free = found[1]
    if free >= need * LOAD_MARGIN:
        return True
    _log(
        f"warm: not loading step {step} before the word: it needs about "
        f"{need * LOAD_MARGIN / 2**20:.0f} MiB, the container has {free / 2**20:.0f} MiB free "
        "(loaded at the word)"
    )
    return False


def _end_if_short() -> None:
    """End a held standby whose container has less than FREE_FLOOR of its limit free."""
    found = memory()
    if found is not None and found[1] < FREE_FLOOR * found[0]:
        _log(
            f"the container has {found[1] / 2**20:.0f} MiB of {found[0] / 2**20:.0f} MiB free: "
            "exiting, the running epoch keeps the memory (the next epoch starts cold)"
        )
        sys.stderr.flush()
        os._exit(EXIT_SHORT_OF_MEMORY)


def _newest(newest: Callable[[], int | None]) -> int | None:
    try:
        return newest()
    except Exception as e:  # (as a failed load: the running epoch's directory)
        _log(f"warm: newest() failed ({type(e).__name__}: {e})")
        return None


def wait(
    load: Load,
    newest: Callable[[], int | None],
    *,
    marker: Marker | None = None,
    refresh_s: float = REFRESH_S,
    poll_s: float = POLL_S,
) -> Released:
    """Hold until this epoch's word (a warm standby) and return with its state loaded; see the
    module's docstring."""
    hook = _hook()
    if hook is None:
        step = _step(os.environ.get(ENV_RESUME_STEP, ""))
        if step is not None:
            load(step)
        return Released(os.environ.get(ENV_EPOCH, ""), step, step, warm=False)
    hook.guard_torch()  # what the script imported since the hook ran
    _end_if_started(hook)
    held = _Held(load, marker)
    threads = _Threads()
    try:
        if not hook.word_given():
            held.speculate(_newest(newest))
            checked = time.monotonic()
            while not hook.word_given():
                now = time.monotonic()
                if now - checked >= CHECK_S:
                    checked = now
                    _end_if_started(hook)
                    _end_if_short()
                    if held.due(now, refresh_s):
                        step = _newest(newest)
                        if step is not None and held.stale(step):
                            held.speculate(step)
                time.sleep(poll_s)
        epoch, step_text = hook.release()
    finally:
        threads.restore()
    resume = _step(step_text)
    if held.stale(resume):
        before = "a failed load" if held.dirty else f"step {held.step}"
        if resume is not None or held.step is not None or held.dirty:
            load(resume)  # the gang's step is not the one held (or it was saved again)
        _log(f"epoch {epoch}: released at step {resume}; held {before}: {LOADED_AGAIN}")
    else:
        _log(f"epoch {epoch}: released at step {resume}: already loaded")
    return Released(epoch, resume, resume, warm=True)


def _end_if_started(hook: ModuleType) -> None:
    started = hook.torch_started()
    if started is not None:
        _log(f"{started} started before this standby's epoch: exiting (the epoch starts cold)")
        sys.stderr.flush()
        os._exit(EXIT_TORCH_STARTED)


def ddp_kwargs(run: Released, ddp: Any = None) -> dict[str, Any]:
    """``DistributedDataParallel``'s arguments for a resumed run: ``init_sync=False`` (no
    broadcast of the parameters: every rank loaded one step of one checkpoint) where this
    PyTorch has it and the run resumes from a step; {} otherwise (from scratch the sync
    stays)."""
    if run.resume_step is None:
        return {}
    if ddp is None:
        ddp = importlib.import_module("torch.nn.parallel").DistributedDataParallel
    return {"init_sync": False} if "init_sync" in inspect.signature(ddp).parameters else {}
