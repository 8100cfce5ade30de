"""``parse_policy``: the defaults, every annotation's accepted forms and ranges (both ends),
and errors that name the key, the value and the accepted form (with the range)."""

from __future__ import annotations

from typing import Any

import pytest

from jobset_inplace import names
from jobset_inplace.core import policy
from jobset_inplace.core.policy import (
    KNOWN_KEYS,
    CheckpointDirs,
    Escalation,
    ForceDelete,
    NoCommonCheckpoint,
    Policy,
    PolicyError,
    PolicyErrors,
    StragglerAction,
    format_duration,
    is_managed,
    parse_duration,
    parse_policy,
    unknown_keys,
)
from jobset_inplace.names import RestartScope
from jobset_inplace.trainer.layouts import PATTERN_FORM, Layout


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
    assert p.restart_scope == RestartScope.PROCESS
    assert p.trainer_stop_grace_s == 1.0
    assert (p.hang_timeout_s, p.startup_timeout_s) == (None, None), "hang detection off"
    assert p.straggler_factor is None, "straggler detection off"
    assert (p.straggler_windows, p.straggler_window_s) == (3, 300.0)
    assert p.straggler_action == StragglerAction.REPORT


# (annotation, value, Policy field, parsed value)
ACCEPTED: list[tuple[str, str, str, Any]] = [
    (names.INPLACE_BUDGET, "0", "inplace_budget", 0),
    (names.INPLACE_BUDGET, "3", "inplace_budget", 3),
    (names.INPLACE_BUDGET, "10", "inplace_budget", 10),
    (names.INPLACE_BUDGET, "10000", "inplace_budget", 10_000),
    (names.RECREATE_BUDGET, "0", "recreate_budget", 0),
    (names.RECREATE_BUDGET, "10000", "recreate_budget", 10_000),
    (names.BARRIER_TIMEOUT, "30s", "barrier_timeout_s", 30.0),  # the minimum
    (names.BARRIER_TIMEOUT, "90s", "barrier_timeout_s", 90.0),
    (names.BARRIER_TIMEOUT, "5m", "barrier_timeout_s", 300.0),
    (names.BARRIER_TIMEOUT, "1h30m", "barrier_timeout_s", 5400.0),
    (names.BARRIER_TIMEOUT, "1h2m3s", "barrier_timeout_s", 3723.0),
    (names.BARRIER_TIMEOUT, "2h", "barrier_timeout_s", 7200.0),
    (names.BARRIER_TIMEOUT, "05m", "barrier_timeout_s", 300.0),  # as Go's ParseDuration
    (names.BARRIER_TIMEOUT, "24h", "barrier_timeout_s", 86400.0),  # the maximum
    (names.BARRIER_TIMEOUT, "23h59m60s", "barrier_timeout_s", 86400.0),
    (names.NODE_UNHEALTHY_AFTER, "5s", "node_unhealthy_after_s", 5.0),  # the minimum
    (names.NODE_UNHEALTHY_AFTER, "7.5s", "node_unhealthy_after_s", 7.5),
    (names.NODE_UNHEALTHY_AFTER, "1h", "node_unhealthy_after_s", 3600.0),  # the maximum
    (names.UNHEALTHY_TAINTS, "example.com/gpu-fault", "unhealthy_taints",
     frozenset({"example.com/gpu-fault"})),
    (names.UNHEALTHY_TAINTS, " a.io/x , b.io/y_z ,", "unhealthy_taints",
     frozenset({"a.io/x", "b.io/y_z"})),
    (names.UNHEALTHY_CONDITIONS, "GPUFault,NetworkUnavailable", "unhealthy_conditions",
     frozenset({"GPUFault", "NetworkUnavailable"})),
    (names.FORCE_DELETE, "never", "force_delete", ForceDelete.NEVER),
    (names.FORCE_DELETE, "unreachable", "force_delete", ForceDelete.UNREACHABLE),
    (names.MEMBER_REPEAT_LIMIT, "1", "member_repeat_limit", 1),
    (names.MEMBER_REPEAT_LIMIT, "10", "member_repeat_limit", 10),
    (names.MEMBER_REPEAT_LIMIT, "1000", "member_repeat_limit", 1000),
    (names.NO_PROGRESS_LIMIT, "0", "no_progress_limit", 0),
    (names.NO_PROGRESS_LIMIT, "1000", "no_progress_limit", 1000),
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
    (names.KUEUE_RECOVERY_TIMEOUT, "1m15s", "kueue_recovery_timeout_s", 75.0),  # the minimum
    (names.KUEUE_RECOVERY_TIMEOUT, "168h", "kueue_recovery_timeout_s", 604800.0),  # the maximum
    (names.TAINT_ON_DEVICE_FAULT, "true", "taint_on_device_fault", True),
    (names.TAINT_ON_DEVICE_FAULT, "false", "taint_on_device_fault", False),
    (names.RESTART_SCOPE, "pod", "restart_scope", RestartScope.POD),
    (names.RESTART_SCOPE, "process", "restart_scope", RestartScope.PROCESS),
    (names.TRAINER_STOP_GRACE, "0s", "trainer_stop_grace_s", 0.0),
    (names.TRAINER_STOP_GRACE, "0.5s", "trainer_stop_grace_s", 0.5),
    (names.TRAINER_STOP_GRACE, "5m", "trainer_stop_grace_s", 300.0),
    (names.PRESTART_IMPORTS, "torch", "prestart_imports", ("torch",)),
    (names.PRESTART_WARM, "true", "prestart_warm", True),
    (names.PRESTART_WARM, "false", "prestart_warm", False),
    (names.PRESTART_IMPORTS, " torch , torch.distributed.checkpoint", "prestart_imports",
     ("torch", "torch.distributed.checkpoint")),
    (names.HANG_TIMEOUT, "2s", "hang_timeout_s", 2.0),
    (names.HANG_TIMEOUT, "10s", "hang_timeout_s", 10.0),
    (names.HANG_TIMEOUT, "30m", "hang_timeout_s", 1800.0),
    (names.HANG_TIMEOUT, "168h", "hang_timeout_s", 604_800.0),
    (names.STARTUP_TIMEOUT, "10s", "startup_timeout_s", 10.0),
    (names.STARTUP_TIMEOUT, "1h30m", "startup_timeout_s", 5400.0),
    (names.STARTUP_TIMEOUT, "168h", "startup_timeout_s", 604_800.0),
    (names.STRAGGLER_FACTOR, "1.1", "straggler_factor", 1.1),
    (names.STRAGGLER_FACTOR, "1.5", "straggler_factor", 1.5),
    (names.STRAGGLER_FACTOR, "100", "straggler_factor", 100.0),
    (names.STRAGGLER_WINDOWS, "1", "straggler_windows", 1),
    (names.STRAGGLER_WINDOWS, "20", "straggler_windows", 20),
    (names.STRAGGLER_WINDOW, "30s", "straggler_window_s", 30.0),
    (names.STRAGGLER_WINDOW, "1h", "straggler_window_s", 3600.0),
    (names.STRAGGLER_ACTION, "report", "straggler_action", StragglerAction.REPORT),
    (names.STRAGGLER_ACTION, "recreate", "straggler_action", StragglerAction.RECREATE),
    (names.PLANNED_MOVES, "false", "planned_moves", False),
    (names.PLANNED_MOVES, "true", "planned_moves", True),
    (names.PLANNED_MOVE_TIMEOUT, "10s", "planned_move_timeout_s", 10.0),
    (names.PLANNED_MOVE_TIMEOUT, "24h", "planned_move_timeout_s", 86_400.0),
    (names.CHECKPOINT_LAYOUT, "orbax", "checkpoint_layout", Layout.ORBAX),
    (names.CHECKPOINT_LAYOUT, "torch-dcp", "checkpoint_layout", Layout.TORCH_DCP),
    (names.CHECKPOINT_LAYOUT, "hf-trainer", "checkpoint_layout", Layout.HF_TRAINER),
    (names.CHECKPOINT_LAYOUT, "megatron", "checkpoint_layout", Layout.MEGATRON),
    (names.CHECKPOINT_LAYOUT, "jobset-inplace", "checkpoint_layout", Layout.JOBSET_INPLACE),
    # (with the default layout, ours, only its own names are accepted: see below)
    (names.CHECKPOINT_STEP_PATTERN, "step-{step}", "checkpoint_step_pattern", "step-{step}"),
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


def test_a_layout_takes_its_own_step_pattern() -> None:
    p = parse_policy(
        {
            names.ENABLED: "true",
            names.CHECKPOINT_LAYOUT: "torch-dcp",
            names.CHECKPOINT_STEP_PATTERN: "ckpt_{step}",
        }
    )
    assert (p.checkpoint_layout, p.checkpoint_step_pattern) == (Layout.TORCH_DCP, "ckpt_{step}")


def test_every_annotation_key_is_covered() -> None:
    keys = {k for k, *_ in ACCEPTED}
    fields = {f for _, _, f, _ in ACCEPTED}
    assert fields == set(vars(Policy())), "a Policy field without a test of its annotation"
    assert len(keys) == len(fields)


def test_every_bound_is_accepted() -> None:
    """Both ends of every range are accepted (in the table above, checked here against the
    module's constants so that a changed range shows up)."""
    accepted = {(k, parsed) for k, _, _, parsed in ACCEPTED}
    for key, (lo, hi) in RANGES.items():
        assert (key, lo) in accepted, (key, lo)
        assert (key, hi) in accepted, (key, hi)


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
            names.RESTART_SCOPE: "pod",
            names.TRAINER_STOP_GRACE: "3s",
            names.HANG_TIMEOUT: "20m",
            names.STARTUP_TIMEOUT: "1h",
            names.STRAGGLER_FACTOR: "2",
            names.STRAGGLER_WINDOWS: "4",
            names.STRAGGLER_WINDOW: "2m",
            names.STRAGGLER_ACTION: "recreate",
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
        restart_scope=RestartScope.POD,
        trainer_stop_grace_s=3.0,
        hang_timeout_s=1200.0,
        startup_timeout_s=3600.0,
        straggler_factor=2.0,
        straggler_windows=4,
        straggler_window_s=120.0,
        straggler_action=StragglerAction.RECREATE,
    )


RANGES: dict[str, tuple[float, float]] = {
    names.INPLACE_BUDGET: (0, 10_000),
    names.RECREATE_BUDGET: (0, 10_000),
    names.BARRIER_TIMEOUT: (30.0, 86_400.0),
    names.NODE_UNHEALTHY_AFTER: (5.0, 3600.0),
    names.MEMBER_REPEAT_LIMIT: (1, 1000),
    names.NO_PROGRESS_LIMIT: (0, 1000),
    names.RESTART_EXIT_CODE: (3, 255),
    names.KUEUE_RECOVERY_TIMEOUT: (75.0, 604_800.0),
    names.TRAINER_STOP_GRACE: (0.0, 300.0),
    names.HANG_TIMEOUT: (2.0, 604_800.0),
    names.STARTUP_TIMEOUT: (10.0, 604_800.0),
    names.STRAGGLER_FACTOR: (1.1, 100.0),
    names.STRAGGLER_WINDOWS: (1, 20),
    names.STRAGGLER_WINDOW: (30.0, 3600.0),
}


def test_the_ranges_are_the_modules() -> None:
    assert RANGES == {
        names.INPLACE_BUDGET: policy.INPLACE_BUDGET_RANGE,
        names.RECREATE_BUDGET: policy.RECREATE_BUDGET_RANGE,
        names.BARRIER_TIMEOUT: policy.BARRIER_TIMEOUT_RANGE_S,
        names.NODE_UNHEALTHY_AFTER: policy.NODE_UNHEALTHY_AFTER_RANGE_S,
        names.MEMBER_REPEAT_LIMIT: policy.MEMBER_REPEAT_LIMIT_RANGE,
        names.NO_PROGRESS_LIMIT: policy.NO_PROGRESS_LIMIT_RANGE,
        names.RESTART_EXIT_CODE: policy.RESTART_EXIT_CODE_RANGE,
        names.KUEUE_RECOVERY_TIMEOUT: policy.KUEUE_RECOVERY_TIMEOUT_RANGE_S,
        names.TRAINER_STOP_GRACE: policy.TRAINER_STOP_GRACE_RANGE_S,
        names.HANG_TIMEOUT: policy.HANG_TIMEOUT_RANGE_S,
        names.STARTUP_TIMEOUT: policy.STARTUP_TIMEOUT_RANGE_S,
        names.STRAGGLER_FACTOR: policy.STRAGGLER_FACTOR_RANGE,
        names.STRAGGLER_WINDOWS: policy.STRAGGLER_WINDOWS_RANGE,
        names.STRAGGLER_WINDOW: policy.STRAGGLER_WINDOW_RANGE_S,
    }


def int_form(lo: int, hi: int) -> str:
    digits = "plain decimal digits: no sign, spaces, underscores or leading zeros"
    return f"an integer from {lo} to {hi} ({digits})"


BUDGET = int_form(0, 10_000)
REPEAT = int_form(1, 1000)
NO_PROGRESS = int_form(0, 1000)
EXIT = int_form(3, 255)
BARRIER = "a duration such as 30s, 5m or 1h30m, from 30s to 24h"
NODE = "a duration such as 5s, 15s or 1m, from 5s to 1h"
KUEUE = "a duration such as 3m, 30m or 1h, from 1m15s to 168h"
NAMES = (
    "a comma-separated list of taint keys or condition types (Kubernetes qualified names: "
    "an optional DNS prefix and '/', then up to 63 of A-Z a-z 0-9 - _ .)"
)
NOT_READY = "condition types that are True when a node is unhealthy (not Ready)"
HANG = "a duration such as 10m, 30m or 1h, from 2s to 168h"
STARTUP = "a duration such as 10m, 30m or 1h, from 10s to 168h"
FACTOR = "a number such as 1.5 or 2, from 1.1 to 100"
FACTORS = {names.STRAGGLER_FACTOR}  # ranges of plain numbers, not durations
DIRS = "local=/abs/path,persistent=/abs/path (either part may be left out)"
DIR_FORM = f"{DIRS}; each an absolute path without '.', '..' or '//', not /"
TWO_DIRS = f"{DIRS}; two directories, neither in the other"

# Python's int() takes all of these; a policy integer (and a report number) is canonical only.
# Full-width (\uff11) and Arabic-Indic (\u0661) digits are escaped: ruff flags them as look-alikes.
NON_CANONICAL_INTS = [
    "\uff11",
    "\u0661",
    "1_0",
    " 1",
    "1 ",
    "+1",
    "01",
    "-0",
    "00",
    "1.0",
    "0x1",
    "1e1",
]

# (annotation, malformed value, the accepted form the error must state)
MODULES = "Python module names, comma-separated (e.g. torch or torch,numpy), at most 32"
REJECTED: list[tuple[str, str, str]] = [
    (names.ENABLED, "yes", '"true" or "false"'),
    (names.ENABLED, "True", '"true" or "false"'),
    (names.INPLACE_BUDGET, "-1", BUDGET),
    (names.INPLACE_BUDGET, "10001", BUDGET),
    (names.INPLACE_BUDGET, "three", BUDGET),
    (names.INPLACE_BUDGET, "2.5", BUDGET),
    (names.INPLACE_BUDGET, " 7 ", BUDGET),
    (names.INPLACE_BUDGET, "9" * 5000, BUDGET),  # beyond int()'s 4300 digits: still refused
    *((names.INPLACE_BUDGET, v, BUDGET) for v in NON_CANONICAL_INTS),
    (names.RECREATE_BUDGET, "", BUDGET),
    (names.RECREATE_BUDGET, "10001", BUDGET),
    *((names.RECREATE_BUDGET, v, BUDGET) for v in NON_CANONICAL_INTS),
    (names.BARRIER_TIMEOUT, "soon", BARRIER),
    (names.BARRIER_TIMEOUT, "300", BARRIER),  # a unit is required
    (names.BARRIER_TIMEOUT, "", BARRIER),
    (names.BARRIER_TIMEOUT, "1d", BARRIER),
    (names.BARRIER_TIMEOUT, "-5s", BARRIER),
    (names.BARRIER_TIMEOUT, "5m1h", BARRIER),  # largest unit first
    (names.BARRIER_TIMEOUT, " 5m", BARRIER),
    (names.BARRIER_TIMEOUT, "5m ", BARRIER),
    (names.BARRIER_TIMEOUT, "5m\n", BARRIER),
    (names.BARRIER_TIMEOUT, "\uff15m", BARRIER),  # full-width digit five
    (names.BARRIER_TIMEOUT, "\u0665m", BARRIER),  # Arabic-Indic digit
    (names.BARRIER_TIMEOUT, "1_0m", BARRIER),
    (names.BARRIER_TIMEOUT, "+5m", BARRIER),
    (names.BARRIER_TIMEOUT, "0s", BARRIER),  # escalated a failure to a JobSet restart in 67 ms
    (names.BARRIER_TIMEOUT, "29.999s", BARRIER),
    (names.BARRIER_TIMEOUT, "24h0m0.001s", BARRIER),
    (names.BARRIER_TIMEOUT, "25h", BARRIER),
    (names.BARRIER_TIMEOUT, "99999999h", BARRIER),  # past the year 9999: crashed the planner
    (names.BARRIER_TIMEOUT, "1" * 5000 + "h", BARRIER),
    (names.NODE_UNHEALTHY_AFTER, "15 s", NODE),
    (names.NODE_UNHEALTHY_AFTER, "0s", NODE),  # the flap filter off
    (names.NODE_UNHEALTHY_AFTER, "2.5s", NODE),
    (names.NODE_UNHEALTHY_AFTER, "4.999s", NODE),
    (names.NODE_UNHEALTHY_AFTER, "1h0m1s", NODE),
    (names.NODE_UNHEALTHY_AFTER, "2h", NODE),
    (names.KUEUE_RECOVERY_TIMEOUT, "3 minutes", KUEUE),
    (names.KUEUE_RECOVERY_TIMEOUT, "0s", KUEUE),
    (names.KUEUE_RECOVERY_TIMEOUT, "1m14s", KUEUE),
    (names.KUEUE_RECOVERY_TIMEOUT, "168h0m1s", KUEUE),
    (names.UNHEALTHY_TAINTS, "", NAMES),
    (names.UNHEALTHY_TAINTS, " , ", NAMES),
    (names.UNHEALTHY_TAINTS, "a.io/x,bad key", NAMES),
    (names.UNHEALTHY_CONDITIONS, "-Leading", NAMES),
    (names.UNHEALTHY_TAINTS, "x" * 400, NAMES),  # a name is 63 characters at most
    (names.UNHEALTHY_TAINTS, "a//b", NAMES),
    (names.UNHEALTHY_TAINTS, "Example.com/gpu", NAMES),  # a DNS prefix is lower case
    (names.UNHEALTHY_TAINTS, f"{'a' * 251}.io/x", NAMES),  # the prefix: 253 at most
    (names.UNHEALTHY_CONDITIONS, "Ready", NOT_READY),  # True on every healthy node
    (names.UNHEALTHY_CONDITIONS, "KernelDeadlock,Ready", NOT_READY),
    (names.HANG_TIMEOUT, "0s", HANG),  # off is the annotation left out
    (names.HANG_TIMEOUT, "1.999s", HANG),
    (names.HANG_TIMEOUT, "30", HANG),
    (names.HANG_TIMEOUT, "off", HANG),
    (names.HANG_TIMEOUT, "168h0m1s", HANG),
    (names.STARTUP_TIMEOUT, "9.999s", STARTUP),
    (names.STARTUP_TIMEOUT, "1d", STARTUP),
    (names.STRAGGLER_FACTOR, "1", FACTOR),
    (names.STRAGGLER_FACTOR, "1.09", FACTOR),
    (names.STRAGGLER_FACTOR, "100.5", FACTOR),
    (names.STRAGGLER_FACTOR, "1.5x", FACTOR),
    (names.STRAGGLER_FACTOR, " 2", FACTOR),
    (names.STRAGGLER_FACTOR, "1e1", FACTOR),
    (names.STRAGGLER_FACTOR, "nan", FACTOR),
    (names.STRAGGLER_FACTOR, "\uff12", FACTOR),
    (names.STRAGGLER_WINDOWS, "0", int_form(1, 20)),
    (names.STRAGGLER_WINDOWS, "21", int_form(1, 20)),
    (names.STRAGGLER_WINDOW, "29s", "a duration such as 1m, 5m or 15m, from 30s to 1h"),
    (names.STRAGGLER_WINDOW, "2h", "a duration such as 1m, 5m or 15m, from 30s to 1h"),
    (names.STRAGGLER_ACTION, "evict", "report or recreate"),
    (names.PLANNED_MOVES, "yes", '"true" or "false"'),
    (names.PLANNED_MOVE_TIMEOUT, "9s", "a duration such as 2m, 10m or 1h, from 10s to 24h"),
    (names.PLANNED_MOVE_TIMEOUT, "25h", "a duration such as 2m, 10m or 1h, from 10s to 24h"),
    (names.FORCE_DELETE, "always", "never or unreachable"),
    (names.FORCE_DELETE, "Never", "never or unreachable"),
    (names.MEMBER_REPEAT_LIMIT, "0", REPEAT),
    (names.MEMBER_REPEAT_LIMIT, "1001", REPEAT),
    *((names.MEMBER_REPEAT_LIMIT, v, REPEAT) for v in NON_CANONICAL_INTS),
    (names.NO_PROGRESS_LIMIT, "-1", NO_PROGRESS),
    (names.NO_PROGRESS_LIMIT, "1001", NO_PROGRESS),
    *((names.NO_PROGRESS_LIMIT, v, NO_PROGRESS) for v in NON_CANONICAL_INTS),
    (names.NO_COMMON_CHECKPOINT, "restart", "escalate or scratch"),
    # 1 is a Python crash and 2 the agent's configuration error: never "restart"
    (names.RESTART_EXIT_CODE, "1", EXIT),
    (names.RESTART_EXIT_CODE, "2", EXIT),
    (names.RESTART_EXIT_CODE, "256", EXIT),
    (names.RESTART_EXIT_CODE, "088", EXIT),
    (names.RESTART_EXIT_CODE, "\uff18\uff18", EXIT),
    (names.RESTART_EXIT_CODE, "\u0668\u0668", EXIT),
    (names.CHECKPOINT_DIRS, "", DIRS),
    (names.CHECKPOINT_DIRS, "local=relative/path", DIR_FORM),
    (names.CHECKPOINT_DIRS, "/no/tier", DIRS),
    (names.CHECKPOINT_DIRS, "remote=/x", DIRS),
    (names.CHECKPOINT_DIRS, "local=/a,local=/b", DIRS),
    (names.CHECKPOINT_DIRS, "local=/", DIR_FORM),
    (names.CHECKPOINT_DIRS, "local=/a/../../etc", DIR_FORM),
    (names.CHECKPOINT_DIRS, "local=/a/./b", DIR_FORM),
    (names.CHECKPOINT_DIRS, "persistent=/a//b", DIR_FORM),
    (names.CHECKPOINT_DIRS, "persistent=/ckpt/", DIR_FORM),
    (names.CHECKPOINT_DIRS, f"local=/{'a' * 4096}", DIR_FORM),
    (names.CHECKPOINT_DIRS, "local=/x,persistent=/x", TWO_DIRS),
    (names.CHECKPOINT_DIRS, "local=/x,persistent=/x/y", TWO_DIRS),
    (names.CHECKPOINT_DIRS, "local=/x/y,persistent=/x", TWO_DIRS),
    (names.ESCALATION, "restart", "restart-jobset or fail-jobset"),
    (names.TAINT_ON_DEVICE_FAULT, "yes", '"true" or "false"'),
    (names.TAINT_ON_DEVICE_FAULT, "TRUE", '"true" or "false"'),
    (names.RESTART_SCOPE, "container", "process or pod"),
    (names.TRAINER_STOP_GRACE, "1", "a duration such as 0s, 0.5s or 5s, from 0s to 5m"),
    (names.TRAINER_STOP_GRACE, "6m", "a duration such as 0s, 0.5s or 5s, from 0s to 5m"),
    (names.PRESTART_IMPORTS, "torch;rm -rf", MODULES),
    (names.PRESTART_IMPORTS, "torch,,numpy", MODULES),
    (names.PRESTART_IMPORTS, "1torch", MODULES),
    (names.PRESTART_IMPORTS, ",".join(["m"] * 33), MODULES),
    (names.PRESTART_WARM, "yes", '"true" or "false"'),
    (
        names.CHECKPOINT_LAYOUT,
        "pytorch",
        "jobset-inplace or orbax or torch-dcp or hf-trainer or megatron",
    ),
    (names.CHECKPOINT_STEP_PATTERN, "step-", PATTERN_FORM),
    (names.CHECKPOINT_STEP_PATTERN, "a/{step}", PATTERN_FORM),
    # the default layout (ours) has fixed names
    (
        names.CHECKPOINT_STEP_PATTERN,
        "ckpt-{step}",
        f"no {names.CHECKPOINT_STEP_PATTERN} with {names.CHECKPOINT_LAYOUT} jobset-inplace "
        "(step-{step})",
    ),
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
    shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:80]}... ({len(value)} chars)"
    assert str(e) == f"annotation {key}={shown} is invalid: expected {accepted}"
    assert isinstance(e, ValueError)
    if key in RANGES:  # the message states the range
        lo, hi = RANGES[key]
        fmt = format_duration if isinstance(lo, float) and key not in FACTORS else "{:g}".format
        assert f"from {fmt(lo)} to {fmt(hi)}" in str(e)


def test_every_annotation_key_has_a_rejected_form() -> None:
    assert {k for k, _, _ in REJECTED} == {k for k, *_ in ACCEPTED} | {names.ENABLED}


def test_every_malformed_key_is_reported_at_once_in_a_stable_order() -> None:
    bad = {names.ESCALATION: "x", names.BARRIER_TIMEOUT: "x", names.INPLACE_BUDGET: "x"}
    for order in (bad, dict(reversed(list(bad.items())))):
        with pytest.raises(PolicyErrors) as err:
            parse_policy({names.ENABLED: "true", **order})
        assert err.value.key == names.INPLACE_BUDGET, "the first, for callers that name one"
        assert [e.key for e in err.value.errors] == [
            names.INPLACE_BUDGET,
            names.BARRIER_TIMEOUT,
            names.ESCALATION,
        ]
        assert str(err.value).count("is invalid: expected") == 3
    # an invalid opt-in value is reported before any other key
    with pytest.raises(PolicyError) as first:
        parse_policy({names.ENABLED: "on", names.INPLACE_BUDGET: "x"})
    assert first.value.key == names.ENABLED


@pytest.mark.parametrize(
    ("typo", "nearest"),
    [
        (f"{names.PREFIX}inplace-budgte", names.INPLACE_BUDGET),
        (f"{names.PREFIX}barrier_timeout", names.BARRIER_TIMEOUT),
        (f"{names.PREFIX}restart-scopes", names.RESTART_SCOPE),
        (f"{names.PREFIX}something-else-entirely", None),
    ],
)
def test_an_unknown_key_is_an_error_naming_the_nearest_known_key(
    typo: str, nearest: str | None
) -> None:
    (e,) = unknown_keys({names.ENABLED: "true", typo: "3", "other.io/x": "y"})
    assert e.key == typo
    if nearest:
        assert f"(did you mean {nearest}?)" in str(e)
    else:
        assert "did you mean" not in str(e)
    assert unknown_keys({k: "x" for k in KNOWN_KEYS}) == []
    assert parse_policy({names.ENABLED: "true", typo: "3"}) == Policy(), "left to admission"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (2.5, "2.5s"), (30, "30s"), (75, "1m15s"), (3600, "1h"), (3723, "1h2m3s"),
     (86_400, "24h"), (604_800, "168h")],
)  # fmt: skip
def test_format_duration_is_read_back_by_parse_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration("k", text) == seconds


def test_parse_duration_itself_is_unbounded_but_canonical() -> None:
    """The plugin's --barrier-timeout and Kueue's configured recoveryTimeout use the bare
    parse (no policy range), with the same form."""
    assert parse_duration("k", "0s") == 0.0
    assert parse_duration("k", "48h") == 172_800.0
    for bad in (" 5m", "\uff15m", "1_0s", "1" * 100 + "s"):
        with pytest.raises(PolicyError):
            parse_duration("k", bad)


def test_a_jobset_is_managed_while_opted_in_and_not_being_deleted() -> None:
    on = {"metadata": {"annotations": {names.ENABLED: "true"}}}
    assert is_managed(on)
    assert not is_managed({"metadata": {"annotations": {names.ENABLED: "false"}}})
    deleting = {"metadata": {**on["metadata"], "deletionTimestamp": "2026-11-23T00:00:00Z"}}
    assert not is_managed(deleting), "a foreground deletion removes the GangState first"
