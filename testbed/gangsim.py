"""Simulated kubelets, JobSet/Job controllers and agents for integration tests on the real
apiserver (which runs none of them). Each helper does through the API exactly what the real
component would write: pods with JobSet's labels, pod status as a kubelet reports it, and the
agent's annotations; each member pod controlled by a Job controlled by the JobSet, as the
controller checks membership by those owners' UIDs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.times import format_time
from testbed import workloads
from testbed.kube import Clients, create_jobset, wait_for

CRD = Path(__file__).resolve().parents[1] / "manifests" / "crd" / "gangstates.yaml"
CRD_NAME = f"{names.GANGSTATE_PLURAL}.{names.GROUP}"
RJ = "workers"


def now_iso(offset: float = 0.0) -> str:
    return format_time(time.time() + offset, micro=False)


def micro(offset: float = 0.0) -> str:
    return format_time(time.time() + offset)


def running_status(restarts: int = 0, *, exit_code: int | None = None) -> dict[str, Any]:
    state: dict[str, Any] = (
        {"running": {"startedAt": now_iso()}}
        if exit_code is None
        else {"terminated": {"exitCode": exit_code, "reason": "Error", "finishedAt": now_iso()}}
    )
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if exit_code is None else "False"}],
        "containerStatuses": [
            {
                "name": "trainer",
                "image": "trainer:local",
                "imageID": "",
                "ready": exit_code is None,
                "restartCount": restarts,
                "state": state,
            }
        ],
    }


@dataclass
class Gang:
    """One simulated opted-in JobSet of ``size`` single-pod jobs, one pod per node."""

    kube: Clients
    namespace: str
    name: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)
    pods: dict[int, str] = field(default_factory=dict)  # member index -> current pod name
    jobs: dict[int, str] = field(default_factory=dict)  # member index -> its Job's UID
    leases: LeaseKeeper | None = None

    def create(self, *, enabled: bool = True) -> None:
        annotations = {names.ENABLED: "true"} | self.annotations if enabled else {}
        body = workloads.jobset(
            self.name, [(RJ, self.size, 1)], annotations=annotations, node_selector={"type": "sim"}
        )
        js = create_jobset(self.kube, self.namespace, body)
        for i in range(self.size):
            self.jobs[i] = self.make_job(i, js["metadata"]["uid"])
            ensure_node(self.kube, self.node(i))
            if self.leases is not None:
                self.leases.nodes.add(self.node(i))
            self.make_pod(i)

    def node(self, i: int) -> str:
        return f"{self.name}-node-{i}"

    def make_job(self, i: int, jobset_uid: str) -> str:
        """Member ``i``'s Job as JobSet makes it (inert: no Job controller runs); its UID."""
        name = f"{self.name}-{RJ}-{i}"
        owner = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "name": self.name,
            "uid": jobset_uid,
            "controller": True,
        }
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "labels": {names.JOBSET_NAME_LABEL: self.name},
                "ownerReferences": [owner],
            },
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "trainer", "image": "trainer:local"}],
                    }
                }
            },
        }
        made = client.BatchV1Api(self.kube.api).create_namespaced_job(self.namespace, job)
        return str(made.metadata.uid)

    def delete_jobs(self) -> None:
        batch = client.BatchV1Api(self.kube.api)
        for i in self.jobs:
            batch.delete_namespaced_job(
                f"{self.name}-{RJ}-{i}", self.namespace, propagation_policy="Background"
            )
        self.jobs.clear()

    def make_pod(self, i: int, node: str | None = None, *, owned: bool = True) -> str:
        """What JobSet + the Job controller + the scheduler + a kubelet would produce; not
        ``owned``: a pod someone made with member ``i``'s labels (not the member's)."""
        name = f"{self.name}-{RJ}-{i}-0-{uuid.uuid4().hex[:5]}"
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": f"{self.name}-{RJ}-{i}",
            "uid": self.jobs[i],
            "controller": True,
        }
        labels = {
            names.JOBSET_NAME_LABEL: self.name,
            names.REPLICATED_JOB_LABEL: RJ,
            names.JOB_INDEX_LABEL: str(i),
            names.COMPLETION_INDEX_LABEL: "0",
            names.RESTART_ATTEMPT_LABEL: "0",
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "ownerReferences": [owner] if owned else [],
            },
            "spec": {
                "nodeName": node or self.node(i),
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "trainer",
                        "image": "trainer:local",
                        # As the transform injects it: a trainer failure restarts the pod in
                        # place (this is also what lets its status go back to running).
                        "restartPolicy": "Never",
                        "restartPolicyRules": [
                            {
                                "action": "RestartAllContainers",
                                "exitCodes": {"operator": "NotIn", "values": [0]},
                            }
                        ],
                    }
                ],
            },
        }
        self.kube.core.create_namespaced_pod(self.namespace, pod)
        self.kube.core.patch_namespaced_pod_status(
            name, self.namespace, {"status": running_status()}
        )
        if owned:
            self.pods[i] = name
        return name

    # --- reads ---------------------------------------------------------------------------------
    def pod(self, i: int) -> Any:
        return self.kube.core.read_namespaced_pod(self.pods[i], self.namespace)

    def uids(self) -> dict[int, str]:
        return {i: self.pod(i).metadata.uid for i in self.pods}

    def state(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.GANGSTATE_PLURAL, self.name
        )
        return obj.get("status") or {}

    def wait_state(self, what: str, pred: Any, timeout: float = 30) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            try:
                st = self.state()
            except ApiException:
                return None
            return st if pred(st) else None

        return wait_for(f"GangState {what}", probe, timeout, 0.2)

    def events(self) -> list[tuple[str, str]]:
        evs = self.kube.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={self.name}"
        ).items
        return [(e.reason, e.message) for e in evs if e.source.component == "jobset-inplace"]

    # --- agent and kubelet behaviour -------------------------------------------------------------
    def report(
        self, i: int, epoch: int, steps: str = "200,100", *, rechecked: bool = False
    ) -> None:
        """What the agent writes on its own pod (``rechecked``: answering the status's ask to
        look at its steps again)."""
        report = {names.REPORT_EPOCH: str(epoch), names.REPORT_STEPS: steps}
        if rechecked:
            report[names.REPORT_RECHECKED] = str(epoch)
        self.kube.core.patch_namespaced_pod(
            self.pods[i], self.namespace, {"metadata": {"annotations": report}}
        )

    def withdraw_report(self, i: int) -> dict[str, str]:
        """Remove member ``i``'s report (as before its agent's first report); returns it."""
        ann = self.pod(i).metadata.annotations or {}
        keys = (names.REPORT_EPOCH, names.REPORT_STEPS)
        old = {k: ann[k] for k in keys if k in ann}
        self.kube.core.patch_namespaced_pod(
            self.pods[i], self.namespace, {"metadata": {"annotations": dict.fromkeys(keys)}}
        )
        return old

    def restore_report(self, i: int, report: dict[str, str]) -> None:
        self.kube.core.patch_namespaced_pod(
            self.pods[i], self.namespace, {"metadata": {"annotations": report}}
        )

    def report_all(self, epoch: int, steps: str = "200,100") -> None:
        for i in self.pods:
            self.report(i, epoch, steps)

    def fail_trainer(self, i: int) -> None:
        restarts = self.pod(i).status.container_statuses[0].restart_count
        self.kube.core.patch_namespaced_pod_status(
            self.pods[i], self.namespace, {"status": running_status(restarts, exit_code=1)}
        )

    def restart_in_place(self, i: int) -> None:
        """The kubelet's RestartAllContainers: same pod, every container restarted."""
        restarts = self.pod(i).status.container_statuses[0].restart_count + 1
        self.kube.core.patch_namespaced_pod_status(
            self.pods[i], self.namespace, {"status": running_status(restarts)}
        )

    def rejoin_all(self, epoch: int, steps: str = "200,100") -> None:
        """Every member restarts in place and its new agent reports ``epoch``."""
        for i in self.pods:
            self.restart_in_place(i)
            self.report(i, epoch, steps)


def ensure_node(kube: Clients, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"type": "sim"}},
    }
    try:
        kube.core.create_node(body)
    except ApiException as e:
        if e.status != 409:
            raise
    set_node_ready(kube, name, "True")
    # Admission taints new nodes not-ready until the node lifecycle controller (not running
    # here) sees them Ready and removes it.
    kube.core.patch_node(name, {"spec": {"taints": None}})
    renew_lease(kube, name)


def set_node_ready(kube: Clients, name: str, status: str, since: float = 0.0) -> None:
    cond = {
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady" if status == "True" else "NodeStatusUnknown",
        "lastHeartbeatTime": now_iso(since),
        "lastTransitionTime": now_iso(since),
    }
    kube.core.patch_node_status(name, {"status": {"conditions": [cond]}})


def renew_lease(kube: Clients, name: str, offset: float = 0.0) -> None:
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro(offset)},
    }
    try:
        kube.coordination.create_namespaced_lease(names.NODE_LEASE_NAMESPACE, body)
    except ApiException as e:
        if e.status != 409:
            raise
        kube.coordination.patch_namespaced_lease(
            name, names.NODE_LEASE_NAMESPACE, {"spec": body["spec"]}
        )


class LeaseKeeper(threading.Thread):
    """Renews the Lease of every simulated node every few seconds, as kubelets do, except
    for nodes a test declared dead."""

    def __init__(self, kube: Clients, interval: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.kube, self.interval = kube, interval
        self.nodes: set[str] = set()
        self.dead: set[str] = set()
        self.paused = False  # every kubelet between retries (e.g. just after an outage)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            for name in sorted(self.nodes - self.dead) if not self.paused else []:
                # the apiserver may be down (an outage test): the next round retries
                with contextlib.suppress(Exception):
                    renew_lease(self.kube, name)

    def stop(self) -> None:
        self._stop_event.set()


@dataclass
class Controller:
    """``jobset-inplace run`` as a real subprocess against the test apiserver."""

    kubeconfig: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # e.g. the report channel's settings

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jobset_inplace.controller.main", "run"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as in a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
