"""The kubectl plugin as a Python distribution of its own, ``kubectl-jobset-inplace``: the
plugin and the modules of this package it imports (found from its imports, so a new import
comes along by itself), on Python 3.9 and later, with only the dependencies those modules use
(the Kubernetes client, PyYAML, jsonpatch). The controller's distribution, ``jobset-inplace``,
carries the plugin too but brings kopf, uvloop, cryptography, ... and needs Python 3.11.

Both hold the package ``jobset_inplace``: install one of them in an environment, not both.

``python -m release.plugin_dist --out dist``: the wheel in ``dist``;
``tests/integration/test_package.py`` installs it on the oldest Python the machine has.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

from jobset_inplace import __version__

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "jobset_inplace"
ROOT_MODULE = f"{PACKAGE}.kubectl_plugin"
NAME = "kubectl-jobset-inplace"
REQUIRES_PYTHON = ">=3.9"
# third-party imports of the plugin's modules -> their distributions in pyproject.toml (urllib3:
# the Kubernetes client's, which brings it)
IMPORTED_DISTRIBUTIONS = {
    "kubernetes": "kubernetes",
    "urllib3": "kubernetes",
    "yaml": "pyyaml",
    "jsonpatch": "jsonpatch",
}


def _file(module: str) -> Path | None:
    path = REPO_ROOT.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imports(module: str, path: Path) -> Iterable[str]:
    """The modules ``module`` (at ``path``) imports, absolute; a ``from X import name`` gives
    both X and X.name (a submodule, where it is one)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def closure(root: str = ROOT_MODULE) -> tuple[list[Path], set[str]]:
    """The files of ``root``'s package (all of it: its commands are found by name) and of every
    module of this package they import, with each one's parent packages; and the top-level
    names of the other modules they import (third-party and standard library)."""
    files: set[Path] = set()
    external: set[str] = set()
    todo = [root]
    root_dir = _file(root)
    assert root_dir is not None, root
    assert root_dir.name == "__init__.py", f"{root}: a package"
    todo += [
        ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in root_dir.parent.rglob("*.py")
    ]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module.split(".")[0] != PACKAGE:
            external.add(module.split(".")[0])
            continue
        path = _file(module)
        if path is None:
            continue  # a name imported from a module, not a module
        files.add(path)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
        todo += list(_imports(module, path))
    return sorted(files), external


def pyproject_text(external: set[str]) -> str:
    """The distribution's pyproject.toml: this checkout's version, license and plugin scripts,
    and the requirements of the third-party modules the plugin imports, as pyproject.toml
    gives them."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    by_name = {
        re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower(): d for d in project["dependencies"]
    }
    third_party = external - set(sys.stdlib_module_names)
    unnamed = third_party - IMPORTED_DISTRIBUTIONS.keys()
    if unnamed:
        raise SystemExit(
            f"the plugin imports {sorted(unnamed)}: name its distribution in "
            "release/plugin_dist.py, IMPORTED_DISTRIBUTIONS"
        )
    requires = sorted({by_name[IMPORTED_DISTRIBUTIONS[m]] for m in third_party})
    scripts = {
        name: target
        for name, target in project["scripts"].items()
        if target.startswith(f"{ROOT_MODULE}:") or target.startswith(f"{ROOT_MODULE}.")
    }
    lines = [
        "[build-system]",
        'requires = ["setuptools>=68", "wheel"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        f'name = "{NAME}"',
        f'version = "{__version__}"',
        "description = \"kubectl jobset-inplace: show and drive jobset-inplace's recovery of "
        'JobSet training gangs (the plugin alone)"',
        f'requires-python = "{REQUIRES_PYTHON}"',
        f'license = "{project["license"]}"',
        "dependencies = [" + ", ".join(f'"{r}"' for r in requires) + "]",
        "",
        "[project.scripts]",
        *(f'"{name}" = "{target}"' for name, target in sorted(scripts.items())),
        "",
        "[tool.setuptools.packages.find]",
        f'include = ["{PACKAGE}*"]',
        "",
    ]
    return "\n".join(lines)


def build(out: Path) -> Path:
    """The wheel of ``kubectl-jobset-inplace`` in ``out``."""
    files, external = closure()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        for path in files:
            target = stage / path.relative_to(REPO_ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (stage / "pyproject.toml").write_text(pyproject_text(external))
        shutil.copy2(REPO_ROOT / "LICENSE", stage / "LICENSE")
        return pip_wheel(stage, out)


def pip_wheel(source: Path, out: Path) -> Path:
    """The wheel of the project at ``source`` (pip, its build requirements from the machine's
    package index, no dependencies) in ``out`` (one of the same name there is replaced)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp, str(source)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        [built] = Path(tmp).glob("*.whl")
        return built.replace(out / built.name)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m release.plugin_dist", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=REPO_ROOT / "dist", help="where the wheel goes")
    args = p.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
