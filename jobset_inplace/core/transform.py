"""The JobSet transform: an opted-in JobSet made ready for hybrid recovery. Pure and
idempotent; the admission webhook, ``kubectl jobset-inplace enable`` and the demo all use it.

What it adds to every replicated Job (nothing else is changed):

* the agent as a sidecar (init container with ``restartPolicy: Always``) whose restart exit
  code triggers ``RestartAllContainers``, whose startupProbe is the gang barrier, with the
  downward-API env it needs and the shared state volume;
* on every main container: ``RestartAllContainers`` when it exits non-zero, the state volume;
  in the process restart scope (the default) its command runs under the launcher
  (:mod:`jobset_inplace.launcher`), which the agent starts and stops per epoch;
* on the Job: ``backoffLimit: 2147483647`` (in-place restarts never count, replacements must
  not fail the Job), ``podReplacementPolicy: Failed``, and a ``podFailurePolicy`` that fails
  the Job when the controller escalates;
* on the JobSet (only if it has none): a ``failurePolicy`` restarting it on that failure.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobset_inplace import __version__, names, prestart
from jobset_inplace.core.agent_access import (
    AGENT_SERVICE_ACCOUNT,
    SHARED_SERVICE_ACCOUNT,
    pod_service_account,
)
from jobset_inplace.core.agent_settings import DEFAULT_RESOURCES
from jobset_inplace.core.policy import Escalation, Policy, parse_policy
from jobset_inplace.core.spares import SpareSpec, spare_spec
from jobset_inplace.core.torchrun import identity_options
from jobset_inplace.launcher import (
    DEFAULT_STATE_DIR,
    ENV_CHECKPOINT_LOCAL_DIR,
    ENV_CHECKPOINT_PERSISTENT_DIR,
    ENV_CONTAINER,
    ENV_LEASE,
    ENV_PRESTART_IMPORTS,
    ENV_PRESTART_WARM,
    ENV_STATE_DIR,
    ENV_STOP_GRACE,
    LAUNCHER_FILE,
)
from jobset_inplace.names import RestartScope
from jobset_inplace.trainer.layouts import Layout

AGENT_CONTAINER = "jobset-inplace-agent"
# The image that runs the agent (Python 3 plus this package); the webhook and `enable` default.
DEFAULT_AGENT_IMAGE = f"jobset-inplace/agent:{__version__}"
STATE_VOLUME = "jobset-inplace-state"
STATE_DIR = DEFAULT_STATE_DIR
REPORT_TOKEN_VOLUME = "jobset-inplace-report-token"
REPORT_TOKEN_FILE = "token"
LAUNCHER_PATH = f"{STATE_DIR}/{LAUNCHER_FILE}"
# The process scope's entrypoint prefix: the trainer image's python3 runs the launcher.
LAUNCHER_COMMAND = ["python3", LAUNCHER_PATH, "--"]
# The agent holds to Pod Security's `restricted` profile (no privilege, no capability, the
# runtime's seccomp profile) and runs as the trainer runs: it renames the trainer's checkpoint
# markers, so it needs the trainer's user (the pod's, or the first main container's own
# runAsUser/runAsGroup/runAsNonRoot, copied). Files it shares on the state volume are
# world-readable either way.
AGENT_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
TRAINER_IDENTITY = ("runAsUser", "runAsGroup", "runAsNonRoot")
MAX_BACKOFF = 2147483647
DEFAULT_MAX_RESTARTS = 2


class TransformError(ValueError):
    """The JobSet cannot be made safe; the message names the field."""


@dataclass(frozen=True)
class AgentSettings:
    image: str
    image_pull_policy: str = "IfNotPresent"
    probe_port: int = names.DEFAULT_PROBE_PORT
    # Where agents reach the apiserver instead of the in-cluster Service (the tests' local-process
    # controller gives its agents the host's address); None: in-cluster config.
    api_server: str | None = None
    # the agent container's resources (core/agent_settings.py: parse_resources)
    resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_RESOURCES.items()}
    )
    # Secrets added to every prepared pod's imagePullSecrets (the agent image's registry);
    # the pod's own pull secrets stay, and serve the agent's image too
    image_pull_secrets: tuple[str, ...] = ()


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def agent_container(jobset_name: str, policy: Policy, s: AgentSettings) -> dict[str, Any]:
    process = policy.restart_scope == RestartScope.PROCESS
    return {
        "name": AGENT_CONTAINER,
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "command": ["python3", "-m", "jobset_inplace.agent"],
        "restartPolicy": "Always",
        # The agent exits with the restart code when its epoch is outdated. Any other non-zero
        # exit (a crash, an OOM kill) must restart the whole pod too: a lone new agent could
        # not tell that its trainer is still running an old epoch.
        "restartPolicyRules": [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
        ],
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("POD_UID", "metadata.uid"),
            {
                "name": names.ENV_REPORT_TOKEN_FILE,
                "value": f"{names.REPORT_TOKEN_DIR}/{REPORT_TOKEN_FILE}",
            },
            {"name": names.ENV_GANGSTATE, "value": jobset_name},
            {"name": ENV_STATE_DIR, "value": STATE_DIR},
            {"name": names.ENV_RESTART_EXIT_CODE, "value": str(policy.restart_exit_code)},
            {"name": names.ENV_PROBE_PORT, "value": str(s.probe_port)},
            {"name": names.ENV_RESTART_SCOPE, "value": policy.restart_scope.value},
            *([{"name": names.ENV_API_SERVER, "value": s.api_server}] if s.api_server else []),
            *_seconds_env(names.ENV_HANG_TIMEOUT, policy.hang_timeout_s),
            *_seconds_env(names.ENV_STARTUP_TIMEOUT, policy.startup_timeout_s),
            *_straggler_env(policy),
            *_layout_env(policy),
        ],
        # Pod scope: the barrier; main containers start only once this passes. Process scope:
        # passes once the launcher is installed (the launchers hold the trainers). Its
        # failures restart only the agent (137 is not the restart code); the controller owns
        # deadlines.
        "startupProbe": {
            "httpGet": {"path": "/started" if process else "/barrier", "port": s.probe_port},
            "periodSeconds": 1,
            "failureThreshold": 100000,
        },
        "volumeMounts": [
            {"name": STATE_VOLUME, "mountPath": STATE_DIR},
            {"name": REPORT_TOKEN_VOLUME, "mountPath": names.REPORT_TOKEN_DIR, "readOnly": True},
        ],
        "resources": {kind: dict(values) for kind, values in s.resources.items()},
    }


def report_token_volume() -> dict[str, Any]:
    """The agent's token for the report channel: its own audience, so the controller never
    receives a token the apiserver would accept."""
    token = {
        "audience": names.REPORT_TOKEN_AUDIENCE,
        "expirationSeconds": names.REPORT_TOKEN_SECONDS,
        "path": REPORT_TOKEN_FILE,
    }
    return {"name": REPORT_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def _seconds_env(name: str, seconds: float | None) -> list[dict[str, Any]]:
    return [] if seconds is None else [{"name": name, "value": f"{seconds:g}"}]


def _straggler_env(policy: Policy) -> list[dict[str, Any]]:
    if policy.straggler_factor is None:
        return []
    return [
        *_seconds_env(names.ENV_STRAGGLER_WINDOW, policy.straggler_window_s),
        {"name": names.ENV_STRAGGLER_WINDOWS, "value": str(policy.straggler_windows)},
    ]


def _layout_env(policy: Policy) -> list[dict[str, Any]]:
    if policy.checkpoint_layout is Layout.JOBSET_INPLACE:
        return []
    return [
        {"name": names.ENV_CHECKPOINT_LAYOUT, "value": policy.checkpoint_layout.value},
        *(
            [{"name": names.ENV_CHECKPOINT_STEP_PATTERN, "value": policy.checkpoint_step_pattern}]
            if policy.checkpoint_step_pattern
            else []
        ),
    ]


def _add_by_name(items: list[dict[str, Any]], item: dict[str, Any]) -> list[dict[str, Any]]:
    """Replace the entry with the same name, or append (keeps order: idempotent)."""
    out = [i for i in items if i.get("name") != item["name"]]
    if len(out) == len(items):
        return [*items, item]
    return [item if i.get("name") == item["name"] else i for i in items]


CHECKPOINT_ENV = (ENV_CHECKPOINT_LOCAL_DIR, ENV_CHECKPOINT_PERSISTENT_DIR)


# A $(VAR) reference in an env value or a subPathExpr (expanded by the kubelet).
_ENV_REFERENCE = re.compile(r"\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def agent_security_context(containers: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent's securityContext: restricted, as the first main container's user."""
    own = (containers[0].get("securityContext") or {}) if containers else {}
    return {**AGENT_SECURITY_CONTEXT, **{k: own[k] for k in TRAINER_IDENTITY if k in own}}


def _share_checkpoint_tiers(agent: dict[str, Any], containers: list[dict[str, Any]]) -> None:
    """The agent reports the checkpoints the trainer writes: give it the trainer's checkpoint
    tier variables and the volume mounts those directories live on, with the variables they
    refer to (``/ckpt/$(JOB_INDEX)``, ``subPathExpr: $(JOB_INDEX)``: per-member roots), so
    that the agent's paths expand to the trainer's."""
    for c in containers:
        for env in c.get("env") or []:
            if env.get("name") not in CHECKPOINT_ENV or "value" not in env:
                continue
            _share_references(agent, c, env["value"])
            agent["env"] = _add_by_name(agent["env"], dict(env))
            path = env["value"].rstrip("/") + "/"
            for m in c.get("volumeMounts") or []:
                if path.startswith(m["mountPath"].rstrip("/") + "/"):
                    _share_references(agent, c, m.get("subPathExpr") or "")
                    mounts = [x for x in agent["volumeMounts"] if x["name"] != m["name"]]
                    agent["volumeMounts"] = [*mounts, {**m, "readOnly": False}]


def _share_references(
    agent: dict[str, Any], container: dict[str, Any], text: str, seen: frozenset[str] = frozenset()
) -> None:
    """Add the env entries of ``container`` that ``text`` refers to (and those they refer to)
    to the agent, before whatever refers to them (the kubelet expands only earlier ones)."""
    defined = {e.get("name"): e for e in container.get("env") or []}
    for name in _ENV_REFERENCE.findall(text):
        entry = defined.get(name)
        if entry is None or name in seen or any(e.get("name") == name for e in agent["env"]):
            continue  # not the container's (the Job's own, or a Service's), or already there
        _share_references(agent, container, entry.get("value") or "", seen | {name})
        agent["env"] = _add_by_name(agent["env"], dict(entry))


def _prepare_pod(
    pod: dict[str, Any], agent: dict[str, Any], where: str, s: AgentSettings, policy: Policy
) -> None:
    spec = pod.setdefault("spec", {})
    labels = pod.setdefault("metadata", {}).setdefault("labels", {})
    labels[names.AGENT_POD_LABEL] = "true"
    agent = copy.deepcopy(agent)
    tiers = {
        ENV_CHECKPOINT_LOCAL_DIR: policy.checkpoint_dirs.local,
        ENV_CHECKPOINT_PERSISTENT_DIR: policy.checkpoint_dirs.persistent,
    }
    for c in spec.get("containers") or []:
        for name, value in tiers.items():
            if value and not any(e.get("name") == name for e in c.get("env") or []):
                c["env"] = [*(c.get("env") or []), {"name": name, "value": value}]
    _share_checkpoint_tiers(agent, spec.get("containers") or [])
    agent["securityContext"] = agent_security_context(spec.get("containers") or [])
    if policy.prestart_warm and not policy.prestart_imports:
        raise TransformError(
            f"{names.PRESTART_WARM} needs {names.PRESTART_IMPORTS} (the modules the held "
            "trainer imports before its script runs, e.g. torch): set it, or remove "
            f"{names.PRESTART_WARM}"
        )
    if policy.restart_scope == RestartScope.PROCESS:
        _launch(spec.get("containers") or [], agent, where, policy)
    elif policy.prestart_imports or policy.prestart_warm:
        key = names.PRESTART_IMPORTS if policy.prestart_imports else names.PRESTART_WARM
        raise TransformError(
            f"{key} needs {names.RESTART_SCOPE}: {RestartScope.PROCESS} (a pod restart starts "
            f"every container anew): remove it, or set that scope"
        )
    if spec.get("restartPolicy", "Never") != "Never":
        raise TransformError(
            f"{where}.spec.restartPolicy must be Never (in-place restarts and "
            f"the Job failure policy need it), got {spec['restartPolicy']!r}"
        )
    spec["restartPolicy"] = "Never"
    volumes = _add_by_name(spec.get("volumes") or [], {"name": STATE_VOLUME, "emptyDir": {}})
    spec["volumes"] = _add_by_name(volumes, report_token_volume())
    spec["initContainers"] = _add_by_name(spec.get("initContainers") or [], agent)
    if pod_service_account(spec) == SHARED_SERVICE_ACCOUNT:
        raise TransformError(
            f"{where}.spec.serviceAccountName: {SHARED_SERVICE_ACCOUNT} is refused: every pod "
            "of the namespace that names none runs as it, and jobset-inplace binds the agent's "
            "rights to the account its pods run as and confines that account's pod writes to "
            "the agent's (docs/operations.md); name an account of the training's own, or none "
            f"({AGENT_SERVICE_ACCOUNT} is then used)"
        )
    if pod_service_account(spec) is None:
        spec["serviceAccountName"] = AGENT_SERVICE_ACCOUNT
    for secret in s.image_pull_secrets:
        spec["imagePullSecrets"] = _add_by_name(
            spec.get("imagePullSecrets") or [], {"name": secret}
        )
    rule = {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
    for i, c in enumerate(spec.get("containers") or []):
        rules = c.get("restartPolicyRules")
        if rules not in (None, [rule]):
            raise TransformError(
                f"{where}.spec.containers[{i}].restartPolicyRules: jobset-inplace sets "
                "[RestartAllContainers on exit codes NotIn [0]]; remove your rules"
            )
        c["restartPolicy"] = "Never"
        c["restartPolicyRules"] = [rule]
        mount = {"name": STATE_VOLUME, "mountPath": STATE_DIR}
        c["volumeMounts"] = _add_by_name(c.get("volumeMounts") or [], mount)
        env = _add_by_name(c.get("env") or [], {"name": ENV_STATE_DIR, "value": STATE_DIR})
        # Its state file's name (launcher) and its progress record's (hang detection).
        c["env"] = _add_by_name(env, {"name": ENV_CONTAINER, "value": c["name"]})


def _launch(
    containers: list[dict[str, Any]], agent: dict[str, Any], where: str, policy: Policy
) -> None:
    """Process scope: every main container's command runs under the launcher."""
    grace = {"name": ENV_STOP_GRACE, "value": f"{policy.trainer_stop_grace_s:g}"}
    for i, c in enumerate(containers):
        command = list(c.get("command") or [])
        if not command:
            raise TransformError(
                f"{where}.spec.containers[{i}].command is required with "
                f"{names.RESTART_SCOPE}: {RestartScope.PROCESS} (the launcher runs it; the "
                f"image's entrypoint cannot be read here): set it, or set "
                f"{names.RESTART_SCOPE}: {RestartScope.POD}"
            )
        if command[: len(LAUNCHER_COMMAND)] == LAUNCHER_COMMAND:
            command = command[len(LAUNCHER_COMMAND) :]
        c["command"] = [*LAUNCHER_COMMAND, *command]
        c["env"] = _add_by_name(c.get("env") or [], grace)
        if policy.prestart_imports:
            why = prestart.refusal([*command, *(c.get("args") or [])])
            if why is not None:
                raise TransformError(
                    f"{where}.spec.containers[{i}].command cannot be pre-started "
                    f"({names.PRESTART_IMPORTS}): {why}"
                )
            imports = {"name": ENV_PRESTART_IMPORTS, "value": ",".join(policy.prestart_imports)}
            c["env"] = _add_by_name(c["env"], imports)
        if policy.prestart_warm:
            _warm(c, [*command, *(c.get("args") or [])], f"{where}.spec.containers[{i}]")
    launched = ",".join(c["name"] for c in containers)
    launched_env = {"name": names.ENV_LAUNCHED_CONTAINERS, "value": launched}
    agent["env"] = _add_by_name(agent["env"], launched_env)
    agent["env"] = _add_by_name(agent["env"], grace)


def _warm(container: dict[str, Any], argv: list[str], where: str) -> None:
    """prestart-warm: the trainer's own process holds itself (one per container)."""
    why = prestart.warm_refusal(argv)
    if why is not None:
        raise TransformError(
            f"{where}.command: {names.PRESTART_WARM} is refused: {why} (or leave "
            f"{names.PRESTART_WARM} out: {names.PRESTART_IMPORTS} alone pre-starts launchers)"
        )
    container["env"] = _add_by_name(container["env"], {"name": ENV_PRESTART_WARM, "value": "1"})


def _declared_spares(jobset: dict[str, Any]) -> SpareSpec | None:
    """The JobSet's hot spares, read as its owner wrote it, or as this transform left it (its
    spares' pod template has the agent already: its ``replicas`` include them)."""
    spare = spare_spec(jobset, prepared=False)
    if spare is None:
        return None
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if rj.get("name") == spare.replicated_job and has_agent(rj):
            return spare_spec(jobset, prepared=True)
    return spare


def has_agent(replicated_job: Mapping[str, Any]) -> bool:
    """Whether the replicatedJob's pod template has the agent (this transform ran on it)."""
    pod = ((replicated_job.get("template") or {}).get("spec") or {}).get("template") or {}
    inits = (pod.get("spec") or {}).get("initContainers") or []
    return any(c.get("name") == AGENT_CONTAINER for c in inits)


# Pod labels a trainer must not take its rank from when a spare may take its place: the
# position's job index is not the member's rank once a spare holds its slot.
_POSITION_FIELDS = (
    f"metadata.labels['{names.JOB_INDEX_LABEL}']",
    f"metadata.annotations['{names.JOB_INDEX_LABEL}']",
    "metadata.name",
)


def _spare_agent(
    agent: dict[str, Any],
    spare: SpareSpec,
    jobset: Mapping[str, Any],
    job: Mapping[str, Any],
    *,
    where: str,
    policy: Policy,
) -> dict[str, Any]:
    """The agent of the spares' replicatedJob (with what it needs to know its slot), after
    checking that a pod there can take any member's place: one pod per member, the process
    scope (the launcher gives each epoch its rank), pod DNS names (slot 0's holder is the
    rendezvous host), and no rank fixed in the pod's own spec."""
    what = f"{names.HOT_SPARES}: {spare.spares}"
    if policy.prestart_warm:
        raise TransformError(
            f"{names.PRESTART_WARM} is not supported with {what} yet (a spare's rank comes with "
            f"its word, after a warm standby built its model): remove one of them "
            "(docs/design/warm-standby.md)"
        )
    if job.get("parallelism", 1) != 1:
        raise TransformError(
            f"{where}.template.spec.parallelism must be 1 with {what} (one pod per member: "
            f"the unit a spare replaces), got {job.get('parallelism')}"
        )
    if policy.restart_scope != RestartScope.PROCESS:
        raise TransformError(
            f"{what} needs {names.RESTART_SCOPE}: {RestartScope.PROCESS} (the launcher gives "
            "each epoch's trainer the rank of the slot its pod holds; a pod restart re-runs "
            "the environment fixed when the pod was made)"
        )
    network = (jobset.get("spec") or {}).get("network") or {}
    if network.get("enableDNSHostnames") is False:
        raise TransformError(
            f"spec.network.enableDNSHostnames: false is refused with {what}: the trainers "
            "reach rank 0 by its pod's DNS name, which changes when a spare takes its place"
        )
    pod = (job.get("template") or {}).get("spec") or {}
    for i, c in enumerate(pod.get("containers") or []):
        argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        pinned = identity_options(argv)
        if pinned:
            raise TransformError(
                f"{where}.template.spec.containers[{i}]: torchrun {pinned} is refused with "
                f"{what}: a spare takes a member's rank and rendezvous host, which the "
                f"launcher gives each epoch ({names.ENV_TORCHRUN_NODE_RANK}, "
                f"{names.ENV_TORCHRUN_MASTER_ADDR}: torchrun reads them when they are not on "
                "its command line); remove it (a static rendezvous: no --rdzv-backend c10d)"
            )
        for e in c.get("env") or []:
            path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if path in _POSITION_FIELDS:
                raise TransformError(
                    f"{where}.template.spec.containers[{i}].env {e.get('name')}: {path} is "
                    f"refused with {what}: it is the pod's position, not its member's rank "
                    f"once a spare holds the member's slot; read {names.ENV_SLOT} (set by the "
                    "launcher for each epoch) instead"
                )
    subdomain = network.get("subdomain") or (jobset.get("metadata") or {}).get("name")
    job_index = f"metadata.labels['{names.JOB_INDEX_LABEL}']"
    out = copy.deepcopy(agent)
    for item in (
        {"name": names.ENV_SLOTS, "value": str(spare.members)},
        {"name": names.ENV_REPLICATED_JOB, "value": spare.replicated_job},
        _field_env(names.ENV_JOB_INDEX, job_index),
        {"name": names.ENV_PEER_DOMAIN, "value": str(subdomain)},
    ):
        out["env"] = _add_by_name(out["env"], item)
    return out


FAIL_JOBSET_RULE = {
    "name": "jobset-inplace-escalation",
    "action": "FailJobSet",
    "onJobFailureReasons": ["PodFailurePolicy"],
}
ESCALATION_RULE = {
    "action": "FailJob",
    "onPodConditions": [{"type": names.ESCALATION_CONDITION, "status": "True"}],
}


def transform(jobset: dict[str, Any], settings: AgentSettings) -> dict[str, Any]:
    """The JobSet with everything hybrid recovery needs; raises :class:`TransformError` (or
    :class:`~.policy.PolicyError` for bad annotations) when it cannot be made safe."""
    out = copy.deepcopy(jobset)
    meta = out.get("metadata") or {}
    policy = parse_policy(meta.get("annotations"))
    name = meta.get("name")
    if not name:
        raise TransformError("metadata.name is required (generateName is not supported)")
    agent = agent_container(name, policy, settings)
    spec = out.setdefault("spec", {})
    spare = _declared_spares(out)
    for r, rj in enumerate(spec.get("replicatedJobs") or []):
        where = f"spec.replicatedJobs[{r}].template.spec"
        job = rj.setdefault("template", {}).setdefault("spec", {})
        par, comp = job.get("parallelism", 1), job.get("completions", job.get("parallelism", 1))
        if par != comp:
            raise TransformError(
                f"{where}: completions ({comp}) must equal parallelism ({par}) "
                "so every member is one long-running pod"
            )
        pod_agent = agent
        if spare is not None and rj.get("name") == spare.replicated_job:
            rj["replicas"] = spare.members + spare.spares
            where_rj = f"spec.replicatedJobs[{r}]"
            pod_agent = _spare_agent(agent, spare, out, job, where=where_rj, policy=policy)
        job["backoffLimit"] = MAX_BACKOFF
        job["podReplacementPolicy"] = "Failed"
        pfp = job.setdefault("podFailurePolicy", {"rules": []})
        rules = pfp.setdefault("rules", [])
        if ESCALATION_RULE not in rules:
            rules.insert(0, copy.deepcopy(ESCALATION_RULE))
        _prepare_pod(
            job.setdefault("template", {}), pod_agent, f"{where}.template", settings, policy
        )
        if pod_agent is not agent:  # the spares' pods: a trainer runs only under a lease
            lease = {"name": ENV_LEASE, "value": "1"}
            for c in job["template"]["spec"].get("containers") or []:
                c["env"] = _add_by_name(c.get("env") or [], lease)
    fp = spec.get("failurePolicy")
    if policy.escalation == Escalation.FAIL_JOBSET:
        # An escalation fails the Job with reason PodFailurePolicy: fail the whole JobSet on it.
        rules = spec.setdefault("failurePolicy", {"maxRestarts": 0}).setdefault("rules", [])
        if FAIL_JOBSET_RULE not in rules:
            rules.insert(0, copy.deepcopy(FAIL_JOBSET_RULE))
    elif fp is None:
        spec["failurePolicy"] = {"maxRestarts": DEFAULT_MAX_RESTARTS}
    elif int(fp.get("maxRestarts", 0)) < 1:
        raise TransformError(
            "spec.failurePolicy.maxRestarts must be >= 1: escalation restarts the JobSet "
            f"through its failure policy (or set {names.ESCALATION}: {Escalation.FAIL_JOBSET})"
        )
    return out
