"""Admission logic (pure): what the mutating webhook patches, what the validating webhook
refuses and with which message, the kopf handlers (their operations, patch and refusals), and
that the shipped manifests match the code."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import jsonpatch
import kopf
import pytest
import yaml

from jobset_inplace import names
from jobset_inplace.core.admission import mutate, update_warnings, validate, warnings
from jobset_inplace.core.agent_access import (
    AGENT_BINDING_LABEL,
    AGENT_SERVICE_ACCOUNT,
    agent_cluster_role,
    desired_binding,
)
from jobset_inplace.core.policy import (
    CREATE_TIME_KEYS,
    CREATE_TIME_PRESENCE_KEYS,
    IMMUTABLE_KEYS,
    KNOWN_KEYS,
    PolicyError,
)
from jobset_inplace.core.transform import (
    DEFAULT_AGENT_IMAGE,
    AgentSettings,
    transform,
)
from jobset_inplace.runtime.webhook_server import (
    MUTATE_ID,
    VALIDATE_ID,
    register_webhooks,
    server_from_env,
    settings_from_env,
)

REPO = Path(__file__).resolve().parents[2]
S = AgentSettings(image="example.test/agent:1")


def jobset(annotations: dict[str, str] | None = None, **pod_spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "annotations": {names.ENABLED: "true"} if annotations is None else annotations,
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "template": {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "trainer",
                                            "image": "t",
                                            "command": ["python3", "train.py"],
                                        }
                                    ],
                                    **pod_spec,
                                }
                            },
                        }
                    },
                }
            ]
        },
    }


def job_spec(js: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    return spec


# --- mutate ---------------------------------------------------------------------------------


def test_mutate_patch_yields_the_transform() -> None:
    js = jobset()
    ops = mutate(js, S)
    assert ops
    assert jsonpatch.apply_patch(js, ops) == transform(js, S)
    assert js == jobset()  # the input is not modified


def test_mutate_is_empty_when_already_transformed_or_not_opted_in() -> None:
    assert mutate(transform(jobset(), S), S) == []
    assert mutate(jobset({}), S) == []
    assert mutate(jobset({names.ENABLED: "false"}), S) == []
    assert mutate(jobset({"team": "ml"}), S) == []


def test_mutate_refuses_what_cannot_be_made_safe() -> None:
    with pytest.raises(PolicyError):
        mutate(jobset({names.ENABLED: "true", names.FORCE_DELETE: "always"}), S)


# --- validate -------------------------------------------------------------------------------


def test_not_opted_in_is_none_of_our_business() -> None:
    assert validate(jobset({})) == (True, "")
    assert validate(jobset({names.ENABLED: "false", names.BARRIER_TIMEOUT: "soon"})) == (True, "")
    assert validate(jobset({"team": "ml"}, restartPolicy="OnFailure")) == (True, "")


@pytest.mark.parametrize("value", ["True", "yes", "1", ""])
def test_enabled_typo_names_the_key_and_accepted_form(value: str) -> None:
    allowed, message = validate(jobset({names.ENABLED: value}))
    assert not allowed
    assert names.ENABLED in message
    assert '"true" or "false"' in message


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        (names.BARRIER_TIMEOUT, "five minutes", "30s, 5m or 1h30m"),
        # admitted before, then every planning pass of the gang raised (RFC 3339 ends in 9999)
        (names.BARRIER_TIMEOUT, "99999999h", "from 30s to 24h"),
        (names.BARRIER_TIMEOUT, "0s", "from 30s to 24h"),  # a JobSet restart in 67 ms
        (names.NODE_UNHEALTHY_AFTER, "0s", "from 5s to 1h"),  # the flap filter off
        (names.NODE_UNHEALTHY_AFTER, "2h", "from 5s to 1h"),
        (names.KUEUE_RECOVERY_TIMEOUT, "1m", "from 1m15s to 168h"),
        (names.INPLACE_BUDGET, "-1", "0 to 10000"),
        (names.INPLACE_BUDGET, "+1", "0 to 10000"),
        (names.INPLACE_BUDGET, "\uff11", "0 to 10000"),  # full-width digit one
        (names.INPLACE_BUDGET, "1_0", "0 to 10000"),
        (names.INPLACE_BUDGET, "9" * 5000, "0 to 10000"),  # past int()'s 4300 digits
        (names.RECREATE_BUDGET, " 1", "0 to 10000"),
        (names.MEMBER_REPEAT_LIMIT, "03", "1 to 1000"),
        (names.FORCE_DELETE, "always", "never or unreachable"),
        (names.RESTART_EXIT_CODE, "1", "3 to 255"),
        (names.UNHEALTHY_TAINTS, ",", "comma-separated list"),
    ],
)
def test_bad_annotation_names_the_key_and_accepted_form(
    key: str, value: str, accepted: str
) -> None:
    allowed, message = validate(jobset({names.ENABLED: "true", key: value}))
    assert not allowed
    assert key in message
    assert repr(value)[:80] in message
    assert accepted in message
    assert len(message) < 512  # a huge value is shown cut


def test_transform_refusals_name_the_field() -> None:
    allowed, message = validate(jobset(restartPolicy="OnFailure"))
    assert not allowed
    assert "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy" in message
    assert "Never" in message
    js = jobset()
    job_spec(js)["completions"] = 3
    allowed, message = validate(js)
    assert not allowed
    assert "completions (3) must equal parallelism (2)" in message


def test_valid_and_transformed_jobsets_are_allowed() -> None:
    good = jobset(
        {names.ENABLED: "true", names.BARRIER_TIMEOUT: "1h30m", names.INPLACE_BUDGET: "3"}
    )
    assert validate(good) == (True, "")
    assert validate(transform(good, S)) == (True, "")


@pytest.mark.parametrize(
    "values",
    [
        ("30s", "5s", "1m15s", "0", "0", "1", "3"),  # every lower bound
        ("24h", "1h", "168h", "10000", "10000", "1000", "255"),  # every upper bound
    ],
    ids=["lower bounds", "upper bounds"],
)
def test_both_ends_of_every_range_are_admitted(values: tuple[str, ...]) -> None:
    keys = (
        names.BARRIER_TIMEOUT,
        names.NODE_UNHEALTHY_AFTER,
        names.KUEUE_RECOVERY_TIMEOUT,
        names.INPLACE_BUDGET,
        names.RECREATE_BUDGET,
        names.MEMBER_REPEAT_LIMIT,
        names.RESTART_EXIT_CODE,
    )
    annotations = {names.ENABLED: "true", **dict(zip(keys, values, strict=True))}
    assert validate(jobset(annotations)) == (True, "")
    assert validate(transform(jobset(annotations), S)) == (True, "")


def test_update_checks_only_changed_policy_annotations() -> None:
    old = transform(jobset(), S)
    # An update by another controller (e.g. Kueue resuming it) with unchanged annotations is
    # never blocked, even if our rules would refuse something else in the spec now.
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    job_spec(new)["completions"] = 5
    assert validate(new, old) == (True, "")
    bad = copy.deepcopy(old)
    bad["metadata"]["annotations"][names.INPLACE_BUDGET] = "lots"
    allowed, message = validate(bad, old)
    assert not allowed
    assert names.INPLACE_BUDGET in message
    good = copy.deepcopy(old)
    good["metadata"]["annotations"][names.INPLACE_BUDGET] = "20"
    assert validate(good, old) == (True, "")


def test_a_typo_key_is_refused_with_every_bad_key_and_the_nearest_name() -> None:
    typo = f"{names.PREFIX}inplace-budgte"
    bad = jobset({names.ENABLED: "true", typo: "3", names.BARRIER_TIMEOUT: "soon"})
    allowed, message = validate(bad)
    assert not allowed
    assert f"(did you mean {names.INPLACE_BUDGET}?)" in message
    assert names.BARRIER_TIMEOUT in message, "every bad key in one answer"
    assert validate(jobset({names.ENABLED: "false", typo: "3"})) == (True, ""), "not ours"
    # a JobSet admitted with the typo before an upgrade stays updatable (Kueue, JobSet) ...
    old = transform(jobset(), S)
    old["metadata"]["annotations"][typo] = "3"
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][names.INPLACE_BUDGET] = "4"
    assert validate(new, old) == (True, "")
    # ... but no new unknown key is added to one
    newer = copy.deepcopy(new)
    newer["metadata"]["annotations"][f"{names.PREFIX}recreate-budgte"] = "1"
    allowed, message = validate(newer, new)
    assert not allowed
    assert f"(did you mean {names.RECREATE_BUDGET}?)" in message


# Two valid values of every policy key (CHECKPOINT_STEP_PATTERN with a layout that takes one)
TWO_VALUES: dict[str, tuple[str, str]] = {
    names.INPLACE_BUDGET: ("1", "2"),
    names.RECREATE_BUDGET: ("1", "2"),
    names.BARRIER_TIMEOUT: ("1m", "2m"),
    names.NODE_UNHEALTHY_AFTER: ("5s", "10s"),
    names.UNHEALTHY_TAINTS: ("a.io/x", "b.io/y"),
    names.UNHEALTHY_CONDITIONS: ("GPUFault", "KernelDeadlock"),
    names.FORCE_DELETE: ("never", "unreachable"),
    names.MEMBER_REPEAT_LIMIT: ("1", "2"),
    names.NO_PROGRESS_LIMIT: ("0", "3"),
    names.NO_COMMON_CHECKPOINT: ("scratch", "escalate"),
    names.RESTART_EXIT_CODE: ("3", "4"),
    names.CHECKPOINT_DIRS: ("persistent=/a", "persistent=/b"),
    names.CHECKPOINT_LAYOUT: ("orbax", "torch-dcp"),
    names.CHECKPOINT_STEP_PATTERN: ("ckpt-{step}", "c{step}"),
    names.ESCALATION: ("fail-jobset", "restart-jobset"),
    names.KUEUE_RECOVERY_TIMEOUT: ("3m", "5m"),
    names.TAINT_ON_DEVICE_FAULT: ("true", "false"),
    names.RESTART_SCOPE: ("pod", "process"),
    names.TRAINER_STOP_GRACE: ("0s", "1s"),
    names.PRESTART_IMPORTS: ("torch", "numpy"),
    names.PRESTART_WARM: ("true", "false"),
    names.HANG_TIMEOUT: ("10m", "20m"),
    names.STARTUP_TIMEOUT: ("10m", "20m"),
    names.STRAGGLER_FACTOR: ("1.5", "2"),
    names.STRAGGLER_WINDOWS: ("2", "3"),
    names.STRAGGLER_WINDOW: ("1m", "2m"),
    names.STRAGGLER_ACTION: ("report", "recreate"),
    names.PLANNED_MOVES: ("true", "false"),
    names.PLANNED_MOVE_TIMEOUT: ("2m", "1h"),
}


def test_create_time_keys_are_exactly_those_the_transform_writes_into_the_spec() -> None:
    """The warning on update must name a key iff its value (or, for a presence key, whether
    it is set) reaches the JobSet's spec."""
    assert set(TWO_VALUES) == KNOWN_KEYS - {names.ENABLED, names.RESTART_REQUEST} - IMMUTABLE_KEYS
    base = {
        names.ENABLED: "true",
        names.CHECKPOINT_LAYOUT: "orbax",  # a layout that takes a step pattern
        names.STRAGGLER_FACTOR: "1.5",  # the straggler windows are written only with it
    }

    def spec(key: str, value: str | None) -> Any:
        needs = {names.PRESTART_IMPORTS: "torch"} if key == names.PRESTART_WARM else {}
        annotations = {
            k: v for k, v in (base | needs | {key: value or ""}).items() if value or k != key
        }
        return transform(jobset(annotations), S)["spec"]

    baked = {k for k, (a, b) in TWO_VALUES.items() if spec(k, a) != spec(k, b)}
    assert baked == CREATE_TIME_KEYS
    present = {
        k for k, (a, _) in TWO_VALUES.items() if k not in baked and spec(k, a) != spec(k, None)
    }
    assert present == CREATE_TIME_PRESENCE_KEYS


def test_changing_a_create_time_key_later_is_admitted_with_a_warning() -> None:
    old = transform(jobset(), S)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][names.RESTART_SCOPE] = "pod"
    new["metadata"]["annotations"][names.INPLACE_BUDGET] = "3"  # read live: no warning
    assert validate(new, old) == (True, "")
    (warning,) = update_warnings(new, old)
    assert names.RESTART_SCOPE in warning
    assert "does not reach them" in warning
    assert update_warnings(old, old) == []
    # straggler-factor: whether it is set is written at creation, its value is read live
    on = copy.deepcopy(old)
    on["metadata"]["annotations"][names.STRAGGLER_FACTOR] = "1.5"
    (warning,) = update_warnings(on, old)
    assert names.STRAGGLER_FACTOR in warning
    retuned = copy.deepcopy(on)
    retuned["metadata"]["annotations"][names.STRAGGLER_FACTOR] = "2"
    assert update_warnings(retuned, on) == []


def test_opting_in_on_update_needs_the_agent_already_there() -> None:
    old = jobset({})
    new = jobset()
    allowed, message = validate(new, old)
    assert not allowed
    assert names.ENABLED in message
    assert "cannot be added to an existing JobSet" in message
    # An offline-transformed JobSet (kubectl jobset-inplace enable) may opt in later.
    prepared = transform(jobset(), S)
    prepared_old = copy.deepcopy(prepared)
    prepared_old["metadata"]["annotations"] = {}
    assert validate(prepared, prepared_old) == (True, "")
    # Opting out is always fine.
    assert validate(jobset({names.ENABLED: "false"}), jobset()) == (True, "")


# --- settings -------------------------------------------------------------------------------


def test_agent_settings_from_env() -> None:
    assert settings_from_env({}) == AgentSettings(image=DEFAULT_AGENT_IMAGE)
    assert DEFAULT_AGENT_IMAGE.startswith("jobset-inplace/agent:")
    s = settings_from_env(
        {
            "JSI_AGENT_IMAGE": "reg.example/agent:2",
            "JSI_AGENT_IMAGE_PULL_POLICY": "Always",
            "JSI_AGENT_API_SERVER": "https://10.0.0.1:6443",
        }
    )
    assert (s.image, s.image_pull_policy, s.api_server) == (
        "reg.example/agent:2",
        "Always",
        "https://10.0.0.1:6443",
    )


# --- the kopf handlers ------------------------------------------------------------------------


def handlers(make_account: Any = None) -> dict[str, Any]:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, S, make_account)
    return {h.id: h for h in registry._webhooks.get_all_handlers()}


def test_handlers_are_registered_on_their_paths_and_operations() -> None:
    hs = handlers()
    assert set(hs) == {MUTATE_ID, VALIDATE_ID}
    assert hs[MUTATE_ID].operations == ["CREATE"]
    assert hs[VALIDATE_ID].operations == ["CREATE", "UPDATE"]


def test_mutate_handler_makes_kopf_send_the_transform() -> None:
    raw = jobset()
    body = kopf.Body(cast(kopf.RawBody, raw))
    patch = kopf.Patch(body=body)
    handlers()[MUTATE_ID].fn(body=body, patch=patch, operation="CREATE")
    assert jsonpatch.apply_patch(raw, patch.as_json_patch()) == transform(raw, S)


def test_an_admitted_create_makes_the_agents_account_except_on_a_dry_run() -> None:
    """The pods of a namespace's first JobSet would be refused until the keeper made the
    account from its watch: the webhook makes it first (NoneOnDryRun: not on a dry run, and
    never for a JobSet it refuses)."""
    made: list[tuple[str, str]] = []
    mutate_jobset = handlers(lambda ns, js: made.append((ns, js["metadata"]["name"])))[MUTATE_ID]
    raw = jobset()
    raw["metadata"]["namespace"] = "ml"
    body = kopf.Body(cast(kopf.RawBody, raw))
    mutate_jobset.fn(body=body, patch=kopf.Patch(body=body), operation="CREATE", dryrun=True)
    assert made == []
    mutate_jobset.fn(body=body, patch=kopf.Patch(body=body), operation="CREATE", dryrun=False)
    assert made == [("ml", raw["metadata"]["name"])]
    bad = copy.deepcopy(raw)
    bad["metadata"]["annotations"][names.NO_COMMON_CHECKPOINT] = "retry"
    refused = kopf.Body(cast(kopf.RawBody, bad))
    with pytest.raises(kopf.AdmissionError):
        mutate_jobset.fn(body=refused, patch=kopf.Patch(body=refused), operation="CREATE")
    assert len(made) == 1


def test_handlers_raise_admission_errors_with_the_message() -> None:
    bad = kopf.Body(
        cast(kopf.RawBody, jobset({names.ENABLED: "true", names.NO_COMMON_CHECKPOINT: "retry"}))
    )
    for hid in (MUTATE_ID, VALIDATE_ID):
        patch = kopf.Patch(body=bad)
        with pytest.raises(kopf.AdmissionError, match="no-common-checkpoint") as info:
            handlers()[hid].fn(body=bad, patch=patch, operation="CREATE")
        assert info.value.code == 400
        assert "escalate or scratch" in str(info.value)
        assert not patch.fns  # a refusal never patches


# --- manifests match the code -----------------------------------------------------------------


def load(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


def test_agent_cluster_role_manifest_matches_the_core() -> None:
    assert load("manifests/rbac/agent.yaml") == [agent_cluster_role()]


def test_webhook_manifest_rules_paths_and_conditions() -> None:
    docs = {d["kind"]: d for d in load("manifests/webhook/webhook.yaml")}
    [mut] = docs["MutatingWebhookConfiguration"]["webhooks"]
    [val] = docs["ValidatingWebhookConfiguration"]["webhooks"]
    assert mut["clientConfig"]["service"]["path"] == f"/{MUTATE_ID}"
    assert val["clientConfig"]["service"]["path"] == f"/{VALIDATE_ID}"
    assert [r["operations"] for r in mut["rules"]] == [["CREATE"]]
    assert [r["operations"] for r in val["rules"]] == [["CREATE", "UPDATE"]]
    # the mutating webhook makes the agents' ServiceAccount, except on a dry run
    assert (mut["sideEffects"], val["sideEffects"]) == ("NoneOnDryRun", "None")
    for wh in (mut, val):
        assert wh["failurePolicy"] == "Fail"
        assert wh["rules"][0]["resources"] == ["jobsets"]
        [cond] = wh["matchConditions"]
        assert f"'{names.ENABLED}' in object.metadata.annotations" in cond["expression"]
    assert "== 'true'" in mut["matchConditions"][0]["expression"]
    svc = docs["Service"]
    assert svc["metadata"]["name"] == mut["clientConfig"]["service"]["name"]


def test_agent_vap_confines_the_accounts_the_controllers_binding_names() -> None:
    policy, binding = load("manifests/rbac/agent-vap.yaml")
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["paramKind"] == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
    }
    assert binding["spec"]["paramRef"] == {
        "selector": {"matchLabels": {AGENT_BINDING_LABEL: "true"}},
        "parameterNotFoundAction": "Allow",
    }, "looked up in the request's namespace; none there: nobody holds the agents' rights"
    # by label: a parameter named by name is fetched from the API on every pod write of a
    # namespace without it (Kubernetes 1.37), a selector only reads the apiserver's cache
    assert desired_binding("ns", [])["metadata"]["labels"][AGENT_BINDING_LABEL] == "true"
    [cond] = policy["spec"]["matchConditions"]
    assert "params.subjects.exists(" in cond["expression"]
    text = json.dumps(policy)
    assert "authentication.kubernetes.io/pod-name" in text
    assert "jobset-inplace.dev/" in text


def test_controller_serves_only_with_a_mounted_certificate(tmp_path: Path) -> None:
    env = {"JSI_WEBHOOK_CERT_DIR": str(tmp_path), "JSI_WEBHOOK_PORT": "8443"}
    assert server_from_env(env) is None
    (tmp_path / "tls.crt").write_text("cert")
    (tmp_path / "tls.key").write_text("key")
    server = server_from_env(env)
    assert server is not None
    assert (server.port, server.certfile, server.pkeyfile) == (
        8443,
        str(tmp_path / "tls.crt"),
        str(tmp_path / "tls.key"),
    )


CKPT = {names.ENABLED: "true", names.CHECKPOINT_DIRS: "persistent=/ckpt"}


def test_own_service_account_is_admitted_with_a_warning() -> None:
    own = jobset(CKPT, serviceAccountName="trainer-sa")
    assert validate(own) == (True, "")
    (warning,) = warnings(own)
    assert "'trainer-sa'" in warning
    assert "may write pods only as an agent does" in warning
    assert warnings(jobset(CKPT)) == []
    assert warnings(jobset(CKPT, serviceAccountName=AGENT_SERVICE_ACCOUNT)) == []
    assert warnings(jobset({}, serviceAccountName="trainer-sa")) == [], "not opted in"


def test_no_checkpoint_tier_is_admitted_with_a_warning_saying_what_happens() -> None:
    (warning,) = warnings(jobset())
    assert names.CHECKPOINT_DIRS in warning
    assert "restarts training from step 0" in warning
    assert warnings(jobset(CKPT)) == []
    env = [{"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/local"}]
    containers = [{"name": "trainer", "image": "t", "command": ["train"], "env": env}]
    assert warnings(jobset(None, containers=containers)) == [], "the tier from the trainer's env"


def test_a_non_root_trainer_without_a_user_is_admitted_with_a_warning() -> None:
    """runAsNonRoot by the image's user alone: the agent (as the trainer, but its image's user
    is root) would be refused by the kubelet; the warning says to name the user."""
    container = {"name": "trainer", "image": "t", "command": ["train"]}
    by_pod = jobset(CKPT, securityContext={"runAsNonRoot": True})
    (warning,) = warnings(by_pod)
    assert "runAsNonRoot without runAsUser" in warning
    own = {**container, "securityContext": {"runAsNonRoot": True}}
    assert len(warnings(jobset(CKPT, containers=[own]))) == 1
    named = {**container, "securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}
    assert warnings(jobset(CKPT, containers=[named])) == []
    pod_user = {"runAsNonRoot": True, "runAsUser": 1000}
    assert warnings(jobset(CKPT, securityContext=pod_user, containers=[own])) == []


def test_the_hugging_face_trainer_on_each_pods_own_disk_is_admitted_with_a_warning() -> None:
    """hf-trainer with a local tier only: the Trainer writes the weights from global rank 0
    only, so the other members' checkpoints could not be loaded; the warning says to share
    output_dir. A persistent tier, or another layout, is not warned about."""
    hf = {names.ENABLED: "true", names.CHECKPOINT_LAYOUT: "hf-trainer"}
    (warning,) = warnings(jobset({**hf, names.CHECKPOINT_DIRS: "local=/output"}))
    assert "hf-trainer with a local tier only" in warning
    assert "a volume every pod shares" in warning
    for dirs in ("persistent=/output", "local=/l,persistent=/output"):
        assert warnings(jobset({**hf, names.CHECKPOINT_DIRS: dirs})) == [], dirs
    assert warnings(jobset({names.ENABLED: "true", names.CHECKPOINT_DIRS: "local=/c"})) == []
