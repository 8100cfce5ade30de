"""The pinned kubectl binary, used where the CLI is the natural tool (apply, kustomize)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from .processes import wait_until
from .versions import binaries


class Kubectl:
    def __init__(self, kubeconfig: Path, binary: Path | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.binary = binary or binaries().kubectl

    def command(self, *args: str) -> list[str]:
        return [str(self.binary), "--kubeconfig", str(self.kubeconfig), *args]

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        cmd = self.command(*args)
        res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
        if check and res.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}"
            )
        return res.stdout

    def apply_files(self, files: Sequence[Path], *, server_side: bool = False) -> None:
        args = ["apply"]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        for f in files:
            args += ["-f", str(f)]
        self.run(*args)

    def apply_yaml(self, manifest: str, *, server_side: bool = False) -> None:
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        self.run(*args, stdin=manifest)

    def wait_crds_established(self, names: Sequence[str], timeout: float = 60) -> None:
        """Wait until every CRD is Established (``kubectl wait`` errors out instead of
        waiting when a just-created CRD has no status yet)."""
        path = '{.status.conditions[?(@.type=="Established")].status}'

        for name in names:

            def established(name: str = name) -> bool:
                out = self.run("get", f"crd/{name}", "-o", f"jsonpath={path}", check=False)
                return out.strip() == "True"

            wait_until(f"CRD {name} Established", established, timeout)


def kustomize(directory: Path) -> str:
    """Render a kustomization with kubectl's built-in kustomize."""
    res = subprocess.run(
        [str(binaries().kubectl), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {res.stderr.strip()}")
    return res.stdout
