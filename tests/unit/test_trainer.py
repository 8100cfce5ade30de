"""Trainer helper: resume.json, waiting for it, and saving checkpoints the agent can report."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jobset_inplace.trainer as trainer_module
from jobset_inplace import trainer
from jobset_inplace.trainer import (
    DEFAULT_STATE_DIR,
    ENV_CHECKPOINT_LOCAL_DIR,
    ENV_CHECKPOINT_PERSISTENT_DIR,
    ENV_STATE_DIR,
    RESUME_FILE,
    ResumeInfo,
    checkpoint_path,
    clear_resume,
    read_resume,
    resolve_state_dir,
    save_checkpoint,
    staged_checkpoint,
    tier_roots,
    wait_for_resume,
    write_resume,
)
from jobset_inplace.trainer.checkpoints import (
    COMPLETE_MARKER,
    MAX_STEP,
    available_steps,
    retire_steps_after,
    scan_tier,
    step_dir,
)

GANG = "team-a/llama"


def tiers_env(tmp_path: Path) -> dict[str, str]:
    return {
        ENV_CHECKPOINT_LOCAL_DIR: str(tmp_path / "local"),
        ENV_CHECKPOINT_PERSISTENT_DIR: str(tmp_path / "persistent"),
    }


def write_weights(text: str) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        (directory / "weights.bin").write_text(text)
        (directory / "optim").mkdir()
        (directory / "optim" / "shard-0").write_text(text + "-optim")
        (directory / "optim" / COMPLETE_MARKER).write_text("a user file, not our marker")

    return write


# --- ResumeInfo / resume.json ----------------------------------------------------------------


def test_resume_json_has_exactly_the_contract_keys() -> None:
    doc = json.loads(ResumeInfo(epoch=3, resume_step=1200, gang=GANG).to_json())
    assert doc == {"epoch": 3, "resumeStep": 1200, "gang": GANG}
    assert json.loads(ResumeInfo(0, None, GANG).to_json())["resumeStep"] is None


@settings(deadline=None)
@given(
    st.integers(min_value=0, max_value=2**40),
    st.none() | st.integers(min_value=0, max_value=MAX_STEP),
    st.from_regex(r"[a-z0-9-]{1,20}/[a-z0-9.-]{1,20}", fullmatch=True),
)
def test_resume_json_round_trip(epoch: int, step: int | None, gang: str) -> None:
    info = ResumeInfo(epoch, step, gang)
    assert ResumeInfo.from_json(info.to_json()) == info


def test_resume_json_ignores_unknown_keys() -> None:
    text = json.dumps({"epoch": 2, "resumeStep": None, "gang": GANG, "future": {"x": 1}})
    assert ResumeInfo.from_json(text) == ResumeInfo(2, None, GANG)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[1]", "expected a JSON object"),
        ('{"epoch": 1, "gang": "a/b"}', "missing resumeStep"),
        ("{}", "missing epoch, resumeStep, gang"),
        ('{"epoch": -1, "resumeStep": null, "gang": "a/b"}', "epoch must be"),
        ('{"epoch": true, "resumeStep": null, "gang": "a/b"}', "epoch must be"),
        ('{"epoch": 1.0, "resumeStep": null, "gang": "a/b"}', "epoch must be"),
        ('{"epoch": 1, "resumeStep": "5", "gang": "a/b"}', "resumeStep must be"),
        ('{"epoch": 1, "resumeStep": -5, "gang": "a/b"}', "step must be between"),
        ('{"epoch": 1, "resumeStep": 5, "gang": "ab"}', "gang must be '<namespace>/<jobset>'"),
        ('{"epoch": 1, "resumeStep": 5, "gang": "a/b/c"}', "gang must be"),
        ('{"epoch": 1, "resumeStep": 5, "gang": null}', "gang must be"),
    ],
)
def test_resume_json_rejects_malformed(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=r"malformed resume\.json") as err:
        ResumeInfo.from_json(text)
    assert problem in str(err.value)


def test_state_dir_from_env_or_default() -> None:
    assert resolve_state_dir({}) == DEFAULT_STATE_DIR == Path("/var/run/jobset-inplace")
    assert resolve_state_dir({ENV_STATE_DIR: ""}) == DEFAULT_STATE_DIR
    assert resolve_state_dir({ENV_STATE_DIR: "/x/y"}) == Path("/x/y")


def test_tier_roots_from_env() -> None:
    assert tier_roots({}) == (None, None)
    assert tier_roots({ENV_CHECKPOINT_LOCAL_DIR: "/l", ENV_CHECKPOINT_PERSISTENT_DIR: ""}) == (
        Path("/l"),
        None,
    )
    assert tier_roots({ENV_CHECKPOINT_PERSISTENT_DIR: "/p"}) == (None, Path("/p"))


def test_write_then_read_resume(tmp_path: Path) -> None:
    assert read_resume(tmp_path) is None
    path = write_resume(ResumeInfo(1, 100, GANG), tmp_path)
    assert path == tmp_path / RESUME_FILE
    assert read_resume(tmp_path) == ResumeInfo(1, 100, GANG)
    write_resume(ResumeInfo(2, None, GANG), tmp_path)
    assert read_resume(str(tmp_path)) == ResumeInfo(2, None, GANG)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESUME_FILE]  # no temp file left


def test_resume_file_is_readable_by_another_user(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = write_resume(ResumeInfo(1, 100, GANG), tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_failed_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_resume(ResumeInfo(1, 100, GANG), tmp_path)

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_resume(ResumeInfo(2, 200, GANG), tmp_path)
    monkeypatch.undo()
    assert read_resume(tmp_path) == ResumeInfo(1, 100, GANG)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESUME_FILE]


def test_read_resume_uses_env_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_resume(ResumeInfo(4, 7, GANG), tmp_path)
    monkeypatch.setenv(ENV_STATE_DIR, str(tmp_path))
    assert read_resume() == ResumeInfo(4, 7, GANG)


def test_read_resume_raises_on_a_malformed_file(tmp_path: Path) -> None:
    (tmp_path / RESUME_FILE).write_text('{"epoch": 1}')
    with pytest.raises(ValueError, match="missing resumeStep"):
        read_resume(tmp_path)


def test_clear_resume(tmp_path: Path) -> None:
    assert clear_resume(tmp_path) is False
    write_resume(ResumeInfo(1, None, GANG), tmp_path)
    assert clear_resume(tmp_path) is True
    assert read_resume(tmp_path) is None


# --- wait_for_resume -------------------------------------------------------------------------


def test_wait_returns_an_existing_file(tmp_path: Path) -> None:
    write_resume(ResumeInfo(1, 5, GANG), tmp_path)
    assert wait_for_resume(timeout=0, state_dir=tmp_path) == ResumeInfo(1, 5, GANG)


class FakeTime:
    """``time.monotonic``/``time.sleep`` for the trainer module: sleeping moves the clock on
    (no real time passes) and may run what "happens meanwhile" (e.g. the agent's write)."""

    def __init__(self, meanwhile: Callable[[], object] | None = None) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.meanwhile = meanwhile

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.meanwhile is not None and len(self.slept) == 3:
            self.meanwhile()


def fake_time(monkeypatch: pytest.MonkeyPatch, fake: FakeTime) -> FakeTime:
    clock = SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep)
    monkeypatch.setattr(trainer_module, "time", clock)  # the module's own name, nothing else
    return fake


def test_wait_sees_a_file_written_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = FakeTime(lambda: write_resume(ResumeInfo(2, None, GANG), tmp_path))
    fake = fake_time(monkeypatch, written)
    got = wait_for_resume(timeout=30, poll=0.5, state_dir=tmp_path)
    assert got == ResumeInfo(2, None, GANG)
    assert fake.slept == [0.5, 0.5, 0.5], "polled until the agent wrote it"


def test_wait_times_out_with_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_time(monkeypatch, FakeTime())
    with pytest.raises(TimeoutError, match=f"is the jobset-inplace agent running.*{ENV_STATE_DIR}"):
        wait_for_resume(timeout=1.0, poll=0.4, state_dir=tmp_path)
    assert fake.slept == [0.4, 0.4, pytest.approx(0.2)], "never sleeps past the timeout"


def test_wait_rejects_non_positive_poll(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="poll must be > 0"):
        wait_for_resume(timeout=1, poll=0, state_dir=tmp_path)


# --- saving checkpoints ----------------------------------------------------------------------


def test_save_local_commits_a_complete_step_dir(tmp_path: Path) -> None:
    env = tiers_env(tmp_path)
    [saved] = save_checkpoint(100, write_weights("v100"), env=env)
    assert saved == tmp_path / "local" / "step-100"
    assert (saved / COMPLETE_MARKER).is_file()
    assert (saved / "weights.bin").read_text() == "v100"
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["step-100"]
    assert not (tmp_path / "persistent").exists()
    assert available_steps(*tier_roots(env)) == [100]


def test_save_both_writes_once_and_copies(tmp_path: Path) -> None:
    env = tiers_env(tmp_path)
    calls: list[Path] = []

    def write(directory: Path) -> None:
        calls.append(directory)
        write_weights("v5")(directory)

    saved = save_checkpoint(5, write, tier="both", env=env, durable=False)
    assert saved == [tmp_path / "local" / "step-5", tmp_path / "persistent" / "step-5"]
    assert [(c.parent, c.name.startswith("step-5.tmp-")) for c in calls] == [
        (tmp_path / "local", True)
    ]
    for d in saved:
        assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == [
            COMPLETE_MARKER,
            "optim",
            f"optim/{COMPLETE_MARKER}",
            "optim/shard-0",
            "weights.bin",
        ]
        assert (d / "optim" / "shard-0").read_text() == "v5-optim"


def test_save_persistent_only(tmp_path: Path) -> None:
    env = tiers_env(tmp_path)
    assert save_checkpoint(9, write_weights("x"), tier="persistent", env=env) == [
        tmp_path / "persistent" / "step-9"
    ]
    assert scan_tier(tmp_path / "local") == set()


@pytest.mark.parametrize(
    ("tier", "env_keep", "missing"),
    [
        ("local", ENV_CHECKPOINT_PERSISTENT_DIR, ENV_CHECKPOINT_LOCAL_DIR),
        ("persistent", ENV_CHECKPOINT_LOCAL_DIR, ENV_CHECKPOINT_PERSISTENT_DIR),
        ("both", ENV_CHECKPOINT_LOCAL_DIR, ENV_CHECKPOINT_PERSISTENT_DIR),
    ],
)
def test_save_to_an_unconfigured_tier_names_the_env_var(
    tmp_path: Path, tier: trainer.Tier, env_keep: str, missing: str
) -> None:
    env = {env_keep: str(tmp_path / "x")}
    with pytest.raises(ValueError, match=f"needs \\${missing} to be set"):
        save_checkpoint(1, write_weights("x"), tier=tier, env=env)
    assert not (tmp_path / "x").exists()  # nothing written to the configured tier either


def test_save_rejects_unknown_tier(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tier must be one of local, persistent, both"):
        save_checkpoint(1, write_weights("x"), tier="ssd", env=tiers_env(tmp_path))  # type: ignore[arg-type]


def test_failed_write_commits_nothing_and_keeps_the_old_step(tmp_path: Path) -> None:
    env = tiers_env(tmp_path)
    save_checkpoint(10, write_weights("old"), env=env, durable=False)

    def fails(directory: Path) -> None:
        (directory / "weights.bin").write_text("half")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        save_checkpoint(10, fails, env=env)
    with pytest.raises(RuntimeError):
        save_checkpoint(20, fails, env=env)
    local = tmp_path / "local"
    assert sorted(p.name for p in local.iterdir()) == ["step-10"]
    assert (local / "step-10" / "weights.bin").read_text() == "old"
    assert scan_tier(local) == {10}


def test_resaving_a_step_replaces_it_entirely(tmp_path: Path) -> None:
    root = tmp_path / "local"
    with staged_checkpoint(root, 3, durable=False) as d:
        (d / "stale-only-in-old-run").write_text("x")
    with staged_checkpoint(root, 3) as d:
        (d / "new").write_text("y")
    assert sorted(p.name for p in step_dir(root, 3).iterdir()) == [COMPLETE_MARKER, "new"]


def test_leftovers_of_a_crashed_save_are_cleaned_up(tmp_path: Path) -> None:
    """This host's staging of a process that is gone, and the name earlier versions staged
    in, are removed; another host's (a member sharing the root) is not ours to judge."""
    root = tmp_path / "local"
    dead = subprocess.Popen(["true"])  # (its PID is free once it has been waited for)
    dead.wait()
    host = socket.gethostname()
    for name in ("step-4.tmp", f"step-4.tmp-{host}-{dead.pid}-{dead.pid}", "step-4.tmp-peer-1-1"):
        (root / name).mkdir(parents=True)
        (root / name / "junk").write_text("half")
    (root / "step-4").mkdir()  # renamed but crashed before the marker
    (root / "step-4" / "junk").write_text("half")
    assert scan_tier(root) == set()
    with staged_checkpoint(root, 4) as d:
        assert list(d.iterdir()) == []
        (d / "w").write_text("ok")
    assert sorted(p.name for p in root.iterdir()) == ["step-4", "step-4.tmp-peer-1-1"]
    assert sorted(p.name for p in (root / "step-4").iterdir()) == [COMPLETE_MARKER, "w"]


def _save_the_same_step(root: str, writer: str, rounds: int) -> None:
    for n in range(rounds):
        with staged_checkpoint(root, 7 + n % 2, durable=False) as d:
            for part in ("a", "b", "c"):
                (d / part).write_text(writer)


def _read_at(directory: int, name: str) -> str:
    with open(name, opener=lambda path, flags: os.open(path, flags, dir_fd=directory)) as f:
        return f.read()


def test_members_sharing_a_root_save_the_same_step_at_once(tmp_path: Path) -> None:
    """One root for a replicated gang: two processes of two threads each save steps 7 and 8
    over and over at once; a scan beside them never sees a complete step that is not one
    writer's whole save (its marker included: it is complete whenever it is there), and at
    the end each step is one writer's, nothing staged is left."""
    root = tmp_path / "shared"
    stop = threading.Event()
    seen: list[str] = []

    def scan() -> None:
        while not stop.is_set():
            for step in scan_tier(root):
                try:  # one directory, read through its descriptor (a load by path could mix
                    # two saves if another member replaced the step meanwhile)
                    fd = os.open(step_dir(root, step), os.O_RDONLY | os.O_DIRECTORY)
                except FileNotFoundError:
                    continue
                try:
                    parts = {_read_at(fd, x) for x in ("a", "b", "c", COMPLETE_MARKER)}
                except FileNotFoundError:
                    continue  # moved aside and removed meanwhile
                finally:
                    os.close(fd)
                seen.append("whole" if len(parts - {""}) == 1 else f"torn {parts}")

    scanner = threading.Thread(target=scan)
    scanner.start()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_the_same_step, args=(str(root), f"p{i}", 60)) for i in (0, 1)]
    threads = [
        threading.Thread(target=_save_the_same_step, args=(str(root), f"t{i}", 60)) for i in (0, 1)
    ]
    for proc in procs:
        proc.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    stop.set()
    scanner.join(10)
    assert seen, "the scan saw no step"
    assert set(seen) == {"whole"}, [s for s in seen if s != "whole"][:3]
    assert sorted(p.name for p in root.iterdir()) == ["step-7", "step-8"]
    assert scan_tier(root) == {7, 8}


def test_staging_dir_is_invisible_to_the_agent(tmp_path: Path) -> None:
    root = tmp_path / "local"
    with staged_checkpoint(root, 8) as d:
        (d / "w").write_text("ok")
        (d / COMPLETE_MARKER).write_text("")  # even a stray marker in staging does not count
        assert scan_tier(root) == set()
    assert scan_tier(root) == {8}


def test_checkpoint_path_prefers_local(tmp_path: Path) -> None:
    env = tiers_env(tmp_path)
    save_checkpoint(1, write_weights("a"), tier="both", env=env, durable=False)
    save_checkpoint(2, write_weights("b"), tier="persistent", env=env, durable=False)
    assert checkpoint_path(1, env=env) == tmp_path / "local" / "step-1"
    assert checkpoint_path(2, env=env) == tmp_path / "persistent" / "step-2"
    with pytest.raises(FileNotFoundError, match="no complete checkpoint of step 3"):
        checkpoint_path(3, env=env)
    with pytest.raises(FileNotFoundError, match="no tier configured"):
        checkpoint_path(1, env={})


# --- the whole cycle -------------------------------------------------------------------------


def test_recovery_cycle_between_agent_and_trainer(tmp_path: Path) -> None:
    """Save, fail, agent picks a step and retires newer ones, trainer resumes from it."""
    env = tiers_env(tmp_path)
    local, persistent = tier_roots(env)
    assert local is not None
    assert persistent is not None
    state = tmp_path / "state"
    state.mkdir()
    for step in (100, 200, 300):
        tier: trainer.Tier = "both" if step == 200 else "local"
        save_checkpoint(step, write_weights(f"v{step}"), tier=tier, env=env, durable=False)
    # Agent (re)starts: stale resume.json gone, report what it sees.
    clear_resume(state)
    assert available_steps(local, persistent) == [300, 200, 100]
    # The controller picked 200 (say, a replacement pod only had the persistent tier).
    for root in (local, persistent):
        retire_steps_after(root, 200)
    write_resume(ResumeInfo(epoch=2, resume_step=200, gang=GANG), state)
    # Trainer starts.
    info = wait_for_resume(timeout=1, state_dir=state)
    assert info.resume_step == 200
    assert (checkpoint_path(info.resume_step, env=env) / "weights.bin").read_text() == "v200"
    # The abandoned run's step 300 is never reported again, until saved anew.
    assert available_steps(local, persistent) == [200, 100]
    save_checkpoint(300, write_weights("v300-new"), env=env, durable=False)
    assert available_steps(local, persistent) == [300, 200, 100]
    assert (checkpoint_path(300, env=env) / "weights.bin").read_text() == "v300-new"
