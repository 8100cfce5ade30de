"""jobset-inplace installed *in* the local cluster, as a user installs it: the product images
(``make images``) on every real node, then ``kubectl apply --server-side -k
manifests/overlays/local``; the controller runs as its Deployment (2 replicas, leader
election, self-managed webhook certificate) on the real kubelet nodes.

``python -m testbed install`` / ``uninstall`` (``make cluster-install``)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.runtime.leader_election import DEFAULT_LEASE

from . import images, workloads
from .cluster import LocalCluster, log
from .kube import Clients, clients, wait_for
from .kubectl import Kubectl
from .processes import wait_until
from .versions import REPO_ROOT

MANIFESTS = REPO_ROOT / "manifests"
OVERLAY = MANIFESTS / "overlays" / "local"
DEPLOYMENT = names.CONTROLLER_NAME
POD_LABEL = "app.kubernetes.io/name=jobset-inplace-controller"
CRD = "gangstates.jobset-inplace.dev"
# A controller log line at WARNING or above, or a traceback's (kept whatever it names).
_LOUD = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|Error")


def leader_pod(kube: Clients) -> str:
    """The in-cluster controller's pod holding its leader Lease (identities are
    ``<pod name>_<random>``); "" while none does."""
    lease = or_none(kube.coordination.read_namespaced_lease, DEFAULT_LEASE, names.INSTALL_NAMESPACE)
    holder = lease.spec.holder_identity if lease is not None else None
    return str(holder or "").rsplit("_", 1)[0]


def leader_node(kube: Clients) -> str:
    """The node of the in-cluster controller's leader pod; "" while none leads (or its pod is
    gone)."""
    pod_name = leader_pod(kube)
    pod = (
        or_none(kube.core.read_namespaced_pod, pod_name, names.INSTALL_NAMESPACE)
        if pod_name
        else None
    )
    return str(pod.spec.node_name or "") if pod is not None else ""


@dataclass
class Installation:
    """jobset-inplace installed in the cluster of ``kubeconfig``. ``cluster``: the local
    cluster, whose real nodes get the images imported (``overlays/local``); None: a cluster
    whose nodes have the images already (kind: ``kind load``, testbed/kind/run.sh), installed
    from ``manifests/`` exactly as a user installs it."""

    kubeconfig: Path
    cluster: LocalCluster | None = None

    @property
    def kubectl(self) -> Kubectl:
        return Kubectl(self.kubeconfig)

    @cached_property
    def kube(self) -> Clients:
        return clients(self.kubeconfig)

    @property
    def overlay(self) -> Path:
        return OVERLAY if self.cluster is not None else MANIFESTS

    def install(self, timeout: float = 180) -> None:
        """Images onto the nodes, apply, wait until the replicas are ready, the webhook
        injects and the install is settled (:meth:`wait_settled`). Idempotent; pods already
        running keep the image they started with (same tag, never pulled): a changed image
        reaches them when they restart."""
        t0 = time.monotonic()
        if self.cluster is not None:
            self._import_images(self.cluster)
        self.kubectl.run("apply", "--server-side", "--force-conflicts", "-k", str(self.overlay))
        self.kubectl.wait_crds_established([CRD])
        self.kubectl.run(
            "rollout",
            "status",
            f"deployment/{DEPLOYMENT}",
            "-n",
            names.INSTALL_NAMESPACE,
            f"--timeout={int(timeout)}s",
        )
        wait_until(
            "the in-cluster webhook injects the agent", lambda: webhook_injects(self.kubectl), 60
        )
        self.wait_settled(self.replicas())
        log(f"jobset-inplace installed in-cluster in {time.monotonic() - t0:.1f}s")

    def replicas(self) -> int:
        """The controller Deployment's replicas (its spec)."""
        ns = names.INSTALL_NAMESPACE
        jsonpath = "jsonpath={.spec.replicas}"
        return int(self.kubectl.run("get", f"deployment/{DEPLOYMENT}", "-n", ns, "-o", jsonpath))

    @staticmethod
    def _import_images(cluster: LocalCluster) -> None:
        nodes = cluster.real_nodes()
        if not nodes:
            raise RuntimeError(
                "the in-cluster install runs on real kubelet nodes and this cluster has none:"
                " make cluster-up REAL_NODES=2"
            )
        built = images.build(imports=[str(images.node_socket(n)) for n in nodes])
        log(
            f"images on {', '.join(nodes)}: "
            + ", ".join(f"{i.name} {i.digest()[:19]}" for i in built)
        )

    def uninstall(self) -> None:
        """Remove everything the manifests made (JobSets keep running: docs/operations.md)."""
        self.kubectl.run("delete", "-k", str(self.overlay), "--ignore-not-found", "--wait=true")

    def pin_to(self, node: str, taint: str, timeout: float = 180) -> None:
        """Run the controller's replicas on ``node`` alone, the production layout of
        docs/operations.md ("Where the replicas run": off the training nodes): a nodeSelector
        for it and a toleration of ``taint`` (``key=value:effect``, which the caller put on the
        node to keep every other pod off). Waits until the replicas run there, settled."""
        key, _, rest = taint.partition("=")
        value, _, effect = rest.partition(":")
        patch = {
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "tolerations": [
                            {"key": key, "operator": "Equal", "value": value, "effect": effect}
                        ],
                    }
                }
            }
        }
        ns = names.INSTALL_NAMESPACE
        self.kubectl.run("patch", f"deployment/{DEPLOYMENT}", "-n", ns, "-p", json.dumps(patch))
        self.kubectl.run(
            "rollout", "status", f"deployment/{DEPLOYMENT}", "-n", ns, f"--timeout={int(timeout)}s"
        )
        leader, _ = self.wait_settled(self.replicas(), timeout)
        away = [
            p["metadata"]["name"] for p in self.pods() if p.get("spec", {}).get("nodeName") != node
        ]
        if away:
            raise RuntimeError(f"controller replicas not on {node} after the rollout: {away}")
        log(f"the controller's replicas run on {node} alone (leader {leader})")

    def scale(self, replicas: int, timeout: float = 120) -> None:
        """Scale the controller Deployment and wait until it is there: ``replicas`` ready pods
        (the webhook serving again) and settled (:meth:`wait_settled`), or none left at all for
        0."""
        ns = names.INSTALL_NAMESPACE
        self.kubectl.run("scale", f"deployment/{DEPLOYMENT}", "-n", ns, f"--replicas={replicas}")
        if replicas == 0:
            wait_until("no controller pod left", lambda: not self.pods(), timeout)
            return
        self.kubectl.run(
            "rollout", "status", f"deployment/{DEPLOYMENT}", "-n", ns, f"--timeout={int(timeout)}s"
        )
        wait_until("the webhook injects the agent", lambda: webhook_injects(self.kubectl), 60)
        self.wait_settled(replicas, timeout)

    def leader(self) -> str:
        """The pod holding the controller's leader Lease; "" while none does."""
        return leader_pod(self.kube)

    def leader_node(self) -> str:
        """The node of the pod holding the controller's leader Lease; "" while none does."""
        return leader_node(self.kube)

    def wait_settled(self, replicas: int, timeout: float = 120) -> tuple[str, list[str]]:
        """Wait until exactly ``replicas`` pods run and are ready, none of them being deleted,
        and one of them holds the Lease; return (leader, the others). A rollout can be complete
        while a replaced pod is still terminating (and may still lead, or the Lease be free),
        and a pod the Deployment made when a node died runs a while before it is ready (its
        webhook certificate, its server): a test reading the leader or the replicas would take
        either for the install."""

        def settled() -> tuple[str, list[str]] | None:
            pods = self.pods()
            ready = {
                p["metadata"]["name"]
                for p in pods
                if p.get("status", {}).get("phase") == "Running"
                and _ready(p)
                and not p["metadata"].get("deletionTimestamp")
            }
            leader = self.leader()
            if len(pods) != replicas or len(ready) != replicas or leader not in ready:
                return None
            return leader, sorted(ready - {leader})

        return wait_for(
            f"{replicas} running, ready controller replicas, none terminating, one holding"
            " the Lease",
            settled,
            timeout,
        )

    def logs(self, tail: int = 200, *, about: str | None = None) -> str:
        """Every controller pod's phase and the last ``tail`` lines of its log, timestamped
        (for a failing test's report); ``about``: only the lines naming it (a test's namespace)
        and the warnings and errors, so that a long-lived controller's log keeps the test's."""
        parts = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            phase = pod.get("status", {}).get("phase")
            gone = " (terminating)" if pod["metadata"].get("deletionTimestamp") else ""
            out = self.kubectl.run(
                "logs",
                name,
                "-n",
                names.INSTALL_NAMESPACE,
                "--timestamps",
                *([] if about else [f"--tail={tail}"]),
                check=False,
            )
            if about:
                kept = [ln for ln in out.splitlines() if about in ln or _LOUD.search(ln)]
                out = "\n".join(kept[-tail:])
            parts.append(f"--- {name}: {phase}{gone}\n{out}")
        return "\n".join(parts)

    @contextmanager
    def following(self, pod: str) -> Iterator[Callable[[], str]]:
        """Follow one controller pod's log for the block (it outlives the pod's deletion);
        yields a function returning what was logged so far."""
        with tempfile.TemporaryFile("w+") as out:
            cmd = self.kubectl.command(
                "logs", "-f", pod, "-n", names.INSTALL_NAMESPACE, "--timestamps"
            )
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)

            def so_far() -> str:
                out.seek(0)
                return out.read()

            try:
                yield so_far
            finally:
                proc.terminate()
                proc.wait()

    def pods(self) -> list[dict[str, Any]]:
        out = self.kubectl.run(
            "get", "pods", "-n", names.INSTALL_NAMESPACE, "-l", POD_LABEL, "-o", "yaml"
        )
        items: list[dict[str, Any]] = yaml.safe_load(out)["items"]
        return items


def _ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition is True (its readiness probe passes)."""
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def webhook_injects(kubectl: Kubectl) -> bool:
    """A server-side dry run of an opted-in JobSet comes back with the agent injected."""
    probe = workloads.jobset("webhook-probe", [("w", 1, 1)], annotations={names.ENABLED: "true"})
    probe["metadata"]["namespace"] = "default"
    try:
        out = kubectl.run(
            "create", "--dry-run=server", "-o", "yaml", "-f", "-", stdin=yaml.safe_dump(probe)
        )
    except RuntimeError:
        return False
    return AGENT_CONTAINER in out
