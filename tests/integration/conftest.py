"""Integration fixtures: one real etcd + kube-apiserver per test session, with the JobSet CRDs
installed, and a fresh namespace per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.controlplane import ControlPlane, start_control_plane
from testbed.kube import Clients, clients, temporary_namespace


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    cp = start_control_plane()
    print(f"\nintegration control plane at {cp.server} ready in {cp.started_in:.1f}s")
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def kube(kubeconfig: Path) -> Clients:
    return clients(kubeconfig)


@pytest.fixture
def namespace(kube: Clients, request: pytest.FixtureRequest) -> Iterator[str]:
    with temporary_namespace(kube, request.node.name, default_sa=True) as ns:
        yield ns
