"""The integration control plane: a real etcd and a real kube-apiserver on free loopback
ports, with RBAC on, token authentication and the JobSet CRDs installed.

No kubelet, scheduler or controllers run here; tests that need pod behaviour patch pod status
themselves. The full cluster lives in :mod:`testbed.cluster`."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from . import certs, kubeconfig, processes
from .addons import jobset_crds
from .kubectl import Kubectl
from .versions import Binaries, ensure_binaries, versions

SERVICE_CIDR = "10.96.0.0/16"


def feature_gates_args() -> list[str]:
    """``--feature-gates`` for the pinned Kubernetes: the in-place path's gates on 1.35, none
    from 1.36 (the components run with their defaults)."""
    gates = versions().feature_gates
    return ["--feature-gates", gates] if gates else []


@dataclass
class ControlPlane:
    """Handle on a running etcd + kube-apiserver pair."""

    workdir: Path
    kubeconfig: Path
    server: str
    token: str
    procs: list[Popen[bytes]] = field(default_factory=list)
    started_in: float = 0.0
    apiserver: list[str | Path] = field(default_factory=list)  # its command line

    def kubectl(self) -> Kubectl:
        return Kubectl(self.kubeconfig)

    @property
    def apiserver_log(self) -> Path:
        return self.workdir / "kube-apiserver.log"

    def stop_apiserver(self) -> None:
        """An apiserver outage: kube-apiserver stops (etcd keeps the state)."""
        processes.stop(self.procs.pop())  # started last

    def start_apiserver(self) -> None:
        """The end of the outage: the same kube-apiserver (same port, certificate, etcd)."""
        self.procs.append(processes.start(self.apiserver, self.apiserver_log))
        self._wait_ready()

    def _wait_ready(self) -> None:
        processes.wait_until(
            "kube-apiserver",
            lambda: processes.https_ok(f"{self.server}/readyz", token=self.token),
            60,
            log=self.apiserver_log,
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            processes.stop(p)
        self.procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_control_plane(
    bins: Binaries | None = None,
    *,
    install_crds: bool = True,
    apiserver_args: Sequence[str] = (),
) -> ControlPlane:
    """Start etcd + kube-apiserver (with ``apiserver_args`` added) and wait until the API is
    ready (a few seconds warm)."""
    bins = bins or ensure_binaries("etcd", "kube_apiserver", "kubectl")
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="jsi-controlplane-"))
    token = secrets.token_hex(16)
    cp = ControlPlane(workdir, workdir / "kubeconfig", "", token)
    try:
        etcd_port, etcd_peer, api_port = (processes.free_port() for _ in range(3))
        etcd_log = workdir / "etcd.log"
        cp.procs.append(
            processes.start(
                [
                    bins.etcd,
                    "--data-dir",
                    workdir / "etcd",
                    "--listen-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{etcd_peer}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{etcd_peer}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{etcd_peer}",
                    "--unsafe-no-fsync",
                    "--log-level",
                    "warn",
                ],
                etcd_log,
            )
        )
        processes.wait_until(
            "etcd",
            lambda: processes.http_ok(f"http://127.0.0.1:{etcd_port}/health"),
            30,
            log=etcd_log,
        )

        sa_key, sa_pub = certs.ensure_service_account_keypair(workdir / "pki")
        tokens = workdir / "tokens.csv"
        tokens.write_text(f'{token},admin,admin,"system:masters"\n')
        cp.apiserver = [
            bins.kube_apiserver,
            "--etcd-servers",
            f"http://127.0.0.1:{etcd_port}",
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            # No endpoints for the `kubernetes` Service: nothing here routes to it, and from
            # 1.37 the default (lease) reconciler refuses a loopback advertise address.
            "--endpoint-reconciler-type",
            "none",
            "--secure-port",
            str(api_port),
            "--cert-dir",
            workdir / "pki",
            "--token-auth-file",
            tokens,
            "--authorization-mode",
            "RBAC",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            sa_pub,
            "--service-account-signing-key-file",
            sa_key,
            "--service-cluster-ip-range",
            SERVICE_CIDR,
            *feature_gates_args(),
            "--enable-priority-and-fairness=false",
            *apiserver_args,
        ]
        cp.procs.append(processes.start(cp.apiserver, cp.apiserver_log))
        cp.server = f"https://127.0.0.1:{api_port}"
        cp._wait_ready()
        # kube-apiserver made itself a CA and a serving cert for 127.0.0.1/localhost there.
        kubeconfig.write_token_kubeconfig(
            cp.kubeconfig, cp.server, token, workdir / "pki" / "apiserver.crt"
        )
        if install_crds:
            cp.kubectl().apply_files(jobset_crds(), server_side=True)
            cp.kubectl().wait_crds_established(["jobsets.jobset.x-k8s.io"])
        cp.started_in = time.monotonic() - t0
        return cp
    except BaseException:
        cp.stop()
        raise
