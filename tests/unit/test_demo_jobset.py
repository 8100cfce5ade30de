"""The demo JobSet's persistent tier: one root per member (its job index) by default; one
root for the gang with ``shared_root`` (a replicated gang: the soak's ``--keep-step``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import soak
from testbed.demo import PERSISTENT_MOUNT, demo_jobset


def _trainer(js: dict[str, Any]) -> dict[str, Any]:
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (trainer,) = [c for c in pod["containers"] if c["name"] == "trainer"]
    return dict(trainer)


def _persistent_mount(trainer: dict[str, Any]) -> dict[str, Any]:
    (mount,) = [m for m in trainer["volumeMounts"] if m["mountPath"] == PERSISTENT_MOUNT]
    return dict(mount)


def test_each_member_has_its_own_persistent_root_by_default() -> None:
    trainer = _trainer(demo_jobset("g", 2, persistent=Path("/tmp/x")))
    assert _persistent_mount(trainer)["subPathExpr"] == "$(JOB_INDEX)"
    assert "JOB_INDEX" in {e["name"] for e in trainer["env"]}


def test_a_replicated_gang_shares_one_persistent_root() -> None:
    trainer = _trainer(demo_jobset("g", 2, persistent=Path("/tmp/x"), shared_root=True))
    assert "subPathExpr" not in _persistent_mount(trainer)
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["JSI_CHECKPOINT_PERSISTENT_DIR"] == PERSISTENT_MOUNT
    assert "JOB_INDEX" not in env


def test_the_soak_keeps_steps_only_when_asked() -> None:
    assert soak.parse_args([]).keep_step is False
    assert soak.parse_args(["--keep-step"]).keep_step is True
