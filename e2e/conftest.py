"""e2e fixtures. The suite runs against ``JSI_KUBECONFIG`` when set (any cluster with JobSet
and Kueue installed), otherwise against the local cluster, which it brings up if needed
(idempotent) and takes down afterwards only if it created it (``JSI_KEEP_CLUSTER=1`` keeps it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cluster import DEFAULT_NODES, DEFAULT_REAL_NODES, LocalCluster
from testbed.controller import ControllerProcess
from testbed.kube import Clients, clients, temporary_namespace


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster | None]:
    if os.environ.get("JSI_KUBECONFIG"):
        yield None
        return
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    created = not cluster.is_up()
    cluster.up(
        int(os.environ.get("JSI_NODES", DEFAULT_NODES)),
        int(os.environ.get("JSI_REAL_NODES", DEFAULT_REAL_NODES)),
    )
    try:
        yield cluster
    finally:
        if created and not os.environ.get("JSI_KEEP_CLUSTER"):
            cluster.down()


@pytest.fixture(scope="session")
def cluster_kubeconfig(local_cluster: LocalCluster | None) -> Path:
    return local_cluster.kubeconfig if local_cluster else Path(os.environ["JSI_KUBECONFIG"])


@pytest.fixture(scope="session")
def kube(cluster_kubeconfig: Path) -> Clients:
    return clients(cluster_kubeconfig)


@pytest.fixture
def namespace(kube: Clients, request: pytest.FixtureRequest) -> Iterator[str]:
    with temporary_namespace(kube, request.node.name) as ns:
        yield ns


@pytest.fixture(scope="session")
def controller(local_cluster: LocalCluster | None) -> Iterator[ControllerProcess]:
    """``jobset-inplace run`` against the local cluster for the session."""
    if local_cluster is None:
        pytest.skip("runs the controller on the local cluster (JSI_KUBECONFIG points elsewhere)")
    ctl = ControllerProcess(local_cluster, local_cluster.logs_dir / "controller-e2e.log")
    yield ctl
    ctl.stop()
