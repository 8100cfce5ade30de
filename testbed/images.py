"""The product images, built offline: ``make images`` (``python -m testbed.images``).

Both are the real nodes' Python image (Debian bookworm minbase + python3 3.11, made from Debian
packages by ``testbed/realnode/build-images.sh``: rootfs -> umoci -> skopeo, no Docker engine)
plus one layer:

* ``jobset-inplace/agent:<version>``: the ``jobset_inplace`` package (standard library only,
  import contract ``agent-no-third-party``), compiled to unchecked-hash bytecode: the agent
  starts again after every in-place restart and must not compile itself on the way.
* ``jobset-inplace/controller:<version>``: the package plus its dependencies, pinned with
  hashes in ``images/controller-requirements.txt`` (wheels only), and the ``jobset-inplace``
  command.

Reproducible: file times are clamped to SOURCE_DATE_EPOCH, bytecode carries no timestamp, the
layer tarballs are written in name order; the same checkout gives the same image digests
(``--force`` rebuilds to show it). ``images/Dockerfile`` is the same recipe for Docker users
(docs/images.md)."""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jobset_inplace import __version__
from jobset_inplace.core.transform import DEFAULT_AGENT_IMAGE

from .versions import cache_dir, real_node_dir

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "jobset_inplace"
REQUIREMENTS = ROOT / "images" / "controller-requirements.txt"
# The JAX examples' image (examples/jax-orbax.yaml, e2e/test_framework_jax.py): JAX on CPU and
# Orbax, pinned like the controller's dependencies, and the trainer as module jax_orbax_trainer.
FRAMEWORK_PACKAGES = ("jax[cpu]==0.10.2", "orbax-checkpoint==0.12.8")
FRAMEWORK_REQUIREMENTS = ROOT / "images" / "jax-requirements.txt"
JAX_EXAMPLES_IMAGE = f"jobset-inplace/jax-examples:{__version__}"
FRAMEWORK_TRAINER = ROOT / "testbed" / "frameworks" / "jax_orbax_trainer.py"
# PyTorch for the real-framework test (e2e/test_framework_torch.py). PyPI's Linux wheel is the
# CUDA build: `import torch` loads its NVIDIA libraries even with no GPU, so they come along
# (several GB). Not an image: installed once into the cache (by the requirements' hash) and
# mounted read-only into the trainers' containers (hostPath: the real nodes share this host).
# DCP saves through NumPy; the Hugging Face Trainer (examples/hf-trainer.yaml) needs transformers
# and accelerate.
TORCH_PACKAGES = ("torch==2.15.0", "numpy==2.4.6", "transformers==5.25.0", "accelerate==1.16.0")
TORCH_REQUIREMENTS = ROOT / "images" / "torch-requirements.txt"
TORCH_TRAINER = ROOT / "testbed" / "frameworks" / "torch_dcp_trainer.py"
# The PyTorch examples' image (examples/pytorch-dcp*.yaml, examples/hf-trainer.yaml): PyTorch,
# transformers and accelerate (TORCH_REQUIREMENTS) with the examples' scripts in /app.
PYTORCH_EXAMPLES_IMAGE = f"jobset-inplace/pytorch-examples:{__version__}"
EXAMPLE_SCRIPTS = {
    "train.py": TORCH_TRAINER,
    "finetune.py": ROOT / "testbed" / "frameworks" / "hf_trainer.py",
}
# PyTorch's own test helper in Python 3.12 syntax (imported only by its tests on 3.12): it
# would not compile for the image's 3.11
TORCH_UNUSED = ("torch/testing/_internal/py312_intrinsics.py",)
BUILD_IMAGES = ROOT / "testbed" / "realnode" / "build-images.sh"
IMAGE_PYTHON = (3, 11)  # python3 of Debian bookworm, the images' base
# Where Debian's python3 looks for packages: the distribution's directory and the local one.
DIST_PACKAGES = "usr/lib/python3/dist-packages"
LOCAL_PACKAGES = "usr/local/lib/python3.11/dist-packages"
AGENT_IMAGE = DEFAULT_AGENT_IMAGE
# The local nodes' test image: this checkout's package and the demo trainer on the Python
# image (build-images.sh's PYTHON_NAME, replaced by that layer on the nodes).
NODE_IMAGE = "jobset-inplace/python:local"
# Set to 1 where another cluster's nodes have these images already (testbed/kind/run.sh loads
# them into kind): the e2e tests that need them run there too.
IMAGES_LOADED_ENV = "JSI_E2E_IMAGES_LOADED"
CONTROLLER_IMAGE = f"jobset-inplace/controller:{__version__}"
# The controller's user (65532, distroless's "nonroot"; in the base image's /etc/passwd).
NONROOT = "65532:65532"
# The ``jobset-inplace`` command of the controller image (also the Dockerfile's).
CONTROLLER_COMMAND = ROOT / "images" / "jobset-inplace"


def log(msg: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Image:
    key: str
    name: str
    archive: Path

    def size_mib(self) -> float:
        return self.archive.stat().st_size / 2**20

    def digest(self) -> str:
        """The image's config digest (its ID): the same for the same content, wherever
        stored."""
        manifest = json.loads(_tar_member(self.archive, "manifest.json"))
        return "sha256:" + Path(manifest[0]["Config"]).name.removesuffix(".json")


def _tar_member(archive: Path, member: str) -> str:
    return subprocess.run(
        ["tar", "-xOf", str(archive), member], capture_output=True, text=True, check=True
    ).stdout


def _labels(title: str) -> list[str]:
    return [
        f"--config.label=org.opencontainers.image.title={title}",
        f"--config.label=org.opencontainers.image.version={__version__}",
        "--config.label=org.opencontainers.image.licenses=Apache-2.0",
    ]


def _compile(site: Path, root: Path) -> None:
    ok = compileall.compile_dir(
        site,
        quiet=1,
        ddir=f"/{site.relative_to(root)}",
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    if not ok:
        raise RuntimeError(f"compiling {site} failed")


def copy_package(root: Path, *modules: Path) -> None:
    """This checkout's ``jobset_inplace`` (and ``modules``) into the image tree ``root``, with
    its bytecode: a container's writable layer is new after every in-place restart, so without
    it each agent start compiled the package again (~30 ms of CPU on the recovery's path)."""
    _check_python()
    if root.exists():
        shutil.rmtree(root)
    site = root / DIST_PACKAGES
    site.mkdir(parents=True)
    shutil.copytree(
        PACKAGE_DIR, site / "jobset_inplace", ignore=shutil.ignore_patterns("__pycache__")
    )
    for m in modules:
        shutil.copy2(m, site / m.name)
    _compile(site, root)


def _check_python() -> None:
    if sys.version_info[:2] != IMAGE_PYTHON:
        raise RuntimeError(
            f"building the images needs Python {'.'.join(map(str, IMAGE_PYTHON))} (the images'"
            f" python3: bytecode and compiled wheels must match), this is {sys.version.split()[0]}"
        )


# Parts of the dependencies the controller never imports, left out of the image.
UNUSED = ("kubernetes/aio",)  # the client's asyncio variant: 68 MiB of the 185 MiB installed


def pinned_packages(
    force: bool, requirements: Path = REQUIREMENTS, unused: Sequence[str] = UNUSED
) -> Path:
    """Pinned wheels (``requirements``) installed into an image tree, cached by the
    requirements file's hash; ``unused``: parts of them left out."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    deps = cache_dir() / "image-trees" / f"deps-{digest}"
    if deps.exists() and force:
        shutil.rmtree(deps)
    if deps.exists():
        return deps
    log(f"installing the pinned dependencies of {requirements.name} ({digest}) ...")
    t0 = time.monotonic()
    deps.parent.mkdir(parents=True, exist_ok=True)  # a new cache has none
    tmp = Path(tempfile.mkdtemp(dir=deps.parent))
    target = tmp / LOCAL_PACKAGES
    try:
        _pip_install(
            "--no-deps",
            "--no-compile",
            "--require-hashes",
            "--target",
            str(target),
            "-r",
            str(requirements),
        )
        shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts name this python
        for part in unused:
            path = target / part
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        _compile(target, tmp)
    except BaseException:
        shutil.rmtree(tmp)  # several GB for PyTorch: no half-made tree left in the cache
        raise
    tmp.rename(deps)
    log(f"dependencies ready in {time.monotonic() - t0:.0f}s")
    return deps


def prepare_trees(force: bool = False) -> dict[str, tuple[str, Path]]:
    """The layer trees (and their ``.config`` files) of the product images: key -> (name,
    tree). Rewritten from this checkout each time (a few seconds; the archives are cached by
    the trees' content)."""
    _check_python()
    base = cache_dir() / "image-trees"
    base.mkdir(parents=True, exist_ok=True)
    deps = pinned_packages(force)
    trees: dict[str, tuple[str, Path]] = {}
    for key, name in (("agent", AGENT_IMAGE), ("controller", CONTROLLER_IMAGE)):
        root = base / key
        copy_package(root)
        options = _labels(f"jobset-inplace {key}")
        if key == "agent":
            # No user of its own: the agent renames the trainer's checkpoint markers, so it runs
            # as the pod says, like the trainer (root unless runAsUser; docs/images.md).
            options += [
                "--config.cmd=python3",
                "--config.cmd=-m",
                "--config.cmd=jobset_inplace.agent",
            ]
        else:
            shutil.copytree(deps / LOCAL_PACKAGES, root / LOCAL_PACKAGES)
            command = root / "usr/local/bin/jobset-inplace"
            command.parent.mkdir(parents=True)
            shutil.copyfile(CONTROLLER_COMMAND, command)
            command.chmod(0o755)
            options += [
                f"--config.user={NONROOT}",
                "--config.cmd=jobset-inplace",
                "--config.cmd=run",
            ]
        root.with_suffix(".config").write_text("\n".join(options) + "\n")
        trees[key] = (name, root)
    return trees


def node_socket(node: str) -> Path:
    """The containerd socket of the local cluster's real node ``node`` (realnode/containerd.sh)."""
    return real_node_dir(node) / "containerd" / "containerd.sock"


def image_specs(trees: dict[str, tuple[str, Path]]) -> list[str]:
    """``build-images.sh --image`` specs (``KEY=NAME=DIR``)."""
    return [f"{key}={name}={root}" for key, (name, root) in trees.items()]


def build(*, force: bool = False, imports: Sequence[str] = ()) -> list[Image]:
    trees = prepare_trees(force)
    cmd = ["bash", str(BUILD_IMAGES), *(["--force"] if force else [])]
    for spec in image_specs(trees):
        cmd += ["--image", spec]
    for sock in imports:
        cmd += ["--import", sock]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=_env()).stdout
    archives = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return [Image(key, name, Path(archives[key])) for key, (name, _) in trees.items()]


# Upstream JobSet's in-place restart agent (the benchmark's third path), on the Python image so
# that its main-container mode has a shell and python3 for the demo trainer.
UPSTREAM_AGENT_IMAGE = "jobset-inplace/upstream-ipr-agent:local"
UPSTREAM_AGENT_PATH = "/usr/local/bin/in-place-restart-agent"


def build_upstream_agent(binary: Path, *, imports: Sequence[str] = ()) -> Image:
    """The upstream agent image (its static binary as one layer; also this checkout's
    package and demo trainer, for main-container mode's worker), imported into ``imports``."""
    root = cache_dir() / "image-trees" / "upstream-ipr-agent"
    copy_package(root, ROOT / "testbed" / "demo_trainer.py")
    target = root / UPSTREAM_AGENT_PATH.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(binary, target)
    target.chmod(0o755)
    options = [
        *_labels("upstream JobSet in-place restart agent"),
        f"--config.cmd={UPSTREAM_AGENT_PATH}",
    ]
    root.with_suffix(".config").write_text("\n".join(options) + "\n")
    return _build_alone("ipr-agent", UPSTREAM_AGENT_IMAGE, root, imports)


def build_jax_examples_image(*, imports: Sequence[str] = ()) -> Image:
    """JAX_EXAMPLES_IMAGE: the Python image plus JAX (CPU) and Orbax from
    FRAMEWORK_REQUIREMENTS and the JAX trainer (``python3 -m jax_orbax_trainer``; it imports no
    jobset-inplace), imported into ``imports``."""
    deps = pinned_packages(False, FRAMEWORK_REQUIREMENTS, ())
    root = cache_dir() / "image-trees" / "framework"
    if root.exists():
        shutil.rmtree(root)
    site = root / DIST_PACKAGES
    site.mkdir(parents=True)
    shutil.copy2(FRAMEWORK_TRAINER, site / FRAMEWORK_TRAINER.name)
    _compile(site, root)
    shutil.copytree(deps / LOCAL_PACKAGES, root / LOCAL_PACKAGES)
    root.with_suffix(".config").write_text("\n".join(_labels("JAX + Orbax trainer")) + "\n")
    return _build_alone("framework", JAX_EXAMPLES_IMAGE, root, imports)


def build_pytorch_examples_image(*, imports: Sequence[str] = ()) -> Image:
    """PYTORCH_EXAMPLES_IMAGE: the Python image plus PyTorch, transformers and accelerate
    (TORCH_REQUIREMENTS) and the examples' scripts in ``/app`` (EXAMPLE_SCRIPTS), imported into
    ``imports``. Several GB (PyPI's PyTorch is the CUDA build): minutes the first time."""
    site = torch_site()
    root = cache_dir() / "image-trees" / "pytorch-examples"
    if root.exists():
        shutil.rmtree(root)
    # hard links: no second copy of several GB (build-images.sh copies the tree into the layer)
    shutil.copytree(site, root / LOCAL_PACKAGES, copy_function=os.link)
    app = root / "app"
    app.mkdir()
    for name, source in EXAMPLE_SCRIPTS.items():
        shutil.copy2(source, app / name)
    options = [*_labels("PyTorch examples"), "--config.workingdir=/app"]
    root.with_suffix(".config").write_text("\n".join(options) + "\n")
    return _build_alone("pytorch-examples", PYTORCH_EXAMPLES_IMAGE, root, imports)


def _build_alone(key: str, name: str, root: Path, imports: Sequence[str]) -> Image:
    """Image ``name``: the Python image plus ``root`` as one layer (``root.config``: its
    ``umoci config`` options), built alone (the other images' archives are not stale: kept;
    this one's older archives are pruned) and imported into the containerd sockets
    ``imports``."""
    cmd = ["bash", str(BUILD_IMAGES), "--image", f"{key}={name}={root}"]
    for sock in imports:
        cmd += ["--import", sock]
    env = {**_env(), "JSI_KEEP_OLD_IMAGES": "1"}
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    archives = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    archive = Path(archives[key])
    for old in archive.parent.glob(f"{key}-*.tar"):  # this image's older recipes (GBs each)
        if old != archive:
            log(f"pruning stale {old.name}")
            old.unlink()
    return Image(key, name, archive)


def torch_site() -> Path:
    """The directory of PyTorch and its dependencies (TORCH_REQUIREMENTS, bytecode compiled),
    for a trainer's ``PYTHONPATH``; installed on first use (a few minutes)."""
    return pinned_packages(False, TORCH_REQUIREMENTS, TORCH_UNUSED) / LOCAL_PACKAGES


def _env() -> dict[str, str]:
    # stderr of the script (progress) goes straight to the terminal; JSI_IMAGES would add the
    # harness's node images to a product build.
    return {k: v for k, v in os.environ.items() if k != "JSI_IMAGES"}


def _pip_install(*args: str) -> None:
    """This Python's pip (the machine's configured index), wheels only: built images must not
    depend on compiling a source distribution here."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--only-binary=:all:", *args]
    subprocess.run(cmd, check=True)


def lock() -> None:
    """Write images/controller-requirements.txt (pyproject's dependencies),
    images/jax-requirements.txt (FRAMEWORK_PACKAGES) and images/torch-requirements.txt
    (TORCH_PACKAGES), resolved to wheels with their hashes (``python -m testbed.images
    --lock``)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    _lock(
        REQUIREMENTS,
        deps,
        "The controller image's Python dependencies: pyproject.toml's",
        also=ARM64_WHEEL_TAGS,
    )
    _lock(FRAMEWORK_REQUIREMENTS, FRAMEWORK_PACKAGES, "The JAX trainer image's: JAX and Orbax")
    _lock(
        TORCH_REQUIREMENTS,
        TORCH_PACKAGES,
        "The PyTorch trainers': PyTorch, NumPy, transformers, accelerate",
    )


# The controller image is also built for linux/arm64 (images/Dockerfile in the release
# workflow): its lock carries those wheels' hashes too (CPython 3.11, Debian bookworm's glibc).
ARM64_WHEEL_TAGS = ("manylinux_2_36_aarch64", "manylinux2014_aarch64")


def _resolve(packages: Sequence[str], wheel_tags: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """What pip installs for ``packages`` (wheels only): name -> (version, sha256); for another
    platform's ``wheel_tags`` if given (CPython 3.11)."""
    other = [f"--platform={t}" for t in wheel_tags]
    if other:
        other += ["--python-version=3.11", "--implementation=cp", "--abi=cp311", "--no-deps"]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        target = ["--target", str(Path(tmp) / "t")] if other else []
        _pip_install(
            "--dry-run", "--ignore-installed", "--report", str(report), *other, *target, *packages
        )
        installs = json.loads(report.read_text())["install"]
    return {
        _canonical(i["metadata"]["name"]): (
            i["metadata"]["version"],
            i["download_info"]["archive_info"]["hashes"]["sha256"],
        )
        for i in installs
    }


def _canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(path: Path, packages: Sequence[str], what: str, also: Sequence[str] = ()) -> None:
    """Resolve ``packages`` here and write them pinned with their wheels' hashes; with
    ``also`` (another platform's wheel tags), the same versions' wheels there too."""
    native = _resolve(packages)
    hashes = {name: [sha] for name, (_, sha) in native.items()}
    if also:
        pins = [f"{name}=={version}" for name, (version, _) in native.items()]
        for name, (_, sha) in _resolve(pins, also).items():
            if sha not in hashes[name]:
                hashes[name].append(sha)
    lines = [
        f"# {what}, resolved to wheels for",
        "# CPython 3.11 (the image's python3)"
        + (" on linux/amd64 and linux/arm64" if also else "")
        + ". Regenerate: python -m testbed.images --lock",
    ]
    for name in sorted(native):
        pin = f"{name}=={native[name][0]}"
        lines.append(" \\\n".join([pin, *(f"    --hash=sha256:{h}" for h in hashes[name])]))
    path.write_text("\n".join(lines) + "\n")
    log(f"wrote {path} ({len(native)} packages)")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testbed.images", description=__doc__.split("\n")[0])
    p.add_argument("--force", action="store_true", help="rebuild even if cached (same digests)")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="SOCK",
        help="also import the images into the containerd at SOCK",
    )
    p.add_argument("--lock", action="store_true", help="re-resolve the pinned dependencies")
    p.add_argument(
        "--examples",
        action="store_true",
        help=f"also the examples' images {PYTORCH_EXAMPLES_IMAGE} (several GB: PyTorch's CUDA"
        f" build) and {JAX_EXAMPLES_IMAGE}",
    )
    args = p.parse_args(argv)
    if args.lock:
        lock()
        return
    t0 = time.monotonic()
    images = build(force=args.force, imports=args.imports)
    if args.examples:
        images.append(build_pytorch_examples_image(imports=args.imports))
        images.append(build_jax_examples_image(imports=args.imports))
    print(f"{'image':<40} {'size':>10}  digest")
    for i in images:
        print(f"{i.name:<40} {i.size_mib():>6.1f} MiB  {i.digest()}")
        print(f"  {i.archive}")
    log(f"done in {time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    main()
