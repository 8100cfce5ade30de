"""``python -m bench.leader_loop``: the leader's real report server, cache and reconciler in
one process, its agents in another, a recovery at a time; run small here, against this checkout
as the other version too."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from bench import channel_attack, leader_loop
from bench.channel_attack import GANG, NAMESPACE


def test_recoveries_are_measured_and_two_versions_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here = Path(leader_loop.__file__).resolve().parent.parent
    out = tmp_path / "loop.json"
    argv = ["--members", "8", "--recoveries", "2", "--compare", str(here), "--out", str(out)]
    assert leader_loop.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["members"] == 8
    assert doc["command"].endswith(" ".join(argv))
    for version in ("this", "compare"):
        recoveries = doc["runs"][version]
        assert len(recoveries) == 2
        for r in recoveries:
            assert r["cpu_s"] > 0
            assert r["passes"] >= 1, "the recovery was planned (its barrier opened: else exit)"
            assert 0 <= r["gc_cpu_s"] <= r["cpu_s"]
            assert 0 < r["planning_cpu_s"] < r["cpu_s"], "plan()'s share, from its metric"
    printed = capsys.readouterr().out
    assert "this / compare: " in printed
    assert "this / compare, plan() alone: " in printed


def test_a_gang_too_small_or_too_large_is_refused() -> None:
    with pytest.raises(SystemExit):
        leader_loop.main(["--members", "2"])


def test_the_floor_runs_beside_the_leader_with_the_same_agents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "floor.json"
    argv = ["--members", "8", "--recoveries", "2", "--floor", "--out", str(out)]
    assert leader_loop.main(argv) == 0
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"this", "floor"}
    for r in doc["runs"]["floor"]:
        # every agent's report was answered 200 (a refusal ends the run), nothing planned
        assert r["cpu_s"] > 0
        assert r["user_s"] + r["system_s"] == pytest.approx(r["cpu_s"])
        assert r["passes"] == 0
    assert all(r["passes"] >= 1 for r in doc["runs"]["this"])
    assert "this / floor: " in capsys.readouterr().out


def beside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, *flags: str
) -> list[dict[str, Any]]:
    """``version`` run beside this one (``flags``: how), 2 recoveries of 8 members: its
    recoveries, each planned with its barrier opened (else the run exits) and none of its
    reports refused (else it exits too), and their ratio printed."""
    out = tmp_path / f"{version}.json"
    argv = ["--members", "8", "--recoveries", "2", *flags, "--out", str(out)]
    assert leader_loop.main(argv) == 0
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"this", version}
    recoveries: list[dict[str, Any]] = doc["runs"][version]
    for r in recoveries:
        assert r["passes"] >= 1
        assert r["cpu_s"] > 0
    assert f"this / {version}: " in capsys.readouterr().out
    return recoveries


def test_the_leader_runs_with_its_reports_handed_to_it_without_a_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every member's report taken by the leader's own handler, with no agent process."""
    beside(tmp_path, capsys, "in-process", "--in-process", "--batch", "3")


def test_the_leader_runs_behind_a_front_with_its_reports_in_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every member's report taken from a front's batch; a batch beyond a front's refused."""
    beside(tmp_path, capsys, "batched", "--batched", "--batch", "3")
    with pytest.raises(SystemExit):
        leader_loop.main(["--members", "8", "--batched", "--batch", "257"])


def test_the_leader_runs_behind_a_real_front_over_its_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every member's report went agent -> front -> the leader's link."""
    for r in beside(tmp_path, capsys, "fronts", "--fronts"):
        assert 2 <= r["link_batches"] <= 9, "the exit's batch, then the epoch's (1 to 8)"


def test_two_versions_are_compared_without_a_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here = Path(leader_loop.__file__).resolve().parent.parent
    out = tmp_path / "no-transport.json"
    argv = ["--members", "8", "--recoveries", "2", "--compare", str(here), "--no-transport"]
    assert leader_loop.main([*argv, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"this", "compare"}
    for version in ("this", "compare"):
        for r in doc["runs"][version]:
            assert r["passes"] >= 1, "planned, its barrier opened (else the run exits)"
    assert "this / compare: " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        leader_loop.main([*argv, "--floor"])


def test_a_batch_of_no_request_is_refused() -> None:
    with pytest.raises(SystemExit):
        leader_loop.main(["--members", "8", "--in-process", "--batch", "0"])


def test_each_member_sits_on_a_node_of_its_own_with_a_fresh_lease() -> None:
    """As on a cluster, so that a pass looks at every member's node (``--nodes``, the
    default): the planner sees one healthy node per member."""
    cache = channel_attack._cache(6)
    leader_loop._on_nodes(cache)
    gang = cache.gangs[NAMESPACE, GANG]
    now = time.time()
    snap = cache.snapshot(gang, now)
    assert snap is not None
    assert sorted(snap.nodes) == sorted(pod.node or "" for pod in snap.pods)
    assert len(snap.nodes) == 6
    for node in snap.nodes.values():
        assert node.ready == "True"
        assert node.lease_renewed is not None
        assert now - node.lease_renewed < 5
