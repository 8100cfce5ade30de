"""testbed/kind/runc-host-caps: the runtime that lets a privileged container start on a host whose
capability bounding set lacks some capabilities (this machine's lacks CAP_SYS_RESOURCE)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

WRAPPER = Path(__file__).resolve().parents[2] / "testbed" / "kind" / "runc-host-caps"
ALL = "1ffffffffff"  # CAP_CHOWN (0) .. CAP_CHECKPOINT_RESTORE (40)
NO_SYS_RESOURCE = "1fffeffffff"  # bit 24 cleared, as on this machine
PRIVILEGED = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_BPF"]


def _spec() -> dict[str, list[str]]:
    return {k: list(PRIVILEGED) for k in ("bounding", "effective", "permitted", "inheritable")}


def _run(tmp: Path, capbnd: str, *args: str) -> list[str]:
    """Run the wrapper with a stand-in runc that records the arguments it was given."""
    seen = tmp / "runc-args"
    runc = tmp / "runc"
    runc.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    runc.chmod(0o755)
    env = {**os.environ, "JSI_CAPBND": capbnd, "JSI_RUNC": str(runc)}
    subprocess.run([str(WRAPPER), *args], env=env, check=True, timeout=30)
    return seen.read_text().splitlines()


def test_it_names_what_the_host_lacks() -> None:
    def missing(capbnd: str) -> str:
        env = {**os.environ, "JSI_CAPBND": capbnd}
        out = subprocess.run(
            [str(WRAPPER), "--missing"], env=env, capture_output=True, text=True, check=True
        )
        return out.stdout

    assert missing(NO_SYS_RESOURCE) == "CAP_SYS_RESOURCE\n"
    assert missing(ALL) == ""
    assert missing("1fffeffff7f") == "CAP_SETUID\nCAP_SYS_RESOURCE\n"


def test_a_created_container_is_given_only_what_the_host_has(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = {"ociVersion": "1.0.2", "process": {"args": ["/pause"], "capabilities": _spec()}}
    (bundle / "config.json").write_text(json.dumps(config))
    args = ["--root", "/run/x", "create", "--bundle", str(bundle), "--pid-file", "p", "c1"]
    assert _run(tmp_path, NO_SYS_RESOURCE, *args) == args  # runc gets the same arguments
    caps = json.loads((bundle / "config.json").read_text())["process"]["capabilities"]
    kept = [c for c in PRIVILEGED if c != "CAP_SYS_RESOURCE"]
    assert caps == {k: kept for k in ("bounding", "effective", "permitted", "inheritable")}
    assert json.loads((bundle / "config.json").read_text())["process"]["args"] == ["/pause"]


def test_an_exec_process_is_given_only_what_the_host_has(tmp_path: Path) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": _spec()}))
    _run(tmp_path, NO_SYS_RESOURCE, "exec", "--process", str(process), "--detach", "c1")
    caps = json.loads(process.read_text())["capabilities"]
    assert all("CAP_SYS_RESOURCE" not in v and "CAP_BPF" in v for v in caps.values())


def test_on_a_host_with_every_capability_nothing_is_changed(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    text = json.dumps({"process": {"capabilities": _spec()}})
    (bundle / "config.json").write_text(text)
    _run(tmp_path, ALL, "create", "--bundle", str(bundle), "c1")
    assert (bundle / "config.json").read_text() == text
    # and other commands pass through untouched
    assert _run(tmp_path, NO_SYS_RESOURCE, "delete", "--force", "c1") == ["delete", "--force", "c1"]
