"""Every artifact of a release from one command: ``make release VERSION=X.Y.Z``
(``python -m release.artifacts --version X.Y.Z``), into ``dist/X.Y.Z/``:

- ``images/controller.oci.tar``, ``images/agent.oci.tar``: the product images (linux/amd64, the
  offline build of ``make images``) as OCI archives; what is pushed, digests kept:
  ``skopeo copy --preserve-digests oci-archive:images/agent.oci.tar docker://REGISTRY/agent:X.Y.Z``;
- ``install.yaml``: the kustomize base (``manifests/``) in one file, both images by digest;
- ``prometheus.yaml``: monitoring with the Prometheus Operator (the component
  ``manifests/components/prometheus``: a PodMonitor, the alerts as a PrometheusRule whose
  runbook links point at ``--runbook-base-url``, the Grafana dashboard as a ConfigMap);
- ``jobset-inplace-X.Y.Z.tgz``: the Helm chart of the same version, its values pinned alike;
- the wheel and the sdist (``python -m build``), and the plugin's own wheel
  (``kubectl-jobset-inplace``: Python 3.9+, without the controller's dependencies;
  ``release/plugin_dist.py``);
- the kubectl plugin's krew archive and manifest (``release/plugin.py``);
- ``SHA256SUMS``.

The release workflow (``.github/workflows/release.yaml``) builds multi-platform images with
Docker's buildx instead, pushes them, and passes their digests here (``--digest
controller=sha256:... --digest agent=sha256:...``): the same manifests, pinned to those.

A version is released from a tree that says it everywhere: :func:`version_mismatches` names
every file that says otherwise (tests/unit/test_release.py keeps them in step at every commit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from jobset_inplace import __version__, names
from release import plugin, plugin_dist
from testbed import images  # the offline image build (as root, Debian's tools)
from testbed.helm import Helm  # the pinned binaries
from testbed.kubectl import kustomize
from testbed.versions import ensure_binaries

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "charts" / "jobset-inplace"
DEPLOYMENT = REPO_ROOT / "manifests" / "controller" / "deployment.yaml"
PROMETHEUS = REPO_ROOT / "manifests" / "components" / "prometheus"
KEYS = ("controller", "agent")  # the product images, named REGISTRY/KEY
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# a repository prefix: host[:port]/path or path, lowercase, no tag or digest
REGISTRY = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$")


def log(msg: str) -> None:
    print(f"[release] {msg}", file=sys.stderr, flush=True)


# --- the version, said once per file ----------------------------------------------------------
def version_mismatches(version: str) -> list[str]:
    """Every place of the tree that does not say ``version`` (empty: it can be released). The
    package's version is ``jobset_inplace.__version__`` (pyproject.toml reads it there)."""
    found: list[tuple[str, str | None]] = [("jobset_inplace/__init__.py", __version__)]
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    if "version" in project:
        found.append(("pyproject.toml [project] version", project["version"]))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    found += [
        ("charts/jobset-inplace/Chart.yaml version", str(chart.get("version"))),
        ("charts/jobset-inplace/Chart.yaml appVersion", str(chart.get("appVersion"))),
    ]
    (deploy,) = [d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    where = "manifests/controller/deployment.yaml"
    found += [
        (f"{where} image tag", container["image"].rpartition(":")[2]),
        (
            f"{where} {names.ENV_AGENT_IMAGE} tag",
            env.get(names.ENV_AGENT_IMAGE, "").rpartition(":")[2],
        ),
    ]
    return [f"{place} says {said!r}" for place, said in found if said != version]


# --- images -----------------------------------------------------------------------------------
def oci_digest(archive: Path) -> str:
    """The manifest digest of an OCI archive's one image (what a registry will serve it by
    when pushed with its digests kept)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive}: no index.json (not an OCI archive)")
        index = json.load(member)
    (manifest,) = index["manifests"]
    return str(manifest["digest"])


def oci_archives(out: Path, registry: str, version: str) -> dict[str, str]:
    """The product images built offline (``testbed.images``), as OCI archives in
    ``out/images``; their digests by key."""
    built = {i.key: i for i in images.build()}
    (out / "images").mkdir(parents=True, exist_ok=True)
    digests = {}
    for key in KEYS:
        dest = out / "images" / f"{key}.oci.tar"
        dest.unlink(missing_ok=True)
        ref = f"{registry}/{key}:{version}"
        log(f"{key}: {built[key].archive.name} -> {dest.name} ({ref})")
        subprocess.run(
            ["skopeo", "copy", "--quiet", f"docker-archive:{built[key].archive}",
             f"oci-archive:{dest}:{ref}"],
            check=True,
        )  # fmt: skip
        digests[key] = oci_digest(dest)
    return digests


def pinned(registry: str, version: str, digests: Mapping[str, str]) -> dict[str, str]:
    """``REGISTRY/KEY:VERSION@sha256:...`` by key: pulled by the digest (the tag is only read,
    by people and ``kubectl jobset-inplace version``)."""
    return {key: f"{registry}/{key}:{version}@{digests[key]}" for key in KEYS}


# --- install.yaml -----------------------------------------------------------------------------
def pin_install(objects: Sequence[dict[str, Any]], refs: Mapping[str, str]) -> list[dict[str, Any]]:
    """The base's objects with the controller's image and the agent image it injects set to
    ``refs`` (by digest); a ValueError if the base no longer has them where expected."""
    out = [json.loads(json.dumps(o)) for o in objects]
    name = names.CONTROLLER_NAME
    deployments = [o for o in out if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    if len(deployments) != 1:
        raise ValueError(f"expected one Deployment {name}, found {len(deployments)}")
    (container,) = deployments[0]["spec"]["template"]["spec"]["containers"]
    container["image"] = refs["controller"]
    agent = [e for e in container.get("env", []) if e["name"] == names.ENV_AGENT_IMAGE]
    if len(agent) != 1:
        raise ValueError(f"the controller's container has no {names.ENV_AGENT_IMAGE} to pin")
    agent[0]["value"] = refs["agent"]
    return out


def install_yaml(refs: Mapping[str, str], version: str) -> str:
    ensure_binaries("kubectl")  # (kustomize: built from its Go module on first use)
    objects = [o for o in yaml.safe_load_all(kustomize(REPO_ROOT / "manifests")) if o]
    header = (
        f"# jobset-inplace {version}: kubectl apply --server-side -f install.yaml\n"
        f"# (the kustomize base manifests/, images by digest: {refs['controller']},\n"
        f"# agent {refs['agent']})\n"
    )
    return header + yaml.safe_dump_all(pin_install(objects, refs), sort_keys=False)


def prometheus_yaml(runbook_base_url: str, version: str) -> str:
    """The monitoring component alone, each alert's runbook_url at ``runbook_base_url``."""
    ensure_binaries("kubectl")
    with tempfile.TemporaryDirectory() as work:
        path = os.path.relpath(PROMETHEUS, work)  # (kustomize takes relative paths only)
        (Path(work) / "kustomization.yaml").write_text(yaml.safe_dump({"components": [path]}))
        objects = [o for o in yaml.safe_load_all(kustomize(Path(work))) if o]
    header = (
        f"# jobset-inplace {version}: monitoring with the Prometheus Operator (installed\n"
        "# separately): kubectl apply --server-side -f prometheus.yaml (docs/metrics.md)\n"
    )
    return header + yaml.safe_dump_all(with_runbooks(objects, runbook_base_url), sort_keys=False)


def with_runbooks(objects: Sequence[dict[str, Any]], base_url: str) -> list[dict[str, Any]]:
    """``objects`` with each alert's ``runbook_url`` at ``base_url#<alert in lower case>``,
    as the chart's ``metrics.prometheusRule.runbookBaseURL`` makes it."""
    out: list[dict[str, Any]] = json.loads(json.dumps(list(objects)))
    for obj in out:
        if obj["kind"] != "PrometheusRule":
            continue
        for group in obj["spec"]["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    url = f"{base_url.rstrip('/')}#{rule['alert'].lower()}"
                    rule.setdefault("annotations", {})["runbook_url"] = url
    return out


# --- the chart --------------------------------------------------------------------------------
def pin_values(text: str, registry: str, digests: Mapping[str, str]) -> str:
    """The chart's values.yaml with each image's repository under ``registry`` and its digest
    set (comments kept); a ValueError naming what is not where expected."""
    for key, section in (("controller", "image"), ("agent", "agentImage")):
        block = re.compile(
            rf"^({section}:\n  repository: )\S+(\n(?:  .*\n)*?  digest: )\"\"", re.MULTILINE
        )
        text, n = block.subn(rf'\g<1>{registry}/{key}\g<2>"{digests[key]}"', text, count=1)
        if n != 1:
            raise ValueError(f"values.yaml: no {section}.repository and {section}.digest to set")
    return text


def package_chart(out: Path, version: str, registry: str, digests: Mapping[str, str]) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / CHART.name
        shutil.copytree(CHART, chart)  # (files/ links to manifests/: copied as files)
        values = chart / "values.yaml"
        values.write_text(pin_values(values.read_text(), registry, digests))
        Helm().run("package", str(chart), "--version", version, "--app-version", version,
                   "--destination", str(out))  # fmt: skip
    return out / f"{CHART.name}-{version}.tgz"


# --- the rest ---------------------------------------------------------------------------------
def python_dists(out: Path) -> None:
    log("wheel and sdist (python -m build) ...")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(REPO_ROOT)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    log("the plugin's own wheel (release/plugin_dist.py) ...")
    plugin_dist.build(out)


def checksums(out: Path) -> Path:
    lines = [
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out)}"
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "SHA256SUMS"
    ]
    path = out / "SHA256SUMS"
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_digests(given: Sequence[str]) -> dict[str, str]:
    """``--digest KEY=sha256:...`` values, checked; {} for none."""
    digests: dict[str, str] = {}
    for item in given:
        key, _, digest = item.partition("=")
        if key not in KEYS or not DIGEST.match(digest):
            raise ValueError(
                f"--digest {item!r}: expected KEY=sha256:<64 hex digits>, KEY one of "
                f"{', '.join(KEYS)}"
            )
        digests[key] = digest
    if digests and set(digests) != set(KEYS):
        raise ValueError(f"--digest: give one for each of {', '.join(KEYS)}, got {sorted(digests)}")
    return digests


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m release.artifacts", description=__doc__.split("\n")[0]
    )
    p.add_argument("--version", required=True, help="X.Y.Z, as the tree says it")
    p.add_argument(
        "--registry",
        required=True,
        help="where the images are pushed: REGISTRY/controller, REGISTRY/agent",
    )
    p.add_argument(
        "--plugin-base-url",
        required=True,
        help="https:// URL where the plugin archive is published (the krew uri)",
    )
    p.add_argument(
        "--runbook-base-url",
        required=True,
        help="https:// URL of the published docs/runbooks.md (each alert links <URL>#<alert>)",
    )
    p.add_argument(
        "--digest",
        action="append",
        default=[],
        metavar="KEY=sha256:...",
        help="images built and pushed elsewhere (the release workflow): their "
        "digests, for each of controller and agent; none: built here",
    )
    p.add_argument("--out", type=Path, default=REPO_ROOT / "dist", help="dist/VERSION under it")
    args = p.parse_args(argv)  # fmt: skip
    if not SEMVER.match(args.version):
        p.error(f"--version: X.Y.Z (semantic version, no prefix), got {args.version!r}")
    for flag in ("plugin_base_url", "runbook_base_url"):
        if not getattr(args, flag).startswith("https://"):
            name = "--" + flag.replace("_", "-")
            p.error(f"{name}: an https:// URL, got {getattr(args, flag)!r}")
    if not REGISTRY.match(args.registry):
        p.error(f"--registry: a repository prefix such as ghcr.io/org, got {args.registry!r}")
    try:
        digests = parse_digests(args.digest)
    except ValueError as e:
        p.error(str(e))
    wrong = version_mismatches(args.version)
    if wrong:
        p.error(
            f"the tree is not at version {args.version}: " + "; ".join(wrong)
            + " (set the version in each, and move CHANGELOG.md's Unreleased under it)"
        )  # fmt: skip
    out = args.out / args.version
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if not digests:
        log("images: the offline build (make images), as OCI archives ...")
        digests = oci_archives(out, args.registry, args.version)
    refs = pinned(args.registry, args.version, digests)
    (out / "install.yaml").write_text(install_yaml(refs, args.version))
    log(f"install.yaml: {refs['controller']}, {refs['agent']}")
    (out / "prometheus.yaml").write_text(prometheus_yaml(args.runbook_base_url, args.version))
    log(f"chart: {package_chart(out, args.version, args.registry, digests).name}")
    python_dists(out)
    plugin.build(out, args.plugin_base_url)
    checksums(out)
    for path in sorted(out.rglob("*")):
        if path.is_file():
            print(f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}"
                  f"  {path.stat().st_size / 2**20:.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
