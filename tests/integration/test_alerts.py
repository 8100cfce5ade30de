"""The shipped alerts (manifests/components/prometheus/prometheusrule.yaml) checked by Prometheus's
own tools: ``promtool check rules`` on its rule groups, and ``promtool test rules`` with a case
per alert where it fires (with its labels and annotations as Alertmanager would get them) and
one where it stays quiet. promtool is built from its Go module (testbed/build-binaries.sh
prometheus)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.prometheus import rule_groups
from testbed.versions import ensure_binaries


def _s(series: str, values: str) -> dict[str, str]:
    """An input series of a promtool test: its selector and values (promtool's notation)."""
    return {"series": series, "values": values}


def _hist(name: str, labels: str, buckets: dict[str, str]) -> list[dict[str, str]]:
    """A histogram's bucket series: ``le`` -> values."""
    sep = "," if labels else ""
    return [_s(f'{name}_bucket{{{labels}{sep}le="{le}"}}', v) for le, v in buckets.items()]


# alert -> (series where it fires, eval time, the alert's own labels; series where it is quiet)
CASES: dict[str, tuple[list[dict[str, str]], str, dict[str, str], list[dict[str, str]]]] = {
    "JobsetInplaceNoLeader": (
        [_s('jobset_inplace_leader{pod="a"}', "0x10")],
        "5m",
        {},
        [
            _s('jobset_inplace_leader{pod="a"}', "1x10"),
            _s('jobset_inplace_leader{pod="b"}', "0x10"),
        ],
    ),
    "JobsetInplaceTwoLeaders": (
        [
            _s('jobset_inplace_leader{pod="a"}', "1x10"),
            _s('jobset_inplace_leader{pod="b"}', "1x10"),
        ],
        "5m",
        {},
        [
            _s('jobset_inplace_leader{pod="a"}', "1x10"),
            _s('jobset_inplace_leader{pod="b"}', "0x10"),
        ],
    ),
    "JobsetInplaceEscalations": (
        [_s('jobset_inplace_escalations_total{reason="BudgetExhausted"}', "0 0 1 1 1 1")],
        "5m",
        {"reason": "BudgetExhausted"},
        [_s('jobset_inplace_escalations_total{reason="BudgetExhausted"}', "3x10")],
    ),
    "JobsetInplaceBudgetExhausted": (
        [
            _s(
                'jobset_inplace_gang_restart_budget_remaining{namespace="ns",jobset="g",budget="in_place"}',
                "0x5",
            )
        ],
        "3m",
        {"namespace": "ns", "jobset": "g", "budget": "in_place"},
        [
            _s(
                'jobset_inplace_gang_restart_budget_remaining{namespace="ns",jobset="g",budget="in_place"}',
                "1x5",
            )
        ],
    ),
    # every recovery between 60 s and 600 s (p95 ~570 s) / all under 60 s
    "JobsetInplaceSlowRecoveries": (
        _hist(
            "jobset_inplace_recovery_duration_seconds",
            "",
            {"60": "0x10", "600": "0+1x10", "+Inf": "0+1x10"},
        ),
        "10m",
        {},
        _hist(
            "jobset_inplace_recovery_duration_seconds",
            "",
            {"60": "0+1x10", "600": "0+1x10", "+Inf": "0+1x10"},
        ),
    ),
    "JobsetInplaceSlowDetection": (
        _hist(
            "jobset_inplace_recovery_detection_seconds",
            "",
            {"30": "0x10", "120": "0+1x10", "+Inf": "0+1x10"},
        ),
        "10m",
        {},
        _hist(
            "jobset_inplace_recovery_detection_seconds",
            "",
            {"30": "0+1x10", "120": "0+1x10", "+Inf": "0+1x10"},
        ),
    ),
    "JobsetInplaceRecoveriesNotCompleting": (
        [
            _s(
                'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="Escalated"}',
                "0+2x10",
            ),
            _s(
                'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="BarrierOpened"}',
                "0+1x10",
            ),
        ],
        "10m",
        {},
        [
            _s(
                'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="Escalated"}',
                "0+1x10",
            ),
            _s(
                'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="BarrierOpened"}',
                "0+2x10",
            ),
        ],
    ),
    "JobsetInplaceWatchRestartStorm": (
        [_s('jobset_inplace_watch_restarts_total{watch="pods",reason="error"}', "0+1x15")],
        "12m",
        {"watch": "pods"},
        [_s('jobset_inplace_watch_restarts_total{watch="pods",reason="error"}', "0+0.2x15")],
    ),
    "JobsetInplaceEventLag": (
        _hist(
            "jobset_inplace_event_lag_seconds",
            'watch="pods"',
            {"1": "0x30", "60": "0+1x30", "+Inf": "0+1x30"},
        ),
        "25m",
        {"watch": "pods"},
        _hist(
            "jobset_inplace_event_lag_seconds",
            'watch="pods"',
            {"1": "0+1x30", "60": "0+1x30", "+Inf": "0+1x30"},
        ),
    ),
    "JobsetInplacePassesFailing": (
        [
            _s("jobset_inplace_passes_total", "0+10x30"),
            _s("jobset_inplace_pass_failures_total", "0+5x30"),
        ],
        "25m",
        {},
        [
            _s("jobset_inplace_passes_total", "0+10x30"),
            _s("jobset_inplace_pass_failures_total", "0x30"),
        ],
    ),
    "JobsetInplaceGangsEscalated": (
        [_s('jobset_inplace_gangs{phase="Escalated"}', "1x30")],
        "20m",
        {},
        [
            _s('jobset_inplace_gangs{phase="Running"}', "3x30"),
            _s('jobset_inplace_gangs{phase="Escalated"}', "0x30"),
        ],
    ),
    "JobsetInplaceReportChannelUnreachable": (
        [_s('jobset_inplace_gang_members_reporting_on_pod{namespace="ns",jobset="g"}', "2x30")],
        "15m",
        {"namespace": "ns", "jobset": "g"},
        [_s('jobset_inplace_gang_members_reporting_on_pod{namespace="ns",jobset="g"}', "0x30")],
    ),
}


def _rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups()["groups"] for r in g["rules"]]


def _expanded(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it for an alert with ``labels``."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)


def _promtool_tests() -> dict[str, Any]:
    tests = []
    for rule in _rules():
        firing, at, labels, quiet = CASES[rule["alert"]]
        exp = {"exp_labels": {**labels, **rule["labels"]}}
        exp["exp_annotations"] = {k: _expanded(v, labels) for k, v in rule["annotations"].items()}
        for series, alerts in ((firing, [exp]), (quiet, [])):
            tests.append(
                {
                    "interval": "1m",
                    "input_series": series,
                    "alert_rule_test": [
                        {"eval_time": at, "alertname": rule["alert"], "exp_alerts": alerts}
                    ],
                }
            )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def _promtool(promtool: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_binaries("promtool").promtool


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    assert sorted(CASES) == sorted(r["alert"] for r in _rules())


def test_promtool_checks_and_tests_the_rules(promtool: Path, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_promtool_tests(), sort_keys=False))
    check = _promtool(promtool, tmp_path, "check", "rules", "rules.yaml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(CASES)} rules found" in check.stdout + check.stderr
    test = _promtool(promtool, tmp_path, "test", "rules", "tests.yaml")
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout + test.stderr


def test_a_wrong_expectation_fails_promtool(promtool: Path, tmp_path: Path) -> None:
    """The harness can fail: an alert expected where it stays quiet is reported."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    tests = _promtool_tests()
    quiet = tests["tests"][1]["alert_rule_test"][0]
    quiet["exp_alerts"] = tests["tests"][0]["alert_rule_test"][0]["exp_alerts"]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    test = _promtool(promtool, tmp_path, "test", "rules", "tests.yaml")
    assert test.returncode != 0
    assert "JobsetInplaceNoLeader" in test.stdout + test.stderr
