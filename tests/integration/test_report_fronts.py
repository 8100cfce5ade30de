"""Report fronts with two replicas of ``jobset-inplace run`` against a real apiserver
(docs/design/report-fronts.md): the standby serves a front, learns the leader's link from the
election Lease and says hello; the leader names it in the gang's status; real agents send
their reports through it (none on a pod), and the recovery completes. When the leader dies,
the standby stops its front, leads, serves the channel itself, and the agents send it their
reports again.

Each replica has a pod object of its own (its token for the channel's audience is bound to
it, as the kubelet's projected token is), in the test's namespace and ``default`` service
account: the leader takes batches from that namespace and service account only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.runtime.leader_election import DEFAULT_LEASE
from testbed.gangsim import Gang, LeaseKeeper
from testbed.kube import Clients, wait_for
from testbed.processes import free_port

from .agentproc import StartAgent
from .test_report_channel import FAST, endpoint_leader, pod_reports, report_token, start_member

pytestmark = pytest.mark.integration


@dataclass
class Replica:
    identity: str
    proc: subprocess.Popen[bytes]
    log: Path
    health_port: int

    def logged(self, pattern: str) -> bool:
        return re.search(pattern, self.log.read_text(errors="replace")) is not None

    def metric(self, line: str) -> float:
        """The value of the /metrics sample ``line`` names (0 where absent)."""
        url = f"http://127.0.0.1:{self.health_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for sample in r.read().decode().splitlines():
                if sample.startswith(line + " "):
                    return float(sample.split()[-1])
        return 0.0


StartReplica = Callable[[str], Replica]


@pytest.fixture
def replicas(
    kubeconfig: Path, kube: Clients, namespace: str, gangstate_crd: None, tmp_path: Path
) -> Iterator[StartReplica]:
    """Start replicas with ``start(identity)``; all stopped afterwards."""
    started: list[Replica] = []

    def start(identity: str) -> Replica:
        pod = kube.core.create_namespaced_pod(
            namespace,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=identity),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="controller", image="controller")]
                ),
            ),
        )
        token = tmp_path / f"{identity}.token"
        token.write_text(report_token(kube, namespace, pod))
        log, port = tmp_path / f"{identity}.log", free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            names.ENV_REPORT_ADVERTISE: "127.0.0.1",
            names.ENV_REPORT_LISTEN: "127.0.0.1:0",
            names.ENV_REPORT_LINK_LISTEN: "127.0.0.1:0",
            "POD_NAMESPACE": namespace,
            names.ENV_SERVICE_ACCOUNT: "default",
            names.ENV_REPORT_TOKEN_FILE: str(token),
        }
        command = [sys.executable, "-m", "jobset_inplace.controller.main", "run", "-v"]
        command += ["--leader-elect", "--namespace", namespace]
        command += ["--leader-elect-identity", identity, f"--health-port={port}"]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        started.append(Replica(identity, proc, log, port))
        return started[-1]

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
            try:
                r.proc.wait(20)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


def holder(kube: Clients, namespace: str) -> str:
    try:
        lease = kube.coordination.read_namespaced_lease(DEFAULT_LEASE, namespace)
    except client.ApiException:
        return ""
    return str(lease.spec.holder_identity or "")


def fronts(gang: Gang) -> list[dict[str, str]]:
    return list((gang.state().get(names.STATUS_REPORT_ENDPOINT) or {}).get("fronts") or [])


def test_agents_report_through_the_standbys_front_then_to_it_as_the_new_leader(  # noqa: PLR0917
    kube: Clients,
    namespace: str,
    replicas: StartReplica,
    start_agent: StartAgent,
    leases: LeaseKeeper,
    tmp_path: Path,
) -> None:
    a = replicas("replica-a")
    wait_for("replica-a leads", lambda: holder(kube, namespace) == "replica-a", 60, 0.2)
    b = replicas("replica-b")
    wait_for("replica-b's front", lambda: b.logged(r"report front: sending to https://"), 60, 0.2)

    gang = Gang(kube, namespace, f"train-{uuid.uuid4().hex[:4]}", 4, dict(FAST), leases=leases)
    gang.create()
    agents = [start_member(start_agent, kube, gang, i, tmp_path) for i in range(4)]
    gang.wait_state("epoch 1 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 1)
    wait_for("the front named in the status", lambda: len(fronts(gang)) == 1, 30, 0.2)
    (named,) = fronts(gang)
    leader_url = gang.state()[names.STATUS_REPORT_ENDPOINT]["url"]
    assert named["url"] != leader_url
    assert a.logged(re.escape(f"front {named['url']} says hello"))
    assert a.metric("jobset_inplace_report_fronts") == 1

    through_front = b.metric('jobset_inplace_report_front_requests_total{code="200"}')
    gang.fail_trainer(0)
    gang.wait_state("epoch 2 recovering", lambda s: s.get("epoch") == 2)
    for i in range(4):
        gang.restart_in_place(i)
    gang.wait_state("epoch 2 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 2)
    assert pod_reports(gang) == dict.fromkeys(range(4)), "no report written on a pod"
    passed = b.metric('jobset_inplace_report_front_requests_total{code="200"}') - through_front
    assert passed >= 4, f"{passed} reports through the front: each member's epoch 2 report"
    assert b.metric("jobset_inplace_report_front_link_failures_total") == 0

    leader_1 = endpoint_leader(gang)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    wait_for("replica-b leads", lambda: holder(kube, namespace) == "replica-b", 60, 0.2)
    wait_for("replica-b's channel named", lambda: endpoint_leader(gang) != leader_1, 60, 0.2)
    assert b.logged(r"report front: stopped")
    assert fronts(gang) == [], "no front left to name"
    for agent in agents:
        agent.wait_log(r"a new leader: report of epoch 2 sent again \(on the channel\)")

    gang.fail_trainer(1)
    gang.wait_state("epoch 3 recovering", lambda s: s.get("epoch") == 3)
    for i in range(4):
        gang.restart_in_place(i)
    state = gang.wait_state("epoch 3 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 3)
    assert [h["epoch"] for h in state["history"]] == [2, 3]
    assert pod_reports(gang) == dict.fromkeys(range(4)), "no report written on a pod"
