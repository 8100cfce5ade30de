"""The controller image installs exactly its pinned requirements (images/
controller-requirements.txt, wheels with hashes, no resolution at build time): every runtime
dependency pyproject.toml names must be pinned there, or the image starts without it (a new
dependency added to pyproject alone crash-loops the in-cluster controller)."""

from __future__ import annotations

import re
import tomllib

from testbed.images import REQUIREMENTS
from testbed.versions import REPO_ROOT


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_runtime_dependency_is_pinned_for_the_image() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        canonical(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in project["dependencies"]
    }
    pinned = {
        canonical(line.split("==", 1)[0])
        for line in REQUIREMENTS.read_text().splitlines()
        if "==" in line and not line.startswith(("#", " "))
    }
    missing = sorted(wanted - pinned)
    assert not missing, (
        f"not in {REQUIREMENTS.name}: {missing}; run python -m testbed.images --lock"
    )
