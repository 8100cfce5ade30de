"""jobset_inplace.trainer.keep: which step a failure keeps, and when nothing is kept."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from jobset_inplace.trainer.keep import StepKeeper, publish_dir


class Saves:
    def __init__(self, fail: bool = False) -> None:
        self.steps: list[int] = []
        self.fail = fail

    def __call__(self, step: int) -> None:
        if self.fail:
            raise OSError("disk full")
        self.steps.append(step)


def train(keeper: StepKeeper, last: int, *, fail_in_update: int | None = None) -> None:
    """Steps 1..last (each updated), then a collective failure in the next step's backward."""
    with keeper:
        for step in range(keeper.step + 1, last + 1):
            with keeper.update(step):
                if step == fail_in_update:
                    raise RuntimeError("optimizer failed halfway")
        raise RuntimeError("gloo: connection closed by peer")


def test_a_failure_between_updates_keeps_the_last_updated_step() -> None:
    saves = Saves()
    keeper = StepKeeper(saves, step=10)
    with pytest.raises(RuntimeError, match="connection closed"):
        train(keeper, 17)
    assert saves.steps == [17]
    assert keeper.kept == 17


def test_a_failure_inside_an_update_keeps_nothing() -> None:
    saves = Saves()
    keeper = StepKeeper(saves)
    with pytest.raises(RuntimeError, match="halfway"):
        train(keeper, 5, fail_in_update=4)
    assert saves.steps == [], "the state is part step 3, part step 4"
    assert keeper.kept is None


def test_nothing_is_kept_where_a_checkpoint_of_the_step_exists() -> None:
    saves = Saves()
    resumed = StepKeeper(saves, step=20)  # from step 20's checkpoint, failed before an update
    with pytest.raises(RuntimeError, match="connection closed"):
        train(resumed, 20)

    def periodic(keeper: StepKeeper) -> None:
        with keeper:
            with keeper.update(30):
                pass
            keeper.saved(30)  # the trainer's own checkpoint of step 30
            raise RuntimeError("failed after it")

    with pytest.raises(RuntimeError, match="after it"):
        periodic(StepKeeper(saves))
    assert saves.steps == []


def test_a_loop_that_ends_normally_keeps_nothing() -> None:
    saves = Saves()
    keeper = StepKeeper(saves)
    with keeper, keeper.update(1):
        pass
    assert saves.steps == []


def test_a_save_that_fails_leaves_the_failure_raised() -> None:
    keeper = StepKeeper(Saves(fail=True))
    with pytest.raises(RuntimeError, match="connection closed"):
        train(keeper, 3)
    assert keeper.kept is None


def terminated(keeper: StepKeeper, step: int, *, inside_update: bool) -> list[str]:
    """Update to ``step``, SIGTERM to this process (inside that update, or after it), then go
    on as a loop would: what ran after the signal."""
    ran: list[str] = []
    with keeper:
        with keeper.update(step):
            if inside_update:
                os.kill(os.getpid(), signal.SIGTERM)
                ran.append("the update went on")
        if not inside_update:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        ran.append("the loop went on")
    return ran


def test_sigterm_between_updates_ends_the_loop_and_keeps_the_step() -> None:
    saves = Saves()
    keeper = StepKeeper(saves)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        terminated(keeper, 1, inside_update=False)
    assert ended.value.code == 143
    assert saves.steps == [1]
    assert signal.getsignal(signal.SIGTERM) == before, "the handler before is back"


def test_sigterm_inside_an_update_is_held_until_the_step_is_whole() -> None:
    saves = Saves()
    keeper = StepKeeper(saves, step=6)
    with pytest.raises(SystemExit) as ended:
        terminated(keeper, 7, inside_update=True)
    assert ended.value.code == 143
    assert saves.steps == [7], "the update finished, then the signal ended the loop"


def test_sigterm_while_saving_is_held(tmp_path: Path) -> None:
    def save(step: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        (tmp_path / f"step-{step}").mkdir()

    keeper = StepKeeper(save, step=1)
    with pytest.raises(RuntimeError, match="connection closed"):
        train(keeper, 2)
    assert (tmp_path / "step-2").is_dir()
    assert keeper.kept == 2


def test_sigterm_as_a_failure_leaves_the_loop_is_held() -> None:
    """The recovery's SIGTERM often lands just as a collective's failure leaves the loop:
    Python may run its handler at the first instruction of the keeper's exit, before the save
    began."""
    saves = Saves()

    class SignalOnExit(StepKeeper):
        def keep(self, why: str) -> int | None:
            self._on_signal(signal.SIGTERM, sys._getframe())  # as the handler would run here
            return super().keep(why)

    keeper = SignalOnExit(saves, step=3)
    with pytest.raises(RuntimeError, match="connection closed"):
        train(keeper, 4)
    assert saves.steps == [4]


def test_sigterm_in_a_blocked_collective_saves_on_the_keepers_thread() -> None:
    """A peer that hangs leaves the others in a collective that never returns: Python's
    handler never runs, but the signal's byte reaches the keeper's thread, which saves."""
    done = threading.Event()
    steps: list[tuple[int, str]] = []

    def save(step: int) -> None:
        steps.append((step, threading.current_thread().name))
        done.set()

    keeper = StepKeeper(save, step=4)
    with keeper:
        with keeper.update(5):
            pass
        assert keeper._wakeup is not None
        # what the C-level handler writes (Python's handler, which would raise, does not run:
        # as in a main thread blocked in native code)
        os.write(keeper._wakeup[1], bytes([signal.SIGTERM]))
        assert done.wait(10), "the keeper's thread did not save"
    assert steps == [(5, "step-keeper")]
    assert keeper.kept == 5


def test_an_update_after_sigterm_waits_for_the_save_then_does_not_begin() -> None:
    """An update after the watcher began saving waits for the save (the state saved is one
    step's, never half the next), then ends the loop instead of beginning: one save, of the
    newest step. (Before, the main thread, whose sleep the signal did not interrupt, went on
    to the next step and saved it again as SystemExit left the loop.)"""
    saving, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def save(step: int) -> None:
        saving.set()
        release.wait(10)
        seen.append(f"saved {step}")

    keeper = StepKeeper(save)
    with keeper:
        with keeper.update(1):
            pass
        assert keeper._wakeup is not None
        os.write(keeper._wakeup[1], bytes([signal.SIGTERM]))
        assert saving.wait(10)
        threading.Timer(0.2, release.set).start()
        with pytest.raises(SystemExit) as stopped, keeper.update(2):
            seen.append("update 2")
    assert stopped.value.code == 143
    assert seen == ["saved 1"]
    assert keeper.kept == 1


def test_an_update_inside_an_update_is_refused() -> None:
    keeper = StepKeeper(Saves())
    with pytest.raises(RuntimeError, match="already inside"), keeper.update(1), keeper.update(2):
        pass


def test_publish_dir_lets_the_first_member_win(tmp_path: Path) -> None:
    target = tmp_path / "step-5"
    for rank in (0, 1):
        done = tmp_path / f".kept-5-rank-{rank}"
        done.mkdir()
        (done / "data").write_text(str(rank))
    assert publish_dir(tmp_path / ".kept-5-rank-0", target)
    assert not publish_dir(tmp_path / ".kept-5-rank-1", target)
    assert (target / "data").read_text() == "0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5"]
