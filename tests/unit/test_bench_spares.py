"""The hot spares benchmark (bench/spares.py): its gang, how the simulated agents find their
place, and how its figures are summarized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import scenarios
from bench import spares as bench_spares
from bench.fleet import agent_env
from jobset_inplace import names
from jobset_inplace.agent.config import position_from_env
from jobset_inplace.agent.logic import Position


def _bench(pods_per_job: int = 1) -> scenarios.Bench:
    return scenarios.Bench(
        kube=None,  # type: ignore[arg-type]  # _gang makes no API call
        namespace="bench",
        server="https://127.0.0.1:1",
        ca_file=Path("/ca"),
        token_file=Path("/token"),
        meter=None,  # type: ignore[arg-type]
        restart_delay=0.0,
        pods_per_job=pods_per_job,
        setup_timeout=1.0,
        stock_cap=1.0,
        node_cap=1.0,
        hot_spares=2,
    )


def _pod(js: dict[str, Any], index: int) -> dict[str, Any]:
    """A pod of the gang's Job ``index`` as JobSet and the Job controller make it."""
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    name = js["metadata"]["name"]
    return {
        "metadata": {
            "name": f"{name}-workers-{index}-0",
            "namespace": "bench",
            "labels": {names.JOBSET_NAME_LABEL: name, names.JOB_INDEX_LABEL: str(index)},
        },
        "spec": template["spec"],
    }


def test_the_spares_gang_has_one_pod_per_job_and_its_spares_beside_the_members() -> None:
    js = _bench()._gang("spares-5", 5, "spares")
    assert js["metadata"]["annotations"][names.HOT_SPARES] == "2"
    (rj,) = js["spec"]["replicatedJobs"]
    assert rj["replicas"] == 7  # the webhook's transform raised it by the spares
    assert rj["template"]["spec"]["parallelism"] == 1
    # the simulated agent of a spare's pod finds its place as the real one would
    pos = position_from_env(agent_env(_pod(js, 6)), "spares-5")
    assert pos is not None
    assert pos == Position("spares-5", "workers", 5, 6, pos.domain)
    assert pos.domain == "spares-5"  # JobSet's subdomain: the peers' DNS names
    assert pos.slot({}) is None  # a spare: holds no slot
    member = position_from_env(agent_env(_pod(js, 3)), "spares-5")
    assert member is not None
    assert member.slot({}) == 3


def test_other_gangs_agents_have_no_place() -> None:
    js = _bench()._gang("hybrid-5", 5, "hybrid")
    assert names.HOT_SPARES not in js["metadata"]["annotations"]
    assert position_from_env(agent_env(_pod(js, 1)), "hybrid-5") is None


def test_the_spares_path_refuses_jobs_of_several_pods() -> None:
    with pytest.raises(ValueError, match="--pods-per-job 1"):
        _bench(pods_per_job=10)._gang("spares-20", 20, "spares")


def test_percentile_is_a_measured_value() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert bench_spares.percentile(values, 50) == 3.0
    assert bench_spares.percentile(values, 99) == 5.0  # fewer than 100: the largest
    assert bench_spares.percentile(list(map(float, range(1, 201))), 99) == 198.0


def _death(running: float, **kw: Any) -> dict[str, Any]:
    return {"running_s": running, "detection_s": 1.0, **kw}


def test_summary_counts_swaps_and_compares_like_for_like() -> None:
    paths = {
        "spares": {
            "node_death": [
                _death(6.0, swapped=True),
                _death(8.0, swapped=True),
                _death(30.0, swapped=False),  # no spare was ready: counted, not hidden
                _death(480.0, capped=True, swapped=False),
            ],
            "idle": {"seconds": 10.0, "controller_cpu_s": 1.5, "heartbeats": 10000},
        },
        "hybrid": {"node_death": [_death(40.0), _death(44.0)]},
        "upstream": {"node_death": [_death(100.0)]},  # one: no interval, no ratio
    }
    s = bench_spares.summarize(paths, 2)
    assert s["spares"].pop("p50_interval_s") == [6.0, 30.0]
    assert s["spares"] | {} == {
        "deaths": 4,
        "recovered": 3,
        "on_a_spare": 2,
        "p50_s": 8.0,
        "p99_s": 30.0,
        "min_s": 6.0,
        "max_s": 30.0,
        "detection_p50_s": 1.0,
        "idle_controller_cores": 0.15,
        "idle_heartbeats_per_s": 1000.0,
    }
    assert s["ratio_hybrid_over_spares"]["ratio"] == pytest.approx(42.0 / 8.0)
    assert "ratio_upstream_over_spares" not in s
    assert s["spare_cost"]["pods"] == 2
    # a verdict only where the interval (and every death recovered) supports it
    assert s["goal"] | {} == {"p50_s": 10.0, "p99_s": 15.0, "p50_met": False, "p99_met": False}
    s["spares"]["p50_interval_s"] = [6.0, 30.0]
    assert "hybrid / spares: 5.25x" in bench_spares.text(
        {"settings": {"size": 5}, "paths": paths, "summary": s}
    )


def test_bad_arguments_are_refused_naming_the_option() -> None:
    with pytest.raises(SystemExit):
        bench_spares.parse_args(["--paths", "spares,stock"])
    with pytest.raises(SystemExit):
        bench_spares.parse_args(["--hot-spares", "0"])
    args = bench_spares.parse_args(["--size", "100", "--paths", "hybrid,spares"])
    assert args.paths == ["hybrid", "spares"]


def test_the_goal_is_met_only_when_the_interval_and_every_death_say_so() -> None:
    fast = [_death(x, swapped=True) for x in (5.0, 6.0, 6.5, 7.0, 8.0)]
    s = bench_spares.summarize({"spares": {"node_death": fast}}, 2)
    assert s["goal"]["p50_met"]
    assert s["goal"]["p99_met"] is None, "5 deaths within it do not show a p99"
    table = "\n".join(
        bench_spares.table(
            {
                "settings": {"size": 1000, "hot_spares": 2},
                "paths": {"spares": {"node_death": fast}},
                "summary": s,
            }
        )
    )
    assert "p50 6.5 s (95 % interval" in table
    assert "**met**" in table
    assert "every one of the 5 deaths within it, but a p99 needs 100 deaths: **not shown**" in table
    stuck = [*fast, _death(480.0, capped=True)]
    assert bench_spares.summarize({"spares": {"node_death": stuck}}, 2)["goal"]["p99_met"] is False
    many = [_death(5.0 + (x % 7) / 2, swapped=True) for x in range(100)]
    assert bench_spares.summarize({"spares": {"node_death": many}}, 2)["goal"]["p99_met"] is True
