"""Integration fixtures: one real etcd + kube-apiserver per test session, with the JobSet CRDs
installed, and a fresh namespace per test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.trainer import RESUME_FILE
from testbed.controlplane import ControlPlane, start_control_plane
from testbed.gangsim import CRD, CRD_NAME, LeaseKeeper
from testbed.kube import Clients, clients, temporary_namespace, wait_for
from testbed.processes import free_port

from .agentproc import AgentProc, StartAgent, checkpoints


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


@pytest.fixture(scope="session")
def gangstate_crd(control_plane: ControlPlane, kube: Clients) -> None:
    kubectl = control_plane.kubectl()
    kubectl.apply_files([CRD], server_side=True)
    kubectl.wait_crds_established([CRD_NAME])

    def served() -> bool:
        try:
            kube.custom.list_cluster_custom_object(
                names.GROUP, names.VERSION, names.GANGSTATE_PLURAL
            )
        except ApiException:
            return False
        return True

    wait_for("GangState resource served", served, 30, 0.2)


@pytest.fixture
def start_agent(
    control_plane: ControlPlane, namespace: str, gangstate_crd: None, tmp_path: Path
) -> Iterator[StartAgent]:
    """Start agent processes (each with its own dirs and port); stop the survivors after."""
    started: list[AgentProc] = []
    token_file = tmp_path / "token"
    token_file.write_text(control_plane.token + "\n")

    def start(
        pod: str,
        gang: str,
        *,
        token: str | None = None,
        tiers: Callable[[Path, Path], None] | None = None,
        **env: str,
    ) -> AgentProc:
        """``tiers(local, persistent)`` writes the checkpoint tiers (default: the trainer
        contract's steps 100, 200 and a partial 300 locally, 100 persistent)."""
        base = tmp_path / f"{pod}-{len(started)}"
        local, persistent, state = base / "local", base / "persistent", base / "state"
        if tiers is None:
            checkpoints(local, [100, 200], partial=(300,))
            checkpoints(persistent, [100])
        else:
            tiers(local, persistent)
        state.mkdir(parents=True)
        (state / RESUME_FILE).write_text('{"epoch": 0, "resumeStep": 7, "gang": "old/one"}\n')
        tok = token_file
        if token is not None:
            tok = base / "token"
            tok.write_text(token)
        port = free_port()
        log = base / "agent.log"
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "POD_NAME": pod,
            "POD_NAMESPACE": namespace,
            "JSI_GANGSTATE": gang,
            # pod scope unless a test says otherwise (the default, process, needs launchers)
            "JSI_RESTART_SCOPE": "pod",
            "JSI_STATE_DIR": str(state),
            "JSI_CHECKPOINT_LOCAL_DIR": str(local),
            "JSI_CHECKPOINT_PERSISTENT_DIR": str(persistent),
            "JSI_PROBE_PORT": str(port),
            "JSI_API_SERVER": control_plane.server,
            "JSI_TOKEN_FILE": str(tok),
            "JSI_CA_FILE": str(control_plane.workdir / "pki" / "apiserver.crt"),
            **env,
        }
        with log.open("wb") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobset_inplace.agent"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=base,
            )
        agent = AgentProc(proc, log, port, state, local, persistent, tok, t0)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.alive():
            agent.proc.kill()
            agent.proc.wait(10)


@pytest.fixture
def leases(kube: Clients) -> Iterator[LeaseKeeper]:
    """Node Leases renewed for the simulated kubelets of the test's nodes (a test declares
    some dead: ``leases.dead``)."""
    keeper = LeaseKeeper(kube)
    keeper.start()
    yield keeper
    keeper.stop()
