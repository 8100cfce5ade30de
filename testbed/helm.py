"""The pinned helm binary and the chart (``charts/jobset-inplace``): render it, and install,
upgrade or uninstall it on the local cluster the way the kustomize overlay ``overlays/local``
does (images imported on the real nodes, never pulled; controller on the real nodes)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from jobset_inplace import names

from .versions import REPO_ROOT, ensure_binaries

CHART = REPO_ROOT / "charts" / "jobset-inplace"
RELEASE = "jobset-inplace"

# The chart's values for the local cluster (the equivalent of manifests/overlays/local).
LOCAL_VALUES: dict[str, Any] = {
    "image": {"pullPolicy": "Never"},
    "agentImage": {"pullPolicy": "Never"},
    "nodeSelector": {"jobset-inplace.dev/real-node": "true"},
}


class Helm:
    def __init__(self, kubeconfig: Path | None = None) -> None:
        self.binary = ensure_binaries("helm").helm
        self.kubeconfig = kubeconfig

    def run(self, *args: str, values: dict[str, Any] | None = None) -> str:
        """``helm ARGS`` (with ``values`` as a values file); RuntimeError with helm's message."""
        cmd = [str(self.binary), *args]
        if self.kubeconfig is not None:
            cmd += ["--kubeconfig", str(self.kubeconfig)]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            if values:
                yaml.safe_dump(values, f)
                f.flush()
                cmd += ["--values", f.name]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res.stdout

    def template(
        self,
        values: dict[str, Any] | None = None,
        chart: Path = CHART,
        namespace: str = names.INSTALL_NAMESPACE,
    ) -> list[dict[str, Any]]:
        """The objects of ``chart`` (a directory or package) for ``values``, released in
        ``namespace`` (the install's by default)."""
        out = self.run("template", RELEASE, str(chart), "-n", namespace, values=values)
        return [d for d in yaml.safe_load_all(out) if d]

    def upgrade_install(self, values: dict[str, Any], timeout: float = 180) -> None:
        """``helm upgrade --install`` into the install namespace, waiting until it is ready."""
        self.run(
            "upgrade", "--install", RELEASE, str(CHART),
            "-n", names.INSTALL_NAMESPACE, "--create-namespace",
            "--wait", f"--timeout={int(timeout)}s",
            values=values,
        )  # fmt: skip

    def uninstall(self, timeout: float = 120) -> None:
        self.run(
            "uninstall", RELEASE, "-n", names.INSTALL_NAMESPACE,
            "--wait", f"--timeout={int(timeout)}s",
        )  # fmt: skip
