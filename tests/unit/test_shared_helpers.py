"""The helpers each fact has one home for: RFC 3339 times (jobset_inplace.times), 404 -> None
(jobset_inplace.apierrors), condition lookup and member names (core.decode), the opt-in check
(core.policy) and the int check of steps and epochs (trainer.checkpoints)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.decode import (
    MEMBER_LABELS,
    condition,
    condition_true,
    expected_members,
    member_key,
)
from jobset_inplace.core.policy import PolicyError, is_enabled, parse_enabled, parse_policy
from jobset_inplace.names import member_name
from jobset_inplace.times import format_time, parse_time, rfc3339
from jobset_inplace.trainer.checkpoints import is_int

T = 1795255200.123456  # 2026-11-21T10:00:00.123456Z


# --- times -------------------------------------------------------------------------------------
def test_format_time_to_the_microsecond_or_the_second() -> None:
    assert format_time(T) == "2026-11-21T10:00:00.123456Z"
    assert format_time(T, micro=False) == "2026-11-21T10:00:00Z"
    assert format_time(0) == "1970-01-01T00:00:00.000000Z"


def test_format_time_defaults_to_now() -> None:
    before = time.time()
    now = parse_time(format_time())
    assert now is not None
    assert before - 1e-6 <= now <= time.time()


def test_rfc3339_passes_none_through() -> None:
    assert rfc3339(None) is None
    assert rfc3339(T) == format_time(T)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2026-11-21T10:00:00.123456Z", T),
        ("2026-11-21T10:00:00Z", 1795255200.0),
        ("2026-11-21T11:00:00+01:00", 1795255200.0),
        ("1970-01-01T00:00:00Z", 0.0),
        (None, None),
        ("", None),
    ],
)
def test_parse_time(text: str | None, seconds: float | None) -> None:
    assert parse_time(text) == seconds


def test_parse_time_inverts_format_time() -> None:
    for t in (0.0, 1.5, T, 2000000000.999999):
        assert parse_time(format_time(t)) == pytest.approx(t, abs=1e-6)
        assert format_time(parse_time(format_time(t))) == format_time(t)


def test_parse_time_refuses_what_is_not_a_time() -> None:
    with pytest.raises(ValueError, match="Invalid isoformat"):
        parse_time("yesterday")


# --- 404 -> None -------------------------------------------------------------------------------
def test_or_none_returns_the_answer_and_passes_the_arguments() -> None:
    def read(name: str, namespace: str, *, pretty: bool = False) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "pretty": pretty}

    assert or_none(read, "a", "ns", pretty=True) == {"name": "a", "namespace": "ns", "pretty": True}


def test_or_none_is_none_on_404_only() -> None:
    def fails(status: int) -> None:
        raise ApiException(status=status, reason="x")

    assert or_none(fails, 404) is None
    for status in (403, 409, 500):
        with pytest.raises(ApiException) as info:
            or_none(fails, status)
        assert info.value.status == status


# --- conditions --------------------------------------------------------------------------------
def test_condition_finds_the_type_and_returns_a_copy() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    node = {"status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, ready]}}
    found = condition(node, "Ready")
    assert found == ready
    assert found is not ready
    assert condition(node, "DiskPressure") is None
    assert condition_true(node, "Ready")
    assert not condition_true(node, "MemoryPressure")
    assert not condition_true(node, "DiskPressure")


@pytest.mark.parametrize(
    "obj", [{}, {"status": None}, {"status": {}}, {"status": {"conditions": None}}]
)
def test_condition_of_an_object_without_conditions(obj: dict[str, Any]) -> None:
    assert condition(obj, "Ready") is None
    assert not condition_true(obj, "Ready")


# --- member names ------------------------------------------------------------------------------
def test_member_name_and_key() -> None:
    assert member_name("workers", 2, 0) == "workers/2/0"
    labels = dict(zip(MEMBER_LABELS, ("workers", "2", "0"), strict=True))
    assert member_key(labels) == "workers/2/0"
    del labels[names.JOB_INDEX_LABEL]
    assert member_key(labels) is None


def test_expected_members_use_the_member_names() -> None:
    jobset = {
        "spec": {
            "replicatedJobs": [
                {"name": "w", "replicas": 2, "template": {"spec": {"parallelism": 2}}},
                {"name": "d", "template": {"spec": {}}},
            ]
        }
    }
    assert expected_members(jobset) == {"w/0/0", "w/0/1", "w/1/0", "w/1/1", "d/0/0"}


# --- opt-in ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("annotations", "enabled"),
    [
        (None, False),
        ({}, False),
        ({names.ENABLED: "false"}, False),
        ({names.ENABLED: "true"}, True),
        ({names.ENABLED: "True"}, False),
    ],
)
def test_is_enabled_only_for_true(annotations: dict[str, str] | None, enabled: bool) -> None:
    assert is_enabled(annotations) is enabled


def test_parse_enabled_refuses_what_is_neither_true_nor_false() -> None:
    assert parse_enabled({names.ENABLED: "true"}) is True
    assert parse_enabled({names.ENABLED: "false"}) is False
    assert parse_enabled(None) is False
    for value in ("True", "yes", " true", ""):
        with pytest.raises(PolicyError) as info:
            parse_enabled({names.ENABLED: value})
        assert (info.value.key, info.value.value) == (names.ENABLED, value)
        assert '"true" or "false"' in str(info.value)
        with pytest.raises(PolicyError):
            parse_policy({names.ENABLED: value})


# --- ints --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, True),
        (-3, True),
        (2**63, True),
        (True, False),
        (False, False),
        (1.0, False),
        ("1", False),
    ],
)
def test_is_int_excludes_bools(value: object, expected: bool) -> None:
    assert is_int(value) is expected
