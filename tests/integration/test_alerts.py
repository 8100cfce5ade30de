"""The shipped alerts (manifests/components/prometheus/prometheusrule.yaml) checked by Prometheus's
own tools: ``promtool check rules`` on its rule groups, and ``promtool test rules`` with a case
per alert where it fires (with its labels and annotations as Alertmanager would get them) and
one where it stays quiet. promtool is built from its Go module (testbed/build-binaries.sh
prometheus)."""

# ruff: noqa: E501  (series names in the cases table)
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.versions import REPO_ROOT, ensure_binaries

RULE = REPO_ROOT / "manifests" / "components" / "prometheus" / "prometheusrule.yaml"


def _hist(name: str, labels: str, buckets: dict[str, str]) -> list[dict[str, str]]:
    """A histogram's bucket series: ``le`` -> values."""
    sep = "," if labels else ""
    return [
        {"series": f'{name}_bucket{{{labels}{sep}le="{le}"}}', "values": values}
        for le, values in buckets.items()
    ]


# alert -> (series where it fires, eval time, the alert's own labels; series where it is quiet)
CASES: dict[str, tuple[list[dict[str, str]], str, dict[str, str], list[dict[str, str]]]] = {
    "JobsetInplaceNoLeader": (
        [{"series": 'jobset_inplace_leader{pod="a"}', "values": "0x10"}],
        "5m",
        {},
        [
            {"series": 'jobset_inplace_leader{pod="a"}', "values": "1x10"},
            {"series": 'jobset_inplace_leader{pod="b"}', "values": "0x10"},
        ],
    ),
    "JobsetInplaceTwoLeaders": (
        [
            {"series": 'jobset_inplace_leader{pod="a"}', "values": "1x10"},
            {"series": 'jobset_inplace_leader{pod="b"}', "values": "1x10"},
        ],
        "5m",
        {},
        [
            {"series": 'jobset_inplace_leader{pod="a"}', "values": "1x10"},
            {"series": 'jobset_inplace_leader{pod="b"}', "values": "0x10"},
        ],
    ),
    "JobsetInplaceEscalations": (
        [
            {
                "series": 'jobset_inplace_escalations_total{reason="BudgetExhausted"}',
                "values": "0 0 1 1 1 1",
            }
        ],
        "5m",
        {"reason": "BudgetExhausted"},
        [
            {
                "series": 'jobset_inplace_escalations_total{reason="BudgetExhausted"}',
                "values": "3x10",
            }
        ],
    ),
    "JobsetInplaceBudgetExhausted": (
        [
            {
                "series": 'jobset_inplace_gang_restart_budget_remaining{namespace="ns",jobset="g",budget="in_place"}',
                "values": "0x5",
            }
        ],
        "3m",
        {"namespace": "ns", "jobset": "g", "budget": "in_place"},
        [
            {
                "series": 'jobset_inplace_gang_restart_budget_remaining{namespace="ns",jobset="g",budget="in_place"}',
                "values": "1x5",
            }
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
            {
                "series": 'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="Escalated"}',
                "values": "0+2x10",
            },
            {
                "series": 'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="BarrierOpened"}',
                "values": "0+1x10",
            },
        ],
        "10m",
        {},
        [
            {
                "series": 'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="Escalated"}',
                "values": "0+1x10",
            },
            {
                "series": 'jobset_inplace_recoveries_total{cause="TrainerExited",outcome="BarrierOpened"}',
                "values": "0+2x10",
            },
        ],
    ),
    "JobsetInplaceWatchRestartStorm": (
        [
            {
                "series": 'jobset_inplace_watch_restarts_total{watch="pods",reason="error"}',
                "values": "0+1x15",
            }
        ],
        "12m",
        {"watch": "pods"},
        [
            {
                "series": 'jobset_inplace_watch_restarts_total{watch="pods",reason="error"}',
                "values": "0+0.2x15",
            }
        ],
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
            {"series": "jobset_inplace_passes_total", "values": "0+10x30"},
            {"series": "jobset_inplace_pass_failures_total", "values": "0+5x30"},
        ],
        "25m",
        {},
        [
            {"series": "jobset_inplace_passes_total", "values": "0+10x30"},
            {"series": "jobset_inplace_pass_failures_total", "values": "0x30"},
        ],
    ),
    "JobsetInplaceGangsEscalated": (
        [{"series": 'jobset_inplace_gangs{phase="Escalated"}', "values": "1x30"}],
        "20m",
        {},
        [
            {"series": 'jobset_inplace_gangs{phase="Running"}', "values": "3x30"},
            {"series": 'jobset_inplace_gangs{phase="Escalated"}', "values": "0x30"},
        ],
    ),
    "JobsetInplaceReportChannelUnreachable": (
        [
            {
                "series": 'jobset_inplace_gang_members_reporting_on_pod{namespace="ns",jobset="g"}',
                "values": "2x30",
            }
        ],
        "15m",
        {"namespace": "ns", "jobset": "g"},
        [
            {
                "series": 'jobset_inplace_gang_members_reporting_on_pod{namespace="ns",jobset="g"}',
                "values": "0x30",
            }
        ],
    ),
}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULE.read_text())
    return [r for g in doc["spec"]["groups"] for r in g["rules"]]


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


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_binaries("promtool").promtool


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    assert sorted(CASES) == sorted(r["alert"] for r in _rules())


def test_promtool_checks_and_tests_the_rules(promtool: Path, tmp_path: Path) -> None:
    groups = yaml.safe_load(RULE.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_promtool_tests(), sort_keys=False))
    check = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(CASES)} rules found" in check.stdout + check.stderr
    test = subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout + test.stderr


def test_a_wrong_expectation_fails_promtool(promtool: Path, tmp_path: Path) -> None:
    """The harness can fail: an alert expected where it stays quiet is reported."""
    groups = yaml.safe_load(RULE.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    tests = _promtool_tests()
    quiet = tests["tests"][1]["alert_rule_test"][0]
    quiet["exp_alerts"] = tests["tests"][0]["alert_rule_test"][0]["exp_alerts"]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    test = subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert test.returncode != 0
    assert "JobsetInplaceNoLeader" in test.stdout + test.stderr
