"""The kubectl plugin installed the way krew users install it: release/plugin.py builds the
executable (PyInstaller) and its archive and manifest for this machine's platform; krew (built
from its Go module) installs it from the local archive into a fresh KREW_ROOT; the installed
plugin then runs with nothing of this checkout or its virtualenv on the PATH."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from jobset_inplace import __version__
from release import plugin
from testbed.versions import REPO_ROOT, ensure_binaries

BASE_URL = "https://downloads.example/jobset-inplace"  # the manifest's uri; never fetched here


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(archive, manifest), built once for the module."""
    out = tmp_path_factory.mktemp("dist")
    assert plugin.main(["--out", str(out), "--base-url", BASE_URL]) == 0
    (archive,) = out.glob(f"{plugin.EXECUTABLE}-v{__version__}-*.tar.gz")
    return archive, out / f"{plugin.PLUGIN}.krew.yaml"


def test_the_manifest_names_the_archive_with_its_checksum(built: tuple[Path, Path]) -> None:
    archive, manifest_path = built
    manifest = yaml.safe_load(manifest_path.read_text())
    assert manifest["metadata"]["name"] == "jobset-inplace"
    assert manifest["spec"]["version"] == f"v{__version__}"
    (entry,) = manifest["spec"]["platforms"]
    os_name, arch = plugin.this_platform()
    assert entry["selector"] == {"matchLabels": {"os": os_name, "arch": arch}}
    assert entry["uri"] == f"{BASE_URL}/{archive.name}"
    assert entry["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()


def test_krew_installs_the_plugin_and_it_runs_on_its_own(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    archive, manifest = built
    krew = ensure_binaries("krew").krew
    root = tmp_path / "krew"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KREW_ROOT": str(root)}
    install = subprocess.run(
        [str(krew), "install", f"--manifest={manifest}", f"--archive={archive}"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    # (krew list needs its plugin index, a git clone of a public repository: not here)
    receipt = yaml.safe_load((root / "receipts" / "jobset-inplace.yaml").read_text())
    assert receipt["spec"]["version"] == f"v{__version__}", "krew recorded the install"
    installed = root / "bin" / plugin.EXECUTABLE
    assert installed.exists(), sorted(p.name for p in (root / "bin").iterdir())
    # as kubectl runs it: found on the PATH by name, from a directory with nothing of ours
    env["PATH"] = f"{root / 'bin'}:{env['PATH']}"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert not any(str(REPO_ROOT) in v for v in env.values())
    help_ = subprocess.run(
        [plugin.EXECUTABLE, "--help"], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    assert help_.returncode == 0, help_.stderr
    assert "status" in help_.stdout
    example = REPO_ROOT / "examples" / "trainer-contract.yaml"
    enabled = subprocess.run(
        [plugin.EXECUTABLE, "enable", "-f", str(example)],
        env=env, cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert enabled.returncode == 0, enabled.stderr
    assert "name: jobset-inplace-agent" in enabled.stdout, "the agent was added"
    offline = subprocess.run(
        [plugin.EXECUTABLE, "status", "gang"],
        env={**env, "KUBECONFIG": os.devnull}, cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert offline.returncode == 4, "no cluster: its own exit code, no traceback"
    assert "no usable kubeconfig" in offline.stderr
    assert "Traceback" not in offline.stderr
