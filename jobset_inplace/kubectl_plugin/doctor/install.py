"""The install, live: the controller Deployment and its leader, the webhook (a JobSet dry run), the
leader's report channel."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.times import parse_time

from .result import Check, Result


def check_controller(deployment: Mapping[str, Any] | None, namespace: str) -> Check:
    name = "Controller"
    where = f"{namespace}/{names.CONTROLLER_NAME}"
    hint = f"kubectl -n {namespace} describe deployment {names.CONTROLLER_NAME}"
    if deployment is None:
        return Check(
            name,
            Result.FAIL,
            f"Deployment {where} not found",
            "install the controller (docs/operations.md#install), or pass --controller-namespace",
        )
    status = deployment.get("status") or {}
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    ready = int(status.get("readyReplicas") or 0)
    detail = f"Deployment {where}: {ready}/{wanted} replicas ready"
    if ready == 0:
        return Check(name, Result.FAIL, detail, hint)
    if ready < wanted:
        return Check(name, Result.WARN, f"{detail} (no standby for a failover)", hint)
    return Check(name, Result.PASS, detail)


def leader_pod(holder: str) -> str:
    """The pod a candidate identity names (``<pod>_<random>``, runtime.leader_election)."""
    return holder.rpartition("_")[0] or holder


def check_leader(
    lease: Mapping[str, Any] | None, server_now: float | None, namespace: str
) -> Check:
    """A live leader: the Lease has a holder renewed within its duration, by the apiserver's
    clock (``server_now``, from its ``Date`` header; None: this machine's is not used)."""
    name = "Leader"
    where = f"{namespace}/{names.CONTROLLER_NAME}"
    hint = f"kubectl -n {namespace} logs deployment/{names.CONTROLLER_NAME}"
    if lease is None:
        return Check(name, Result.FAIL, f"Lease {where} not found: no replica ever led", hint)
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    if not holder:
        return Check(name, Result.FAIL, f"Lease {where} has no holder (released)", hint)
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is None or server_now is None:
        return Check(name, Result.WARN, f"{holder} holds {where}; its age is unknown", hint)
    age = max(0.0, server_now - renewed)
    detail = f"{leader_pod(holder)} holds {where}, renewed {age:.0f}s ago (duration {duration:g}s)"
    if age > duration + 1:  # (the Date header has whole seconds)
        return Check(name, Result.FAIL, f"{detail}: expired, no live leader", hint)
    return Check(name, Result.PASS, detail)


def probe_jobset(suffix: str) -> dict[str, Any]:
    """An opted-in JobSet, for a server-side dry run of its create: the webhook must add the
    agent. Named (the webhook needs a name: no generateName), ``suffix`` keeps it apart from
    any real one."""
    pod = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "trainer", "image": "registry.k8s.io/pause:3.10", "command": ["/pause"]}
        ],
    }
    job = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": f"jobset-inplace-doctor-{suffix}",
            "annotations": {names.ENABLED: "true"},
        },
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}]},
    }


def _has_agent(jobset: Mapping[str, Any]) -> bool:
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get(
            "spec"
        ) or {}
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            if c.get("name") == AGENT_CONTAINER:
                return True
    return False


def check_webhook(created: Mapping[str, Any] | None, error: str | None, namespace: str) -> Check:
    name = "Webhook"
    what = f"server-side dry run of an opted-in JobSet in {namespace}"
    if error is not None:
        return Check(
            name,
            Result.FAIL,
            f"{what} refused: {error}",
            "check the controller's pods and the jobset-inplace-webhook Service's endpoints",
        )
    if created is not None and _has_agent(created):
        return Check(name, Result.PASS, f"{what}: the agent was added")
    return Check(
        name,
        Result.FAIL,
        f"{what}: accepted without the agent (the mutating webhook did not run)",
        "kubectl get mutatingwebhookconfiguration jobset-inplace-webhook -o yaml "
        "(namespaceSelector, objectSelector)",
    )


def channel_port(pod: Mapping[str, Any] | None) -> int:
    """The leader pod's report channel port (its container port named ``reports``)."""
    for c in ((pod or {}).get("spec") or {}).get("containers") or []:
        for port in c.get("ports") or []:
            if port.get("name") == "reports":
                return int(port["containerPort"])
    return names.DEFAULT_REPORT_PORT


def check_channel(status: int, body: str, where: str) -> Check:
    """The leader's report channel answered a GET through the apiserver's pod proxy: the
    channel refuses it (405, its own JSON), which shows it listens and speaks TLS."""
    name = "Report channel"
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status == 405 and isinstance(answer, dict) and "POST" in str(answer.get("error")):
        return Check(name, Result.PASS, f"{where} answers (through the apiserver's pod proxy)")
    said = (
        str((answer or {}).get("message") or body)[:200] if isinstance(answer, dict) else body[:200]
    )
    return Check(
        name,
        Result.WARN,
        f"{where} did not answer through the apiserver's pod proxy ({status}: {said})",
        "agents then report on their pods (more API writes): check the leader's log; a "
        "NetworkPolicy that admits only agent pods blocks this probe, not agents",
    )
