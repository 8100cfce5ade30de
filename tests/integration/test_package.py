"""The package as users install it (issue: installed the way users install tools): a wheel built
from this checkout, installed from the machine's configured package index (no editable install,
no dev tools) into a fresh virtualenv with pip and as an application with pipx, whose console
scripts run: the plugin's help and an
offline `enable` of an example, kubectl's completion helper, the agent's and the controller's
argument checks; and the plugin's own distribution (``kubectl-jobset-inplace``) on the oldest
Python here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from jobset_inplace import __version__
from release import plugin_dist
from testbed.versions import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout."""
    return plugin_dist.pip_wheel(REPO_ROOT, tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module", params=["pip", "pipx"])
def installed(
    request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The wheel installed as users install it: into a fresh virtualenv with pip, or as an
    application with pipx (its own virtualenv, the console scripts linked into a bin
    directory); the directory holding the console scripts."""
    work = tmp_path_factory.mktemp(request.param)
    if request.param == "pip":
        env_dir = work / "venv"
        venv.create(env_dir, with_pip=True)
        cmd = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)]
        bin_dir, env = env_dir / "bin", None
    else:
        bin_dir = work / "bin"
        env = {
            **os.environ,
            "PIPX_HOME": str(work / "pipx"),
            "PIPX_BIN_DIR": str(bin_dir),
            "PIPX_MAN_DIR": str(work / "man"),
        }
        cmd = [sys.executable, "-m", "pipx", "install", "--python", sys.executable, str(wheel)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, f"{request.param} install failed:\n{done.stdout}{done.stderr}"
    return bin_dir


def run(bin_dir: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_installed_plugin_runs_and_enables_an_example_offline(installed: Path) -> None:
    help_ = run(installed, "kubectl-jobset_inplace", "--help")
    assert help_.returncode == 0, help_.stderr
    assert "Inspect and operate jobset-inplace gangs." in help_.stdout
    example = REPO_ROOT / "examples" / "trainer-contract.yaml"
    enabled = run(installed, "kubectl-jobset_inplace", "enable", "-f", str(example))
    assert enabled.returncode == 0, enabled.stderr
    assert "name: jobset-inplace-agent" in enabled.stdout, "the agent was added"
    assert "launcher.py" in enabled.stdout, "with the process scope's launcher"


def test_the_installed_completion_helper_answers_as_kubectl_expects(installed: Path) -> None:
    done = run(installed, "kubectl_complete-jobset_inplace", "doc")
    assert (done.returncode, done.stdout) == (0, "doctor\n:4\n")


def test_the_installed_agent_and_controller_check_their_configuration(installed: Path) -> None:
    agent = run(installed, "jobset-inplace-agent")
    assert agent.returncode == 2, "a bad configuration is exit 2, never the restart code"
    assert "POD_NAME" in agent.stdout + agent.stderr
    controller = run(installed, "jobset-inplace", "run", "--log-format", "xml")
    assert controller.returncode == 2
    assert "--log-format" in controller.stderr


# --- the plugin alone (release/plugin_dist.py) --------------------------------------------------
CONTROLLER_ONLY = {"kopf", "uvloop", "cryptography", "aiohttp", "prometheus-client", "httptools"}


def oldest_python() -> Path:
    """The oldest Python of those the plugin supports that this machine has (3.9 first: the
    distribution says >= 3.9): on PATH as python3.N, or under pyenv's versions; else this one."""
    roots = [Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"]
    for minor in range(9, sys.version_info.minor):
        found = [shutil.which(f"python3.{minor}")]
        found += [str(p) for root in roots for p in sorted(root.glob(f"3.{minor}.*/bin/python"))]
        for candidate in filter(None, found):
            version = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            if version.stdout.strip() == f"(3, {minor})":
                return Path(candidate)
    return Path(sys.executable)


def test_the_plugin_alone_installs_on_the_oldest_python_without_the_controller(
    tmp_path: Path,
) -> None:
    """``kubectl-jobset-inplace``, built from this checkout, installed from the machine's
    package index into a fresh virtualenv of the oldest Python it supports that is here: none
    of the controller's dependencies come with it, and its commands answer as this checkout's
    plugin does (every example enabled offline: the same JobSet and the same warnings)."""
    wheel = plugin_dist.build(tmp_path / "wheel")
    python = oldest_python()
    env_dir = tmp_path / "venv"
    subprocess.run([str(python), "-m", "venv", str(env_dir)], check=True, timeout=120)
    began = time.monotonic()
    done = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"install failed:\n{done.stdout}{done.stderr}"
    listed = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    names = {d["name"].lower() for d in json.loads(listed)}
    version = subprocess.run(
        [str(env_dir / "bin" / "python"), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"{wheel.name} on {version} ({python}): installed in {time.monotonic() - began:.1f} s, "
        f"{len(names)} distributions"
    )
    assert "kubectl-jobset-inplace" in names
    assert not names & CONTROLLER_ONLY, names & CONTROLLER_ONLY
    bin_dir = env_dir / "bin"
    client = run(bin_dir, "kubectl-jobset_inplace", "version", "--client")
    assert (client.returncode, client.stdout.split()) == (0, ["plugin:", __version__])
    examples = sorted((REPO_ROOT / "examples").glob("*.yaml"))
    assert examples
    for example in examples:
        theirs = run(bin_dir, "kubectl-jobset_inplace", "enable", "-f", str(example))
        ours = subprocess.run(
            [sys.executable, "-m", "jobset_inplace.kubectl_plugin", "enable", "-f", str(example)],
            capture_output=True, text=True, timeout=60, check=False, cwd=REPO_ROOT,
        )  # fmt: skip
        assert (theirs.returncode, theirs.stdout, theirs.stderr) == (
            ours.returncode, ours.stdout, ours.stderr
        ), example.name  # fmt: skip
    completed = run(bin_dir, "kubectl_complete-jobset_inplace", "doc")
    assert (completed.returncode, completed.stdout) == (0, "doctor\n:4\n")
