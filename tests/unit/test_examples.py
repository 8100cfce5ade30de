"""The JobSets under examples/ are what the webhook admits and prepares as they are written,
with no warning but the ones a reader is told about; the trainer-contract example's trainer
saves checkpoints and resumes through the contract (run here as a process, with its state
directory as the agent would leave it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobset_inplace.core.admission import validate, warnings
from jobset_inplace.core.transform import DEFAULT_AGENT_IMAGE, AgentSettings, transform
from jobset_inplace.trainer import ResumeInfo, write_resume
from testbed.images import JAX_EXAMPLES_IMAGE, PYTORCH_EXAMPLES_IMAGE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOBSET_FILES = sorted(EXAMPLES.glob("*.yaml"))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _jobset(path: Path) -> dict[str, Any]:
    [js] = [d for d in _docs(path) if d["kind"] == "JobSet"]
    return js


def test_there_are_examples() -> None:
    assert {p.name for p in JOBSET_FILES} >= {
        "trainer-contract.yaml",
        "pytorch-dcp.yaml",
        "jax-orbax.yaml",
        "hf-trainer.yaml",
    }


@pytest.mark.parametrize("path", JOBSET_FILES, ids=lambda p: p.name)
def test_the_webhook_admits_and_prepares_each_example_without_warnings(path: Path) -> None:
    js = _jobset(path)
    assert validate(js) == (True, ""), path.name
    assert warnings(js) == [], "an example the webhook warns about teaches the wrong thing"
    prepared = transform(js, AgentSettings(image=DEFAULT_AGENT_IMAGE))
    pod = prepared["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["jobset-inplace-agent"]


def test_the_trainer_contract_example_checkpoints_and_resumes(tmp_path: Path) -> None:
    [config] = [d for d in _docs(EXAMPLES / "trainer-contract.yaml") if d["kind"] == "ConfigMap"]
    script = tmp_path / "train.py"
    script.write_text(config["data"]["train.py"])
    state, ckpt = tmp_path / "state", tmp_path / "ckpt"
    state.mkdir()
    env = {
        **os.environ,
        "JSI_STATE_DIR": str(state),
        "JSI_CHECKPOINT_LOCAL_DIR": str(ckpt),
        "STEP_SECONDS": "0.01",
    }

    def run_until(step_dir: str, resume: ResumeInfo) -> str:
        write_resume(resume, state)  # as the agent leaves it before the barrier opens
        proc = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 30
            while not (ckpt / step_dir / "COMPLETE").exists():
                assert proc.poll() is None, "the trainer ended"
                assert time.monotonic() < deadline, f"no {step_dir} within 30 s"
                time.sleep(0.05)
        finally:
            proc.kill()
            out, _ = proc.communicate()
        return out

    out = run_until("step-20", ResumeInfo(epoch=1, resume_step=None, gang="demo/contract-demo"))
    assert "epoch 1: starting from scratch" in out
    out = run_until("step-30", ResumeInfo(epoch=2, resume_step=20, gang="demo/contract-demo"))
    assert "epoch 2: resumed at step 20 (step=20)" in out


# The images `make images` builds (EXAMPLES=1 for the examples' own).
BUILT_IMAGES = {
    DEFAULT_AGENT_IMAGE: "make images",
    PYTORCH_EXAMPLES_IMAGE: "make images EXAMPLES=1",
    JAX_EXAMPLES_IMAGE: "make images EXAMPLES=1",
}


@pytest.mark.parametrize("path", JOBSET_FILES, ids=lambda p: p.name)
def test_an_example_that_runs_as_written_names_images_make_images_builds_and_says_so(
    path: Path,
) -> None:
    """examples/README.md says which examples run as written; theirs name only the images
    `make images` builds, at this version, and the file says how to build them."""
    pod = _jobset(path)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    named = {c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]}
    if _runs_as_written(path):
        assert named <= BUILT_IMAGES.keys(), f"{path.name}: {named - BUILT_IMAGES.keys()}"
        for image in named:
            assert BUILT_IMAGES[image] in path.read_text(), f"{path.name}: how {image} is built"


def _runs_as_written(path: Path) -> bool:
    """The README table's "runs as is?" column for ``path`` starts with "yes"."""
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        if line.startswith(f"| [`{path.name}`]"):
            return line.rsplit("|", 2)[1].strip().startswith("yes")
    raise AssertionError(f"{path.name} is not in examples/README.md's table")
