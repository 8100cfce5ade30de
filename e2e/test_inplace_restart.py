"""A real in-place pod restart (``RestartAllContainers``) on a real kubelet node (the local
cluster's, or a kind node: testbed/kind/run.sh).

The pod has an init container that counts its runs in an emptyDir, a sidecar whose exit code 88
has a ``RestartAllContainers`` rule, and a main container. The test makes the sidecar exit 88
(by dropping a trigger file through ``kubectl exec``) and checks what Kubernetes promises for an
in-place restart, three times in a row, printing the latency of each.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch

from testbed.cluster import REAL_NODE_LABEL, LocalCluster
from testbed.images import IMAGES_LOADED_ENV, NODE_IMAGE
from testbed.kube import Clients, wait_for
from testbed.versions import binaries

pytestmark = [pytest.mark.e2e, pytest.mark.kube_release]

IMAGE = NODE_IMAGE
RESTART_EXIT_CODE = 88
POD = "inplace"
CYCLES = 3

# The sidecar exits 88 once per trigger file; the main container records its starts.
SIDECAR_SCRIPT = (
    "while [ ! -f /shared/trigger ]; do sleep 0.05; done; rm -f /shared/trigger; "
    f"exit {RESTART_EXIT_CODE}"
)
INIT_SCRIPT = (
    "n=$(cat /shared/init-count 2>/dev/null || echo 0); n=$((n+1)); "
    "echo $n > /shared/init-count; echo -n $n > /dev/termination-log"
)
MAIN_SCRIPT = (
    "[ -f /shared/created ] || echo $(date +%s%N) > /shared/created; "
    "echo start >> /shared/main-starts; exec sleep 86400"
)


def _pod(node: str) -> dict[str, Any]:
    mount = [{"name": "shared", "mountPath": "/shared"}]
    common = {"image": IMAGE, "imagePullPolicy": "Never", "volumeMounts": mount}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [
                {"name": "init", "command": ["sh", "-c", INIT_SCRIPT], **common},
                {
                    "name": "agent",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [
                        {
                            "action": "RestartAllContainers",
                            "exitCodes": {"operator": "In", "values": [RESTART_EXIT_CODE]},
                        }
                    ],
                    "command": ["sh", "-c", SIDECAR_SCRIPT],
                    **common,
                },
            ],
            "containers": [{"name": "main", "command": ["sh", "-c", MAIN_SCRIPT], **common}],
        },
    }


@dataclass
class PodWatch:
    """Records every version of one pod seen on a watch, with a monotonic timestamp."""

    kube: Clients
    namespace: str
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            for ev in w.stream(
                self.kube.core.list_namespaced_pod,
                self.namespace,
                field_selector=f"metadata.name={POD}",
                timeout_seconds=5,
            ):
                obj = self.kube.api.sanitize_for_serialization(ev["object"])
                self.events.append((time.monotonic(), obj))
                if self._stop.is_set():
                    w.stop()

    def stop(self) -> None:
        self._stop.set()

    def conditions_since(self, t: float, ctype: str) -> list[str]:
        """Successive distinct statuses of a pod condition seen after ``t``."""
        seen: list[str] = []
        for ts, pod in self.events:
            if ts < t:
                continue
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond["type"] == ctype and (not seen or seen[-1] != cond["status"]):
                    seen.append(cond["status"])
        return seen

    def first_since(self, t: float, pred: Any) -> float | None:
        return next((ts for ts, pod in self.events if ts >= t and pred(pod)), None)


@pytest.fixture
def real_node(kube: Clients, local_cluster: LocalCluster | None) -> str:
    """A Ready kubelet node labelled as a real node that has the image: the local cluster's,
    or another cluster's whose nodes have it (kind: testbed/kind/run.sh labels its workers and
    loads the image)."""
    if local_cluster is None and os.environ.get(IMAGES_LOADED_ENV) != "1":
        pytest.skip(
            f"needs real kubelet nodes ({REAL_NODE_LABEL}=true) with the image {IMAGE}: the "
            f"local cluster's, or another cluster's whose nodes have it ({IMAGES_LOADED_ENV}=1)"
        )
    nodes = kube.core.list_node(label_selector=f"{REAL_NODE_LABEL}=true").items
    ready = [
        n.metadata.name
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    ]
    if not ready:
        pytest.fail(f"no Ready node labelled {REAL_NODE_LABEL}=true")
    return str(ready[0])


@pytest.fixture
def pod_watch(kube: Clients, namespace: str) -> Iterator[PodWatch]:
    pw = PodWatch(kube, namespace)
    thread = threading.Thread(target=pw.run, daemon=True)
    thread.start()
    yield pw
    pw.stop()
    thread.join(timeout=10)


def _status(pod: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    return next(s for s in pod["status"].get(kind) or [] if s["name"] == name)


def _exec(kubeconfig: Path, namespace: str, *cmd: str) -> str:
    res = subprocess.run(
        [str(binaries().kubectl), "--kubeconfig", str(kubeconfig), "-n", namespace, "exec",
         POD, "-c", "main", "--", *cmd],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert res.returncode == 0, f"kubectl exec {cmd} failed: {res.stderr}"
    return res.stdout


def _main_running_after(pod: dict[str, Any], restarts: int) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    main = next((s for s in statuses if s["name"] == "main"), None)
    return bool(main and main["restartCount"] >= restarts and "running" in main["state"])


def test_restart_all_containers_in_place_on_real_node(
    kube: Clients, namespace: str, real_node: str, pod_watch: PodWatch, cluster_kubeconfig: Path
) -> None:
    kube.core.create_namespaced_pod(namespace, _pod(real_node))

    def running() -> dict[str, Any] | None:
        pod = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(POD, namespace))
        return pod if _main_running_after(pod, 0) and pod["status"].get("podIP") else None

    before = wait_for("pod running on the real node", running, timeout=90)
    uid, ip = before["metadata"]["uid"], before["status"]["podIP"]
    created = _exec(cluster_kubeconfig, namespace, "cat", "/shared/created")
    latencies = []

    for cycle in range(1, CYCLES + 1):
        t0 = time.monotonic()
        _exec(cluster_kubeconfig, namespace, "touch", "/shared/trigger")

        def restarted(cycle: int = cycle) -> dict[str, Any] | None:
            pod = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(POD, namespace))
            return pod if _main_running_after(pod, cycle) else None

        after = wait_for(f"main container running again (cycle {cycle})", restarted, 90, 0.1)
        ran_at = pod_watch.first_since(t0, lambda p, c=cycle: _main_running_after(p, c))
        latencies.append((ran_at or time.monotonic()) - t0)

        assert after["metadata"]["uid"] == uid, "in-place restart must keep the pod UID"
        assert after["status"]["podIP"] == ip, "in-place restart must keep the pod IP"
        assert after["spec"]["nodeName"] == real_node
        init = _status(after, "initContainerStatuses", "init")
        assert init["state"]["terminated"]["message"] == str(cycle + 1), "init ran again"
        for kind, name in (
            ("initContainerStatuses", "init"),
            ("initContainerStatuses", "agent"),
            ("containerStatuses", "main"),
        ):
            assert _status(after, kind, name)["restartCount"] == cycle, f"{name} restartCount"
        # emptyDir content survives: the first start's marker and every start's line.
        assert _exec(cluster_kubeconfig, namespace, "cat", "/shared/created") == created
        starts = _exec(cluster_kubeconfig, namespace, "cat", "/shared/main-starts")
        assert starts.split() == ["start"] * (cycle + 1)

        def restarting_cycle(t0: float = t0) -> bool:
            seen = pod_watch.conditions_since(t0, "AllContainersRestarting")
            return seen[-2:] == ["True", "False"]

        wait_for(f"AllContainersRestarting True then False (cycle {cycle})", restarting_cycle, 30)

    print(
        f"\nin-place restart on {real_node} (sidecar exit -> main running again), "
        f"{CYCLES} cycles: min {min(latencies):.2f}s median {statistics.median(latencies):.2f}s "
        f"max {max(latencies):.2f}s"
    )
