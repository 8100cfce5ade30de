"""Checkpoint layouts (jobset_inplace.trainer.layouts) on real directories: what each framework
counts as complete, step names, setting newer steps aside so the framework's own "latest" is
the gang's step, and restoring them. The on-disk shapes follow the frameworks' sources: Orbax
(_src/path/atomicity.py, step.py), torch.distributed.checkpoint (filesystem.py) with
torchtitan's step names, transformers (trainer_utils.get_last_checkpoint), Megatron-LM
(training/checkpointing.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobset_inplace.trainer.checkpoints import mark_complete, step_dir
from jobset_inplace.trainer.layouts import (
    MEGATRON_TRACKER,
    SET_ASIDE_DIR,
    Layout,
    checkpoint_layout,
    parse_step_pattern,
)


def orbax_step(root: Path, name: str, *, committed: bool = True) -> None:
    """Orbax on a local filesystem: written as <name>.orbax-checkpoint-tmp, renamed when done."""
    d = root / (name if committed else f"{name}.orbax-checkpoint-tmp")
    (d / "default").mkdir(parents=True)
    (d / "_CHECKPOINT_METADATA").write_text("{}")


def dcp_step(root: Path, step: int, *, finished: bool = True) -> None:
    """DCP: every rank's __<i>_<k>.distcp, then the coordinator's .metadata (tmp + rename)."""
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x")
    (d / "__1_0.distcp").write_bytes(b"x")
    (d / (".metadata" if finished else ".metadata.tmp")).write_bytes(b"m")


def hf_step(root: Path, step: int, *, finished: bool = True) -> None:
    """transformers Trainer: weights, optimizer, ..., trainer_state.json last."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w")
    if finished:
        (d / "optimizer.pt").write_bytes(b"o")
        (d / "trainer_state.json").write_text(f'{{"global_step": {step}}}')


def megatron_step(root: Path, step: int, *, tracked: bool = True) -> None:
    """Megatron-LM: iter_<7 digits>/ by every rank, then rank 0 writes the tracker."""
    d = root / f"iter_{step:07d}"
    d.mkdir(parents=True)
    (d / "metadata.json").write_text("{}")
    if tracked:
        (root / MEGATRON_TRACKER).write_text(str(step))


# --- what each framework's own resume would pick (their rules, for the tests' checks) --------


def hf_last_checkpoint(root: Path) -> str | None:
    """transformers.trainer_utils.get_last_checkpoint."""
    found = re.compile(r"^checkpoint\-(\d+)$")
    ck = [p.name for p in root.iterdir() if found.search(p.name) and p.is_dir()]
    return max(ck, key=lambda x: int(found.search(x).groups()[0])) if ck else None  # type: ignore[union-attr]


def torchtitan_load_step(root: Path) -> int:
    """torchtitan's _find_load_step: unanchored step-(\\d+), .metadata inside, the max."""
    steps = [
        int(m.group(1))
        for p in root.iterdir()
        if (m := re.search(r"step-(\d+)", p.name)) and (p / ".metadata").is_file()
    ]
    return max(steps) if steps else -1


def orbax_latest(root: Path) -> int | None:
    """Orbax's find_all without a prefix: finalized entries whose whole name is a step."""
    steps = [
        int(p.name)
        for p in root.iterdir()
        if re.fullmatch(r"0*(0|[1-9]\d*)", p.name) and ".orbax-checkpoint-tmp" not in p.name
    ]
    return max(steps) if steps else None


# --- complete steps ---------------------------------------------------------------------------


def test_orbax_counts_committed_steps_not_tmp_ones(tmp_path: Path) -> None:
    orbax_step(tmp_path, "100")
    orbax_step(tmp_path, "200")
    orbax_step(tmp_path, "300", committed=False)
    (tmp_path / "metadata").mkdir()  # Orbax's root metadata: not a step
    assert checkpoint_layout("orbax").steps(tmp_path) == {100, 200}


def test_orbax_fixed_length_and_prefixed_names(tmp_path: Path) -> None:
    orbax_step(tmp_path, "0000100")
    assert checkpoint_layout("orbax").steps(tmp_path) == {100}
    other = tmp_path / "prefixed"
    orbax_step(other, "step_7")
    orbax_step(other, "step_8", committed=False)
    assert checkpoint_layout("orbax", "step_{step}").steps(other) == {7}


def test_dcp_counts_a_step_once_its_metadata_is_written(tmp_path: Path) -> None:
    dcp_step(tmp_path, 10)
    dcp_step(tmp_path, 20, finished=False)
    assert checkpoint_layout("torch-dcp").steps(tmp_path) == {10}


def test_hf_trainer_counts_a_step_once_its_trainer_state_is_written(tmp_path: Path) -> None:
    hf_step(tmp_path, 500)
    hf_step(tmp_path, 1000, finished=False)
    (tmp_path / "runs").mkdir()
    assert checkpoint_layout("hf-trainer").steps(tmp_path) == {500}


def test_megatron_counts_iterations_up_to_its_tracker(tmp_path: Path) -> None:
    megatron_step(tmp_path, 1000)
    megatron_step(tmp_path, 2000)
    megatron_step(tmp_path, 3000, tracked=False)  # being written: the tracker says 2000
    assert checkpoint_layout("megatron").steps(tmp_path) == {1000, 2000}


def test_megatron_without_tracker_or_release_has_no_step(tmp_path: Path) -> None:
    megatron_step(tmp_path, 1000, tracked=False)
    assert checkpoint_layout("megatron").steps(tmp_path) == set()
    (tmp_path / MEGATRON_TRACKER).write_text("release")
    assert checkpoint_layout("megatron").steps(tmp_path) == set()


def test_megatron_malformed_tracker_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / MEGATRON_TRACKER).write_text("12a")
    with pytest.raises(ValueError, match=r"latest_checkpointed_iteration.txt: '12a'"):
        checkpoint_layout("megatron").steps(tmp_path)


def test_a_missing_root_has_no_steps(tmp_path: Path) -> None:
    for kind in Layout:
        assert checkpoint_layout(kind).steps(tmp_path / "absent") == set()


def test_ours_is_the_trainer_contract(tmp_path: Path) -> None:
    d = step_dir(tmp_path, 40)
    d.mkdir()
    mark_complete(d, durable=False)
    step_dir(tmp_path, 50).mkdir()
    assert checkpoint_layout("jobset-inplace").steps(tmp_path) == {40}


# --- step names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "step"),
    [
        ("step-{step}", "step-12", 12),
        ("step-{step}", "step-012", 12),
        ("step-{step}", "step-12.old", None),
        ("step-{step}", "xstep-12", None),
        ("step-{step}", "step-", None),
        ("step-{step}", "step-1\u0662", None),  # a non-ASCII digit
        ("{step}", "9223372036854775807", 2**63 - 1),
        ("{step}", "9223372036854775808", None),
        ("ckpt_{step}.d", "ckpt_5.d", 5),
    ],
)
def test_step_names(pattern: str, name: str, step: int | None) -> None:
    assert parse_step_pattern(pattern).step_of(name) == step


@pytest.mark.parametrize("bad", ["step", "a/{step}", "{step}{step}", "", "{step} x", "../{step}"])
def test_a_bad_step_pattern_names_the_form(bad: str) -> None:
    with pytest.raises(ValueError, match=r"expected a directory name with one \{step\}"):
        parse_step_pattern(bad)


def test_an_unknown_layout_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="expected jobset-inplace, orbax, torch-dcp"):
        checkpoint_layout("tensorflow")


def test_ours_takes_no_other_step_pattern() -> None:
    with pytest.raises(ValueError, match="always step-"):
        checkpoint_layout("jobset-inplace", "ckpt-{step}")


# --- resume: the framework's own "latest" becomes the gang's step ------------------------------


def test_hf_trainer_resumes_from_the_gang_step_and_the_step_comes_back(tmp_path: Path) -> None:
    for s in (100, 200, 300):
        hf_step(tmp_path, s)
    hf_step(tmp_path, 400, finished=False)  # partial, newer: set aside too
    layout = checkpoint_layout("hf-trainer")
    assert layout.prepare_resume(tmp_path, 200, epoch=3) == [400, 300]
    assert hf_last_checkpoint(tmp_path) == "checkpoint-200"
    # nothing the Trainer's rotation globs (checkpoint-*) is left of the set-aside steps
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-100",
        "checkpoint-200",
    ]
    assert layout.steps(tmp_path) == {100, 200}
    restored, kept = layout.restore(tmp_path)
    assert (sorted(restored), kept) == (["checkpoint-300", "checkpoint-400"], [])
    assert hf_last_checkpoint(tmp_path) == "checkpoint-400"
    assert not (tmp_path / SET_ASIDE_DIR / "epoch-3").exists()


def test_dcp_resume_hides_newer_steps_from_torchtitans_search(tmp_path: Path) -> None:
    for s in (10, 20, 30):
        dcp_step(tmp_path, s)
    layout = checkpoint_layout("torch-dcp")
    assert layout.prepare_resume(tmp_path, 10, epoch=2) == [30, 20]
    assert torchtitan_load_step(tmp_path) == 10  # (the set-aside dir has no step-<n> name)


def test_orbax_resume_and_a_fresh_start(tmp_path: Path) -> None:
    for s in ("1", "2", "3"):
        orbax_step(tmp_path, s)
    layout = checkpoint_layout("orbax")
    assert layout.prepare_resume(tmp_path, 2, epoch=5) == [3]
    assert orbax_latest(tmp_path) == 2
    assert layout.prepare_resume(tmp_path, None, epoch=6) == [2, 1]
    assert orbax_latest(tmp_path) is None
    restored, _ = layout.restore(tmp_path, epoch=5)
    assert restored == ["3"]
    assert orbax_latest(tmp_path) == 3


def test_megatron_tracker_points_at_the_gang_step_and_is_restored(tmp_path: Path) -> None:
    for s in (1000, 2000, 3000):
        megatron_step(tmp_path, s)
    layout = checkpoint_layout("megatron")
    assert layout.prepare_resume(tmp_path, 2000, epoch=4) == [3000]
    assert (tmp_path / MEGATRON_TRACKER).read_text() == "2000"
    assert layout.steps(tmp_path) == {1000, 2000}
    assert not list(tmp_path.glob(".*.tmp")), "the tracker is replaced, no temporary left"
    restored, kept = layout.restore(tmp_path)
    assert (sorted(restored), kept) == (["iter_0003000", MEGATRON_TRACKER], [])
    assert (tmp_path / MEGATRON_TRACKER).read_text() == "3000"


def test_megatron_fresh_start_removes_the_tracker(tmp_path: Path) -> None:
    megatron_step(tmp_path, 1000)
    layout = checkpoint_layout("megatron")
    assert layout.prepare_resume(tmp_path, None, epoch=2) == [1000]
    assert not (tmp_path / MEGATRON_TRACKER).exists()
    assert layout.steps(tmp_path) == set()


def test_every_member_preparing_one_shared_root_sets_each_step_aside_once(
    tmp_path: Path,
) -> None:
    for s in (1000, 2000, 3000):
        megatron_step(tmp_path, s)
    layout = checkpoint_layout("megatron")
    first = layout.prepare_resume(tmp_path, 1000, epoch=7)
    again = layout.prepare_resume(tmp_path, 1000, epoch=7)
    assert (first, again) == ([3000, 2000], [])
    # the original tracker is the one kept, not the rewritten one
    kept = tmp_path / SET_ASIDE_DIR / "epoch-7" / MEGATRON_TRACKER
    assert kept.read_text() == "3000"


def test_restore_leaves_a_step_set_aside_when_the_trainer_saved_it_again(
    tmp_path: Path,
) -> None:
    for s in (1, 2):
        hf_step(tmp_path, s)
    layout = checkpoint_layout("hf-trainer")
    layout.prepare_resume(tmp_path, 1, epoch=2)
    hf_step(tmp_path, 2)  # the resumed run saved step 2 again
    restored, kept = layout.restore(tmp_path)
    assert (restored, kept) == ([], ["checkpoint-2"])
    assert (tmp_path / SET_ASIDE_DIR / "epoch-2" / "checkpoint-2").is_dir()


def test_ours_retires_and_restores_by_marker(tmp_path: Path) -> None:
    for s in (10, 20):
        d = step_dir(tmp_path, s)
        d.mkdir()
        mark_complete(d, durable=False)
    layout = checkpoint_layout("jobset-inplace")
    assert layout.prepare_resume(tmp_path, 10, epoch=2) == [20]
    assert layout.steps(tmp_path) == {10}
    assert layout.restore(tmp_path) == (["step-20"], [])
    assert layout.steps(tmp_path) == {10, 20}
