"""The real-node crash benchmark's paths (like for like: grace periods, the persistent tier) and
its summary (ratios within one run, the gang's consistency)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import realnode, realnode_deaths
from bench.realnode import Run
from jobset_inplace import names
from testbed import workloads

SHARED = Path("/shared")


def _pod(js: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


def _env(js: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in _pod(js)["containers"][0]["env"]}


@pytest.mark.parametrize("path", realnode.PATHS)
def test_every_path_checkpoints_to_a_persistent_tier_of_its_own(path: str) -> None:
    js = realnode.jobset_for(path, f"{path}-0", SHARED)
    [shared] = [v for v in _pod(js)["volumes"] if v["name"] == "shared"]
    assert shared["hostPath"]["path"] == f"/shared/{path}-0"
    assert _env(js)["JSI_DEMO_PERSIST_EVERY"] == "10", "every checkpoint in both tiers"


@pytest.mark.parametrize(
    ("path", "grace"),
    [
        ("stock", 2),
        ("stock-grace0", 0),
        ("upstream-sidecar", 2),
        ("upstream-sidecar-grace0", 0),
        ("upstream-main", 2),
        ("upstream-main-grace0", 0),
    ],
)
def test_grace0_paths_have_no_grace_period(path: str, grace: int) -> None:
    assert _pod(realnode.jobset_for(path, "x", SHARED))["terminationGracePeriodSeconds"] == grace


def test_the_upstream_grace0_paths_are_the_upstream_modes() -> None:
    main = realnode.jobset_for("upstream-main-grace0", "x", SHARED)
    plain = realnode.jobset_for("upstream-main", "x", SHARED)
    _pod(main).pop("terminationGracePeriodSeconds")
    _pod(plain).pop("terminationGracePeriodSeconds")
    assert main == plain


def _run(path: str, running: float, steps: dict[str, int]) -> Run:
    return Run(path, 0, None, running, {"pods": 2}, steps)


def test_the_table_gives_ratios_to_both_scopes_and_counts_consistent_resumes() -> None:
    runs = [
        _run("jsi-process", 0.2, {"0": 40, "1": 40}),
        _run("jsi-pod", 2.0, {"0": 40, "1": 40}),
        _run("stock", 4.0, {"0": 40, "1": 30}),
        _run("stock", 6.0, {"0": 40, "1": 40}),
    ]
    s = realnode.summary(runs)
    assert (s["stock"].running_median, s["stock"].consistent, s["stock"].reps) == (5.0, 1, 2)
    stock_row = next(r for r in realnode.table(s).splitlines() if r.startswith("| stock |"))
    assert "| 25.0x | 2.5x | 1/2 |" in stock_row
    assert not runs[2].consistent


def test_p99_is_a_measured_value_by_nearest_rank() -> None:
    from bench.report import nearest_rank, stats  # noqa: PLC0415

    thirty = [float(i) for i in range(1, 31)]
    assert nearest_rank(thirty, 0.99) == 30.0, "with 30 values p99 is the largest"
    assert nearest_rank(thirty, 0.5) == 15.0
    assert nearest_rank([float(i) for i in range(1, 201)], 0.99) == 198.0
    assert stats([2.0, 1.0, 3.0]) == {
        "n": 3,
        "median_ci": [1.0, 3.0],
        "min": 1.0,
        "median": 2.0,
        "p99": 3.0,
        "max": 3.0,
    }
    assert "median_ci" not in (stats([2.0]) or {}), "no interval from one value"


@pytest.mark.parametrize("path", ["upstream-sidecar-grace0", "upstream-main-grace0"])
def test_the_grace0_paths_time_their_barrier_like_their_mode(path: str) -> None:
    seen: list[tuple[str, str]] = []

    class Probe(realnode.Bench):
        def __init__(self) -> None:
            pass

        def all_after(self, name: str, container: str, after: float, text: str) -> float:
            seen.append((container, text))
            return 1.0

    assert Probe().barrier(path, "x", 0.0) == 1.0
    assert seen, "the barrier is read from the agent's log line"


# --- node deaths (bench.realnode_deaths) ------------------------------------------------------
@pytest.mark.parametrize("path", realnode_deaths.PATHS)
def test_every_node_death_path_spreads_its_pods_alike(path: str) -> None:
    """Like for like: each path's pods prefer nodes of their own (one death takes one member),
    checkpoint to the persistent tier every 10 steps; only jsi-spare has a spare."""
    js = realnode_deaths.jobset_for(path, f"{path}-0", SHARED)
    assert _pod(js)["affinity"] == workloads.spread_over_nodes(f"{path}-0")
    assert _env(js)["JSI_DEMO_PERSIST_EVERY"] == "10"
    annotations = js["metadata"].get("annotations") or {}
    assert (annotations.get(names.HOT_SPARES) == "1") == (path == "jsi-spare")
    assert (names.ENABLED in annotations) == path.startswith("jsi-")


def test_a_node_death_ends_when_as_many_live_pods_as_members_resumed() -> None:
    """A spare logs nothing until it holds a slot, the dead node's pod cannot: the gang runs
    again when the members' count of live pods has resumed."""
    assert realnode_deaths.nth_after({"a": 3.0, "b": None, "c": 1.0}, 2) == 3.0
    assert realnode_deaths.nth_after({"a": 3.0, "b": None}, 2) is None


def test_the_node_death_table_gives_ratios_to_the_spare_and_no_spare_paths() -> None:
    runs = [
        _run("jsi-spare", 5.0, {"a": 40, "b": 40}),
        _run("jsi-process", 20.0, {"a": 40, "b": 40}),
        _run("upstream-sidecar", 80.0, {"a": 40, "b": 30}),
    ]
    s = realnode.summary(runs, realnode_deaths.PATHS)
    rows = realnode.table(s, bases=realnode_deaths.BASES).splitlines()
    assert "/ jsi-spare | / jsi-process |" in rows[0]
    upstream_row = next(r for r in rows if r.startswith("| upstream-sidecar |"))
    assert "| 16.0x | 4.0x | 0/1 |" in upstream_row
