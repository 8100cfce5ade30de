"""The controller under test: ``jobset-inplace run`` as a process against the local cluster,
with its admission webhook served on loopback, and what a namespace needs for gangs (the
GangState CRD, the agent's RBAC). Used by the e2e suite, the demo and the benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core import spares
from jobset_inplace.times import parse_time

from . import addons, certs, processes
from .cluster import LocalCluster
from .images import NODE_IMAGE
from .install import webhook_injects
from .kube import Clients, create_unless_exists, jobsets, wait_for
from .kubectl import Kubectl
from .versions import REPO_ROOT, binaries

CRD = REPO_ROOT / "manifests" / "crd" / "gangstates.yaml"
MEMBERS_CRD = REPO_ROOT / "manifests" / "crd" / "gangmembers.yaml"
# JSI_REPORT_LIMITS of the controller run as a host process (report_limits.Limits.parse): the
# simulated fleet's agents share this host's address, which is no member pod's, so the
# handshake gate would hold them too
FLEET_LIMITS = (
    "max_per_source=100000,max_unauthenticated_per_source=100000,connect_burst=100000,"
    "handshake_rate=100000,handshake_burst=100000"
)
WEBHOOK_MANIFEST = REPO_ROOT / "manifests" / "webhook" / "webhook.yaml"
# The agent may patch only its own pod (guarantee 9): installed wherever agents run.
AGENT_POLICY = REPO_ROOT / "manifests" / "rbac" / "agent-vap.yaml"
AGENT_ROLE = REPO_ROOT / "manifests" / "rbac" / "agent.yaml"
# The node image of the real kubelet nodes: Python, this checkout's package and the demo trainer.
IMAGE = NODE_IMAGE


class ControllerProcess:
    """``jobset-inplace run`` against the local cluster, serving the admission webhook on
    loopback (the cluster's local CA signed its serving cert); the webhook configurations from
    ``manifests/webhook/`` are installed with their clientConfig pointed at it, and removed again
    by :meth:`stop` (their failurePolicy is Fail)."""

    def __init__(
        self,
        cluster: LocalCluster,
        log: Path,
        *,
        verbose: bool = False,
        leader_identity: str | None = None,
        install_webhook: bool = True,
        module: str | None = None,
        metrics: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``leader_identity``: run as a leader-election candidate with this identity (stable
        across :meth:`kill` and :meth:`start`, as a pod's restarted container keeps its pod).
        ``install_webhook`` False: serve the webhook but leave the cluster's configurations to
        another instance (a standby replica). ``module``: run this one's ``run`` command instead
        of the controller's (the benchmark's controller variant, bench/member_leases.py).
        ``metrics``: serve its /metrics on a free loopback port (:attr:`metrics_url`).
        ``env``: more of its environment (a report front's settings)."""
        self.log, self.cluster = log, cluster
        self.leader_identity, self.install_webhook = leader_identity, install_webhook
        self.kubectl = Kubectl(cluster.kubeconfig)
        port = processes.free_port()
        objs = [o for o in yaml.safe_load_all(WEBHOOK_MANIFEST.read_text()) if o]
        cert = certs.ServingCert(
            cluster.cert_dir / "ca.crt", cluster.cert_dir / "tls.crt", cluster.cert_dir / "tls.key"
        )
        configs = addons.rewrite_for_loopback(
            objs, f"https://127.0.0.1:{port}", cert.ca_bundle(), namespace=names.INSTALL_NAMESPACE
        )
        self.configs = [o for o in configs if o["kind"] in addons.WEBHOOK_CONFIG_KINDS]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "JSI_WEBHOOK_CERT_DIR": str(cluster.cert_dir),
            "JSI_WEBHOOK_PORT": str(port),
            "JSI_AGENT_IMAGE": IMAGE,
            "JSI_AGENT_IMAGE_PULL_POLICY": "Never",
            "JSI_AGENT_API_SERVER": cluster.pod_api_server,
            # the report channel where the agents reach it (a free port: several instances)
            "JSI_REPORT_ADVERTISE": cluster.pod_reachable_address,
            "JSI_REPORT_LISTEN": f"{cluster.pod_reachable_address}:0",
            # the simulated fleet's agents (bench/) all connect from this host's one address:
            # its per-source limits would otherwise refuse all but the first few hundred
            "JSI_REPORT_LIMITS": FLEET_LIMITS,
            **(env or {}),
        }
        self.verbose = verbose
        self.module = module or "jobset_inplace.controller.main"
        self.health_port = processes.free_port() if metrics else None
        self.metrics_url = (
            f"http://127.0.0.1:{self.health_port}/metrics" if self.health_port else None
        )
        if leader_identity is not None:
            self.kubectl.apply_yaml(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": names.INSTALL_NAMESPACE},
                    }
                ),
                server_side=True,
            )
        self.proc = self._spawn()
        if install_webhook:
            self.kubectl.apply_yaml(yaml.safe_dump_all(self.configs), server_side=True)
            processes.wait_until("jobset-inplace admission webhook", self._injects, 60, log=log)

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", self.module, "run"]
        if self.leader_identity is not None:
            command += [
                "--leader-elect",
                "--namespace",
                names.INSTALL_NAMESPACE,
                "--leader-elect-identity",
                self.leader_identity,
            ]
        if self.health_port is not None:
            command += ["--health-port", str(self.health_port)]
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [*command, *(["-v"] * self.verbose)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def kill(self) -> None:
        """Crash the controller (SIGKILL, as an OOM kill or a lost node would): nothing runs
        until :meth:`start`; the webhook configurations stay (JobSet writes fail meanwhile)."""
        self.proc.kill()
        self.proc.wait(10)

    def start(self) -> None:
        """Start the controller again after :meth:`kill`; returns once its webhook serves."""
        if self.proc.poll() is None:
            raise RuntimeError("the controller is still running")
        self.proc = self._spawn()
        if self.install_webhook:
            processes.wait_until(
                "jobset-inplace admission webhook", self._injects, 60, log=self.log
            )

    def _injects(self) -> bool:
        return webhook_injects(self.kubectl)

    def stop(self) -> None:
        """SIGTERM (a leader releases its Lease) and remove the webhook configurations."""
        for cfg in self.configs if self.install_webhook else []:
            self.kubectl.run(
                "delete", cfg["kind"], cfg["metadata"]["name"], "--ignore-not-found", check=False
            )
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)  # a leader keeps its Lease 4 s after its channel stopped
            except subprocess.TimeoutExpired:
                self.proc.kill()


def gang_state(kube: Clients, ns: str, name: str) -> dict[str, Any]:
    """The GangState's status ({} until the controller created it)."""
    obj = or_none(
        kube.custom.get_namespaced_custom_object,
        names.GROUP,
        names.VERSION,
        ns,
        names.GANGSTATE_PLURAL,
        name,
    )
    return dict((obj or {}).get("status") or {})


def barrier_open(kube: Clients, ns: str, name: str, epoch: int, timeout: float) -> dict[str, Any]:
    """Wait until the barrier of ``epoch`` is open; the GangState's status then."""
    return wait_for(
        f"barrier of epoch {epoch} open",
        lambda: (
            st
            if (st := gang_state(kube, ns, name)).get("epoch") == epoch and st["barrierOpen"]
            else None
        ),
        timeout,
    )


def recovery_times(recovery: dict[str, Any]) -> tuple[float, float]:
    """When a GangState's (opened) recovery started and when its barrier opened."""
    started, opened = parse_time(recovery["startedAt"]), parse_time(recovery["openedAt"])
    assert started is not None, recovery
    assert opened is not None, recovery
    return started, opened


def member_pods(
    kube: Clients, ns: str, name: str, *, include_failed: bool = True
) -> dict[str, Any]:
    """The gang's pods that are not being deleted, by job index."""
    pods = kube.core.list_namespaced_pod(
        ns, label_selector=f"{names.JOBSET_NAME_LABEL}={name}"
    ).items
    return {
        p.metadata.labels[names.JOB_INDEX_LABEL]: p
        for p in pods
        if not p.metadata.deletion_timestamp and (include_failed or p.status.phase != "Failed")
    }


def holder_index(slots: dict[str, str], replicated_job: str, slot: int) -> str:
    """The job index of the pod that holds member ``slot`` of ``replicated_job`` under a
    GangState's ``status.slots`` (its own pod's unless a hot spare took it)."""
    return spares.holder(slots, names.member_name(replicated_job, slot, 0)).split("/")[1]


def slot_holders(
    kube: Clients, ns: str, name: str, members: int, *, replicated_job: str = "workers"
) -> dict[str, Any]:
    """The pods that hold the gang's ``members`` slots (:func:`member_pods` less its hot
    spares), by slot; a slot whose holder has no pod is missing."""
    pods = member_pods(kube, ns, name)
    slots = gang_state(kube, ns, name).get(names.STATUS_SLOTS) or {}
    held = {str(k): pods.get(holder_index(slots, replicated_job, k)) for k in range(members)}
    return {slot: pod for slot, pod in held.items() if pod is not None}


def job_failures(kube: Clients, ns: str, name: str) -> dict[str, int]:
    """The gang's Jobs' ``status.failed`` by Job name: the pods their Job controller counted as
    failed (each one delays the Job's next pod: its pod-failure backoff)."""
    jobs = client.BatchV1Api(kube.api).list_namespaced_job(
        ns, label_selector=f"{names.JOBSET_NAME_LABEL}={name}"
    )
    return {j.metadata.name: j.status.failed or 0 for j in jobs.items}


def prepare(kube: Clients, cluster_kubeconfig: Path, namespace: str) -> None:
    """What a cluster needs for gangs in ``namespace``, as the install docs say: the GangState
    and GangMembers CRDs, the agents' ClusterRole and admission policy (cluster-wide), and the
    namespace. Nothing in the namespace: the controller gives agents their rights there."""
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster_kubeconfig)]
    for manifest_file in (CRD, MEMBERS_CRD, AGENT_ROLE, AGENT_POLICY):
        # created when missing, never re-applied: an install (kustomize or the chart) owns them
        res = subprocess.run(
            [*kubectl, "create", "-f", str(manifest_file)],
            check=False,
            capture_output=True,
            text=True,
        )
        errors = [e for e in res.stderr.splitlines() if "(AlreadyExists)" not in e]
        if res.returncode != 0 and errors:
            raise RuntimeError(f"kubectl create -f {manifest_file}: {res.stderr.strip()}")
    create_unless_exists(kube.core.create_namespace, {"metadata": {"name": namespace}})


EVENTS_SHOWN = 30


def namespace_state(kube: Clients, ns: str) -> str:
    """A failing test's namespace in a few lines: its JobSets' restarts and conditions, their
    GangStates, Jobs, pods (phase, true conditions, deletion) and newest Events: what a CI log
    must keep when the cluster it ran on is gone."""
    lines: list[str] = []

    def conds(obj: Any) -> str:
        found = obj.get("conditions") if isinstance(obj, dict) else obj.conditions
        true = [c["type"] if isinstance(c, dict) else c.type for c in found or []
                if (c["status"] if isinstance(c, dict) else c.status) == "True"]  # fmt: skip
        return ",".join(true) or "-"

    for js in jobsets(kube, ns):
        st = js.get("status") or {}
        name = js["metadata"]["name"]
        lines.append(f"JobSet {name}: restarts {st.get('restarts', 0)}, true {conds(st)}")
        gs = gang_state(kube, ns, name)
        keys = ("phase", "epoch", "barrierOpen", "restartAttempt", "reason", "message")
        lines.append(f"  GangState: { ({k: gs.get(k) for k in keys}) }")
    for job in client.BatchV1Api(kube.api).list_namespaced_job(ns).items:
        s = job.status
        lines.append(
            f"Job {job.metadata.name}: active {s.active or 0}, failed {s.failed or 0}, "
            f"true {conds(s)}{' (deleting)' if job.metadata.deletion_timestamp else ''}"
        )
    for pod in kube.core.list_namespaced_pod(ns).items:
        m = pod.metadata
        lines.append(
            f"pod {m.name} {m.uid[:8]} on {pod.spec.node_name}: {pod.status.phase}, "
            f"true {conds(pod.status)}{' (deleting)' if m.deletion_timestamp else ''}, "
            f"restart attempt {(m.labels or {}).get(names.RESTART_ATTEMPT_LABEL)}"
        )
    events = kube.core.list_namespaced_event(ns).items
    events.sort(key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    for e in events[-EVENTS_SHOWN:]:
        when = e.last_timestamp or e.event_time or e.metadata.creation_timestamp
        what = f"{e.involved_object.kind}/{e.involved_object.name}"
        lines.append(f"event {when:%H:%M:%S} {what} {e.reason}: {(e.message or '')[:200]}")
    return "\n".join(lines)
