"""``python -m bench.leader_loop``: the leader's real report server, cache and reconciler in
one process, its agents in another, a recovery at a time; run small here, against this checkout
as the other version too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import leader_loop


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
    printed = capsys.readouterr().out
    assert "this / compare: " in printed


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


def test_the_leader_runs_with_its_reports_handed_to_it_without_a_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "in-process.json"
    argv = ["--members", "8", "--recoveries", "2", "--in-process", "--batch", "3"]
    assert leader_loop.main([*argv, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"this", "in-process"}
    for r in doc["runs"]["in-process"]:
        # each recovery was planned and its barrier opened (else the run exits): every
        # member's report taken by the leader's own handler, with no agent process
        assert r["passes"] >= 1
        assert r["cpu_s"] > 0
    assert "this / in-process: " in capsys.readouterr().out


def test_a_batch_of_no_request_is_refused() -> None:
    with pytest.raises(SystemExit):
        leader_loop.main(["--members", "8", "--in-process", "--batch", "0"])
