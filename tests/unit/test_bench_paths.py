"""The benchmark's upstream path: its gang shape, its attempts, and the report's comparisons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench import __main__ as bench_main
from bench import leader_cost, profile, report, scenarios, upstream
from bench.fleet import MeasuredPool, epoch_steps
from bench.podwatch import GangPods, Goal
from bench.remediation import NONE, REMEDIATED, NodeDeath
from bench.upstream_fleet import Attempts
from jobset_inplace import names
from jobset_inplace.controller.metrics import Metrics
from jobset_inplace.core import no_progress
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


def _death(running: float, remediation: str, **extra: Any) -> dict[str, Any]:
    return {"running_s": running, "remediation": remediation, **extra}


def test_report_ratios_against_both_peers() -> None:
    results = {
        "sizes": {
            "1000": {
                "hybrid": {
                    "worker_failure": _runs([2.0, 2.0, 4.0]),
                    "node_death": [
                        _death(17.0, "none", force_delete="unreachable", detection_s=15.0),
                        _death(50.0, "out-of-service", force_delete="never", declared_dead_s=40),
                    ],
                },
                "upstream": {
                    "worker_failure": _runs([10.0, 12.0, 14.0]),
                    "node_death": [
                        _death(480.0, "none", capped=True, stuck_terminating=["p-1"]),
                        _death(100.0, "out-of-service", declared_dead_s=41),
                    ],
                },
                "stock": {
                    "worker_failure": [{"all_running_s": 100.0}, {"all_running_s": 120.0}],
                    "node_death": [
                        _death(481.0, "none", capped=True),
                        _death(481.0, "out-of-service", capped=True),
                    ],
                },
            }
        }
    }
    row = report.summarize(results)["1000"]
    assert row["paths"] == ["hybrid", "upstream", "stock"]
    assert row["ratio_upstream_over_hybrid_running"] == 6.0  # 12 / 2
    assert row["ratio_stock_over_hybrid_running"] == 55.0  # 110 / 2
    # with their 95 % bootstrap intervals: medians of resamples, 10-14 over 2-4
    assert row["ratio_upstream_over_hybrid_running_interval"] == {
        "low": 2.5,
        "high": 7.0,
        "n": [3, 3],
    }
    assert report.interval_text(row, "upstream") == "; 95 % interval 2.5-7.0, n = 3, 3"
    deaths = {(x["path"], x["remediation"]): x for x in row["node_death"]}
    # like for like only: the same taint, both recovered (100 / 50)
    assert deaths["upstream", "out-of-service"]["ratio_over_hybrid"] == 2.0
    assert "ratio_over_hybrid" not in deaths["upstream", "none"]  # did not recover
    assert "ratio_over_hybrid" not in deaths["stock", "out-of-service"]
    assert "ratio_over_hybrid" not in deaths["hybrid", "none"]
    table = report.markdown(results)
    assert (
        "| 1000 pods | **2.00 / 2.00 / 4.00 (2.00-4.00, n = 3)** | 10.00 / 12.00 / 14.00 " in table
    )
    # a peer that did not recover within the cap: said so, with the pods stuck, no ratio
    assert (
        "| 1000 pods | upstream IPR (no remediation) | - "
        "| **did not recover within 480 s (1 pod stuck Terminating)** | - |"
    ) in table
    assert (
        "| 1000 pods | upstream IPR (out-of-service taint) | 41.0 s | **100.0 s** "
        "| **2.0x** (n = 1, 1) |"
    ) in table
    row = (
        "| 1000 pods | 3 | **2.00 (2.00-4.00) / 4.00** | 2.00 (2.00-4.00) / 4.00 "
        "| 1.80 (1.80-3.80) / 3.80 | 0.20 (0.20-0.20) / 0.20 | - |"
    )
    assert f"{row} 100 MiB |" in table
    text = report.text(results)
    assert "ratio upstream / hybrid: 6.0x (to barrier open), 6.0x (to all running)" in text
    assert "node death, stock (out-of-service taint): did not recover within 481 s\n" in text + "\n"
    assert "node death, jobset-inplace (force-delete unreachable, no remediation): 17.0 s" in text


def test_both_scopes_and_upstream_in_one_run() -> None:
    """Issue 59's comparison: jobset-inplace in the process scope (hybrid) and in the pod
    scope (hybrid-pod) beside upstream, each ratio against its own gang."""
    ok = bench_main.parse_args(["--sizes", "5000", "--paths", "hybrid,hybrid-pod,upstream"])
    assert ok.paths == {"hybrid", "hybrid-pod", "upstream"}
    assert ok.scope == "process"
    with pytest.raises(SystemExit):  # both gangs would be the pod scope
        bench_main.parse_args(["--paths", "hybrid,hybrid-pod", "--scope", "pod"])
    # each path's gang carries its own scope, and its fleet simulates that one
    bench = types.SimpleNamespace(scope="process", pods_per_job=10, defaults=False, hot_spares=2)
    bench.scope_of = lambda path: scenarios.Bench.scope_of(bench, path)  # type: ignore[arg-type]
    gangs = {p: scenarios.Bench._gang(bench, p, 100, p) for p in ("hybrid", "hybrid-pod")}  # type: ignore[arg-type]
    scope = {p: js["metadata"]["annotations"].get(names.RESTART_SCOPE) for p, js in gangs.items()}
    assert scope == {"hybrid": None, "hybrid-pod": "pod"}  # process: the default, not written

    results = {
        "sizes": {
            "5000": {
                "hybrid": {"worker_failure": _runs([3.0, 3.5, 4.5]), "node_death": []},
                "hybrid-pod": {"worker_failure": _runs([150.0, 160.0, 180.0]), "node_death": []},
                "upstream": {"worker_failure": _runs([140.0, 144.0, 150.0]), "node_death": []},
            }
        }
    }
    row = report.summarize(results)["5000"]
    assert row["paths"] == ["hybrid", "hybrid-pod", "upstream"]
    assert row["ratio_upstream_over_hybrid_running"] == 41.1  # 144 / 3.5
    assert row["ratio_upstream_over_hybrid-pod_running"] == 0.9  # 144 / 160
    assert row["ratio_upstream_over_hybrid-pod_running_interval"]["n"] == [3, 3]
    table = report.markdown(results)
    assert (
        "| gang | **jobset-inplace** | **jobset-inplace, pod scope** | upstream IPR | stock "
        "| **upstream / jobset-inplace** | **upstream / pod scope** "
        "| **stock / jobset-inplace** | **stock / pod scope** |\n"
        "|---|---|---|---|---|---|---|---|---|"
    ) in table
    assert (
        "| 5000 pods | **3.00 / 3.50 / 4.50 (3.00-4.50, n = 3)** "
        "| **150.00 / 160.00 / 180.00 (150.00-180.00, n = 3)** "
        "| 140.00 / 144.00 / 150.00 (140.00-150.00, n = 3) | - | **41.1x** (95 % interval"
    ) in table
    assert "| 5000 pods | jobset-inplace, pod scope | 3 |" in table
    text = report.text(results)
    assert "ratio upstream / hybrid-pod: 0.9x (to barrier open), 0.9x (to all running)" in text


def test_repetitions_are_shared_out_over_the_rounds() -> None:
    assert [bench_main.share(30, 3, r) for r in range(3)] == [10, 10, 10]
    assert [bench_main.share(2, 3, r) for r in range(3)] == [1, 1, 0]
    row: dict[str, Any] = {}
    for rnd in range(2):
        block = {
            "size": 10,
            "setup_s": 1.0 + rnd,
            "worker_failure": [{"all_running_s": 1.0}],
            "node_death": [{"running_s": 5.0}] if rnd else [],
        }
        if rnd == 0:
            block["profiled"] = {"all_running_s": 9.0}
        bench_main.merge_block(row, "hybrid", block, rnd)
    merged = row["hybrid"]
    assert [m["round"] for m in merged["worker_failure"]] == [0, 1]
    assert [m["round"] for m in merged["node_death"]] == [1]
    assert [b["setup_s"] for b in merged["blocks"]] == [1.0, 2.0]
    assert merged["profiled"] == {"all_running_s": 9.0}
    assert "profiled" not in merged["blocks"][0]


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
    assert (
        "| 1000 pods | **2.00 / 2.00 / 2.00 (n = 1)** | - | 10.00 / 10.00 / 10.00 (n = 1) | - |"
        in (report.markdown(results))
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


def _pod(name: str, index: int, phase: str, attempt: int, **meta: Any) -> dict[str, Any]:
    labels = {
        names.REPLICATED_JOB_LABEL: "w",
        names.JOB_INDEX_LABEL: "0",
        names.COMPLETION_INDEX_LABEL: str(index),
        names.RESTART_ATTEMPT_LABEL: str(attempt),
    }
    return {
        "metadata": {"name": name, "labels": labels, **meta},
        "spec": {"nodeName": f"n{index}", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase},
    }


def test_a_stock_restart_ends_with_the_event_that_brings_the_last_member_back() -> None:
    pods = GangPods(None, "ns", "g")  # fed by hand: no watch
    pods._list([_pod("a0", 0, "Running", 0), _pod("b0", 1, "Running", 0)])
    pods.aim(Goal(2, attempt=1))
    assert pods.met(0) is None
    pods._event("MODIFIED", _pod("a0", 0, "Running", 0, deletionTimestamp="t"))
    pods._event("ADDED", _pod("a1", 0, "Running", 1))
    pods._event("DELETED", _pod("a0", 0, "Running", 0))
    assert pods.met(0) is None, "one member of the new attempt only"
    assert pods.counted() == 1
    assert pods.terminating_on("n1") == []
    pods._event("MODIFIED", _pod("b0", 1, "Running", 0, deletionTimestamp="t"))
    assert pods.terminating_on("n1") == ["b0"]
    before = time.monotonic()
    pods._event("ADDED", _pod("b1", 1, "Pending", 1))
    pods._event("MODIFIED", _pod("b1", 1, "Running", 1))
    met = pods.met(0)
    assert met is not None
    assert met >= before
    assert pods.counted() == 2
    # a goal that already holds is met at once; a pod on the avoided node does not count
    pods.aim(Goal(2, avoid="n1"))
    assert pods.met(0) is None
    pods.aim(Goal(2))
    assert pods.met(0) is not None


def _burn_user_cpu(seconds: float) -> None:
    """Arithmetic, not a clock read per turn (a thread clock is a system call)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(100_000))


def test_the_meter_splits_the_controllers_cpu_into_user_and_system() -> None:
    meter = scenarios.ProcessMeter(os.getpid())
    out: dict[str, Any] = {}
    with meter.window(out):
        _burn_user_cpu(0.2)
    assert out["controller_cpu_user_s"] + out["controller_cpu_system_s"] == pytest.approx(
        out["controller_cpu_s"], abs=0.011
    )
    assert out["controller_cpu_user_s"] >= 0.15  # the loop ran in user space


def test_pinning_moves_every_thread_of_a_process_and_the_threads_it_makes_later() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail(f"this test needs two CPUs to pin between, the process has {cpus}")
    code = (
        "import os, sys, threading\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "print('up', flush=True); sys.stdin.readline()\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join(); print(seen[0], sorted(os.sched_getaffinity(0)), flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "up"
        assert scenarios.pin(proc.pid, {cpus[-1]}) == 2  # its main thread and the reader
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert all(os.sched_getaffinity(t) == {cpus[-1]} for t in tids)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == f"[{cpus[-1]}] [{cpus[-1]}]"
    finally:
        proc.kill()
        proc.wait()
    assert scenarios.pin(proc.pid, {cpus[-1]}) == 0  # gone


def test_a_gangs_set_up_gives_every_process_every_core_again() -> None:
    """With a leader core, the windows of recoveries pin; a set-up window does not, and
    share_cores undoes an earlier window's pinning (the set-up of 10,000 pods on one core)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail(f"this test needs two CPUs to pin between, the process has {cpus}")
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        meter = scenarios.ProcessMeter(leader.pid, leader_core=cpus[0])
        scenarios.pin(leader.pid, {cpus[-1]})  # as an earlier window could have left it
        out: dict[str, Any] = {}
        with meter.window(out, own_core=False):
            assert os.sched_getaffinity(leader.pid) == {cpus[-1]}, "a set-up window pins nothing"
        assert out["leader_core_own"] is False
        meter.share_cores()
        assert os.sched_getaffinity(leader.pid) == set(range(os.cpu_count() or 1))
        assert os.sched_getaffinity(0) == set(range(os.cpu_count() or 1))
    finally:
        leader.kill()
        leader.wait()


def test_longer_node_leases_are_refused_where_a_node_dies() -> None:
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--sizes", "1000", "--node-lease", "200"])  # deaths at 1000
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--node-lease", "20", "--node-death-sizes", "none"])
    args = bench_main.parse_args(
        ["--sizes", "10000", "--node-lease", "200", "--node-death-sizes", "none"]
    )
    assert args.node_lease == 200
    assert bench_main.parse_args(["--sizes", "1000"]).node_lease == 40


def test_longer_node_leases_are_refused_where_nodes_are_watched() -> None:
    """At sizes whose gangs keep the default node-unhealthy-after (2000 pods and fewer), the
    simulated nodes' longer Leases would read as dead nodes: refused, naming those sizes (a
    curve of 500 to 5000 pods with --node-lease 200 failed at 500, every node unhealthy)."""
    with pytest.raises(SystemExit):
        bench_main.parse_args(
            ["--sizes", "500,5000", "--node-lease", "200", "--node-death-sizes", "none"]
        )
    args = bench_main.parse_args(
        ["--sizes", "5000", "--node-lease", "200", "--node-death-sizes", "none"]
    )
    assert args.node_lease == 200


def test_a_leader_core_must_be_one_of_the_machines_and_leave_one_for_the_rest() -> None:
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--leader-core", "4096"])
    cpus = sorted(os.sched_getaffinity(0))
    assert bench_main.parse_args(["--leader-core", str(cpus[-1])]).leader_core == cpus[-1]


def test_the_simulated_trainers_progress_between_failures_so_the_stop_rule_never_ends_a_run() -> (
    None
):
    assert epoch_steps((200, 100), 0) == (200, 100)
    assert epoch_steps((200, 100), 3) == (500, 400)
    assert epoch_steps((50,), 2) == (150,)
    memory = None
    for epoch in range(1, 40):
        memory = no_progress.observe(memory, "TrainerExited", epoch_steps((200, 100), epoch)[0])
        assert not no_progress.stop(memory, 3)
    # the fixed steps of before: the third failure in a row stops the run
    memory = None
    for _ in range(3):
        memory = no_progress.observe(memory, "TrainerExited", 200)
    assert no_progress.stop(memory, 3)


def test_the_leaders_cost_per_member_is_each_recoverys_cpu_less_its_idle_rate(
    tmp_path: Any,
) -> None:
    runs = [
        {
            "controller_cpu_s": cpu,
            "window_s": 1.0,
            "controller_cpu_user_s": cpu - 0.1,
            "controller_cpu_system_s": 0.1,
        }
        for cpu in (0.5, 0.6, 0.4)
    ]
    (tmp_path / "a.txt").write_text("main;plan 3\nmain;answer 1\n")
    (tmp_path / "b.txt").write_text("main;answer 4\n")
    prof: dict[str, Any] = {
        "files": ["a.txt", "b.txt"],
        **profile.summarise_stacks([tmp_path / "a.txt", tmp_path / "b.txt"]),
    }
    assert prof["samples"] == 8
    assert prof["self"][0].endswith("answer")
    block = {"idle": {"seconds": 10.0, "controller_cpu_s": 1.0}, "leader_profile": prof}
    results = {"sizes": {"2000": {"hybrid": {"worker_failure": runs, "blocks": [block]}}}}
    lines = report.leader_cost(results)
    # (0.5 - 0.1 * 1.0) / 2000 members = 0.2 ms, the median of 0.15, 0.2, 0.25
    assert lines[0].startswith(
        "hybrid 2000 pods: the leader's CPU per member per recovery 0.200 ms"
    )
    assert "n = 3" in lines[0]
    assert "user 0.40 / system 0.10" in lines[0]
    assert "less 0.100 cores while nothing fails (10 s idle)" in lines[0]
    assert lines[1] == "  sampled (8 samples, 2 recoveries)"
    assert lines[2:4] == ["    100.0% main", "     62.5% answer"]
    block.pop("idle")
    assert "0.250 ms" in report.leader_cost(results)[0]  # nothing subtracted
    for m, passes in zip(runs, (3, 4, 5), strict=True):
        m["controller_passes"], m["controller_planning_cpu_s"] = passes, m["controller_cpu_s"] / 4
    assert report.leader_cost(results)[0].endswith(
        "; 4 planning passes per recovery, plan() 25 % of the leader's CPU (medians)"
    )


def test_the_planning_passes_and_their_cpu_are_read_from_the_controllers_metrics() -> None:
    metrics = Metrics(CollectorRegistry())
    assert scenarios.planning(generate_latest(metrics.registry).decode()) == (0.0, 0.0)
    for cpu in (0.01, 0.02):
        metrics.planned(cpu)
        metrics.passed(failed=False)
    assert scenarios.planning(generate_latest(metrics.registry).decode()) == pytest.approx(
        (2.0, 0.03)
    )


def test_two_runs_leader_costs_side_by_side(tmp_path: Any, capsys: Any) -> None:
    def run(commit: str, cpus: tuple[float, ...], front: float | None = None) -> Any:
        runs = [
            {
                "controller_cpu_s": c,
                "window_s": 1.0,
                "barrier_open_s": 10 * c,
                "cpu_s_by_process": {
                    "jobset-inplace": c,
                    **({} if front is None else {"jobset-inplace report front": front}),
                },
            }
            for c in cpus
        ]
        doc = {
            "commit": commit,
            "command": "python -m bench",
            "sizes": {"1000": {"hybrid": {"worker_failure": runs, "blocks": []}}},
        }
        path = tmp_path / f"{commit}.json"
        path.write_text(json.dumps(doc))
        return path

    before, after = run("aaa", (0.4, 0.5, 0.6)), run("bbb", (0.2, 0.25, 0.3), front=0.4)
    assert leader_cost.main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "commit aaa" in out
    assert "0.500 ms" in out
    assert "0.250 ms" in out
    assert "hybrid 1000 pods, the leader's CPU per member: second / first 0.50x" in out
    assert "hybrid 1000 pods, barrier open: second / first 0.50x" in out
    assert "by process (medians): jobset-inplace 0.50\n" in out
    assert "(medians): jobset-inplace report front 0.40, jobset-inplace 0.25\n" in out
    with pytest.raises(SystemExit):
        leader_cost.main([str(tmp_path / "missing.json")])


def test_where_the_leaders_sampled_cpu_goes(tmp_path: Any) -> None:
    f = tmp_path / "leader.txt"
    f.write_text(
        "run (m.py:1);Reconciler._plan (r.py:2);plan (p.py:3);member_causes (d.py:4) 6\n"
        "run (m.py:1);ReportServer.handle (s.py:5);ClusterCache._merged (c.py:6) 2\n"
        "run (m.py:1);Loop__run (loop.c:1);epoll_wait (libc.so.6) 50\n"
        "run (m.py:1);something (x.py:9) 2\n"
    )
    assert leader_cost.where([f]) == [
        " 60.0% planning: plan()",
        " 20.0% reports: the members' views made again (new epoch)",
        " 20.0% other",
        "(10 samples of CPU in 1 files)",
    ]


def test_a_python_frames_profile_counts_the_loops_own_work_to_the_connections(
    tmp_path: Any,
) -> None:
    """Without native frames, the event loop's C work (sockets, epoll) is a stack that ends at
    its runner; a stack that only passes through the runner is counted by where it ends."""
    f = tmp_path / "leader.txt"
    f.write_text(
        "main (m.py:1);Runner.run (asyncio/runners.py:118) 3\n"
        "main (m.py:1);Runner.run (asyncio/runners.py:118);Reconciler._plan (r.py:2);"
        "plan (p.py:3) 1\n"
    )
    assert leader_cost.where([f]) == [
        " 75.0% reports: the connection and the event loop",
        " 25.0% planning: plan()",
        "(4 samples of CPU in 1 files)",
    ]


def test_py_spy_runs_on_the_cpu_it_is_given() -> None:
    """(py-spy elsewhere than the sampled process's core is descheduled while its peers work.)"""
    spy = profile.PySpyProfile(123, 5, Path("/tmp/x.txt"), rate=250, cpu=1)
    assert spy._cmd[:3] == ["taskset", "-c", "1"]
    assert "--nonblocking" in spy._cmd
    assert profile.PySpyProfile(123, 5, Path("/tmp/x.txt"))._cmd[0] != "taskset"


def test_the_fleets_pool_says_how_long_its_tasks_waited_and_how_full_it_got() -> None:
    pool = MeasuredPool(2, "t")
    gate, started = threading.Event(), threading.Semaphore(0)

    def hold() -> None:
        started.release()
        gate.wait(10)

    try:
        pool.submit(lambda: None)
        deadline = time.monotonic() + 10
        while len(pool.waits) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        mark = pool.mark()
        for _ in range(3):  # two run at once; the third waits for a worker
            pool.submit(hold)
        assert started.acquire(timeout=10)
        assert started.acquire(timeout=10)
        time.sleep(0.2)
        gate.set()
        assert started.acquire(timeout=10)
        w = pool.since(mark)
        assert (w["tasks"], w["peak_busy"], w["workers"]) == (3, 2, 2)
        assert w["wait_max_s"] >= 0.2 > w["wait_p50_s"], w
    finally:
        pool.shutdown()
    doc = {"sizes": {"100": {"hybrid": {"worker_failure": [
        {"all_running_s": 1.0, "fleet_pool": w},
        {"all_running_s": 1.0},  # a run before the pool was measured
    ], "node_death": []}}}}  # fmt: skip
    (line,) = [x for x in report.pool_lines(report.summarize(doc)) if x]
    assert line.startswith("The simulated agents' and kubelets' thread pool, 100 pods: hybrid")
    assert "(1 failures): at most 2 of 2 busy at once, the longest wait for a worker " in line
    assert float(line.split("wait for a worker ")[1].split(" ms")[0]) >= 200


def test_node_deaths_repeat_by_kind_and_a_kind_that_took_the_cap_is_not_run_again() -> None:
    never = NodeDeath(REMEDIATED, "never")
    shipped = NodeDeath(NONE, "unreachable")
    ran: list[str] = []

    def run(death: NodeDeath) -> dict[str, Any]:
        ran.append(death.label)
        # the shipped kind recovers; the tainted one is capped on its second death
        return {"capped": death == never and ran.count(death.label) == 2}

    records, skipped = scenarios.run_deaths((shipped, never) * 3, run)
    assert ran == [shipped.label, never.label, shipped.label, never.label, shipped.label]
    assert len(records) == 5
    assert [r["capped"] for r in records].count(True) == 1
    assert skipped == [never.label]


def _deaths(path_s: list[float], remediation: str, **extra: Any) -> list[dict[str, Any]]:
    return [_death(float(v), remediation, **extra) for v in path_s]


def test_repeated_node_deaths_are_a_row_per_kind_with_median_interval_and_n() -> None:
    results = {
        "sizes": {
            "1000": {
                "hybrid": {
                    "worker_failure": _runs([2.0, 2.0, 4.0]),
                    "node_death": [
                        *_deaths([20, 22, 21, 25, 19], "none", force_delete="unreachable"),
                        *_deaths([60.0, 70.0, 65.0], "out-of-service", force_delete="never"),
                    ],
                },
                "upstream": {
                    "worker_failure": _runs([10.0, 12.0, 14.0]),
                    "node_death": [
                        _death(360.0, "none", capped=True, stuck_terminating=["p-1"]),
                        *_deaths([130.0, 120.0, 140.0], "out-of-service", declared_dead_s=50),
                    ],
                },
                "stock": {
                    "worker_failure": [{"all_running_s": 100.0}, {"all_running_s": 120.0}],
                    # recovered twice, then capped once: a bound among times, no ratio
                    "node_death": [
                        *_deaths([200.0, 210.0], "out-of-service"),
                        _death(360.0, "out-of-service", capped=True),
                    ],
                },
            }
        }
    }
    summ = report.summarize(results)["1000"]
    rows = {(x["path"], x["remediation"]): x for x in summ["node_death"]}
    shipped = rows["hybrid", "none"]
    assert (shipped["n"], shipped["running_s"], shipped["capped"]) == (5, 21.0, False)
    low, high = shipped["interval"]
    assert 19.0 <= low <= 21.0 <= high <= 25.0
    assert report.death_outcome(shipped) == f"21.0 s ({low:.1f}-{high:.1f}, n = 5)"
    up = rows["upstream", "out-of-service"]
    assert up["ratio_over_hybrid"] == 2.0  # 130 / 65
    assert up["ratio_n"] == [3, 3]
    assert up["ratio_interval"][0] <= 2.0 <= up["ratio_interval"][1]
    stock = rows["stock", "out-of-service"]
    assert (stock["n"], stock["capped_runs"], stock["capped"]) == (3, 1, False)
    assert "interval" not in stock
    assert "ratio_over_hybrid" not in stock
    assert report.death_outcome(stock) == "210.0 s (n = 3, 1 not within the cap)"
    assert report.death_outcome(rows["upstream", "none"]) == (
        "did not recover within 360 s (1 pod stuck Terminating)"
    )
    table = report.markdown(results)
    assert "each cell the median of that kind's deaths with its 95 % bootstrap interval" in table
    iv = up["ratio_interval"]
    assert f"| **{report.death_outcome(up)}** | **2.0x** ({iv[0]}-{iv[1]}, n = 3, 3) |" in table


def test_node_deaths_per_kind_count_against_the_default_budgets() -> None:
    args = bench_main.parse_args(["--sizes", "1000", "--reps", "2", "--rounds", "1"])
    assert args.node_deaths == 1
    args.defaults, args.apiserver_profile = True, 0
    assert bench_main.gang_over_default_budgets(args) is None  # 2 + 2 deaths
    args.node_deaths = 5  # 2 + 2 kinds x 5 deaths
    why = bench_main.gang_over_default_budgets(args)
    assert why is not None
    assert why.startswith("12 in-place recoveries of one gang")
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--sizes", "1000", "--node-deaths", "0"])


def test_a_defaults_run_sets_only_the_scope_and_refuses_more_failures_than_the_budgets() -> None:
    assert scenarios.jsi_settings(1000, "process", defaults=True) == {}
    assert scenarios.jsi_settings(5000, "pod", defaults=True) == {names.RESTART_SCOPE: "pod"}
    tuned = scenarios.jsi_settings(5000, "process")
    assert tuned[names.INPLACE_BUDGET] == "10000"
    assert tuned[names.NODE_UNHEALTHY_AFTER] == "1h"
    assert names.NODE_UNHEALTHY_AFTER not in scenarios.jsi_settings(1000, "process")
    assert scenarios.node_unhealthy_after(5000, defaults=True) == "15s"

    def args(*argv: str) -> Any:
        return bench_main.parse_args(["--sizes", "1000", "--defaults", *argv])

    # 3 reps a round + the apiserver's profiled one + 2 node deaths: 6 of 10, 2 of 5
    ok = args("--reps", "6", "--rounds", "2", "--node-death-sizes", "1000")
    assert bench_main.gang_over_default_budgets(ok) is None
    ok.rounds = 1  # 6 + 1 + 2 deaths: still within
    assert bench_main.gang_over_default_budgets(ok) is None
    ok.reps = 9
    why = bench_main.gang_over_default_budgets(ok)
    assert why is not None
    assert why.startswith("12 in-place recoveries of one gang, more than the default")
    with pytest.raises(SystemExit):
        args("--reps", "9", "--rounds", "1", "--node-death-sizes", "1000")


def test_cpu_per_recovery_gives_each_process_its_median_and_interval() -> None:
    windows = [
        {"cpu_s_by_process": {"kube-apiserver": v, "etcd": 0.001}, "controller_cpu_s": c}
        for v, c in ((1.0, 0.2), (2.0, 0.4), (3.0, 0.3))
    ] + [{"controller_cpu_s": 9.0}]  # no per-process figures: not a measured window
    cpu = report.cpu_per_recovery(windows)
    assert list(cpu) == ["kube-apiserver", "jobset-inplace"]  # etcd under the floor
    assert (cpu["kube-apiserver"]["median"], cpu["kube-apiserver"]["n"]) == (2.0, 3)
    assert cpu["jobset-inplace"]["median_ci"] == [0.2, 0.4]
    assert report._cpu_cell(cpu["kube-apiserver"]) == "2.00 (1.00-3.00)"
    assert report._cpu_cell(None) == "0.00"


def test_a_bench_without_its_plotting_library_stops_before_it_measures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(
        SystemExit, match=r"python -m bench: matplotlib is missing .*\.venv/\.bench"
    ):
        report.require_plots("python -m bench")
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))
    report.require_plots("python -m bench")  # importable: no objection
