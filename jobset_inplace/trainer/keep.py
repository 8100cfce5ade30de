"""Keep the step a failure interrupts, so that a member's failure costs at most that step.

In a gang whose training state is replicated (DDP; the replica groups of HSDP), every healthy
member holds the whole state of the newest step the gang completed. When one member dies, the
others learn it at their next collective (it raises: the peer's connection closed) or when the
recovery stops them (SIGTERM); either way their state is still that of the last step whose
optimizer update finished, because every collective of a DDP step (the gradients' all-reduce in
``backward``) runs before its update. A :class:`StepKeeper` saves that state then, through the
trainer's own save function, and the gang resumes from it instead of from the last periodic
checkpoint: the barrier hands every member the newest step all of them can load, which the kept
step is once it is on the tier every member reads (the persistent one).

A few lines around an existing loop (docs/trainer-contract.md, "Keeping the interrupted step")::

    keeper = StepKeeper(save=save_kept, step=start)
    with keeper:                                 # a failure leaving the block saves keeper.step
        for step in range(start + 1, steps + 1):
            loss = compute_loss(model, step)
            loss.backward()                      # collectives: the state is still step - 1
            with keeper.update(step):            # the state becomes ``step``
                optimizer.step()
            if step % save_every == 0:
                save_checkpoint(step)
                keeper.saved(step)               # nothing newer to keep until the next update

Where several members keep the same step into one shared directory, the first to finish wins:
:func:`publish_dir` renames a finished save into place once, atomically.

A worker blocked in a collective that never returns (a peer that hangs instead of dying;
NCCL waits for its watchdog) runs no Python signal handler, so the recovery's SIGTERM also
starts the save on a thread of the keeper's (``signal.set_wakeup_fd``): the state is whole
there too, since a DDP step updates nothing before its collectives are done. What is not kept,
by design: a failure inside the update (the state is part one step, part the next: nothing is
saved, the periodic checkpoint stands), and state that is not replicated (FSDP or ZeRO shards:
the failed member's shard is nowhere else, so the others' kept step is not a whole checkpoint;
such a trainer must not keep steps). The save must end within the stop grace (the
``trainer-stop-grace`` annotation): a SIGTERM that arrives while it saves or updates is held
until it ends; SIGKILL cannot be. The keeper takes the process's wakeup fd while its block
runs (and gives the one before back after).

Standard library only.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType

__all__ = ["StepKeeper", "publish_dir"]

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def _log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} jobset-inplace keep: {msg}\n")
    sys.stderr.flush()


class StepKeeper:
    """Which step the trainer's state holds, and its save when the loop ends by a failure.

    ``save(step)`` writes a checkpoint of the state as it is (without any collective: the gang
    is broken); ``step`` is the step the state holds at the start (the resumed one: a
    checkpoint of it exists, so it is not saved again). Used as a context manager around the
    training loop, from the main thread. When the block is left by any exception it saves
    :attr:`step`, unless a checkpoint of it exists or an update was cut short. SIGTERM becomes
    ``SystemExit(143)`` (held until the end of an update or a save inside one) and starts the
    save at once on a thread of the keeper's: a main thread blocked in a collective that never
    returns (a peer that hangs, NCCL waiting for its watchdog) runs no Python signal handler,
    but its state is still whole (a DDP step updates nothing until its collectives are done).
    An update and a save never overlap (one lock).
    """

    def __init__(self, save: Callable[[int], None], *, step: int = 0) -> None:
        self._save = save
        self.step = step  # the step the state holds
        self._saved = step  # the newest step a checkpoint exists of
        self._lock = threading.RLock()  # held by an update and by a save
        self._updating = False
        self._torn = False  # an update raised: the state is no step's
        self._saving = False
        self._held: int | None = None  # a signal that arrived inside an update or a save
        self._stopping = False  # SIGTERM arrived: no update begins any more
        self._previous: _Handler = None
        self._previous_fd = -1
        self._wakeup: tuple[int, int] | None = None  # (read, write): signals, as bytes
        self.kept: int | None = None  # the step kept, if any

    # -- the loop's side --
    @contextmanager
    def update(self, step: int) -> Iterator[None]:
        """Around the optimizer's update of ``step``: once it returns, the state is ``step``'s.
        An exception inside leaves the state torn (nothing is kept); a SIGTERM inside is
        held, then raised once the state is whole again; a save under way ends first. After a
        SIGTERM no update begins (``SystemExit(143)``): the step kept stays the newest."""
        if self._updating:
            raise RuntimeError("StepKeeper.update: already inside an update")
        with self._lock:
            if self._stopping:
                raise SystemExit(128 + signal.SIGTERM)
            self._updating = True
            try:
                yield
            except BaseException:
                self._torn = True
                raise
            else:
                self.step = step
            finally:
                self._updating = False
        self._raise_held()

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was saved by the trainer's own schedule."""
        self._saved = max(self._saved, step)

    # -- the way out --
    def __enter__(self) -> StepKeeper:
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (read, write)
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), name="step-keeper", daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                self.keep(f"{exc_type.__name__ if exc_type else 'exception'}: {exc}")
        finally:
            signal.set_wakeup_fd(self._previous_fd)
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            if self._wakeup is not None:
                os.close(self._wakeup[1])  # the watcher reads the end of it and returns
                self._wakeup = None

    def keep(self, why: str) -> int | None:
        """Save :attr:`step` now (the loop is ending: ``why``); the step kept, or None when
        there is nothing to keep or the state is torn. A save that raises is logged, not
        raised: the periodic checkpoint stands."""
        with self._lock:
            if self._torn or self._updating:
                _log(f"{why}: interrupted inside the update of step {self.step + 1}: nothing kept")
                return None
            if self.step <= self._saved:
                return None  # a checkpoint of this step exists (or was just kept)
            started = time.monotonic()
            self._saving = True
            try:
                self._save(self.step)
            except Exception as e:  # the failure being handled is the one to raise
                _log(f"{why}: keeping step {self.step} failed: {type(e).__name__}: {e}")
                return None
            finally:
                self._saving = False
            self._saved = self.kept = self.step
            _log(f"{why}: kept step {self.step} ({time.monotonic() - started:.2f} s)")
            return self.step

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._updating or self._saving or _leaving(frame):
            self._held = signum  # (leaving: the failure being handled ends the loop anyway)
            return
        raise SystemExit(128 + signum)

    def _raise_held(self) -> None:
        if self._held is not None:
            signum, self._held = self._held, None
            raise SystemExit(128 + signum)

    def _watch(self, read: int) -> None:
        """The keeper's thread: each signal's number arrives as a byte (``set_wakeup_fd``),
        also while the main thread is blocked in native code; SIGTERM saves."""
        try:
            while chunk := os.read(read, 64):
                if signal.SIGTERM in chunk:
                    self._stopping = True
                    self.keep("SIGTERM")
        finally:
            os.close(read)


def _leaving(frame: FrameType | None) -> bool:
    """The signal interrupted :meth:`StepKeeper.__exit__` (or what it calls): a SIGTERM that
    the recovery sends while a collective's failure leaves the loop (Python runs the handler
    at the first instruction it can, which may be the exit's first) must not cut the save."""
    while frame is not None:
        if frame.f_code is _EXIT_CODE:
            return True
        frame = frame.f_back
    return False


_EXIT_CODE = StepKeeper.__exit__.__code__


def publish_dir(finished: Path, target: Path) -> bool:
    """Rename the finished directory ``finished`` to ``target`` (same filesystem) unless
    another member's is there first; False (and ``finished`` removed) when it was."""
    try:
        os.rename(finished, target)
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        shutil.rmtree(finished, ignore_errors=True)
        return False
    return True
