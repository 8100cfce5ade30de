"""``jobset-inplace run`` as a process against a real apiserver: a replica whose webhook
certificate cannot be made (its Secret is missing) still runs for leader and leads (recoveries
do not need the webhook), is unready and says why; SIGTERM stops the leader (its Lease
released) and a standby, each within seconds and with status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jobset_inplace.runtime.leader_election import DEFAULT_LEASE
from testbed.kube import Clients
from testbed.processes import free_port, wait_until

pytestmark = pytest.mark.integration


def _replica(
    kubeconfig: Path, namespace: str, identity: str, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], Path, int]:
    log, port = tmp_path / f"{identity}.log", free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "JSI_WEBHOOK_CERT_DIR": str(tmp_path / f"{identity}-certs"),
        "JSI_WEBHOOK_PORT": str(free_port()),
    }
    command = [sys.executable, "-m", "jobset_inplace.controller.main", "run"]
    command += ["--leader-elect", "--namespace", namespace, "--leader-elect-identity", identity]
    command += ["--manage-webhook-certificate", f"--health-port={port}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, log, port


def _holder(kube: Clients, namespace: str) -> str:
    try:
        lease = kube.coordination.read_namespaced_lease(DEFAULT_LEASE, namespace)
    except Exception:
        return ""
    return str(lease.spec.holder_identity or "")


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def test_a_replica_without_certificate_leads_and_replicas_stop_at_sigterm(
    kubeconfig: Path, kube: Clients, namespace: str, tmp_path: Path
) -> None:
    # no Secret jobset-inplace-webhook-tls in `namespace`: no certificate can be made
    leader, leader_log, port = _replica(kubeconfig, namespace, "replica-a", tmp_path)
    standby = None
    try:
        wait_until("replica-a leads", lambda: _holder(kube, namespace) == "replica-a", 60)
        wait_until(
            "the certificate error logged",
            lambda: "webhook certificate:" in leader_log.read_text(),
            30,
        )
        status, body = _readyz(port)
        assert (status, "webhook-certificate" in body) == (503, True), body

        standby, standby_log, _ = _replica(kubeconfig, namespace, "replica-b", tmp_path)
        wait_until(
            "replica-b waits as a candidate",
            lambda: "held by replica-a" in standby_log.read_text(),
            60,
        )
        standby.send_signal(signal.SIGTERM)
        assert standby.wait(10) == 0, standby_log.read_text()

        leader.send_signal(signal.SIGTERM)
        assert leader.wait(20) == 0, leader_log.read_text()
        assert _holder(kube, namespace) == "", "the leader released its Lease"
    finally:
        for p in (leader, standby):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
