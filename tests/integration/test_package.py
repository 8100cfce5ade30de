"""The package as users install it (issue: installed the way users install tools): a wheel built
from this checkout, installed from the machine's configured package index (no editable install,
no dev tools) into a fresh virtualenv with pip and as an application with pipx, whose console
scripts run: the plugin's help and an
offline `enable` of an example, kubectl's completion helper, the agent's and the controller's
argument checks."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from testbed.versions import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout."""
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(REPO_ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = wheels.glob("jobset_inplace-*.whl")
    return built


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
