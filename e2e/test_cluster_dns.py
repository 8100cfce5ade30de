"""Cluster DNS on the local cluster's real nodes (testbed/dns.py: CoreDNS built from its Go module,
the kubelets' clusterDNS): a JobSet member on one real node finds the member on the other by
JobSet's own name for it (``<pod hostname>.<jobset>``, through JobSet's headless Service) and
talks to it, as a distributed trainer's rendezvous does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from testbed.cluster import REAL_NODE_LABEL, LocalCluster
from testbed.controller import IMAGE
from testbed.kube import Clients, create_jobset, wait_for
from testbed.kubectl import Kubectl
from testbed.workloads import jobset, one_per_node

pytestmark = pytest.mark.e2e

PORT = 9000
# Member 0 answers one connection; member 1 resolves member 0 by JobSet's name for it and
# connects (bounded retries: its DNS record and listening socket may come after this starts).
SCRIPT = f"""
import os, socket, sys, time
if os.environ["JOB_INDEX"] == "0":
    srv = socket.create_server(("", {PORT}))
    conn, peer = srv.accept()
    conn.sendall(b"pong from " + socket.gethostname().encode() + b" to " + conn.recv(64))
    print("answered", peer[0], flush=True)
    sys.exit(0)
name = "gang-workers-0-0.gang"
deadline = time.time() + 90
while True:
    try:
        address = socket.gethostbyname(name)
        with socket.create_connection((address, {PORT}), timeout=5) as s:
            s.sendall(socket.gethostname().encode())
            print("resolved", name, address, "reply:", s.recv(128).decode(), flush=True)
        sys.exit(0)
    except OSError as e:
        if time.time() > deadline:
            print("gave up:", name, e, flush=True)
            sys.exit(1)
        time.sleep(0.5)
"""


def test_a_member_finds_its_peer_on_the_other_real_node_by_name(
    local_cluster: LocalCluster | None, cluster_kubeconfig: Path, kube: Clients, namespace: str
) -> None:
    if local_cluster is None:
        pytest.skip("tests the local cluster's DNS (other clusters bring their own)")
    container = {
        "name": "member",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "-c", SCRIPT],
        "env": [
            {
                "name": "JOB_INDEX",
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.labels['{names.JOB_INDEX_LABEL}']"}
                },
            }
        ],
    }
    create_jobset(
        kube,
        namespace,
        jobset(
            "gang",
            [("workers", 2, 1)],
            node_selector={REAL_NODE_LABEL: "true"},
            pod={"containers": [container], "affinity": one_per_node("gang")},
        ),
    )

    def pods_done() -> dict[str, Any] | None:
        pods = kube.core.list_namespaced_pod(namespace).items
        if len(pods) == 2 and all(p.status.phase in ("Succeeded", "Failed") for p in pods):
            return {p.metadata.labels[names.JOB_INDEX_LABEL]: p for p in pods}
        return None

    pods = wait_for("both members to finish", pods_done, 150)
    server, client = pods["0"], pods["1"]
    kubectl = Kubectl(cluster_kubeconfig)
    logs = {i: kubectl.run("logs", "-n", namespace, p.metadata.name) for i, p in pods.items()}
    assert (server.status.phase, client.status.phase) == ("Succeeded", "Succeeded"), logs
    assert server.spec.node_name != client.spec.node_name
    line = next(x for x in logs["1"].splitlines() if x.startswith("resolved "))
    _, name, address, *_ = line.split()
    assert name == "gang-workers-0-0.gang"
    assert address == server.status.pod_ip, "JobSet's name resolves to member 0's pod IP"
    assert line.endswith(f"reply: pong from gang-workers-0-0 to {client.spec.hostname}")
    print(f"\n{line} (member 1 on {client.spec.node_name}, member 0 on {server.spec.node_name})")
