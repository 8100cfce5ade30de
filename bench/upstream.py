"""JobSet's own in-place restart (v0.12, the ``InPlaceRestart`` gate) as the benchmarks run it:
the gang shape of its examples, the RBAC its agent needs, and its protocol's names.

Upstream's protocol (``sigs.k8s.io/jobset`` v0.12.0: ``cmd/in-place-restart-agent/main.go``,
``pkg/controllers/in_place_restart.go``): each agent process LIST+WATCHes its JobSet and, once
per process, server-side-applies ``in-place-restart-attempt = current + 1`` (0 when the JobSet
has none) on its own pod. The JobSet controller sets ``status.previousInPlaceRestartAttempt`` to
the pods' highest attempt - 1; an agent whose pod's attempt is <= previous exits with the
in-place-restart code (its pod's rule restarts every container, so a new agent process
follows). Once every pod holds the same attempt the controller sets
``status.currentInPlaceRestartAttempt`` to it, and each agent lifts its barrier (sidecar mode:
its startupProbe passes, the trainer container starts).
"""

from __future__ import annotations

from typing import Any

from jobset_inplace import names
from jobset_inplace.core.transform import MAX_BACKOFF

AGENT = "in-place-restart-agent"  # the agent container's name, and its field manager
SERVICE_ACCOUNT = "upstream-ipr-agent"
EXIT_CODE = 88  # IN_PLACE_RESTART_EXIT_CODE (upstream's default is 1)
PROBE_PORT = 8081
PROBE_PATH = "/barrier-is-down"
ATTEMPT_ANNOTATION = "jobset.sigs.k8s.io/in-place-restart-attempt"
GATES = {"InPlaceRestart": True}  # the JobSet controller's alpha gate, for these runs only


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def in_place_restart(
    jobset: dict[str, Any], mode: str, *, image: str, agent_path: str
) -> dict[str, Any]:
    """``jobset`` (modified and returned) set up for upstream's InPlaceRestart as its v0.12
    examples do: ``sidecar`` (the agent an init sidecar holding a startupProbe barrier, every
    container restarted by the pod's ``RestartAllContainers`` rules) or ``main`` (the agent is
    the trainer container's entrypoint, container-level ``Restart``). The trainer is the first
    container of each replicatedJob's pod."""
    if mode not in ("sidecar", "main"):
        raise ValueError(f"mode: expected sidecar or main, got {mode!r}")
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 1000, "restartStrategy": "InPlaceRestart"}
    for rj in jobset["spec"]["replicatedJobs"]:
        job = rj["template"]["spec"]
        job.update(backoffLimit=MAX_BACKOFF, podReplacementPolicy="Failed")
        pod = job["template"]["spec"]
        pod["serviceAccountName"] = SERVICE_ACCOUNT
        trainer = pod["containers"][0]
        env = [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("JOBSET_NAME", f"metadata.labels['{names.JOBSET_NAME_LABEL}']"),
            {"name": "IN_PLACE_RESTART_EXIT_CODE", "value": str(EXIT_CODE)},
        ]
        trainer["restartPolicy"] = "Never"
        if mode == "sidecar":
            pod["initContainers"] = [
                {
                    "name": AGENT,
                    "image": image,
                    "imagePullPolicy": "Never",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [
                        {
                            "action": "RestartAllContainers",
                            "exitCodes": {"operator": "In", "values": [EXIT_CODE]},
                        }
                    ],
                    "env": [*env, {"name": "STARTUP_PROBE_PORT", "value": str(PROBE_PORT)}],
                    "startupProbe": {
                        "httpGet": {"path": PROBE_PATH, "port": PROBE_PORT},
                        "periodSeconds": 1,
                        "failureThreshold": 100000,
                    },
                }
            ]
            any_failure = {"operator": "NotIn", "values": [0]}
            trainer["restartPolicyRules"] = [
                {"action": "RestartAllContainers", "exitCodes": any_failure}
            ]
        else:  # main-container mode: the agent runs the trainer and restarts only its container
            command = " ".join(trainer.pop("command"))
            trainer["image"] = image
            trainer["command"] = [agent_path]
            trainer["env"] = [
                *trainer.get("env", []),
                *env,
                {"name": "WORKER_COMMAND", "value": command},
                {"name": "SHELL", "value": "/bin/sh"},  # the agent image has no bash
            ]
            trainer["restartPolicyRules"] = [
                {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}
            ]
    return jobset


def rbac(namespace: str) -> list[dict[str, Any]]:
    """What upstream's agent needs: watch its JobSet, apply its pod's annotation."""
    meta = {"name": SERVICE_ACCOUNT, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": ["jobset.x-k8s.io"],
                    "resources": ["jobsets"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SERVICE_ACCOUNT,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}
            ],
        },
    ]
