"""The JobSet transform: what it adds, idempotence, user fields kept, refusals name the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace import names
from jobset_inplace.core.policy import PolicyError
from jobset_inplace.core.transform import (
    AGENT_CONTAINER,
    ESCALATION_RULE,
    LAUNCHER_PATH,
    MAX_BACKOFF,
    STATE_DIR,
    AgentSettings,
    TransformError,
    transform,
)

S = AgentSettings(image="jobset-inplace/python:local", image_pull_policy="Never")


def jobset(replicas: int = 2, pods: int = 1, **pod_spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train", "annotations": {names.ENABLED: "true"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": pods,
                            "completions": pods,
                            "template": {
                                "spec": {
                                    "containers": [
                                        {"name": "trainer", "image": "t", "command": ["train"]}
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


def pod_spec(js: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


def test_adds_agent_rules_and_job_settings() -> None:
    out = transform(jobset(), S)
    job = out["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == MAX_BACKOFF
    assert job["podReplacementPolicy"] == "Failed"
    assert job["podFailurePolicy"]["rules"][0] == ESCALATION_RULE
    spec = pod_spec(out)
    agent = spec["initContainers"][0]
    assert agent["name"] == AGENT_CONTAINER
    assert agent["restartPolicy"] == "Always"
    assert agent["restartPolicyRules"][0]["exitCodes"] == {"operator": "NotIn", "values": [0]}
    assert {"name": "JSI_RESTART_EXIT_CODE", "value": "88"} in agent["env"]
    assert agent["startupProbe"]["httpGet"]["path"] == "/started"
    trainer = spec["containers"][0]
    assert trainer["restartPolicyRules"][0]["exitCodes"] == {"operator": "NotIn", "values": [0]}
    assert out["spec"]["failurePolicy"] == {"maxRestarts": 2}


def test_every_prepared_pod_carries_the_agent_label_and_keeps_its_own() -> None:
    """The label the shipped NetworkPolicy admits to the report channel."""
    js = jobset()
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"] = {"labels": {"team": "a"}}
    out = transform(js, S)
    labels = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    assert labels == {"team": "a", names.AGENT_POD_LABEL: "true"}


def test_process_scope_runs_every_main_container_under_the_launcher() -> None:
    js = jobset()
    spec = pod_spec(js)
    spec["containers"].append(
        {"name": "sidecar-ish", "image": "s", "command": ["s"], "args": ["-v"]}
    )
    js["metadata"]["annotations"][names.TRAINER_STOP_GRACE] = "0.5s"
    out = pod_spec(transform(js, S))
    agent = out["initContainers"][0]
    trainer, second = out["containers"]
    assert trainer["command"] == ["python3", LAUNCHER_PATH, "--", "train"]
    assert (second["command"], second["args"]) == (["python3", LAUNCHER_PATH, "--", "s"], ["-v"])
    assert {"name": "JSI_CONTAINER_NAME", "value": "trainer"} in trainer["env"]
    assert {"name": "JSI_CONTAINER_NAME", "value": "sidecar-ish"} in second["env"]
    assert {"name": "JSI_STOP_GRACE_SECONDS", "value": "0.5"} in trainer["env"]
    assert {"name": "JSI_RESTART_SCOPE", "value": "process"} in agent["env"]
    assert {"name": "JSI_LAUNCHED_CONTAINERS", "value": "trainer,sidecar-ish"} in agent["env"]
    assert {"name": "JSI_STOP_GRACE_SECONDS", "value": "0.5"} in agent["env"]
    assert LAUNCHER_PATH.startswith(STATE_DIR + "/")  # on the volume every container mounts


def test_pod_scope_keeps_the_command_and_holds_trainers_with_the_startup_probe() -> None:
    js = jobset()
    js["metadata"]["annotations"][names.RESTART_SCOPE] = "pod"
    del pod_spec(js)["containers"][0]["command"]  # the image's entrypoint is fine here
    out = pod_spec(transform(js, S))
    agent = out["initContainers"][0]
    assert "command" not in out["containers"][0]
    assert agent["startupProbe"]["httpGet"]["path"] == "/barrier"
    assert {"name": "JSI_RESTART_SCOPE", "value": "pod"} in agent["env"]
    assert not any(e["name"] == "JSI_LAUNCHED_CONTAINERS" for e in agent["env"])


@pytest.mark.parametrize("scope", ["process", "pod"])
def test_hang_detection_settings_reach_the_agent(scope: str) -> None:
    js = jobset()
    ann = js["metadata"]["annotations"]
    ann[names.RESTART_SCOPE] = scope
    plain = pod_spec(transform(js, S))
    assert not any("TIMEOUT" in e["name"] for e in plain["initContainers"][0]["env"]), "off"
    ann[names.HANG_TIMEOUT], ann[names.STARTUP_TIMEOUT] = "10m", "1m30s"
    out = pod_spec(transform(js, S))
    agent = out["initContainers"][0]
    assert {"name": names.ENV_HANG_TIMEOUT, "value": "600"} in agent["env"]
    assert {"name": names.ENV_STARTUP_TIMEOUT, "value": "90"} in agent["env"]
    # every main container knows its name: its progress record's (and its launcher state's)
    trainer = out["containers"][0]
    assert {"name": "JSI_CONTAINER_NAME", "value": trainer["name"]} in trainer["env"]


def test_straggler_detection_settings_reach_the_agent() -> None:
    js = jobset()
    ann = js["metadata"]["annotations"]
    ann[names.STRAGGLER_WINDOW] = "1m"  # without a factor: off
    agent = pod_spec(transform(js, S))["initContainers"][0]
    assert not any("STRAGGLER" in e["name"] for e in agent["env"])
    ann[names.STRAGGLER_FACTOR], ann[names.STRAGGLER_WINDOWS] = "1.5", "4"
    agent = pod_spec(transform(js, S))["initContainers"][0]
    assert {"name": names.ENV_STRAGGLER_WINDOW, "value": "60"} in agent["env"]
    assert {"name": names.ENV_STRAGGLER_WINDOWS, "value": "4"} in agent["env"]


def test_the_checkpoint_layout_reaches_the_agent() -> None:
    js = jobset()
    ann = js["metadata"]["annotations"]
    agent = pod_spec(transform(js, S))["initContainers"][0]
    assert not any("LAYOUT" in e["name"] for e in agent["env"]), "ours: the default"
    ann[names.CHECKPOINT_LAYOUT] = "hf-trainer"
    agent = pod_spec(transform(js, S))["initContainers"][0]
    assert {"name": names.ENV_CHECKPOINT_LAYOUT, "value": "hf-trainer"} in agent["env"]
    assert not any(e["name"] == names.ENV_CHECKPOINT_STEP_PATTERN for e in agent["env"])
    ann[names.CHECKPOINT_STEP_PATTERN] = "ckpt-{step}"
    agent = pod_spec(transform(js, S))["initContainers"][0]
    assert {"name": names.ENV_CHECKPOINT_STEP_PATTERN, "value": "ckpt-{step}"} in agent["env"]


def test_process_scope_needs_a_command() -> None:
    js = jobset()
    del pod_spec(js)["containers"][0]["command"]
    with pytest.raises(TransformError) as e:
        transform(js, S)
    msg = str(e.value)
    assert "spec.replicatedJobs[0].template.spec.template.spec.containers[0].command" in msg
    assert "jobset-inplace.dev/restart-scope: pod" in msg


def test_prestart_imports_reach_every_launched_container() -> None:
    js = jobset()
    pod_spec(js)["containers"][0]["command"] = ["python3", "-u", "train.py"]
    js["metadata"]["annotations"][names.PRESTART_IMPORTS] = "torch, numpy"
    trainer = pod_spec(transform(js, S))["containers"][0]
    assert trainer["command"] == ["python3", LAUNCHER_PATH, "--", "python3", "-u", "train.py"]
    assert {"name": "JSI_PRESTART_IMPORTS", "value": "torch,numpy"} in trainer["env"]
    again = pod_spec(transform(transform(js, S), S))["containers"][0]
    assert again == trainer, "idempotent"


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (["sh", "-c", "python3 train.py"], "not Python"),
        (["python3", "-I", "train.py"], "python -I ignores PYTHONPATH"),
        (["python3", "-SE", "train.py"], "python -ES ignores"),
    ],
)
def test_prestart_refuses_a_command_it_cannot_hold(command: list[str], why: str) -> None:
    js = jobset()
    pod_spec(js)["containers"][0]["command"] = command
    js["metadata"]["annotations"][names.PRESTART_IMPORTS] = "torch"
    with pytest.raises(TransformError) as e:
        transform(js, S)
    assert "containers[0].command cannot be pre-started" in str(e.value)
    assert why in str(e.value)


def test_prestart_needs_the_process_scope_and_module_names() -> None:
    js = jobset()
    js["metadata"]["annotations"] |= {names.PRESTART_IMPORTS: "torch", names.RESTART_SCOPE: "pod"}
    with pytest.raises(TransformError, match=r"prestart-imports needs .*restart-scope: process"):
        transform(js, S)
    js["metadata"]["annotations"] = {names.ENABLED: "true", names.PRESTART_IMPORTS: "torch;rm"}
    with pytest.raises(PolicyError, match="Python module names, comma-separated"):
        transform(js, S)


def test_prestart_warm_marks_each_trainer_and_refuses_what_cannot_hold_a_model() -> None:
    js = jobset()
    pod_spec(js)["containers"][0]["command"] = ["python3", "-u", "train.py"]
    js["metadata"]["annotations"] |= {names.PRESTART_IMPORTS: "torch", names.PRESTART_WARM: "true"}
    trainer = pod_spec(transform(js, S))["containers"][0]
    assert {"name": "JSI_PRESTART_WARM", "value": "1"} in trainer["env"]
    assert pod_spec(transform(transform(js, S), S))["containers"][0] == trainer, "idempotent"
    off = copy.deepcopy(js)
    off["metadata"]["annotations"][names.PRESTART_WARM] = "false"
    env = pod_spec(transform(off, S))["containers"][0]["env"]
    assert not any(e["name"] == "JSI_PRESTART_WARM" for e in env)
    for launcher in (
        ["torchrun", "train.py"],
        ["python3", "-m", "torch.distributed.run", "t.py"],
        ["python3", "-um", "torch.distributed.launch", "t.py"],
        ["python3", "-m", "accelerate.commands.launch", "t.py"],
        ["python3", "-m", "deepspeed.launcher.runner", "t.py"],
    ):
        pod_spec(js)["containers"][0]["command"] = launcher
        with pytest.raises(TransformError, match=r"containers\[0\].command: .*prestart-warm is "
                           "refused: .* starts the trainer's processes after"):  # fmt: skip
            transform(js, S)
    pod_spec(js)["containers"][0]["command"] = ["python3", "-c", "import train"]
    with pytest.raises(TransformError, match="python -c or standard input"):
        transform(js, S)
    pod_spec(js)["containers"][0]["command"] = ["python3", "train.py"]
    del js["metadata"]["annotations"][names.PRESTART_IMPORTS]
    with pytest.raises(TransformError, match=r"prestart-warm needs .*prestart-imports"):
        transform(js, S)
    js["metadata"]["annotations"] |= {names.PRESTART_IMPORTS: "torch", names.RESTART_SCOPE: "pod"}
    with pytest.raises(TransformError, match=r"needs .*restart-scope: process"):
        transform(js, S)
    js["metadata"]["annotations"][names.PRESTART_WARM] = "yes"
    with pytest.raises(PolicyError, match=r'prestart-warm.*"true" or "false"'):
        transform(js, S)


def test_restart_exit_code_annotation_is_used() -> None:
    js = jobset()
    js["metadata"]["annotations"][names.RESTART_EXIT_CODE] = "99"
    agent = pod_spec(transform(js, S))["initContainers"][0]
    assert {"name": "JSI_RESTART_EXIT_CODE", "value": "99"} in agent["env"]


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.integers(1, 5),
    pods=st.integers(1, 3),
    extra_env=st.lists(st.sampled_from(["A", "B", "C"]), unique=True),
    node_selector=st.dictionaries(st.sampled_from(["pool", "zone"]), st.text("abc", min_size=1)),
)
def test_idempotent_and_keeps_user_fields(
    replicas: int, pods: int, extra_env: list[str], node_selector: dict[str, str]
) -> None:
    js = jobset(replicas, pods, nodeSelector=node_selector)
    pod_spec(js)["containers"][0]["env"] = [{"name": n, "value": n} for n in extra_env]
    before = copy.deepcopy(js)
    once = transform(js, S)
    assert transform(once, S) == once
    assert js == before  # input untouched
    spec = pod_spec(once)
    assert spec["nodeSelector"] == node_selector
    names = [e["name"] for e in spec["containers"][0]["env"]]
    assert names[: len(extra_env)] == extra_env
    assert once["spec"]["replicatedJobs"][0]["replicas"] == replicas


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"].update(completions=3),
         "spec.replicatedJobs[0].template.spec: completions"),
        (lambda js: pod_spec(js).update(restartPolicy="OnFailure"),
         "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy"),
        (lambda js: pod_spec(js)["containers"][0].update(restartPolicyRules=[
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [1]}}]),
         "spec.replicatedJobs[0].template.spec.template.spec.containers[0].restartPolicyRules"),
        (lambda js: js["spec"].update(failurePolicy={"maxRestarts": 0}),
         "spec.failurePolicy.maxRestarts"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(change: Any, field: str) -> None:
    js = jobset()
    change(js)
    with pytest.raises(TransformError, match=field.replace("[", r"\[").replace("]", r"\]")):
        transform(js, S)


def test_bad_annotation_names_the_key() -> None:
    js = jobset()
    js["metadata"]["annotations"][names.INPLACE_BUDGET] = "lots"
    with pytest.raises(PolicyError, match=names.INPLACE_BUDGET):
        transform(js, S)


def test_agent_sees_the_trainers_checkpoint_tiers() -> None:
    js = jobset(volumes=[{"name": "ckpt", "emptyDir": {}}])
    trainer = pod_spec(js)["containers"][0]
    trainer["env"] = [{"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/ckpt/local"}]
    trainer["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    once = transform(js, S)
    agent = pod_spec(once)["initContainers"][0]
    assert {"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/ckpt/local"} in agent["env"]
    assert {"name": "ckpt", "mountPath": "/ckpt", "readOnly": False} in agent["volumeMounts"]
    assert transform(once, S) == once


def test_per_member_tier_paths_expand_alike_in_the_agent() -> None:
    """A tier path or subPathExpr built from the trainer's variables (per-member roots): the
    agent gets those variables too, before the tier variable, else its path stays literal."""
    js = jobset(volumes=[{"name": "shared", "hostPath": {"path": "/mnt/shared"}}])
    trainer = pod_spec(js)["containers"][0]
    index = {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
    trainer["env"] = [
        {"name": "UNRELATED", "value": "x"},
        {"name": "RJOB", "value": "workers"},
        {"name": "JOB_INDEX", "valueFrom": index},
        {"name": "MEMBER", "value": "$(RJOB)-$(JOB_INDEX)"},
        {
            "name": "JSI_CHECKPOINT_PERSISTENT_DIR",
            "value": "/ckpt/$(MEMBER)/$(JOB_COMPLETION_INDEX)",
        },
        {"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/shared/local"},
    ]
    trainer["volumeMounts"] = [
        {"name": "ckpt", "mountPath": "/ckpt"},
        {"name": "shared", "mountPath": "/shared", "subPathExpr": "$(JOB_INDEX)"},
    ]
    pod_spec(js)["volumes"].append({"name": "ckpt", "emptyDir": {}})
    once = transform(js, S)
    agent = pod_spec(once)["initContainers"][0]
    names_in_order = [e["name"] for e in agent["env"]]
    wanted = {"RJOB", "JOB_INDEX", "MEMBER", "JSI_CHECKPOINT_PERSISTENT_DIR"}
    shared = [n for n in names_in_order if n in wanted | {"JSI_CHECKPOINT_LOCAL_DIR"}]
    assert shared == [
        "RJOB",
        "JOB_INDEX",
        "MEMBER",
        "JSI_CHECKPOINT_PERSISTENT_DIR",
        "JSI_CHECKPOINT_LOCAL_DIR",
    ], "each after what it refers to; the Job's JOB_COMPLETION_INDEX is its own"
    assert {"name": "JOB_INDEX", "valueFrom": index} in agent["env"]
    assert "UNRELATED" not in names_in_order
    mount = {"name": "shared", "mountPath": "/shared", "subPathExpr": "$(JOB_INDEX)"}
    assert {**mount, "readOnly": False} in agent["volumeMounts"]
    assert transform(once, S) == once


def test_checkpoint_dirs_annotation_reaches_trainer_and_agent() -> None:
    js = jobset(volumes=[{"name": "ckpt", "emptyDir": {}}])
    js["metadata"]["annotations"][names.CHECKPOINT_DIRS] = "local=/ckpt/local,persistent=/ckpt/p"
    pod_spec(js)["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    out = transform(js, S)
    spec = pod_spec(out)
    for c in (spec["containers"][0], spec["initContainers"][0]):
        assert {"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/ckpt/local"} in c["env"]
        assert {"name": "JSI_CHECKPOINT_PERSISTENT_DIR", "value": "/ckpt/p"} in c["env"]
    assert {"name": "ckpt", "mountPath": "/ckpt", "readOnly": False} in spec["initContainers"][0][
        "volumeMounts"
    ]
    assert transform(out, S) == out


def test_escalation_fail_jobset_adds_a_failjobset_rule() -> None:
    js = jobset()
    js["metadata"]["annotations"][names.ESCALATION] = "fail-jobset"
    out = transform(js, S)
    assert out["spec"]["failurePolicy"]["rules"][0]["action"] == "FailJobSet"
    assert out["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert transform(out, S) == out


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (names.CHECKPOINT_DIRS, "local=relative/path"),
        (names.CHECKPOINT_DIRS, "scratch=/x"),
        (names.ESCALATION, "panic"),
        (names.TAINT_ON_DEVICE_FAULT, "yes"),
    ],
)
def test_bad_checkpoint_or_escalation_annotation_names_the_key(key: str, value: str) -> None:
    js = jobset()
    js["metadata"]["annotations"][key] = value
    with pytest.raises(PolicyError, match=key):
        transform(js, S)


def test_configured_pull_secrets_join_the_pods_own_and_resources_reach_the_agent() -> None:
    """A private registry: the install's pull secrets are added to every prepared pod's
    (the pod's own stay, and serve the agent's image too: pull secrets are the pod's)."""
    s = AgentSettings(
        image="registry.corp/agent:1",
        resources={"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        image_pull_secrets=("agent-registry", "team-registry"),
    )
    out = transform(jobset(imagePullSecrets=[{"name": "team-registry"}]), s)
    spec = pod_spec(out)
    assert spec["imagePullSecrets"] == [{"name": "team-registry"}, {"name": "agent-registry"}]
    [agent] = [c for c in spec["initContainers"] if c["name"] == AGENT_CONTAINER]
    assert agent["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"memory": "128Mi"},
    }
    assert transform(out, s) == out, "idempotent"
    # nothing configured: nothing added, the default requests
    plain = pod_spec(transform(jobset(), S))
    assert "imagePullSecrets" not in plain
    [agent] = [c for c in plain["initContainers"] if c["name"] == AGENT_CONTAINER]
    assert agent["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"}}


def test_the_agent_is_restricted_and_runs_as_the_trainer() -> None:
    """Pod Security `restricted` for the agent; the trainer's user (it renames the trainer's
    checkpoint markers): a container's own runAsUser is copied, a pod's applies to both."""
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }

    def agent_of(js: dict[str, Any]) -> dict[str, Any]:
        [agent] = [c for c in pod_spec(js)["initContainers"] if c["name"] == AGENT_CONTAINER]
        context: dict[str, Any] = agent
        return context

    assert agent_of(transform(jobset(), S))["securityContext"] == restricted
    js = jobset()
    pod_spec(js)["containers"][0]["securityContext"] = {
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,  # the trainer's own business
    }
    context = agent_of(transform(js, S))["securityContext"]
    assert context == {**restricted, "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True}
    # a pod-level user is the agent's already: nothing copied
    by_pod = transform(jobset(securityContext={"runAsUser": 1000, "runAsNonRoot": True}), S)
    assert agent_of(by_pod)["securityContext"] == restricted
