"""``parse_policy``: the defaults, every annotation's accepted forms, and errors that name the
key, the value and the accepted form."""

from __future__ import annotations

from typing import Any

import pytest

from jobset_inplace import names
from jobset_inplace.core.policy import (
    CheckpointDirs,
    Escalation,
    ForceDelete,
    NoCommonCheckpoint,
    Policy,
    PolicyError,
    parse_policy,
)


@pytest.mark.parametrize(
    "annotations",
    [
        None,
        {},
        {names.ENABLED: "true"},
        {names.ENABLED: "false"},
        {"example.com/other": "x", "jobset.sigs.k8s.io/anything": "y"},
    ],
)
def test_absent_keys_keep_the_defaults(annotations: dict[str, str] | None) -> None:
    assert parse_policy(annotations) == Policy()


def test_the_defaults() -> None:
    p = Policy()
    assert (p.inplace_budget, p.recreate_budget) == (10, 5)
    assert (p.barrier_timeout_s, p.node_unhealthy_after_s) == (300.0, 15.0)
    assert p.unhealthy_taints == frozenset()
    assert p.unhealthy_conditions == frozenset()
    assert p.force_delete == ForceDelete.UNREACHABLE
    assert p.member_repeat_limit == 3
    assert p.no_common_checkpoint == NoCommonCheckpoint.ESCALATE
    assert p.restart_exit_code == names.DEFAULT_RESTART_EXIT_CODE == 88
    assert p.checkpoint_dirs == CheckpointDirs(None, None)
    assert p.escalation == Escalation.RESTART_JOBSET
    assert p.kueue_recovery_timeout_s is None
    assert p.taint_on_device_fault is False


# (annotation, value, Policy field, parsed value)
ACCEPTED: list[tuple[str, str, str, Any]] = [
    (names.INPLACE_BUDGET, "0", "inplace_budget", 0),
    (names.INPLACE_BUDGET, "3", "inplace_budget", 3),
    (names.INPLACE_BUDGET, " 7 ", "inplace_budget", 7),
    (names.INPLACE_BUDGET, "10000", "inplace_budget", 10_000),
    (names.RECREATE_BUDGET, "0", "recreate_budget", 0),
    (names.RECREATE_BUDGET, "10000", "recreate_budget", 10_000),
    (names.BARRIER_TIMEOUT, "90s", "barrier_timeout_s", 90.0),
    (names.BARRIER_TIMEOUT, "5m", "barrier_timeout_s", 300.0),
    (names.BARRIER_TIMEOUT, "1h30m", "barrier_timeout_s", 5400.0),
    (names.BARRIER_TIMEOUT, "1h2m3s", "barrier_timeout_s", 3723.0),
    (names.BARRIER_TIMEOUT, "2h", "barrier_timeout_s", 7200.0),
    (names.NODE_UNHEALTHY_AFTER, "2.5s", "node_unhealthy_after_s", 2.5),
    (names.NODE_UNHEALTHY_AFTER, "0s", "node_unhealthy_after_s", 0.0),
    (names.UNHEALTHY_TAINTS, "example.com/gpu-fault", "unhealthy_taints",
     frozenset({"example.com/gpu-fault"})),
    (names.UNHEALTHY_TAINTS, " a.io/x , b.io/y_z ,", "unhealthy_taints",
     frozenset({"a.io/x", "b.io/y_z"})),
    (names.UNHEALTHY_CONDITIONS, "GPUFault,NetworkUnavailable", "unhealthy_conditions",
     frozenset({"GPUFault", "NetworkUnavailable"})),
    (names.FORCE_DELETE, "never", "force_delete", ForceDelete.NEVER),
    (names.FORCE_DELETE, "unreachable", "force_delete", ForceDelete.UNREACHABLE),
    (names.MEMBER_REPEAT_LIMIT, "1", "member_repeat_limit", 1),
    (names.MEMBER_REPEAT_LIMIT, "1000", "member_repeat_limit", 1000),
    (names.NO_COMMON_CHECKPOINT, "scratch", "no_common_checkpoint", NoCommonCheckpoint.SCRATCH),
    (names.NO_COMMON_CHECKPOINT, "escalate", "no_common_checkpoint", NoCommonCheckpoint.ESCALATE),
    (names.RESTART_EXIT_CODE, "3", "restart_exit_code", 3),
    (names.RESTART_EXIT_CODE, "255", "restart_exit_code", 255),
    (names.CHECKPOINT_DIRS, "local=/ckpt/local,persistent=/mnt/ckpt", "checkpoint_dirs",
     CheckpointDirs("/ckpt/local", "/mnt/ckpt")),
    (names.CHECKPOINT_DIRS, "persistent=/mnt/ckpt", "checkpoint_dirs",
     CheckpointDirs(None, "/mnt/ckpt")),
    (names.CHECKPOINT_DIRS, " local=/l ,", "checkpoint_dirs", CheckpointDirs("/l", None)),
    (names.ESCALATION, "fail-jobset", "escalation", Escalation.FAIL_JOBSET),
    (names.ESCALATION, "restart-jobset", "escalation", Escalation.RESTART_JOBSET),
    (names.KUEUE_RECOVERY_TIMEOUT, "3m", "kueue_recovery_timeout_s", 180.0),
    (names.TAINT_ON_DEVICE_FAULT, "true", "taint_on_device_fault", True),
    (names.TAINT_ON_DEVICE_FAULT, "false", "taint_on_device_fault", False),
]  # fmt: skip


@pytest.mark.parametrize(("key", "value", "field", "parsed"), ACCEPTED)
def test_each_annotation_sets_its_field_alone(
    key: str, value: str, field: str, parsed: Any
) -> None:
    p = parse_policy({names.ENABLED: "true", key: value})
    assert getattr(p, field) == parsed
    # every other field keeps its default
    default = Policy()
    others = {f: getattr(p, f) for f in vars(default) if f != field}
    assert others == {f: getattr(default, f) for f in others}


def test_every_annotation_key_is_covered() -> None:
    keys = {k for k, *_ in ACCEPTED}
    fields = {f for _, _, f, _ in ACCEPTED}
    assert fields == set(vars(Policy())), "a Policy field without a test of its annotation"
    assert len(keys) == len(fields)


def test_all_annotations_together() -> None:
    p = parse_policy(
        {
            names.ENABLED: "true",
            names.INPLACE_BUDGET: "2",
            names.RECREATE_BUDGET: "1",
            names.BARRIER_TIMEOUT: "1m",
            names.NODE_UNHEALTHY_AFTER: "5s",
            names.UNHEALTHY_TAINTS: "t.io/a",
            names.UNHEALTHY_CONDITIONS: "C",
            names.FORCE_DELETE: "never",
            names.MEMBER_REPEAT_LIMIT: "4",
            names.NO_COMMON_CHECKPOINT: "scratch",
            names.RESTART_EXIT_CODE: "99",
            names.CHECKPOINT_DIRS: "local=/l",
            names.ESCALATION: "fail-jobset",
            names.KUEUE_RECOVERY_TIMEOUT: "10m",
            names.TAINT_ON_DEVICE_FAULT: "true",
        }
    )
    assert p == Policy(
        inplace_budget=2,
        recreate_budget=1,
        barrier_timeout_s=60.0,
        node_unhealthy_after_s=5.0,
        unhealthy_taints=frozenset({"t.io/a"}),
        unhealthy_conditions=frozenset({"C"}),
        force_delete=ForceDelete.NEVER,
        member_repeat_limit=4,
        no_common_checkpoint=NoCommonCheckpoint.SCRATCH,
        restart_exit_code=99,
        checkpoint_dirs=CheckpointDirs("/l", None),
        escalation=Escalation.FAIL_JOBSET,
        kueue_recovery_timeout_s=600.0,
        taint_on_device_fault=True,
    )


DURATION = "a duration such as 30s, 5m or 1h30m"
NAMES = "a comma-separated list of taint keys or condition types"
DIRS = "local=/abs/path,persistent=/abs/path (either part may be left out)"

# (annotation, malformed value, the accepted form the error must state)
REJECTED: list[tuple[str, str, str]] = [
    (names.ENABLED, "yes", '"true" or "false"'),
    (names.ENABLED, "True", '"true" or "false"'),
    (names.INPLACE_BUDGET, "-1", "an integer from 0 to 10000"),
    (names.INPLACE_BUDGET, "10001", "an integer from 0 to 10000"),
    (names.INPLACE_BUDGET, "three", "an integer from 0 to 10000"),
    (names.INPLACE_BUDGET, "2.5", "an integer from 0 to 10000"),
    (names.RECREATE_BUDGET, "", "an integer from 0 to 10000"),
    (names.BARRIER_TIMEOUT, "soon", DURATION),
    (names.BARRIER_TIMEOUT, "300", DURATION),  # a unit is required
    (names.BARRIER_TIMEOUT, "", DURATION),
    (names.BARRIER_TIMEOUT, "1d", DURATION),
    (names.BARRIER_TIMEOUT, "-5s", DURATION),
    (names.BARRIER_TIMEOUT, "5m1h", DURATION),  # largest unit first
    (names.NODE_UNHEALTHY_AFTER, "15 s", DURATION),
    (names.KUEUE_RECOVERY_TIMEOUT, "3 minutes", DURATION),
    (names.UNHEALTHY_TAINTS, "", NAMES),
    (names.UNHEALTHY_TAINTS, " , ", NAMES),
    (names.UNHEALTHY_TAINTS, "a.io/x,bad key", NAMES),
    (names.UNHEALTHY_CONDITIONS, "-Leading", NAMES),
    (names.FORCE_DELETE, "always", "never or unreachable"),
    (names.FORCE_DELETE, "Never", "never or unreachable"),
    (names.MEMBER_REPEAT_LIMIT, "0", "an integer from 1 to 1000"),
    (names.MEMBER_REPEAT_LIMIT, "1001", "an integer from 1 to 1000"),
    (names.NO_COMMON_CHECKPOINT, "restart", "escalate or scratch"),
    # 1 is a Python crash and 2 the agent's configuration error: never "restart"
    (names.RESTART_EXIT_CODE, "1", "an integer from 3 to 255"),
    (names.RESTART_EXIT_CODE, "2", "an integer from 3 to 255"),
    (names.RESTART_EXIT_CODE, "256", "an integer from 3 to 255"),
    (names.CHECKPOINT_DIRS, "", DIRS),
    (names.CHECKPOINT_DIRS, "local=relative/path", DIRS),
    (names.CHECKPOINT_DIRS, "/no/tier", DIRS),
    (names.CHECKPOINT_DIRS, "remote=/x", DIRS),
    (names.CHECKPOINT_DIRS, "local=/a,local=/b", DIRS),
    (names.ESCALATION, "restart", "restart-jobset or fail-jobset"),
    (names.TAINT_ON_DEVICE_FAULT, "yes", '"true" or "false"'),
    (names.TAINT_ON_DEVICE_FAULT, "TRUE", '"true" or "false"'),
]


@pytest.mark.parametrize(("key", "value", "accepted"), REJECTED)
def test_malformed_annotation_names_key_value_and_accepted_form(
    key: str, value: str, accepted: str
) -> None:
    annotations = {names.ENABLED: "true", key: value}
    with pytest.raises(PolicyError) as err:
        parse_policy(annotations)
    e = err.value
    assert (e.key, e.value, e.accepted) == (key, value, accepted)
    assert str(e) == f"annotation {key}={value!r} is invalid: expected {accepted}"
    assert isinstance(e, ValueError)


def test_every_annotation_key_has_a_rejected_form() -> None:
    assert {k for k, _, _ in REJECTED} == {k for k, *_ in ACCEPTED} | {names.ENABLED}


def test_the_first_malformed_key_in_a_stable_order_is_reported() -> None:
    bad = {names.ESCALATION: "x", names.BARRIER_TIMEOUT: "x", names.INPLACE_BUDGET: "x"}
    for order in (bad, dict(reversed(list(bad.items())))):
        with pytest.raises(PolicyError) as err:
            parse_policy({names.ENABLED: "true", **order})
        assert err.value.key == names.INPLACE_BUDGET
    # an invalid opt-in value is reported before any other key
    with pytest.raises(PolicyError) as err:
        parse_policy({names.ENABLED: "on", names.INPLACE_BUDGET: "x"})
    assert err.value.key == names.ENABLED
