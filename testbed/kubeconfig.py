"""Writing kubeconfig files for local components."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_token_kubeconfig(
    path: Path, server: str, token: str, ca_file: Path, *, name: str = "jsi"
) -> None:
    """A kubeconfig that authenticates with a bearer token and verifies the apiserver's
    serving certificate against ``ca_file``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
