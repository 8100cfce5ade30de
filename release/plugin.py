"""The kubectl plugin as krew installs it: one executable, the plugin with its libraries and
CPython (PyInstaller ``--onefile``; the Kubernetes client's pydantic core is a compiled
extension, so a portable zipapp cannot carry it), packed with the LICENSE into a tar.gz per
platform, and the krew manifest naming each archive with its sha256. Built here for this
machine's platform; other platforms are built the same way on their own machines.

``python -m release.plugin --out dist --base-url URL``: ``URL`` is where the archives will be
published (the manifest's ``uri``); ``tests/integration/test_krew.py`` installs the result
with krew from the local archive.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from jobset_inplace import __version__
from testbed.versions import cache_dir

PLUGIN = "jobset-inplace"
EXECUTABLE = "kubectl-jobset_inplace"  # kubectl finds `kubectl jobset-inplace` by this name
ENTRY = Path(__file__).with_name("kubectl_jobset_inplace.py")
SHORT = "Show and drive jobset-inplace's in-place recovery of JobSet training gangs"
REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "jobset_inplace"
KEPT_BUILDS = 3  # cached executables kept (build_executable)
MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class Archive:
    os: str
    arch: str
    path: Path
    sha256: str


def this_platform() -> tuple[str, str]:
    """(os, arch) as krew names them, of this machine."""
    machine = platform.machine().lower()
    if machine not in MACHINES:
        raise SystemExit(f"unsupported machine {machine!r} (accepted: {', '.join(MACHINES)})")
    return platform.system().lower(), MACHINES[machine]


def build_command(work: Path) -> list[str]:
    return [
        sys.executable, "-m", "PyInstaller", "--onefile", "--noconfirm", "--clean",
        "--log-level", "WARN", "--name", EXECUTABLE,
        # the client imports its API and model modules by name, on first use
        "--collect-submodules", "kubernetes.client",
        "--paths", str(REPO_ROOT),
        "--distpath", str(work / "dist"), "--workpath", str(work / "build"),
        "--specpath", str(work), str(ENTRY),
    ]  # fmt: skip


def inputs_key() -> str:
    """sha256 of all that goes into the executable: the package's and the entry's files,
    every installed distribution with its version, the interpreter and the command."""
    h = hashlib.sha256()
    files = sorted(PACKAGE.rglob("*"))
    sources = [p for p in files if p.is_file() and "__pycache__" not in p.parts]
    for path in [*sources, ENTRY]:
        h.update(f"{path.relative_to(REPO_ROOT)}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    # (this project's own distribution is left out: its files are hashed above, and whether
    # it is found depends on sys.path, which pytest widens)
    dists = sorted(
        {f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()}
        - {f"{PLUGIN}=={__version__}"}
    )
    rest = [sys.version, *dists, *build_command(Path("WORK"))]
    h.update("\0".join(rest).encode())
    return h.hexdigest()


def build_executable(work: Path) -> Path:
    """The plugin as one executable (PyInstaller, from this checkout's package), kept in the
    cache by :func:`inputs_key`: the same inputs give the same program, and PyInstaller's
    90 s or so were paid three times a CI run (krew's test and the release on each version)."""
    cached = cache_dir() / "plugin" / inputs_key()[:32] / EXECUTABLE
    if cached.is_file():
        print(f"{EXECUTABLE}: built before from the same inputs ({cached})", flush=True)
        os.utime(cached)  # used now: the newest are kept
        return cached
    print(f"building {EXECUTABLE} with PyInstaller (a minute or two) ...", flush=True)
    subprocess.run(build_command(work), check=True)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f".{EXECUTABLE}.{os.getpid()}")
    shutil.copy2(work / "dist" / EXECUTABLE, partial)
    partial.replace(cached)  # whole or absent, whoever else builds at once
    used: list[tuple[float, Path]] = []
    for other in cached.parent.parent.glob(f"*/{EXECUTABLE}"):
        with contextlib.suppress(FileNotFoundError):  # (pruned meanwhile by another build)
            used.append((other.stat().st_mtime, other))
    for _, old in sorted(used)[:-KEPT_BUILDS]:  # the newest few; each is some 40 MiB
        shutil.rmtree(old.parent, ignore_errors=True)
    return cached


def archive(executable: Path, out: Path, os_name: str, arch: str) -> Archive:
    """``<executable>`` and the LICENSE in a tar.gz (reproducible: fixed owners and times)."""
    path = out / f"{EXECUTABLE}-v{__version__}-{os_name}-{arch}.tar.gz"
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, src, mode in (
            (EXECUTABLE, executable, 0o755),
            ("LICENSE", REPO_ROOT / "LICENSE", 0o644),
        ):
            data = src.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return Archive(os_name, arch, path, hashlib.sha256(buf.getvalue()).hexdigest())


def manifest(archives: list[Archive], base_url: str) -> dict[str, Any]:
    """The krew plugin manifest (krew.googlecontainertools.github.com/v1alpha2)."""
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": PLUGIN},
        "spec": {
            "version": f"v{__version__}",
            "shortDescription": SHORT,
            "description": (
                "Status, history, manual restart, offline enable and cluster checks for\n"
                "jobset-inplace, the hybrid failure recovery for JobSet training gangs.\n"
            ),
            "platforms": [
                {
                    "selector": {"matchLabels": {"os": a.os, "arch": a.arch}},
                    "uri": f"{base_url.rstrip('/')}/{a.path.name}",
                    "sha256": a.sha256,
                    "bin": EXECUTABLE,
                    "files": [{"from": EXECUTABLE, "to": "."}, {"from": "LICENSE", "to": "."}],
                }
                for a in archives
            ],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m release.plugin", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("dist"), help="output directory (dist)")
    p.add_argument(
        "--base-url", required=True,
        help="where the archives are published: https://... (the manifest's uri)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if not args.base_url.startswith("https://"):
        p.error(f"--base-url: an https:// URL, got {args.base_url!r}")
    built, path = build(args.out, args.base_url)
    print(f"{built.path} (sha256 {built.sha256})\n{path}")
    return 0


def build(out: Path, base_url: str) -> tuple[Archive, Path]:
    """This platform's archive and the krew manifest naming it, in ``out``."""
    with tempfile.TemporaryDirectory() as work:
        built = archive(build_executable(Path(work)), out, *this_platform())
    path = out / f"{PLUGIN}.krew.yaml"
    path.write_text(yaml.safe_dump(manifest([built], base_url), sort_keys=False))
    return built, path


if __name__ == "__main__":
    sys.exit(main())
