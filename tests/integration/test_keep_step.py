"""The interrupted step kept with real PyTorch (bench/keep_step.py, a few failures): two
torchruns, DDP over gloo, DCP; a worker dies by SIGKILL, SIGSEGV, SIGABRT or an uncaught
exception and the gang resumes at the step the failure interrupted, with that step's state.
No Kubernetes here (the trainer's side; e2e/test_framework_torch.py runs it under the
controller): its place is with the real-process tests, not the unit tests (minutes, PyTorch)."""

from __future__ import annotations

from pathlib import Path

from bench import keep_step
from testbed import images


def test_every_crash_kind_costs_at_most_one_step_with_the_step_kept(tmp_path: Path) -> None:
    # No periodic checkpoint within reach (--save-every 1000): without the kept step every
    # failure would cost every step since the start of its directory (the bench's periodic
    # trainer shows it; its run is left out here).
    args = keep_step.parse_args(
        ["--failures", str(len(keep_step.KINDS)), "--chain", "4", "--max-steps", "8",
         "--save-every", "1000", "--modes", "kept"]
    )  # fmt: skip
    trials = keep_step.run(args, tmp_path, images.torch_site())
    kept = [t for t in trials if t.mode == "kept"]
    assert sorted(t.kind for t in trials) == sorted(keep_step.KINDS)
    assert all(t.mode == "kept" for t in trials)
    for t in kept:
        assert t.steps_lost <= 1, t
        assert t.kept_by, f"no worker kept a step: {t}"
        assert t.loss_ok, f"the resumed state is not step {t.resume_next}'s: {t}"
