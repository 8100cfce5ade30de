"""The orbax layout against the real Orbax: the JAX trainer (testbed/frameworks, no jobset-inplace
import) runs as two local JAX processes (a real coordinator and gloo collectives on loopback),
saves with Orbax's CheckpointManager, and the layout finds exactly Orbax's committed steps.
Then, as the agent does before a barrier opens, ``prepare_resume`` makes an older step the
gang's: the unmodified trainer's ``latest_step()`` resumes there, its losses the same as the
first run's at those steps; ``restore`` brings the set-aside step back. The packages come from
the JAX image's pinned wheels (images/jax-requirements.txt), installed for this Python."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobset_inplace.trainer.layouts import SET_ASIDE_DIR, checkpoint_layout
from testbed import images
from testbed.processes import free_port

STEP = re.compile(r"\] step (\d+) loss (\S+)$")


@pytest.fixture(scope="module")
def site_packages() -> Path:
    deps = images.pinned_packages(False, images.FRAMEWORK_REQUIREMENTS, ())
    return deps / images.LOCAL_PACKAGES


def _train(site: Path, root: Path, steps: int, workdir: Path) -> list[str]:
    """Both processes to ``steps``; each process's log."""
    port = free_port()
    procs, logs = [], []
    for i in range(2):
        log = workdir / f"process-{i}-{steps}.log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(site),
            "JAX_COORDINATOR": f"127.0.0.1:{port}",
            "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(i),
            "CHECKPOINT_DIR": str(root),
            "STEPS": str(steps),
            "STEP_SECONDS": "0",
        }
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(images.FRAMEWORK_TRAINER)],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
        logs.append(log)
    codes = [p.wait(180) for p in procs]
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], "\n".join(t[-3000:] for t in texts)
    return texts


def _losses(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in map(STEP.search, text.splitlines()) if m}


def test_orbax_resumes_unmodified_from_the_step_the_layout_prepared(
    site_packages: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    first = _train(site_packages, root, 25, tmp_path)
    layout = checkpoint_layout("orbax")
    # Orbax saved steps 1, 10 and 20 (save_interval_steps 10, and the first): all committed.
    assert layout.steps(root) == {1, 10, 20}

    assert layout.prepare_resume(root, 10, epoch=2) == [20]
    assert layout.steps(root) == {1, 10}
    again = _train(site_packages, root, 14, tmp_path)
    for before, after in zip(first, again, strict=True):
        assert "resumed at step 10 loss" in after
        resumed = _losses(after)
        assert min(resumed) == 11, "from the prepared step, not Orbax's newest (20)"
        for step in (11, 12, 13, 14):
            assert resumed[step] == _losses(before)[step], f"step {step}: the same training"

    restored, kept = layout.restore(root, epoch=2)
    assert (restored, kept) == (["20"], [])
    assert layout.steps(root) == {1, 10, 20}
    assert not (root / SET_ASIDE_DIR / "epoch-2").exists()
