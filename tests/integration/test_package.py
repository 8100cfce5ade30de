"""The package as users install it (issue: installed the way users install tools): a wheel built
from this checkout, installed into a fresh virtualenv from the machine's configured package
index (no editable install, no dev tools), whose console scripts run: the plugin's help and an
offline `enable` of an example, kubectl's completion helper, the agent's and the controller's
argument checks."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from testbed.versions import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel of this checkout installed: its bin directory."""
    work = tmp_path_factory.mktemp("package")
    wheels = work / "wheels"
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
    [wheel] = wheels.glob("jobset_inplace-*.whl")
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
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
