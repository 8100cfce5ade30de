"""The published figures come from stored result files: the pages are up to date with them, a
figure without its commit is refused, ratios are within one run and like for like."""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from bench import crash_matrix, pages, provenance, soak
from bench.first_step import MILESTONES
from bench.pages import PagesError
from bench.realnode import PathSummary, barrier_by_path, running_by_path, table, writes_by_path
from testbed.crashes import CaseResult


def test_the_pages_are_what_their_result_files_give() -> None:
    assert pages.main(["--check"]) == 0, "make bench-pages, then commit the pages"


def _summary(running: float, reps: int = 5) -> dict[str, Any]:
    return {
        "running_median": running,
        "running_min": running,
        "running_max": running,
        "barrier_median": None,
        "reps": reps,
        "writes_median": 9,
        "consistent": reps,
    }


DOC: dict[str, Any] = {
    "when": "2026-11-28T03:00:00Z",
    "commit": "abc1234",
    "dirty": False,
    "command": "python -m bench.realnode --reps 5",
    "kubernetes": "v1.37.2",
    "jobset": "v0.12.0",
    "machine": {"cpus": 2, "steal_pct": 0.4},
    "summary": {
        "jsi-process": _summary(0.2),
        "jsi-pod": _summary(2.0),
        "upstream-sidecar": _summary(4.0),
        "upstream-main": _summary(3.0),
        "stock-grace0": _summary(5.0),
    },
    # each path's repetitions: its median, and one either side (the intervals' values)
    "runs": [
        {"path": path, "running": running * f}
        for path, running in (
            ("jsi-process", 0.2),
            ("jsi-pod", 2.0),
            ("upstream-sidecar", 4.0),
            ("upstream-main", 3.0),
            ("stock-grace0", 5.0),
        )
        for f in (0.9, 1.0, 1.1)
    ],
}


def test_the_headline_compares_like_with_like_from_one_run() -> None:
    text = pages.realnode_headline(DOC)
    assert "`abc1234`" in text
    pod_row, process_row = text.splitlines()[-4:-2]
    assert (
        "| 2.00 s (95 % interval 1.80-2.20) | 3.00 s (95 % interval 2.70-3.30); `upstream-main`: "
        "1.50x, 95 % interval 1.23-1.83 | 5.00 s (95 % interval 4.50-5.50); 2.50x, " in pod_row
    )
    assert "**0.20 s (95 % interval 0.18-0.22)** | no such mode | no such mode |" in process_row
    assert "x" not in process_row.split("|")[2], "no unlike ratio"


def test_the_table_names_its_commit_and_machine() -> None:
    text = pages.realnode_table(DOC)
    assert "commit `abc1234`" in text
    assert "2 cores (steal 0.4 %)" in text
    assert "| upstream-sidecar |" in text
    assert (
        "| jsi-pod | 5 | - | 2.00 s (1.80-2.20; range 2.00-2.00) | 10.0x (8.2-12.2) | 1.0x |"
        in text
    )


def _torch(first_step: float | None, consistent: bool = True) -> dict[str, Any]:
    med = dict.fromkeys(MILESTONES, 1.0) | {"first_step": first_step}
    return {
        "reps": 5,
        "median": med,
        "first_step_min": first_step,
        "first_step_max": first_step,
        "steps_lost_median": 3,
        "steps_lost_max": 9,
        "consistent": consistent,
        "writes_median": 4,
    }


def _torch_runs(path: str, first_step: float | None, consistent: bool = True) -> list[Any]:
    """Three repetitions of ``path`` around ``first_step`` (None: it never got there)."""
    return [
        {
            "path": path,
            "rep": rep,
            "milestones": dict.fromkeys(MILESTONES, 1.0)
            | {"first_step": None if first_step is None else first_step * f},
            "resume_steps": {"0": 40},
            "gang_resume_step": 40,
            "consistent": consistent,
            "last_step": 43,
            "steps_lost": lost,
            "writes": {"PATCH gangstates": 4},
        }
        for rep, (f, lost) in enumerate(((0.9, 3), (1.0, 3), (1.1, 9)))
    ]


def test_the_torch_run_is_published_with_its_ratios_and_failures() -> None:
    paths = {
        "jsi-prestart": 6.0,
        "jsi-process": 13.0,
        "jsi-pod": 14.0,
        "upstream-sidecar": 15.0,
        "upstream-main": 12.0,
        "stock": None,
        "stock-grace0": 14.7,
    }
    doc = {
        **DOC,
        "command": "python -m bench.realnode --trainer torch --reps 5",
        "members": 2,
        "failed": {"stock": "no rank resumed within 240 s"},
        "summary": {p: _torch(f, consistent=p != "upstream-main") for p, f in paths.items()},
        "runs": [r for p, f in paths.items() for r in _torch_runs(p, f, p != "upstream-main")],
    }
    table = pages.realnode_torch_table(doc)
    assert "commit `abc1234`" in table
    assert "**stock did not recover**: no rank resumed within 240 s." in table
    assert "| upstream-main |" in table
    assert "| stock |" not in table
    headline = pages.realnode_torch_headline(doc)
    assert "**6.00 s (95 % interval 5.40-6.60)** with jobset-inplace restarting the" in headline
    assert "InPlaceRestart 12.00 s (95 % interval 10.80-13.20) (`upstream-main`, its" in headline
    assert "2.00x, 95 % interval 1.64-2.44, of the pre-started scope; 0.86x" in headline
    assert "stock JobSet at grace 0 14.70 s (95 % interval 13.23-16.17) (1.05x, 95 %" in headline
    assert (
        "| **14.00** (95 % 12.60-15.40; range 12.60-15.40) | 1.08x (0.88-1.32) "
        "| 1.17x (0.95-1.43) |" in table
    )
    assert "one checkpoint step on 6 of 7 paths" in headline
    del doc["summary"]["jsi-prestart"]
    with pytest.raises(PagesError, match=r"no first productive step for \['jsi-prestart'\]"):
        pages.realnode_torch_headline(doc)


def test_the_warm_run_is_held_against_the_goal_with_its_reloads_counted() -> None:
    paths = {"jsi-warm": 4.0, "torchrun-restarts": 17.0, "upstream-main": 19.0}
    runs = [r for p, f in paths.items() for r in _torch_runs(p, f)]
    for r in runs:
        if r["path"] == "jsi-warm":
            r["warm_reloads"] = 2 if r["rep"] == 0 else 0
    doc = {
        **DOC,
        "command": "python -m bench.realnode --trainer torch --model transformer",
        "members": 2,
        "failed": {},
        "summary": {p: _torch(f) for p, f in paths.items()},
        "runs": runs,
    }
    text = pages.realnode_torch_real_size(doc, pages.TORCH_WARM)
    assert "| jsi-warm / path |" in text, "the ratios are the warm path's"
    assert "- `jsi-warm` / `torchrun-restarts`: 0.24x" in text
    assert "the interval under it): met." in text
    assert "loaded the checkpoint again after its word" in text
    assert "in 1 of 3 repetitions" in text
    del doc["summary"]["upstream-main"]
    doc["runs"] = [r for r in runs if r["path"] != "upstream-main"]
    with pytest.raises(PagesError, match="no ratio of jsi-warm to upstream-main"):
        pages.realnode_torch_real_size(doc, pages.TORCH_WARM)


def test_the_cpu_run_says_how_far_each_warm_way_is_from_the_floor() -> None:
    def runs(first: float) -> list[dict[str, float]]:
        return [{"group": 0.1, "restored": 0.2, "first_step": first * f} for f in (0.9, 1, 1.1)]

    ways = {"warm": 0.9, "warm-reload": 1.4, "torchrun": 5.0, "floor": 1.5}
    doc: dict[str, Any] = {
        "when": "2026-12-06T00:40:00Z",
        "commit": "abc1234",
        "dirty": False,
        "command": "bench/gpu/gpu_first_step.py --device cpu",
        "torch": "2.15.0",
        "device": "cpu",
        "checkpoint_gib": 1.23,
        "model": {"layers": 12, "width": 768, "heads": 12, "vocab": 32000, "seq": 64},
        "runs": {w: runs(f) for w, f in ways.items()},
        "medians": {w: {"group": 0.1, "restored": 0.2, "first_step": f} for w, f in ways.items()},
    }
    text = pages.cpu_floor(doc, pages.CPU_WARM)
    assert "[bench/cpu-first-step-warm.json](bench/cpu-first-step-warm.json)" in text
    assert "| warm | - | 0.10 (0.10-0.10) |" in text
    assert "median minus the floor's: `warm` -0.60 s, `warm-reload` -0.10 s." in text
    del doc["runs"]["floor"], doc["medians"]["floor"]
    assert "minus the floor" not in pages.cpu_floor(doc, pages.CPU_WARM), "no floor: no line"


def test_a_result_file_without_its_commit_is_not_published(tmp_path: Path) -> None:
    f = tmp_path / "old.json"
    f.write_text('{"when": "2026-11-24T02:28:36Z", "summary": {}}')
    with pytest.raises(PagesError, match="without its commit is not published"):
        pages.load(f)


def _repo(path: Path) -> list[str]:
    """A git repository of two commits at ``path`` (this checkout may be a shallow clone, in
    which no old commit can be told from an unknown one); their short hashes, oldest first."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    path.mkdir()
    git("init", "-q")
    hashes = []
    for n in (1, 2):
        (path / "f").write_text(str(n))
        git("add", "f")
        git("commit", "-q", "-m", str(n))
        hashes.append(git("rev-parse", "--short", "HEAD"))
    return hashes


def test_a_result_file_of_unknown_or_uncommitted_code_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, _ = _repo(tmp_path / "repo")
    monkeypatch.chdir(tmp_path / "repo")
    f = tmp_path / "results.json"
    clean = f'{{"commit": "{old}", "command": "c", "machine": {{}}, "kubernetes": "v1.37.2"'
    f.write_text(clean + "}")
    assert pages.load(f)["commit"] == old, "a commit of this history"
    f.write_text(clean.replace(old, "deadbee") + "}")
    with pytest.raises(PagesError, match="'deadbee' is not in this repository's history"):
        pages.load(f)
    f.write_text(clean.replace(old, "--all") + "}")
    with pytest.raises(PagesError, match="not in this repository's history"):
        pages.load(f)
    f.write_text(clean + ', "dirty": true}')
    with pytest.raises(PagesError, match="measured with uncommitted changes"):
        pages.load(f)
    f.write_text(clean.replace(old, old + "-dirty") + "}")
    with pytest.raises(PagesError, match="measured with uncommitted changes"):
        pages.load(f)


def test_a_shallow_clone_refuses_only_what_it_can_tell(tmp_path: Path) -> None:
    """CI may check out a shallow clone: a commit older than its depth cannot be told from an
    unknown one there, and is not refused; in a full history an unknown one is."""
    old, new = _repo(tmp_path / "full")
    clone = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{tmp_path / 'full'}", str(clone)],
        check=True,
        capture_output=True,
    )
    assert provenance.in_history(new, clone)
    assert provenance.in_history(old, clone), "older than the clone's depth"
    assert provenance.in_history(old, tmp_path / "full")
    assert not provenance.in_history("deadbee", tmp_path / "full")


def test_a_page_without_its_markers_is_an_error() -> None:
    with pytest.raises(PagesError, match="needs exactly one block"):
        pages.replace_block("no markers", "realnode-table", "x", pages.ROOT / "README.md")
    begin, end = pages.BEGIN.format("b"), pages.END.format("b")
    text = f"a\n{begin}\nold\n{end}\nz"
    assert pages.replace_block(text, "b", "new", pages.ROOT / "README.md") == (
        f"a\n{begin}\nnew\n{end}\nz"
    )


CRASH_BUCKETS = {
    "scheduling": 2.0,
    "detection": 0.1,
    "recovery": 0.5,
    "restore": 0.2,
    "wastedProgress": 1.0,
}


def test_the_soak_account_counts_what_recovered_and_what_was_measured() -> None:
    failures = [  # as the soak writes them
        asdict(soak.Failure("crash", 2, 60.0, "m", 0.069, 10, 100, {}, badput_s=CRASH_BUCKETS)),
        asdict(soak.Failure("silence", 3, 120.0, "m", 16.8, None, 200, {})),  # both gone
        asdict(soak.Failure("silence", 4, 180.0, "m", None, None, None, {})),  # not recovered
    ]
    doc = {
        "when": "2026-11-27T23:38:51Z",
        "commit": "6a043c1",
        "command": "python -m bench.soak",
        "kubernetes": "v1.37.2",
        "machine": {"cpus": 2, "steal_pct": 0.01},
        "members": 2,
        "every_s": 180.0,
        "failures": failures,
        "result": {
            "wall_s": 600.0,
            "failures": 3,
            "failures_per_hour": 18.0,
            "kinds": {"crash": 1, "silence": 2},
            "goodput": 0.9,
            "measured_s": 500.0,
            "productive_s": 450.0,
            "badput_s": {
                "scheduling": 1.0,
                "startup": 1.0,
                "detection": 20.0,
                "recovery": 10.0,
                "restore": 3.0,
                "wastedProgress": 15.0,
            },
            "unmeasured_s": 100.0,
            "steps_lost": {"crash": {"mean": 10.0, "max": 10}},
        },
    }
    text = pages.soak_tables(doc)
    assert "**2 of 3 failures recovered**" in text
    assert "| **90.0 %** (450.0 s productive) | 15.0 s (3.0 %) | 20.0 s (4.0 %) |" in text
    assert "| trainer crash (process scope) | 0.07 s, n = 1; 0.07 s | 10, 10 (1 of 1) |" in text
    assert (
        "| silent node (kubelet and containerd stopped) | 16.80 s, n = 1; 16.80, - s | - |" in text
    )
    # one crash counted: no interval, and why
    assert "Goodput **90.0 %** (no interval: a kind with fewer than 2 failures counted)" in text
    assert "spare" not in text
    # what each kind cost, from the records that carry their buckets
    assert "| trainer crash (process scope) | 1 | 0.1 | 0.5 | 0.2 | 1.0 | 1.8 | 1.8 |" in text
    assert "| silent node" not in text.split("What each kind")[1]
    assert "a failure every 3 minutes, 2 members" in text
    doc["spares"], doc["every_s"] = 1, 60.0
    doc["result"]["slot_moves"] = {"silence": 1, "crash": 1}  # type: ignore[index]
    text = pages.soak_tables(doc)
    # a record from before the soak named its hang-timeout ran at the one it had then
    assert "every minute, 2 members and 1 hot spare(s), `hang-timeout: 10s`; run of" in text
    doc["hang_timeout"] = "3s"
    assert "2 members and 1 hot spare(s), `hang-timeout: 3s`;" in pages.soak_tables(doc)
    assert "node of their own" not in pages.soak_tables(doc)
    doc["controller_node"] = "jsi-real-4"
    assert (
        "1 hot spare(s), the controller's replicas on a node of their own (`jsi-real-4`, no "
        "training pod there), `hang-timeout: 3s`;" in pages.soak_tables(doc)
    )
    assert (
        "Recoveries that gave a member's slot to another pod (a spare): trainer crash (process "
        "scope) 1, silent node (kubelet and containerd stopped) 1." in text
    )


def test_a_soak_names_the_failures_of_the_leaders_node() -> None:
    """A silence of the node the controller's leader ran on took the leader with it, a drain
    of it evicted the leader: named with their recoveries (the member is "pod (slot) on node,
    device ..."); other nodes' failures are not; records without the leader's node say nothing."""

    def failure(kind: str, epoch: int, member: str, leader: str) -> dict[str, Any]:
        f = soak.Failure(kind, epoch, 0.0, member, 7.063, 5, 100, {}, first_signal="TrainerHung")
        return asdict(dataclasses.replace(f, leader_node=leader))

    failures = [
        failure("silence", 3, "workers/1/0 on n3", "n1"),
        failure("silence", 8, "workers/1/0 (slot 0) on n3", "n3"),
        failure("device", 9, "workers/0/0 on n3, device n3-0", "n3"),
        failure("drain", 11, "workers/0/0 on n1", "n1"),
    ]
    said = "\n".join(pages._leader_taken(failures))
    assert "(before the injection; 4 failures name it): 2: silent node" in said
    assert "epoch 8: first signal TrainerHung, recovery 7.06 s, 5 step(s) lost" in said
    assert "drain (planned move, member recreated), epoch 11" in said
    assert "epoch 3" not in said
    assert "epoch 9" not in said
    assert pages._leader_taken(failures[:1]).pop().startswith("No silence or drain")
    assert pages._leader_taken([asdict(soak.Failure("crash", 2, 0, "m", 1, 0, 1, {}))]) == []


def test_a_kwok_result_file_names_its_kubernetes_among_its_versions(tmp_path: Path) -> None:
    f = tmp_path / "results.json"
    f.write_text(
        '{"commit": "901caf3", "command": "python -m bench", "machine": {"cpus": 2}, '
        '"versions": {"kubernetes": "v1.37.2"}}'
    )
    assert pages.load(f)["commit"] == "901caf3"
    f.write_text('{"commit": "901caf3", "command": "python -m bench", "machine": {}}')
    with pytest.raises(PagesError, match="no kubernetes"):
        pages.load(f)
    # the leader's loop runs no cluster: it has no Kubernetes to name; nothing else is excused
    f.write_text('{"commit": "901caf3", "command": "python -m bench.leader_loop", "machine": {}}')
    assert pages.load(f)["commit"] == "901caf3"
    f.write_text('{"commit": "901caf3", "command": "bench.leader_loop", "machine": {}}')
    with pytest.raises(PagesError, match="no kubernetes"):
        pages.load(f)


def test_the_floor_table_gives_each_size_the_ratio_with_its_interval_and_its_file() -> None:
    def recs(us: float, system: float) -> list[dict[str, float]]:
        return [
            {"us_per_member": us + i, "cpu_s": 1.0, "system_s": system, "passes": 2}
            for i in range(5)
        ]

    docs = [
        {
            "commit": "4e17b14",
            "command": f"python -m bench.leader_loop --members {n} --floor",
            "machine": {"cpus": 2},
            "members": n,
            "runs": {"this": recs(200.0, 0.1), "floor": recs(100.0, 0.25)},
        }
        for n in (2000, 5000, 10000)
    ]
    text = pages.leader_loop_floor_table(*docs)
    assert text.startswith("Runs at commit `4e17b14`, 2 cores")
    row = next(line for line in text.splitlines() if line.startswith("| 10,000 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "202 us (200-204, n = 5)"
    assert cells[2] == "102 us (100-104, n = 5)"
    assert cells[3].startswith("**1.98x (95 % ")
    assert cells[4] == "10 %, 25 %"
    assert cells[6].endswith("(bench/leader-cost-2026-12-06/leader-loop-floor-10000.json)")


def _runs(seconds: float) -> list[dict[str, Any]]:
    phases = {"detection_s": 0.1, "restart_s": 1.0, "barrier_s": 0.1, "protocol_s": seconds}
    return [{**phases, "barrier_open_s": seconds, "all_running_s": seconds}] * 3


def _death(path_s: float, remediation: str, **extra: Any) -> dict[str, Any]:
    return {"running_s": path_s, "remediation": remediation, **extra}


def _kwok_run(commit: str, **paths: tuple[float, list[dict[str, Any]]]) -> dict[str, Any]:
    """A kwok run at 1000 pods: per path, its worker failures' time and its node deaths."""

    def block(path: str, seconds: float, deaths: list[dict[str, Any]]) -> dict[str, Any]:
        failures = [{"all_running_s": seconds}] * 2 if path == "stock" else _runs(seconds)
        return {"worker_failure": failures, "node_death": deaths}

    return {
        "started": "2026-11-29T01:00:00Z",
        "commit": commit,
        "command": "python -m bench --sizes 1000 --scope pod",
        "duration_s": 3600,
        "machine": {"cpus": 2, "steal_pct": 0.1},
        "versions": {"kubernetes": "v1.37.2", "jobset": "v0.12.0", "kwok": "v0.8.0"},
        "sizes": {"1000": {p: block(p, *v) for p, v in paths.items()}} if paths else {},
    }


def _jsi_deaths(shipped: float, never: float) -> list[dict[str, Any]]:
    """jobset-inplace's two node deaths: as shipped, and `force-delete: never` with the taint."""
    return [
        _death(shipped, "none", force_delete="unreachable"),
        _death(never, "out-of-service", force_delete="never", declared_dead_s=50),
    ]


def test_the_kwok_paths_and_their_headline_come_from_one_run() -> None:
    doc = _kwok_run(
        "abc1234",
        hybrid=(20.0, _jsi_deaths(17.0, 80.0)),
        upstream=(
            40.0,
            [
                _death(360.0, "none", capped=True, stuck_terminating=["u"]),
                _death(120.0, "out-of-service", declared_dead_s=51),
            ],
        ),
        stock=(
            150.0,
            [
                _death(360.0, "none", capped=True),
                _death(240.0, "out-of-service", declared_dead_s=52),
            ],
        ),
    )
    table = pages.kwok_paths(doc)
    assert "commit `abc1234`" in table
    assert (
        "| 1000 pods | **20.00 / 20.00 / 20.00 (20.00-20.00, n = 3)** | 40.00 / 40.00 / 40.00 "
        in table
    )
    headline = pages.kwok_headline(doc, _kwok_run("def5678"))
    assert "**20.0 s (20.0-20.0)** with jobset-inplace restarting whole pods" in headline
    assert "second run" not in headline
    assert "40.0 s (40.0-40.0) with JobSet's InPlaceRestart (2.0x" in headline
    assert "150.0 s (150.0-150.0) with stock JobSet (7.5x" in headline
    assert (
        "jobset-inplace restarting whole pods (`restart-scope: pod`, not the default) 17.0 s"
        in headline
    )
    assert (
        "declared dead (~51 s), jobset-inplace with `force-delete: never` 80.0 s, JobSet's "
        "InPlaceRestart 120.0 s (1.5x), stock JobSet 240.0 s (3.0x);" in headline
    )
    assert (
        "without that taint JobSet's InPlaceRestart did not recover within 360 s (1 pod stuck "
        "Terminating) and stock JobSet did not recover within 360 s." in headline
    )


def test_a_spoiled_node_death_is_shown_without_a_ratio_and_taken_from_a_second_run() -> None:
    spoiled = _death(360.0, "out-of-service", capped=True, invalid="a harness bug")
    first = _kwok_run(
        "abc1234",
        hybrid=(20.0, _jsi_deaths(17.0, 80.0)),
        upstream=(40.0, [spoiled]),
        stock=(150.0, [_death(240.0, "out-of-service", declared_dead_s=52)]),
    )
    second = _kwok_run(
        "def5678",
        hybrid=(21.0, _jsi_deaths(30.0, 70.0)),
        upstream=(41.0, [_death(105.0, "out-of-service", declared_dead_s=51)]),
    )
    table = pages.kwok_paths(first)
    assert "| **not counted: a harness bug** | - |" in table
    assert (
        "| 1000 pods | stock (out-of-service taint) | 52.0 s | **240.0 s** | **3.0x** (n = 1, 1) |"
        in table
    )
    again = pages.kwok_deaths(second)
    assert "commit `def5678`" in again
    assert (
        "| 1000 pods | upstream IPR (out-of-service taint) | 51.0 s | **105.0 s** "
        "| **1.5x** (n = 1, 1) |" in again
    )
    headline = pages.kwok_headline(first, second)
    assert (
        "(jobset-inplace's and upstream's from a second run, 2026-11-29 at `def5678`; stock's "
        "from the first): jobset-inplace restarting whole pods (`restart-scope: pod`, not the "
        "default) 30.0 s" in headline
    )
    assert (
        "jobset-inplace with `force-delete: never` 70.0 s, JobSet's InPlaceRestart 105.0 s "
        "(1.5x), stock JobSet 240.0 s (3.0x of jobset-inplace's 80.0 s in that run)." in headline
    )
    assert "harness bug" not in headline


def test_the_headline_gives_repeated_node_deaths_their_medians_intervals_and_n() -> None:
    first = _kwok_run(
        "abc1234",
        hybrid=(20.0, _jsi_deaths(17.0, 80.0)),
        upstream=(40.0, []),
        stock=(150.0, []),
    )
    shipped = [_death(v, "none", force_delete="unreachable") for v in (20, 22, 21, 25, 19)]
    never = [
        _death(v, "out-of-service", force_delete="never", declared_dead_s=55)
        for v in (60, 70, 65, 66, 64)
    ]
    tainted = [_death(v, "out-of-service", declared_dead_s=55) for v in (130, 120, 140, 125, 135)]
    capped = [_death(360.0, "none", capped=True, stuck_terminating=["u"])]
    second = _kwok_run(
        "def5678",
        hybrid=(21.0, shipped + never),
        upstream=(41.0, capped + tainted),
        stock=(150.0, capped + tainted),
    )
    second["settings"] = {"restart_scope": "process"}
    headline = pages.kwok_headline(first, second)
    scope = "jobset-inplace restarting the trainer processes (the default scope)"
    assert f"{scope} 21.0 s (" in headline
    assert "(jobset-inplace's, upstream's and stock's from a second run, " in headline
    assert "from the first" not in headline
    assert ", n = 5) (by default it force-deletes" in headline
    assert "JobSet's InPlaceRestart 130.0 s (" in headline
    assert "(2.0x; 95 % interval " in headline
    assert "did not recover within 360 s (1 pod stuck Terminating)" in headline
    assert "n = 1): no interval" not in headline
    assert headline.endswith(
        "Medians of each kind's deaths with their 95 % intervals and n; a kind that did not "
        "recover within the cap was not run again."
    )


def test_the_kept_step_table_shows_both_trainers_from_one_run() -> None:
    trials = [
        {"mode": mode, "kind": kind, "steps_lost": lost, "loss_ok": mode == "kept" or lost != 2}
        for kind, kept, periodic in (("sigkill", 0, 4), ("hang", 1, 7), ("segv", -1, 2))
        for mode, lost in (("kept", kept), ("periodic", periodic))
    ]
    trials[-1]["loss_ok"] = None  # resumed at step 0: nothing to check
    summary = {
        mode: {
            "failures": 3,
            "steps_lost_p50": p50,
            "steps_lost_p99": p99,
            "steps_lost_max": p99,
            "steps_lost_mean": mean,
            "resumed_state_checked": 3 if mode == "kept" else 2,
            "resumed_state_wrong": 0,
            "by_kind": {t["kind"]: [t["steps_lost"]] for t in trials if t["mode"] == mode},
        }
        for mode, p50, p99, mean in (("kept", 0, 1, 0.0), ("periodic", 4, 7, 4.33))
    }
    doc = {
        "when": "2026-12-02T15:00:00Z",
        "commit": "abc1234",
        "command": "python -m bench.keep_step",
        "machine": {"cpus": 2},
        "settings": {"save_every": 10, "step_seconds": 0.1},
        "summary": summary,
        "trials": trials,
    }
    text = pages.keep_step_table(doc)
    assert "commit `abc1234`" in text
    kept = next(line for line in text.splitlines() if line.startswith("| keeps the"))
    assert kept.startswith("| keeps the interrupted step (`KEEP_STEP=1`) | 3 | 0 (-1 to 1) | 1 |")
    assert "| 1 | 0.0 (-" in kept  # the mean's interval around 0
    assert kept.endswith("| 3 of 3 |")
    assert "| periodic checkpoints only (every 10 steps) | 3 | 4 (2 to 7) | 7 | 7 | 4.33 (" in text
    assert "| 2 of 2 (1 from step 0) |" in text
    assert "p50 = 0 (95 % interval -1 to 1), p99 = 1 over 3 failures" in text
    assert "(the most per kind: sigkill 0, hang 1, segv -1)" in text
    assert "median 4 (95 % interval 2-7)" in text


def test_the_trainers_own_account_of_a_soak_stands_beside_the_controllers() -> None:
    theirs = {
        "members": {
            "1": {"goodput": 0.88, "wasted": 0.0093, "goodput_points_apart": 0.09,
                  "wasted_points_apart": 0.44},
            "0": {"goodput": 0.8808, "wasted": 0.0044, "goodput_points_apart": 0.01,
                  "wasted_points_apart": 0.05},
        },
        "steps_lost_agree": {"crash": "1/1", "hang": "0/1"},
        "productive_points_apart_by_kind": {"crash": {"0": 0.12, "1": 0.3}, "hang": {"0": 1.5}},
        "wasted_points_apart_by_kind": {"silence": {"0": 0.25, "1": 0.5}},
    }  # fmt: skip
    lines = pages.trainers_table(theirs, 88.1, 0.48)
    assert "(88.1 % goodput, 0.48 % wasted progress)" in lines[0]
    rows = [line for line in lines if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert rows == [
        "| 0 | 88.08 % | 0.01 | 0.44 % | 0.05 |",
        "| 1 | 88.00 % | 0.09 | 0.93 % | 0.44 |",
    ]
    assert "| trainer crash (process scope) | 0.12 | 0.30 |" in lines
    assert "| hung trainer (after the hang timeout) | 1.50 | - |" in lines
    wasted = lines.index(next(line for line in lines if line.startswith("Their wasted")))
    assert lines[wasted + 4].endswith("| 0.25 | 0.50 |"), lines[wasted:]
    assert lines[-1] == (
        "Steps lost per failure, the trainers' count and the controller's agreeing: trainer "
        "crash (process scope) 1/1, hung trainer (after the hang timeout) 0/1."
    )


def _crash(crash: str, first: float, held: int | None, passed: bool = True) -> dict[str, Any]:
    return {
        "scope": "prestart",
        "crash": crash,
        "first_step": first,
        "standbys_held": held,
        "passed": passed,
        "problems": [] if passed else ["2 recoveries after the crash, not 1"],
    }


CRASH_DOC: dict[str, Any] = {
    "when": "2026-12-05T02:00:00Z",
    "commit": "abc1234",
    "command": "python -m bench.crash_matrix --reps 3",
    "kubernetes": "v1.37.2",
    "jobset": "v0.12.0",
    "machine": {"cpus": 2, "steal_pct": 0.4},
}


def test_the_crash_matrix_shows_each_cases_range_and_what_it_is_worth() -> None:
    results = [CaseResult("prestart", "worker-sigkill", first_step=t) for t in (5.0, 6.0, 7.5)] + [
        CaseResult("prestart", "segv", first_step=4.0) for _ in range(3)
    ]
    doc = CRASH_DOC | {
        "results": [{"passed": r.passed, "scope": r.scope, "crash": r.crash} for r in results],
        "summary": crash_matrix.summary(results),
    }
    text = pages.crash_matrix_table(doc)
    assert "| 6.00 s (5.00-7.50, 3/3) |" in text
    assert "| 4.00 s (3/3) |" in text, "no range where the repetitions agree"
    assert "probability 75 %: no 95 % interval is claimed" in text
    assert crash_matrix.range_coverage(6) > 0.95 > crash_matrix.range_coverage(5)


def test_the_early_crash_is_compared_with_the_late_one_from_one_run() -> None:
    early = [_crash("worker-sigkill-early", t, 0) for t in (9.0, 10.0, 11.0, 10.5)]
    late = [_crash("worker-sigkill", t, 2) for t in (5.0, 5.5, 6.0, 5.2)]
    text = pages.crash_early_text(CRASH_DOC | {"results": early + late})
    assert "8 of 8 recoveries passed." in text
    assert "**early 10.25 s** (" in text
    assert ") (4 crashes, standbys held at the crash: 0/0/0/0 of 2" in text
    assert "**late 5.35 s** (" in text
    assert ") (4 crashes, standbys held: 2/2/2/2 of 2)" in text
    assert "Early / late: **1.92x (95% interval" in text
    assert "the early crash is slower" in text
    close = [_crash("worker-sigkill-early", t, 0) for t in (5.0, 6.0)] + late[:2]
    close.append(_crash("worker-sigkill", 9.0, 2, passed=False))
    text = pages.crash_early_text(CRASH_DOC | {"results": close})
    assert "not told apart" in text
    assert "4 of 5 recoveries passed. **worker-sigkill failed**: 2 recoveries" in text


def test_a_kwok_run_says_which_of_jobset_inplaces_settings_were_not_its_defaults() -> None:
    doc: dict[str, Any] = {"settings": {}}
    assert pages.jsi_settings_text(doc) == "", "an older run says nothing it did not record"
    doc["settings"]["jsi_annotations"] = {"1000": {}}
    assert (
        pages.jsi_settings_text(doc) == " jobset-inplace's settings other than its defaults: none."
    )
    doc["settings"]["jsi_annotations"] = {
        "1000": {"jobset-inplace.dev/inplace-budget": "10000"},
        "5000": {"jobset-inplace.dev/inplace-budget": "10000", "x/node-unhealthy-after": "1h"},
    }
    assert pages.jsi_settings_text(doc) == (
        " jobset-inplace's settings other than its defaults: 1000 pods: `inplace-budget: 10000`; "
        "5000 pods: `inplace-budget: 10000`, `node-unhealthy-after: 1h`."
    )


def test_the_fleets_pool_is_judged_by_a_run_with_a_larger_one() -> None:
    def run(workers: int, hybrid: list[float], upstream: list[float]) -> dict[str, Any]:
        def failures(times: list[float]) -> list[dict[str, Any]]:
            pool = {"tasks": 9, "wait_p50_s": 0.0, "wait_p99_s": 0.1, "wait_max_s": 0.2}
            return [
                {
                    "all_running_s": t,
                    "fleet_pool": pool | {"peak_busy": workers, "workers": workers},
                }
                for t in times
            ]

        return {
            "started": "2026-12-05T02:00:00Z",
            "commit": "abc1234",
            "settings": {"fleet_workers": workers},
            "sizes": {"1000": {"hybrid": {"worker_failure": failures(hybrid)},
                               "upstream": {"worker_failure": failures(upstream)}}},
        }  # fmt: skip

    text = pages.kwok_pool(
        run(32, [1.0, 1.1, 0.9], [20.0, 21.0]), run(256, [1.0, 1.0], [20.0, 21.0])
    )
    assert "with `--fleet-workers 256`" in text
    assert "| upstream IPR | 32 | 2 | 20.50 s (20.00-21.00) | 32 | 200 ms | - |" in text
    assert (
        "| upstream IPR | 256 | 2 | 20.50 s (20.00-21.00) | 256 | 200 ms | 1.00x (95% interval"
        in text
    )


def test_a_fallback_run_says_how_many_surfaced_in_time_not_that_the_goal_is_met() -> None:
    reps = [
        {"where": "pod", "fallback_s": t, "counted_s": t + 0.01, "event_s": t + 0.02}
        for t in (0.5, 0.6, 0.7, 0.8)
    ]
    summ = {
        key: {"median": 0.65 + d, "max": 0.8 + d, "min": 0.5 + d}
        for key, d in (("fallback_s", 0.0), ("counted_s", 0.01), ("event_s", 0.02))
    }
    doc = CRASH_DOC | {
        "reps": reps,
        "summary": summ | {"n": 4, "on_pod": 4, "surfaced_max_s": 0.82, "goal_met": True},
    }
    text = pages.channel_fallback_text(doc)
    assert "on the pod after 0.65 s (95 % interval 0.50-0.80; largest 0.80 s)" in text
    assert "Surfaced within 2 s: **4 of 4**" in text
    assert "a rate of later ones up to 53 % is not excluded at 95 %" in text
    assert "met" not in text.replace("measured", "")
    doc["reps"][0]["event_s"] = 2.5
    assert "**3 of 4**" in pages.channel_fallback_text(doc)


def test_the_real_node_table_gives_the_barrier_and_the_writes_their_intervals() -> None:
    runs = [
        {"path": "jsi-process", "running": r, "barrier": b, "writes": {"PATCH pods": w}}
        for r, b, w in ((0.2, 0.05, 4), (0.3, 0.07, 4), (0.25, 0.06, 5))
    ]
    s = {"jsi-process": PathSummary(0.25, 0.2, 0.3, 0.06, 3, 4, 3)}
    text = table(s, running_by_path(runs), barrier_by_path(runs), writes_by_path(runs))
    row = text.splitlines()[-1]
    assert row.startswith("| jsi-process | 3 | 0.06 s (0.05-0.07) | 0.25 s (0.20-0.30;")
    assert row.endswith("| 3/3 | 4 (4-5) |")
