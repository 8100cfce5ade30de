"""The warm standby's wait (jobset_inplace.trainer.standby): what it loads before and after its
word, with the pre-start hook faked (tests/unit/test_prestart.py runs the real hook and
launcher)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from jobset_inplace import prestart
from jobset_inplace.trainer import standby


class FakeHook:
    """The hook of a warm standby: its word comes after ``polls`` looks, with ``step``."""

    def __init__(
        self, step: int | None, polls: int = 3, started: str | None = None, started_after: int = 0
    ) -> None:
        """``started``: what it reports having started (CUDA, a process group) once it has
        looked for its word ``started_after`` times."""
        self.step, self.polls, self.started = step, polls, started
        self.started_after = started_after
        self.looks = 0
        self.released = False
        self.guarded = 0

    def warm_held(self) -> bool:
        return not self.released

    def word_given(self) -> bool:
        self.looks += 1
        return self.looks > self.polls

    def guard_torch(self) -> None:
        self.guarded += 1

    def torch_started(self) -> str | None:
        return self.started if self.looks >= self.started_after else None

    def release(self) -> tuple[str, str]:
        self.released = True
        return "4", "" if self.step is None else str(self.step)


@pytest.fixture(autouse=True)
def checks_at_every_poll(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every check at every poll; no cgroup of this machine's read; an exit raises."""
    monkeypatch.setattr(standby, "CHECK_S", 0.0)
    monkeypatch.setattr(standby, "CGROUP", tmp_path / "no-cgroup")

    def exit_(code: int) -> None:
        raise SystemExit(f"os._exit({code})")

    monkeypatch.setattr(os, "_exit", exit_)


def held(monkeypatch: pytest.MonkeyPatch, fake: FakeHook) -> FakeHook:
    monkeypatch.setitem(sys.modules, standby.HOOK_MODULE, fake)
    return fake


class Loads:
    def __init__(self) -> None:
        self.steps: list[int | None] = []

    def __call__(self, step: int | None) -> None:
        self.steps.append(step)


def test_warm_at_10_released_at_15_loads_15(monkeypatch: pytest.MonkeyPatch) -> None:
    held(monkeypatch, FakeHook(15))
    loads = Loads()
    run = standby.wait(loads, lambda: 10, poll_s=0)
    assert loads.steps == [10, 15]
    assert run == standby.Released("4", 15, 15, warm=True)


def test_released_at_the_step_held_loads_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = held(monkeypatch, FakeHook(10))
    loads = Loads()
    run = standby.wait(loads, lambda: 10, poll_s=0)
    assert loads.steps == [10]
    assert run == standby.Released("4", 10, 10, warm=True)
    assert fake.guarded == 1, "what the script imported since the hook is guarded too"


def test_released_from_scratch_after_a_speculative_load_resets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held(monkeypatch, FakeHook(None))
    loads = Loads()
    run = standby.wait(loads, lambda: 10, poll_s=0)
    assert loads.steps == [10, None]
    assert run.loaded_step is None


def test_no_checkpoint_and_released_from_scratch_loads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held(monkeypatch, FakeHook(None))
    loads = Loads()
    assert standby.wait(loads, lambda: None, poll_s=0).loaded_step is None
    assert loads.steps == []


def test_a_step_saved_again_while_held_is_loaded_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Same step, another marker file (a re-save): the held tensors are not that step's."""
    marker = tmp_path / "step-10.metadata"
    marker.write_text("a")
    fake = held(monkeypatch, FakeHook(10))
    loads = Loads()

    def load(step: int | None) -> None:
        loads(step)
        if len(loads.steps) == 1:  # saved again after the speculative load looked
            os.replace(_written(tmp_path / "new", "b"), marker)

    run = standby.wait(load, lambda: 10, marker=lambda s: tmp_path / f"step-{s}.metadata", poll_s=0)
    assert loads.steps == [10, 10]
    assert run.loaded_step == 10
    assert fake.released


def test_the_same_marker_is_not_loaded_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _written(tmp_path / "step-10.metadata", "a")
    held(monkeypatch, FakeHook(10))
    loads = Loads()
    standby.wait(loads, lambda: 10, marker=lambda s: tmp_path / f"step-{s}.metadata", poll_s=0)
    assert loads.steps == [10]


def test_the_word_before_the_warm_up_means_no_speculative_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held(monkeypatch, FakeHook(15, polls=0))
    loads = Loads()
    run = standby.wait(loads, lambda: 10, poll_s=0)
    assert loads.steps == [15]
    assert run == standby.Released("4", 15, 15, warm=True)


def test_a_newer_checkpoint_while_held_is_loaded_at_most_every_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    newest = iter([10, 15, 15, 20, 20, 20, 20, 20, 20, 20])
    held(monkeypatch, FakeHook(20, polls=6))
    loads = Loads()
    run = standby.wait(loads, lambda: next(newest), refresh_s=0, poll_s=0)
    assert loads.steps == [10, 15, 20], "each move loaded once; the word's step already held"
    assert run.loaded_step == 20
    held(monkeypatch, FakeHook(20, polls=6))
    loads = Loads()
    newest = iter([10, 15, 20])
    run = standby.wait(loads, lambda: next(newest), refresh_s=3600, poll_s=0)
    assert loads.steps == [10, 20], "within refresh_s: no reload while held, one at the word"


def test_a_standby_that_held_no_checkpoint_loads_the_first_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    newest = iter([None, None, 5, 5, 5])
    fake = held(monkeypatch, FakeHook(5, polls=4))
    loads: list[tuple[int | None, bool]] = []
    run = standby.wait(
        lambda step: loads.append((step, fake.released)),
        lambda: next(newest),
        refresh_s=3600,
        poll_s=0,
    )
    assert loads == [(5, False)], "loaded when it appeared, before the word, not refresh_s after"
    assert run.loaded_step == 5


def test_a_standby_that_started_cuda_or_a_process_group_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held(monkeypatch, FakeHook(10, started="a process group"))
    loads = Loads()
    with pytest.raises(SystemExit, match=rf"os._exit\({prestart.EXIT_CUDA}\)"):
        standby.wait(loads, lambda: 10, poll_s=0)
    assert loads.steps == [], "ended before any load"


def test_a_standby_that_starts_cuda_while_held_is_found_and_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held(monkeypatch, FakeHook(10, polls=50, started="CUDA", started_after=5))
    loads = Loads()
    with pytest.raises(SystemExit, match=rf"os._exit\({prestart.EXIT_CUDA}\)"):
        standby.wait(loads, lambda: 10, poll_s=0)
    assert loads.steps == [10], "found while it waited for its word, after its load"


class FakeTorch:
    """torch's thread count, as the standby sets it."""

    def __init__(self) -> None:
        self.threads = 4

    def get_num_threads(self) -> int:
        return self.threads

    def set_num_threads(self, n: int) -> None:
        self.threads = n


def test_a_load_that_fails_while_held_is_done_at_the_word_on_every_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The running epoch's files change under a speculative load (pruned, saved again): the
    standby goes on waiting and loads the word's step, whatever it held."""
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    held(monkeypatch, FakeHook(10, polls=3))
    seen: list[tuple[int | None, int]] = []

    def load(step: int | None) -> None:
        seen.append((step, torch.threads))
        if len(seen) == 1:
            raise FileNotFoundError("step-10/__0_0.distcp")

    run = standby.wait(load, lambda: 10, refresh_s=3600, poll_s=0)
    assert seen == [(10, 1), (10, 4)], "held on one thread; at the word on every thread"
    assert run.loaded_step == 10
    assert torch.threads == 4


def test_a_failed_load_is_undone_at_the_word_even_from_scratch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held(monkeypatch, FakeHook(None, polls=2))
    loads = Loads()

    def load(step: int | None) -> None:
        loads(step)
        if step is not None:
            raise OSError("gone")

    standby.wait(load, lambda: 10, refresh_s=3600, poll_s=0)
    assert loads.steps == [10, None], "the tensors a failed load left are reset"


def test_the_thread_count_comes_back_when_the_word_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    fake = held(monkeypatch, FakeHook(10, polls=1))

    def release() -> tuple[str, str]:
        raise OSError("the word")

    monkeypatch.setattr(fake, "release", release)
    with pytest.raises(OSError, match="the word"):
        standby.wait(Loads(), lambda: 10, poll_s=0)
    assert torch.threads == 4


@pytest.mark.parametrize(("step", "loads"), [("7", [7]), ("", [])])
def test_a_cold_start_loads_its_resume_step(
    monkeypatch: pytest.MonkeyPatch, step: str, loads: list[int]
) -> None:
    monkeypatch.delitem(sys.modules, standby.HOOK_MODULE, raising=False)
    monkeypatch.setenv("JSI_EPOCH", "3")
    monkeypatch.setenv("JSI_RESUME_STEP", step)
    seen = Loads()
    run = standby.wait(seen, lambda: pytest.fail("a cold start does not look for the newest"))
    assert seen.steps == loads
    expected = loads[0] if loads else None
    assert run == standby.Released("3", expected, expected, warm=False)


def test_ddp_kwargs_skip_the_sync_only_on_a_resume_and_where_ddp_has_it() -> None:
    class NewDDP:
        def __init__(self, module: object, init_sync: bool = True) -> None: ...

    class OldDDP:
        def __init__(self, module: object) -> None: ...

    resumed = standby.Released("1", 10, 10, warm=True)
    scratch = standby.Released("1", None, None, warm=True)
    assert standby.ddp_kwargs(resumed, NewDDP) == {"init_sync": False}
    assert standby.ddp_kwargs(resumed, OldDDP) == {}
    assert standby.ddp_kwargs(scratch, NewDDP) == {}


def test_the_standby_and_the_hook_agree_on_names() -> None:
    assert standby.HOOK_MODULE == prestart.MODULE
    assert standby.EXIT_TORCH_STARTED == prestart.EXIT_CUDA


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def cgroup_v2(root: Path, limit: str, usage: int, inactive: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.max").write_text(f"{limit}\n")
    (root / "memory.current").write_text(f"{usage}\n")
    (root / "memory.stat").write_text(f"anon {usage - inactive}\ninactive_file {inactive}\n")
    return root


def test_the_containers_memory_is_read_from_either_cgroup_version(tmp_path: Path) -> None:
    assert standby.memory(cgroup_v2(tmp_path / "v2", "1000", 600, 100)) == (1000, 500)
    assert standby.memory(cgroup_v2(tmp_path / "unlimited", "max", 600)) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("2000\n")
    (v1 / "memory.usage_in_bytes").write_text("1500\n")
    (v1 / "memory.stat").write_text("cache 700\ntotal_inactive_file 500\n")
    assert standby.memory(tmp_path / "v1") == (2000, 1000)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert standby.memory(tmp_path / "v1") is None
    assert standby.memory(tmp_path / "none") is None


def checkpoint(root: Path, step: int, size: int) -> Path:
    step_dir = root / f"step-{step}"
    step_dir.mkdir(parents=True)
    (step_dir / "__0_0.distcp").write_bytes(b"\0" * size)
    (step_dir / ".metadata").write_text("m")
    return step_dir / ".metadata"


@pytest.mark.parametrize(
    ("usage", "loaded"),
    [
        (8800, [(10, True)]),  # 1200 free < 1001 bytes x 1.25: not before the word
        (8700, [(10, False)]),  # 1300 free: loaded before the word
    ],
)
def test_a_step_the_containers_memory_cannot_hold_is_loaded_at_the_word_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, usage: int, loaded: list[tuple[int, bool]]
) -> None:
    marker = checkpoint(tmp_path / "ckpt", 10, 1000)
    monkeypatch.setattr(standby, "CGROUP", cgroup_v2(tmp_path / "cg", "10000", usage))
    fake = held(monkeypatch, FakeHook(10, polls=3))
    loads: list[tuple[int | None, bool]] = []
    standby.wait(
        lambda step: loads.append((step, fake.released)),
        lambda: 10,
        marker=lambda s: marker.parent.parent / f"step-{s}" / ".metadata",
        poll_s=0,
    )
    assert loads == loaded


def test_a_held_standby_short_of_memory_ends_before_the_running_epoch_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(standby, "CGROUP", cgroup_v2(tmp_path / "cg", "1000", 950))
    held(monkeypatch, FakeHook(10, polls=50))
    with pytest.raises(SystemExit, match=rf"os._exit\({standby.EXIT_SHORT_OF_MEMORY}\)"):
        standby.wait(Loads(), lambda: None, poll_s=0)  # 50 of 1000 free: under 10 %
