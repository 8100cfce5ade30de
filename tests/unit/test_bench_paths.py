"""The benchmark's upstream path: its gang shape, its attempts, and the report's comparisons."""

from __future__ import annotations

from typing import Any

import pytest

from bench import report, scenarios, upstream
from bench.upstream_fleet import Attempts
from testbed import workloads


def _gang() -> dict[str, Any]:
    return workloads.jobset("g", [("workers", 3, 10)], pod=workloads.whole_node_trainer("24"))


def test_sidecar_mode_shape() -> None:
    js = upstream.in_place_restart(_gang(), "sidecar", image="agent:x", agent_path="/agent")
    assert js["spec"]["failurePolicy"]["restartStrategy"] == "InPlaceRestart"
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["completions"] == job["parallelism"] == 10  # upstream refuses anything else
    pod = job["template"]["spec"]
    (agent,) = pod["initContainers"]
    assert agent["name"] == upstream.AGENT
    assert agent["restartPolicy"] == "Always"
    assert agent["restartPolicyRules"][0]["exitCodes"]["values"] == [upstream.EXIT_CODE]
    assert agent["startupProbe"]["httpGet"]["path"] == upstream.PROBE_PATH
    trainer = pod["containers"][0]
    assert trainer["restartPolicyRules"][0]["action"] == "RestartAllContainers"
    assert trainer["command"] == ["python3", "train.py"]


def test_main_mode_runs_the_trainer_under_the_agent() -> None:
    js = upstream.in_place_restart(_gang(), "main", image="agent:x", agent_path="/agent")
    trainer = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert trainer["command"] == ["/agent"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["WORKER_COMMAND"] == "python3 train.py"
    assert trainer["restartPolicyRules"][0]["action"] == "Restart"


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode: expected sidecar or main"):
        upstream.in_place_restart(_gang(), "pod", image="a", agent_path="/a")


def test_attempts_keep_the_newest_of_two_reads() -> None:
    old = Attempts.of({"status": {"currentInPlaceRestartAttempt": 1}})
    new = Attempts.of(
        {"status": {"currentInPlaceRestartAttempt": 1, "previousInPlaceRestartAttempt": 1}}
    )
    assert old.newest(new) == new.newest(old) == Attempts(1, 1)
    assert Attempts.of({}).newest(old) == Attempts(1, None)


def _runs(values: list[float], **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "detection_s": 0.1,
            "restart_s": v - 0.2,
            "barrier_s": 0.1,
            "barrier_open_s": v,
            "protocol_s": v,
            "all_running_s": v,
            "controller_cpu_s": 1.0,
            "controller_peak_rss_mib": 100.0,
            **extra,
        }
        for v in values
    ]


def test_report_ratios_against_both_peers() -> None:
    results = {
        "sizes": {
            "1000": {
                "hybrid": {
                    "worker_failure": _runs([2.0, 2.0, 4.0]),
                    "node_death": [{"running_s": 50.0, "detection_s": 20.0}],
                },
                "upstream": {
                    "worker_failure": _runs([10.0, 12.0, 14.0]),
                    "node_death": [{"running_s": 480.0, "capped": True}],
                },
                "stock": {
                    "worker_failure": [{"all_running_s": 100.0}, {"all_running_s": 120.0}],
                    "node_death": [{"running_s": 481.0, "capped": True}],
                },
            }
        }
    }
    row = report.summarize(results)["1000"]
    assert row["paths"] == ["hybrid", "upstream", "stock"]
    assert row["ratio_upstream_over_hybrid_running"] == 6.0  # 12 / 2
    assert row["ratio_stock_over_hybrid_running"] == 55.0  # 110 / 2
    assert row["node_death"]["ratio_upstream_over_hybrid"] == 9.6
    assert row["node_death"]["upstream_capped"] is True
    table = report.markdown(results)
    assert "| 1000 pods | **2.00 / 2.00 / 4.00** | 10.00 / 12.00 / 14.00 |" in table
    # a peer that did not recover within the cap: said so, no ratio
    assert "| did not recover in 480 s |" in table
    assert "9.6x" not in table
    assert "| 1000 pods | 3 | **2.00 / 4.00** | 2.00 / 4.00 | - | 1.0 | 100 MiB |" in table
    text = report.text(results)
    assert "ratio upstream / hybrid: 6.0x (to barrier open), 6.0x (to all running)" in text
    assert "upstream did not recover within 480.0s (no ratio)" in text


def test_the_protocol_writes_are_the_controllers_and_agents() -> None:
    requests = {
        "PATCH gangstates/status": 2,
        "POST events": 2,
        "PATCH pods": 3,
        "PATCH pods/status": 1000,  # the simulated kubelets
        "PUT leases": 500,  # node heartbeats
        "GET gangstates": 1000,
    }
    assert report.protocol_writes(requests) == 7


def test_report_of_an_older_run_without_upstream() -> None:
    results = {
        "sizes": {
            "1000": {
                "hybrid": {"worker_failure": _runs([2.0]), "node_death": []},
                "stock": {"worker_failure": [{"all_running_s": 10.0}], "node_death": []},
            }
        }
    }
    row = report.summarize(results)["1000"]
    assert "ratio_upstream_over_hybrid_running" not in row
    assert row["ratio_stock_over_hybrid_running"] == 5.0
    assert "| 1000 pods | **2.00 / 2.00 / 2.00** | - | 10.00 / 10.00 / 10.00 | - |" in (
        report.markdown(results)
    )


def test_settling_counts_the_clusters_writes_about_the_gang_not_its_background() -> None:
    before = {"PUT leases": 100.0, "PUT jobs/status": 10.0, "GET pods": 5.0}
    after = {
        "PUT leases": 600.0,  # node heartbeats: background
        "PATCH nodes/status": 50.0,
        "POST events": 30.0,
        "GET pods": 500.0,  # reads are not writes
        "PUT jobs/status": 40.0,  # the Job controller still at work: 30
        "PATCH pods/status": 20.0,  # new since the first reading: 20
    }
    assert scenarios.settling_writes(before, after, 10.0) == 5.0
    assert scenarios.settling_writes(after, after, 10.0) == 0.0
