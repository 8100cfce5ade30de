"""``make release`` and an install from its artifacts alone (docs/releasing.md).

The release command (``python -m release.artifacts``, what ``make release`` runs) writes every
artifact of this version; each is checked against the others (checksums, digests, the chart's
pins, the krew manifest). Then the session's install makes way for one from the release alone:
the images go onto the real nodes from the release's OCI archives (the lab has no registry:
importing an archive into a node's containerd stands for the pull), ``install.yaml`` is applied
as it is but for one lab setting (the controller on the real kubelet nodes: the simulated kwok
nodes run no container), and that controller (its image and the agent it injects both the
release's, by digest) recovers a gang. The session's install is put back afterwards."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobset_inplace import __version__, names
from jobset_inplace.core.transform import AGENT_CONTAINER
from release import artifacts
from testbed import images
from testbed.cluster import LocalCluster
from testbed.controller import barrier_open, member_pods
from testbed.demo import inject_failure, trainers_running, training_gang
from testbed.helm import Helm
from testbed.install import Installation, webhook_injects
from testbed.kube import Clients, wait_for
from testbed.versions import binaries

pytestmark = pytest.mark.e2e

REGISTRY = "registry.example/jobset-inplace"
RUNBOOKS = "https://docs.example/jobset-inplace/runbooks.md"
MEMBERS = 2


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``dist/<version>`` of this checkout, as ``make release`` writes it."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "release.artifacts", "--version", __version__,
         "--registry", REGISTRY, "--plugin-base-url", "https://example.invalid/download",
         "--runbook-base-url", RUNBOOKS,
         "--out", str(out)],
        check=True,
        timeout=1200,
    )  # fmt: skip
    return out / __version__


def _digests(release: Path) -> dict[str, str]:
    return {k: artifacts.oci_digest(release / "images" / f"{k}.oci.tar") for k in artifacts.KEYS}


def _install_objects(release: Path) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all((release / "install.yaml").read_text()) if o]


def _controller_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_release_artifacts_agree(release: Path) -> None:
    files = {str(p.relative_to(release)) for p in release.rglob("*") if p.is_file()}
    version = __version__
    assert {
        "install.yaml",
        f"jobset-inplace-{version}.tgz",
        f"jobset_inplace-{version}-py3-none-any.whl",
        f"jobset_inplace-{version}.tar.gz",
        "jobset-inplace.krew.yaml",
        "images/controller.oci.tar",
        "images/agent.oci.tar",
        "SHA256SUMS",
        "prometheus.yaml",
    } <= files, files
    sums = {}  # file -> sha256, as `sha256sum -c` reads them
    for line in (release / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    assert set(sums) == files - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((release / name).read_bytes()).hexdigest() == digest, name

    monitoring = [o for o in yaml.safe_load_all((release / "prometheus.yaml").read_text()) if o]
    assert {o["kind"] for o in monitoring} == {"PodMonitor", "PrometheusRule", "ConfigMap"}
    (rule,) = [o for o in monitoring if o["kind"] == "PrometheusRule"]
    links = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert links, "alerts"
    assert all(url.startswith(f"{RUNBOOKS}#jobsetinplace") for url in links), links

    refs = artifacts.pinned(REGISTRY, __version__, _digests(release))
    container = _controller_container(_install_objects(release))
    assert container["image"] == refs["controller"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JSI_AGENT_IMAGE"] == refs["agent"]

    chart = Helm().template(chart=release / f"jobset-inplace-{version}.tgz")
    chart_container = _controller_container(chart)
    assert chart_container["image"] == refs["controller"]
    assert {e["name"]: e.get("value") for e in chart_container["env"]}["JSI_AGENT_IMAGE"] == (
        refs["agent"]
    )

    krew = yaml.safe_load((release / "jobset-inplace.krew.yaml").read_text())
    (platform,) = krew["spec"]["platforms"]
    archive = platform["uri"].rsplit("/", 1)[1]
    assert sums[archive] == platform["sha256"]
    assert krew["spec"]["version"] == f"v{version}"

    with tarfile.open(release / f"jobset_inplace-{version}.tar.gz") as sdist:
        assert f"jobset_inplace-{version}/jobset_inplace/__init__.py" in sdist.getnames()


@contextmanager
def _release_instead_of(controller: Installation, install: str) -> Iterator[None]:
    """The release's install takes the session install's place for the block; the session's
    comes back afterwards whatever failed."""
    try:
        controller.uninstall()
        try:
            yield
        finally:
            controller.kubectl.run(
                "delete", "-f", "-", "--ignore-not-found", "--wait=true", stdin=install
            )
    finally:
        controller.install()


def _on_real_nodes(objects: list[dict[str, Any]]) -> str:
    """The lab's one change to install.yaml: the controller on the real kubelet nodes."""
    for o in objects:
        if o["kind"] == "Deployment":
            o["spec"]["template"]["spec"]["nodeSelector"] = {"jobset-inplace.dev/real-node": "true"}
    return yaml.safe_dump_all(objects)


def test_a_fresh_install_from_the_release_alone_recovers_a_gang(
    *,  # (fixtures)
    release: Path,
    controller: Installation,
    local_cluster: LocalCluster | None,
    cluster_kubeconfig: Path,
    kube: Clients,
    namespace: str,
) -> None:
    if local_cluster is None:
        pytest.skip("imports the release's images into the local cluster's real nodes")
    refs = artifacts.pinned(REGISTRY, __version__, _digests(release))
    for node in local_cluster.real_nodes():
        ctr = [str(binaries().ctr), "--address", str(images.node_socket(node)), "-n", "k8s.io"]
        for key in artifacts.KEYS:
            archive = release / "images" / f"{key}.oci.tar"
            subprocess.run(
                [*ctr, "images", "import", "--snapshotter", "overlayfs", str(archive)],
                check=True, capture_output=True, timeout=300,
            )  # fmt: skip
            # named as a pull by digest names it (the import names it by its tag only)
            by_tag, digest = refs[key].rsplit("@", 1)
            by_digest = f"{by_tag.rpartition(':')[0]}@{digest}"
            subprocess.run(
                [*ctr, "images", "tag", "--force", by_tag, by_digest],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
    install = _on_real_nodes(_install_objects(release))
    with _release_instead_of(controller, install):
        controller.kubectl.run("apply", "--server-side", "-f", "-", stdin=install)
        try:
            controller.kubectl.run(
                "rollout", "status", f"deployment/{names.CONTROLLER_NAME}", "-n",
                names.INSTALL_NAMESPACE, "--timeout=180s",
            )  # fmt: skip
        except RuntimeError as e:
            pods = controller.kubectl.run(
                "describe", "pods", "-n", names.INSTALL_NAMESPACE, check=False
            )
            raise AssertionError(f"the release's controller did not start: {e}\n{pods}") from e
        wait_for("the webhook injects the agent", lambda: webhook_injects(controller.kubectl), 60)
        for pod in controller.pods():  # (the nodes hold that digest only as the release's)
            assert pod["spec"]["containers"][0]["image"] == refs["controller"]
            assert pod["status"]["containerStatuses"][0]["ready"], pod["status"]

        training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS)
        before = member_pods(kube, namespace, "gang")
        for pod in before.values():
            agent = [c for c in pod.spec.containers + (pod.spec.init_containers or [])
                     if c.name == AGENT_CONTAINER]  # fmt: skip
            assert [c.image for c in agent] == [refs["agent"]], "the release's agent, by digest"
        inject_failure(cluster_kubeconfig, namespace, before["1"].metadata.name)
        barrier_open(kube, namespace, "gang", 2, 120)
        wait_for(
            "every trainer running again",
            lambda: trainers_running(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, epoch=2),
            120,
        )
        after = member_pods(kube, namespace, "gang")
        assert {i: p.metadata.uid for i, p in after.items()} == {
            i: p.metadata.uid for i, p in before.items()
        }, "restarted in place"
