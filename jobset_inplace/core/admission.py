"""Admission logic for JobSets, as pure functions (no server, no kopf): what the mutating
webhook adds to an opted-in JobSet and what the validating webhook refuses.

* :func:`mutate`: JSON-patch ops that turn a JobSet into its :func:`~.transform.transform`
  (only on CREATE: a JobSet's pod templates are immutable afterwards).
* :func:`validate`: ``(allowed, message)``; the message names the annotation or field and the
  accepted form (guarantee 8).

The kopf handlers in :mod:`jobset_inplace.runtime.webhook_server` call these two and build
the AdmissionReview responses.

Only JobSets that opted in (``jobset-inplace.dev/enabled: "true"``) are changed; the webhook
configurations' ``matchConditions`` make sure the others never even reach the server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jsonpatch

from jobset_inplace import names
from jobset_inplace.core.agent_access import (
    AGENT_BINDING,
    AGENT_SERVICE_ACCOUNT,
    pod_service_account,
)
from jobset_inplace.core.policy import (
    CREATE_TIME_KEYS,
    CREATE_TIME_PRESENCE_KEYS,
    IMMUTABLE_KEYS,
    PolicyError,
    PolicyErrors,
    is_enabled,
    parse_enabled,
    parse_policy,
    raise_all,
    unknown_keys,
)
from jobset_inplace.core.spares import spare_spec
from jobset_inplace.core.torchrun import MAX_RESTARTS_ENV, max_restarts
from jobset_inplace.core.transform import (
    CHECKPOINT_ENV,
    DEFAULT_AGENT_IMAGE,
    AgentSettings,
    TransformError,
    has_agent,
    transform,
)
from jobset_inplace.launcher import ENV_CHECKPOINT_PERSISTENT_DIR
from jobset_inplace.trainer.layouts import Layout

JSONPatchOp = dict[str, Any]


def _annotations(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def mutate(jobset: Mapping[str, Any], settings: AgentSettings) -> list[JSONPatchOp]:
    """JSON-patch ops (RFC 6902) from ``jobset`` to its transform; ``[]`` when it did not
    opt in or is already transformed (the transform is idempotent).

    Raises :class:`~.policy.PolicyError` / :class:`~.transform.TransformError` when it cannot
    be made safe (:func:`validate` turns those into a refusal)."""
    if not is_enabled(_annotations(jobset)):
        return []
    before = json.loads(json.dumps(jobset))  # a plain, deep copy
    after = transform(before, settings)
    ops: list[JSONPatchOp] = jsonpatch.make_patch(before, after).patch
    return ops


# Refusals do not depend on the agent image; any settings give the same verdict.
_VALIDATION_SETTINGS = AgentSettings(image=DEFAULT_AGENT_IMAGE)


def _policy_keys(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return {k: v for k, v in _annotations(obj).items() if k.startswith(names.PREFIX)}


def _has_agent(jobset: Mapping[str, Any]) -> bool:
    rjs = (jobset.get("spec") or {}).get("replicatedJobs") or []
    return bool(rjs) and all(has_agent(rj) for rj in rjs)


def validate(jobset: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> tuple[bool, str]:
    """``(allowed, message)`` for a JobSet CREATE (``old`` is None) or UPDATE.

    * ``enabled`` must be ``"true"`` or ``"false"``; a JobSet that did not opt in is not
      checked any further (it is none of our business).
    * CREATE of an opted-in JobSet: every ``jobset-inplace.dev/*`` annotation parses and the
      transform accepts the spec (e.g. pod ``restartPolicy: Never``,
      ``completions == parallelism``).
    * UPDATE of an opted-in JobSet: only a change of its ``jobset-inplace.dev/*`` annotations
      is checked, so updates by other controllers (Kueue, JobSet) are never blocked by our
      policy. Opting in on UPDATE is refused unless every pod template already carries the
      agent: pod templates are immutable, and a gang without agents could never pass the
      barrier.
    """
    try:
        if not parse_enabled(_annotations(jobset)):
            return True, ""
        if old is None:
            _known_keys_only(jobset, None)
            transform(json.loads(json.dumps(jobset)), _VALIDATION_SETTINGS)
        else:
            _validate_update(jobset, old)
    except (PolicyError, TransformError) as e:
        return False, str(e)
    return True, ""


def _known_keys_only(jobset: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    """Refuse ``jobset-inplace.dev/*`` keys that mean nothing (typos), with every malformed
    value in the same answer; a key an existing JobSet already had is left alone (a JobSet
    made before an upgrade must stay updatable by Kueue and JobSet)."""
    before = _policy_keys(old)
    errors = [e for e in unknown_keys(_annotations(jobset)) if e.key not in before]
    try:
        parse_policy(_annotations(jobset))
    except PolicyErrors as e:
        errors += e.errors
    except PolicyError as e:
        errors.append(e)
    raise_all(errors)


def update_warnings(jobset: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    """A change of a create-time key on a live JobSet: admitted, but its pods keep the value
    they were created with."""
    if not is_enabled(_annotations(jobset)):
        return []
    before, after = _policy_keys(old), _policy_keys(jobset)
    changed = {k for k in CREATE_TIME_KEYS if before.get(k) != after.get(k)}
    changed |= {k for k in CREATE_TIME_PRESENCE_KEYS if (k in before) != (k in after)}
    return [
        f"annotation {key} is applied to the JobSet's pods when the JobSet is created: this "
        "change does not reach them (its spec is immutable); recreate the JobSet for it to "
        "take effect"
        for key in sorted(changed)
    ]


def warnings(jobset: Mapping[str, Any]) -> list[str]:
    """What an opted-in JobSet is admitted with but told about (kubectl prints each line).

    Pods that name their own ServiceAccount: the agent reads and reports with that account's
    token, so the controller binds the agent's rights to it, and the least-privilege admission
    policy confines its pod writes (core/agent_access.py): its owner should know."""
    if not is_enabled(_annotations(jobset)):
        return []
    out = _checkpoint_warnings(jobset) + _spare_warnings(jobset) + _hf_trainer_warnings(jobset)
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
        out += _torchrun_warnings(str(rj.get("name")), pod or {})
        out += _user_warnings(str(rj.get("name")), pod or {})
        account = pod_service_account(pod or {})
        if account and account != AGENT_SERVICE_ACCOUNT:
            out.append(
                f"replicatedJob {rj.get('name')!r}: pods run as ServiceAccount {account!r}: "
                f"the controller binds the agent's rights to it in this namespace (RoleBinding "
                f"{AGENT_BINDING}), and while an opted-in JobSet runs as it, {account!r} may "
                f"write pods only as an agent does: its own pod's {names.PREFIX} annotations, "
                f"whatever other rights it holds ({names.AGENT_POLICY})"
            )
    return out


def _user_warnings(replicated_job: str, pod: Mapping[str, Any]) -> list[str]:
    """The agent runs as the trainer's user (transform.agent_security_context), which only a
    ``runAsUser`` says: a non-root trainer by its image's user alone leaves the agent to its
    own image's, root, and the kubelet refuses to start it under ``runAsNonRoot``."""
    containers = pod.get("containers") or []
    first = (containers[0].get("securityContext") or {}) if containers else {}
    pod_context = pod.get("securityContext") or {}
    non_root = first.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    user = first.get("runAsUser", pod_context.get("runAsUser"))
    if non_root and user is None:
        return [
            f"replicatedJob {replicated_job!r}: runAsNonRoot without runAsUser: the "
            "jobset-inplace agent runs as the trainer's user, which only runAsUser names (the "
            "agent image's own user is root, which runAsNonRoot refuses): set runAsUser (and "
            "runAsGroup) on the pod or its first container"
        ]
    return []


def _checkpoint_warnings(jobset: Mapping[str, Any]) -> list[str]:
    """No checkpoint tier configured (no ``checkpoint-dirs``, no main container with
    ``JSI_CHECKPOINT_*``): the agents report no steps, so every recovery resumes from scratch."""
    if names.CHECKPOINT_DIRS in _annotations(jobset):
        return []
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
        for c in (pod or {}).get("containers") or []:
            if any(e.get("name") in CHECKPOINT_ENV for e in c.get("env") or []):
                return []
    return [
        f"no checkpoint tier is configured ({names.CHECKPOINT_DIRS}, or "
        f"{' / '.join(CHECKPOINT_ENV)} on the trainer containers): the agents report no "
        "checkpoint step, so every recovery restarts training from step 0 (resumeStep null); "
        "set one to resume from the gang's newest common checkpoint"
    ]


def _spare_warnings(jobset: Mapping[str, Any]) -> list[str]:
    """Hot spares without a persistent tier: a spare taking a member's place has none of its
    local checkpoints, so the gang resumes from the newest step every holder's tiers have,
    which then is none (escalation, or scratch)."""
    try:
        spare = spare_spec(jobset, prepared=False)
    except PolicyError:
        return []  # refused by validate, which names it
    if spare is None:
        return []
    try:
        dirs = parse_policy(_annotations(jobset)).checkpoint_dirs
    except PolicyError:
        return []
    if dirs.persistent:
        return []
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
        for c in (pod or {}).get("containers") or []:
            if any(e.get("name") == ENV_CHECKPOINT_PERSISTENT_DIR for e in c.get("env") or []):
                return []
    return [
        f"{names.HOT_SPARES}: {spare.spares} without a persistent checkpoint tier every pod "
        f"sees ({names.CHECKPOINT_DIRS} persistent=..., on storage the spares mount too): a "
        "spare that takes a member's place has none of that member's local checkpoints, so "
        "the gang can resume only from a step every holder has, and then there is none"
    ]


def _hf_trainer_warnings(jobset: Mapping[str, Any]) -> list[str]:
    """The Hugging Face Trainer with a local tier only: it writes the model weights from
    global rank 0 only (transformers 5.25's ``save_pretrained`` even with
    ``save_on_each_node``), so on each pod's own disk the other members' ``checkpoint-<S>``
    hold ``trainer_state.json``, which makes a step complete, but no weights to load."""
    try:
        policy = parse_policy(_annotations(jobset))
    except PolicyError:
        return []  # refused by validate, which names it
    dirs = policy.checkpoint_dirs
    if policy.checkpoint_layout is not Layout.HF_TRAINER or not dirs.local or dirs.persistent:
        return []
    return [
        f"{names.CHECKPOINT_LAYOUT}: {Layout.HF_TRAINER} with a local tier only "
        f"({names.CHECKPOINT_DIRS} persistent=..., a volume every pod mounts): the Trainer "
        "writes the model weights from global rank 0 only (even with save_on_each_node), so "
        "the other members' own disks would hold checkpoints without weights, which they "
        "cannot resume from; put output_dir on a volume every pod shares"
    ]


def _torchrun_warnings(replicated_job: str, pod: Mapping[str, Any]) -> list[str]:
    """Main containers whose ``torchrun`` restarts failed workers by itself."""
    out = []
    for c in pod.get("containers") or []:
        argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        env = {str(e.get("name")): str(e.get("value", "")) for e in c.get("env") or []}
        restarts = max_restarts(argv, env)
        if restarts:
            out.append(
                f"replicatedJob {replicated_job!r}, container {c.get('name')!r}: torchrun "
                f"--max-restarts {restarts} restarts failed workers inside the pod, so the "
                "failure never reaches jobset-inplace: the gang is not recovered together and "
                "resumes from no agreed step. Use --max-restarts 0 (torchrun's default; also "
                f"{MAX_RESTARTS_ENV}): a worker failure then ends torchrun and the gang "
                "recovers as one"
            )
    return out


def _validate_update(jobset: Mapping[str, Any], old: Mapping[str, Any]) -> None:
    before, after = _policy_keys(old), _policy_keys(jobset)
    if before == after:
        return
    for key in sorted(IMMUTABLE_KEYS):
        if before.get(key) != after.get(key):
            raise TransformError(
                f"annotation {key} cannot be changed on an existing JobSet (was "
                f"{before.get(key)!r}, now {after.get(key)!r}): the webhook made its "
                "replicatedJob's replicas from it when the JobSet was created; recreate the "
                "JobSet to change it"
            )
    if not is_enabled(_annotations(old)) and not _has_agent(jobset):
        raise TransformError(
            f'annotation {names.ENABLED}="true" cannot be added to an existing JobSet: the '
            "agent is injected when the JobSet is created (pod templates are immutable); "
            "create it with the annotation, or use `kubectl jobset-inplace enable`"
        )
    _known_keys_only(jobset, old)
