"""Reading torchrun's --max-restarts from a container's command (and the webhook's warning):
a torchrun that restarts its workers itself hides a failure from the gang."""

from __future__ import annotations

import pytest

from jobset_inplace import names
from jobset_inplace.core.admission import warnings
from jobset_inplace.core.torchrun import max_restarts

NOTHING: dict[str, str] = {}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python3", "train.py"], None),
        (["torchrun", "--nproc-per-node", "4", "train.py"], 0),
        (["/usr/local/bin/torchrun", "--max-restarts", "3", "train.py"], 3),
        (["torchrun", "--max_restarts=2", "--standalone", "train.py"], 2),
        (["torchrun", "--standalone", "--max-restarts", "1", "train.py"], 1),
        (["python", "-m", "torch.distributed.run", "--max-restarts=5", "t.py"], 5),
        (["torchrun", "--max-restarts", "1", "--max-restarts", "0", "t.py"], 0),  # last wins
        # the training script's own arguments are not torchrun's
        (["torchrun", "--nnodes", "2", "train.py", "--max-restarts", "9"], 0),
        (["torchrun", "-m", "--max-restarts", "4", "pkg.train"], 4),  # -m takes no value
        (["torchrun", "--max-restarts", "many", "t.py"], None),  # torchrun refuses it itself
        # under the launcher (process scope) and in shell scripts
        (
            [
                "python3",
                "/var/run/jobset-inplace/launcher.py",
                "--",
                "torchrun",
                "--max-restarts",
                "2",
                "t.py",
            ],
            2,
        ),
        (["bash", "-c", "cd /w && torchrun --max-restarts=3 train.py --lr 1"], 3),
        (["sh", "-c", "echo torchrun; python train.py"], None),
        (["sh", "-c", "torchrun 'unbalanced"], None),
    ],
)
def test_max_restarts_from_the_command(argv: list[str], expected: int | None) -> None:
    assert max_restarts(argv, NOTHING) == expected


def test_max_restarts_from_the_environment_unless_the_command_sets_it() -> None:
    env = {"PET_MAX_RESTARTS": "3"}
    assert max_restarts(["torchrun", "t.py"], env) == 3
    assert max_restarts(["torchrun", "--max-restarts", "0", "t.py"], env) == 0
    assert max_restarts(["python3", "t.py"], env) is None


def _jobset(command: list[str], env: list[dict[str, str]] | None = None) -> dict[str, object]:
    container = {"name": "trainer", "image": "t:1", "command": command, "env": env or []}
    pod = {"spec": {"template": {"spec": {"containers": [container]}}}}
    return {
        "metadata": {
            "name": "g",
            "annotations": {names.ENABLED: "true", names.CHECKPOINT_DIRS: "persistent=/c"},
        },
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": pod}]},
    }


def test_the_webhook_warns_about_a_torchrun_that_restarts_its_workers() -> None:
    (warning,) = warnings(_jobset(["torchrun", "--max-restarts", "3", "train.py"]))
    assert "'workers'" in warning
    assert "'trainer'" in warning
    assert "--max-restarts 3" in warning
    assert "--max-restarts 0" in warning
    assert warnings(_jobset(["torchrun", "train.py"])) == []
    env = [{"name": "PET_MAX_RESTARTS", "value": "1"}]
    assert len(warnings(_jobset(["torchrun", "train.py"], env))) == 1
