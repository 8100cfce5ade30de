"""Crash -> every trainer running again on the local cluster's real kubelet nodes, side by side.

    python -m bench.realnode --reps 5                    (make bench-realnode)
    python -m bench.realnode --trainer torch --reps 5    (a real PyTorch trainer, to its first
                                                          productive step: bench/first_step.py)

Paths, each the demo's gang shape (2 members on the 2 real nodes, the demo trainer, which ends
at once on SIGTERM, also as PID 1; a step every 0.2 s, a checkpoint every 10 steps to its pod's
volume and to a persistent tier the nodes share, so a recreated pod resumes from its newest
checkpoint too; terminationGracePeriodSeconds 2, or 0 for the ``-grace0`` paths):

* ``jsi-process``: jobset-inplace, restart scope ``process`` (the default);
* ``jsi-pod``: jobset-inplace, restart scope ``pod`` (RestartAllContainers);
* ``upstream-sidecar``: JobSet's own InPlaceRestart (v0.12, the ``InPlaceRestart`` gate on the
  JobSet controller for these runs), its Go agent as a sidecar holding a startupProbe barrier;
* ``upstream-main``: the same in its main-container mode (the agent is the trainer container's
  entrypoint and runs the trainer as its child; container-level ``Restart`` rule);
* ``upstream-sidecar-grace0``, ``upstream-main-grace0``: the same with no grace period, as
  upstream's own example sets it;
* ``stock``, ``stock-grace0``: stock JobSet (Recreate: every pod deleted and created again),
  with the demo's grace period and with ``terminationGracePeriodSeconds: 0``.

The same crash (the victim's trainer exits 3 at a set time), repetitions interleaved across the
paths (this machine's drifts hit each alike). Every time is from the components' own
timestamps: the crash time is set, "running" is the runtime's timestamp of each trainer's
"resuming" log line, "barrier" is when the path lets trainers go (jobset-inplace: the
controller's ``openedAt``; upstream: its agent's log line that lifts the barrier). Without an
agent (upstream, stock) the trainer resumes from its own newest checkpoint. Each member's resume
step is recorded: a path resumes the gang consistently when all members resume at one step.
Ratios are within the run: to ``jsi-process`` and to ``jsi-pod`` (which restarts whole pods, as
the upstream and stock paths do). Results: ``docs/bench/realnode.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import utils

from bench import first_step, provenance, upstream
from bench.__main__ import apiserver_metrics
from bench.scenarios import apiserver_requests
from bench.stats import median_interval, ratio_of_medians
from jobset_inplace import names
from jobset_inplace.core.transform import STATE_DIR
from jobset_inplace.times import parse_time
from testbed import images
from testbed.cluster import LocalCluster
from testbed.controller import ControllerProcess, gang_state, prepare
from testbed.demo import CRASH_LEAD_S, demo_jobset, inject_failure, timed_log
from testbed.kube import Clients, clients, create_jobset, delete_jobset, namespace_gone, wait_for
from testbed.torchgang import LINEAR, MODELS, TRANSFORMER
from testbed.versions import binaries, ensure_binaries, versions

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "bench"
DEFAULT_OUT = {"demo": RESULTS / "realnode.json", "torch": RESULTS / "realnode-torch.json"}
# --trainer torch --model transformer
TRANSFORMER_OUT = RESULTS / "realnode-torch-transformer.json"
NAMESPACE = "bench-realnode"
MEMBERS = 2
PATHS = (
    "jsi-process",
    "jsi-pod",
    "upstream-sidecar",
    "upstream-sidecar-grace0",
    "upstream-main",
    "upstream-main-grace0",
    "stock",
    "stock-grace0",
)
RESUMING = "resuming at step"
RESUME_STEP = re.compile(r"resuming at step (\d+)")
GRACE_S = 2  # terminationGracePeriodSeconds of the paths without "-grace0"


def log(msg: str) -> None:
    print(f"[realnode {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Run:
    path: str
    rep: int
    barrier: float | None  # crash -> barrier lifted (None: the path has none)
    running: float  # crash -> every trainer resumed
    # API writes from the injection until every trainer ran again, by resource[/subresource]
    # (the apiserver's own counters; the nodes' heartbeats left out, see WORKLOAD_RESOURCES)
    writes: dict[str, int] = field(default_factory=dict)
    # the step each member resumed at after the crash (its trainer's log), by job index
    resume_steps: dict[str, int] = field(default_factory=dict)

    @classmethod
    def since(
        cls,
        t0: float,
        path: str,
        rep: int,
        *,
        barrier: float | None,
        running: float,
        writes: Counter[str],
        resume_steps: dict[str, int],
    ) -> Run:
        """A run whose failure came at ``t0``, its barrier and running times as clock times."""
        lifted = None if barrier is None else barrier - t0
        return cls(path, rep, lifted, running - t0, dict(writes), resume_steps)

    @property
    def consistent(self) -> bool:
        """Every member resumed at one step (a gang that can go on training together)."""
        return len(set(self.resume_steps.values())) == 1


# What a recovery writes (everything else in the window is the cluster's background: node
# heartbeats and Leases, endpoints).
WORKLOAD_RESOURCES = ("pods", "jobs", "jobsets", "gangstates", "events")
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def write_counts(cluster: LocalCluster) -> Counter[str]:
    """The apiserver's count of mutating requests on a workload's objects so far, per
    resource[/subresource]."""
    counts: Counter[str] = Counter()
    for key, n in apiserver_requests(apiserver_metrics(cluster)).items():
        verb, resource = key.split(" ", 1)
        if verb in WRITE_VERBS and resource.split("/")[0] in WORKLOAD_RESOURCES:
            counts[resource] += int(n)
    return counts


# --- the JobSets -----------------------------------------------------------------------------


def _standalone(jobset: dict[str, Any], *, grace: int = GRACE_S) -> dict[str, Any]:
    """The demo JobSet without jobset-inplace: the trainer finds its own checkpoint; a state
    volume for the failure injection only."""
    jobset["metadata"]["annotations"] = {}
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = job["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = grace
    pod["volumes"].append({"name": "state", "emptyDir": {}})
    trainer = pod["containers"][0]
    trainer["env"].append({"name": "JSI_DEMO_STANDALONE", "value": "1"})
    trainer["volumeMounts"].append({"name": "state", "mountPath": STATE_DIR})
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 1000}
    return jobset


def demo(name: str, shared: Path, scope: str | None = None) -> dict[str, Any]:
    """The demo gang every path runs: checkpoints every 10 steps to the pod's own volume and to
    a persistent tier (a host directory the real nodes share, as a network filesystem), so a
    recreated pod resumes from its member's newest checkpoint as an in-place restarted one
    does."""
    env = {"JSI_DEMO_PERSIST_EVERY": "10"}
    return demo_jobset(name, MEMBERS, scope=scope, persistent=shared / name, env=env)


def stock_jobset(name: str, shared: Path, grace: int) -> dict[str, Any]:
    js = _standalone(demo(name, shared), grace=grace)
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 0
    return js


def upstream_jobset(name: str, shared: Path, mode: str, grace: int) -> dict[str, Any]:
    """JobSet's InPlaceRestart as its v0.12 examples set it up (sidecar or main-container)."""
    return upstream.in_place_restart(
        _standalone(demo(name, shared), grace=grace),
        mode,
        image=images.UPSTREAM_AGENT_IMAGE,
        agent_path=images.UPSTREAM_AGENT_PATH,
    )


def jobset_for(path: str, name: str, shared: Path) -> dict[str, Any]:
    grace = 0 if path.endswith("-grace0") else GRACE_S
    if path.startswith("jsi-"):
        return demo(name, shared, scope=path.removeprefix("jsi-"))
    if path.startswith("upstream-"):
        mode = path.removeprefix("upstream-").removesuffix("-grace0")
        return upstream_jobset(name, shared, mode, grace)
    return stock_jobset(name, shared, grace)


# --- one run ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, cluster: LocalCluster, shared: Path) -> None:
        self.cluster, self.shared = cluster, shared
        self.kubeconfig = cluster.kubeconfig
        self.kube: Clients = clients(cluster.kubeconfig)

    def writes(self) -> Counter[str]:
        return write_counts(self.cluster)

    def pods(self, name: str) -> list[Any]:
        selector = f"{names.JOBSET_NAME_LABEL}={name}"
        items = self.kube.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return [p for p in items if not p.metadata.deletion_timestamp]

    def first_after(self, pod: str, container: str, after: float, text: str) -> float | None:
        try:
            lines = timed_log(self.kubeconfig, NAMESPACE, pod, container)
        except subprocess.CalledProcessError:  # not started yet, or being replaced
            return None
        return next((t for t, line in lines if t > after and text in line), None)

    def all_after(self, name: str, container: str, after: float, text: str) -> float | None:
        """When the last member's log showed ``text`` after ``after`` (None: not all yet)."""
        pods = self.pods(name)
        if len(pods) != MEMBERS:
            return None
        times = [self.first_after(p.metadata.name, container, after, text) for p in pods]
        return None if None in times else max(t for t in times if t is not None)

    def run(self, path: str, rep: int) -> Run:
        name = f"{path}-{rep}"
        create_jobset(self.kube, NAMESPACE, jobset_for(path, name, self.shared))
        wait_for(
            f"{name}: every trainer training",
            lambda: self.all_after(name, "trainer", 0, RESUMING),
            180,
            0.5,
        )
        wait_for(
            f"{name}: a checkpoint on every member",
            lambda: self.all_after(name, "trainer", 0, "checkpoint saved"),
            60,
            0.5,
        )
        victim = sorted(p.metadata.name for p in self.pods(name))[-1]
        crash = time.time() + CRASH_LEAD_S
        before = write_counts(self.cluster)
        inject_failure(self.kubeconfig, NAMESPACE, victim, crash)
        running = wait_for(
            f"{name}: every trainer running again",
            lambda: self.all_after(name, "trainer", crash, RESUMING),
            180,
            0.5,
        )
        writes = write_counts(self.cluster) - before
        barrier = self.barrier(path, name, crash)
        resumed = self.resume_steps(name, crash)
        self.delete(name)
        return Run.since(
            crash, path, rep, barrier=barrier, running=running, writes=writes, resume_steps=resumed
        )

    def resume_steps(self, name: str, crash: float) -> dict[str, int]:
        """The step each member's trainer resumed at after ``crash``, by job index."""
        out = {}
        for pod in self.pods(name):
            lines = timed_log(self.kubeconfig, NAMESPACE, pod.metadata.name, "trainer")
            line = next(line for t, line in lines if t > crash and RESUMING in line)
            match = RESUME_STEP.search(line)
            assert match, f"{pod.metadata.name}: no step in {line!r}"
            out[pod.metadata.labels[names.JOB_INDEX_LABEL]] = int(match.group(1))
        return out

    def barrier(self, path: str, name: str, crash: float) -> float | None:
        if path.startswith("jsi-"):
            rec = gang_state(self.kube, NAMESPACE, name).get("recovery") or {}
            return parse_time(rec.get("openedAt"))
        mode = path.removesuffix("-grace0")
        if mode == "upstream-sidecar":
            return self.all_after(name, upstream.AGENT, crash, "starting startup probe server")
        if mode == "upstream-main":
            return self.all_after(name, "trainer", crash, "executing worker command")
        return None

    def delete(self, name: str) -> None:
        delete_jobset(self.kube, NAMESPACE, name)


# --- the whole comparison --------------------------------------------------------------------


@dataclass
class PathSummary:
    running_median: float
    running_min: float
    running_max: float
    barrier_median: float | None
    reps: int
    writes_median: float
    consistent: int  # runs whose members all resumed at one step


def summary(runs: list[Run], paths: tuple[str, ...] = PATHS) -> dict[str, PathSummary]:
    out: dict[str, PathSummary] = {}
    for path in paths:
        running = [r.running for r in runs if r.path == path]
        barriers = [r.barrier for r in runs if r.path == path and r.barrier is not None]
        if running:
            out[path] = PathSummary(
                statistics.median(running),
                min(running),
                max(running),
                statistics.median(barriers) if barriers else None,
                len(running),
                statistics.median(sum(r.writes.values()) for r in runs if r.path == path),
                sum(r.consistent for r in runs if r.path == path),
            )
    return out


def _x(ratio: float) -> str:
    """A ratio with two significant digits where it is below 1 (0.08x, not 0.1x)."""
    return f"{ratio:.2f}" if ratio < 1 else f"{ratio:.1f}"


def running_by_path(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each path's "every trainer running" times, one per repetition (a results file's runs)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        out.setdefault(r["path"], []).append(float(r["running"]))
    return out


def writes_by_path(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each path's API writes per repetition that counted them."""
    out: dict[str, list[float]] = {}
    for r in runs:
        if "writes" in r:
            out.setdefault(r["path"], []).append(float(sum(r["writes"].values())))
    return out


def barrier_by_path(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each path's "barrier lifted" times, one per repetition that has one."""
    out: dict[str, list[float]] = {}
    for r in runs:
        if r.get("barrier") is not None:
            out.setdefault(r["path"], []).append(float(r["barrier"]))
    return out


def table(
    s: dict[str, PathSummary],
    running: dict[str, list[float]] | None = None,
    barriers: dict[str, list[float]] | None = None,
    writes: dict[str, list[float]] | None = None,
    *,
    bases: tuple[str, ...] = ("jsi-process", "jsi-pod"),
    failure: str = "crash",
) -> str:
    """Markdown: medians, ranges, each path's ratio to jobset-inplace's two scopes in this run
    (like for like: jsi-pod restarts whole pods as the upstream and stock paths do; jsi-process
    only the trainer processes; with each path's repetitions, ``running``, the ratio's 95 %
    bootstrap interval), and how many runs resumed the gang at one step."""
    shown = [b for b in bases if b in s]

    def ratio(path: str, base: str) -> str:
        mine, theirs = (running or {}).get(path, []), (running or {}).get(base, [])
        if path == base or len(mine) < 2 or len(theirs) < 2:
            return f"{_x(s[path].running_median / s[base].running_median)}x"
        r = ratio_of_medians(mine, theirs)
        return f"{_x(r.ratio)}x ({_x(r.low)}-{_x(r.high)})"

    def spread(path: str, v: PathSummary) -> str:
        mine = (running or {}).get(path, [])
        if len(mine) < 2:
            return f"range {v.running_min:.2f}-{v.running_max:.2f}"
        lo, hi = median_interval(mine)
        return f"{lo:.2f}-{hi:.2f}; range {v.running_min:.2f}-{v.running_max:.2f}"

    def within(values: list[float] | None, fmt: str) -> str:
        """`` (low-high)``: the median's 95 % interval, or nothing with fewer than 2 values."""
        if not values or len(values) < 2:
            return ""
        lo, hi = median_interval(values)
        return f" ({lo:{fmt}}-{hi:{fmt}})"

    def barrier(path: str, v: PathSummary) -> str:
        if v.barrier_median is None:
            return "-"
        return f"{v.barrier_median:.2f} s" + within((barriers or {}).get(path), ".2f")

    def counted(path: str, v: PathSummary) -> str:
        return f"{v.writes_median:g}" + within((writes or {}).get(path), "g")

    rows = [
        f"| path | n | {failure} -> barrier lifted (median"
        + (" (95 % interval)" if barriers else "")
        + f") | {failure} -> every trainer running "
        "(median"
        + (" (95 % interval; range)" if running else ", range")
        + ") | "
        + " | ".join(f"/ {b}" + (" (95 % interval)" if running else "") for b in shown)
        + (" | " if shown else "")
        + "resumed at one step | API writes (median"
        + (" (95 % interval)" if writes else "")
        + ") |",
        "|---|---|---|---|" + "---|" * len(shown) + "---|---|",
    ]
    for path, v in s.items():
        ratios = "".join(f"{ratio(path, b)} | " for b in shown)
        rows.append(
            f"| {path} | {v.reps} | {barrier(path, v)} | {v.running_median:.2f} s "
            f"({spread(path, v)}) | {ratios}{v.consistent}/{v.reps} | {counted(path, v)} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.realnode", description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5, help="repetitions per path (default 5)")
    p.add_argument(
        "--paths",
        type=lambda raw: [x for x in raw.split(",") if x],
        help=f"comma-separated subset of {','.join(PATHS)} (default: all; with --trainer torch "
        f"also {','.join(sorted(set(first_step.PATHS) - set(PATHS)))})",
    )
    p.add_argument(
        "--trainer",
        choices=("demo", "torch"),
        default="demo",
        help="demo: the demo trainer, crash -> every trainer running (its first log line); "
        "torch: the PyTorch gang (torchrun, DDP, DCP), crash -> every rank's first productive "
        "step, with where the time went and steps lost",
    )
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=LINEAR.name,
        help="with --trainer torch: what the trainer trains (linear: 8 parameters, 4 ranks; "
        "transformer: 110 M parameters, AdamW, 1.3 GB checkpoints, 2 ranks; default linear)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help=f"results JSON (default {DEFAULT_OUT['demo']}, or {DEFAULT_OUT['torch']} with "
        f"--trainer torch, or {TRANSFORMER_OUT} with --model transformer)",
    )
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    a = p.parse_args(argv)
    if a.model != LINEAR.name and a.trainer != "torch":
        p.error(f"--model {a.model}: only with --trainer torch")
    default = TRANSFORMER_OUT if a.model == TRANSFORMER.name else DEFAULT_OUT[a.trainer]
    a.out = a.out or default
    known = first_step.PATHS if a.trainer == "torch" else PATHS
    a.paths = a.paths or list(known)
    check_runs(p, a.paths, a.reps, known)
    return a


def check_runs(
    p: argparse.ArgumentParser, paths: list[str], reps: int, known: tuple[str, ...]
) -> None:
    """``--paths`` of ``known`` and ``--reps`` >= 1, or the parser's error naming both."""
    unknown = sorted(set(paths) - set(known))
    if unknown or reps < 1:
        p.error(f"--paths: unknown {unknown} (accepted: {','.join(known)}); --reps must be >= 1")


def local_cluster() -> LocalCluster:
    """The local cluster (``$JSI_CLUSTER_NAME``, default jsi), up."""
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    cluster.up()
    return cluster


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run = provenance.begin("bench.realnode", argv, args.allow_dirty)
    cluster = local_cluster()
    nodes = cluster.real_nodes()
    if len(nodes) < MEMBERS:
        raise SystemExit(f"needs {MEMBERS} real nodes, the cluster has {nodes}: make cluster-up")
    shared = cluster.logs_dir.parent / "bench-realnode-shared"  # the persistent tier
    shutil.rmtree(shared, ignore_errors=True)
    bench = Bench(cluster, shared)
    namespace_gone(bench.kube, NAMESPACE)
    prepare(bench.kube, cluster.kubeconfig, NAMESPACE)
    create_objects(bench.kube, upstream.rbac(NAMESPACE))
    if any(p.startswith("upstream-") for p in args.paths):
        agent = ensure_binaries("jobset_ipr_agent").jobset_ipr_agent
        image = images.build_upstream_agent(
            agent, imports=[str(images.node_socket(n)) for n in nodes]
        )
        log(f"upstream agent image {image.name} ({image.size_mib():.0f} MiB) on {nodes}")
    runs: list[Any] = []
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", NAMESPACE]
    torch = None
    if args.trainer == "torch":
        torch = first_step.TorchBench(bench, NAMESPACE, kubectl, MODELS[args.model])
    failed: dict[str, str] = {}  # path -> why its recovery did not complete (torch trainer)
    controller = ControllerProcess(cluster, cluster.logs_dir / "controller-bench-realnode.log")
    try:
        groups: list[tuple[Callable[[], AbstractContextManager[None]], list[str]]] = [
            (contextlib.nullcontext, [p for p in args.paths if not p.startswith("upstream-")]),
            (
                lambda: cluster.jobset_feature_gates(upstream.GATES),
                [p for p in args.paths if p.startswith("upstream-")],
            ),
        ]
        for rep in range(args.reps):
            for gates, paths in groups:
                if not paths:
                    continue
                with gates():
                    for path in paths:
                        if torch is not None:
                            if path in failed:
                                continue
                            try:
                                t = torch.run(path, rep)
                            except (
                                TimeoutError,
                                RuntimeError,
                                AssertionError,
                                subprocess.CalledProcessError,
                            ) as e:
                                failed[path] = f"rep {rep}: {e}"
                                log(f"{path} rep {rep} failed, not run again: {e}")
                                continue
                            runs.append(t)
                            log(
                                f"{path} rep {rep}: {t.milestones}, resumed at "
                                f"{sorted(set(t.resume_steps.values()))} (last step "
                                f"{t.last_step}), API writes {sum(t.writes.values())}"
                            )
                            continue
                        r = bench.run(path, rep)
                        runs.append(r)
                        b = "-" if r.barrier is None else f"{r.barrier:.2f}s"
                        log(
                            f"{path} rep {rep}: barrier {b}, every trainer running "
                            f"{r.running:.2f}s, API writes {sum(r.writes.values())}"
                        )
    finally:
        controller.stop()
    if torch is not None:
        s_torch = first_step.summary(runs, first_step.PATHS)
        print(first_step.table(s_torch))
        summarized: dict[str, Any] = s_torch
    else:
        s = summary(runs)
        print(table(s, running_by_path([asdict(r) for r in runs])))
        summarized = {k: asdict(v) for k, v in s.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **run.origin,
        "trainer": args.trainer,
        "model": args.model,
        "kubernetes": versions().kubernetes,
        "jobset": versions().jobset,
        "members": MEMBERS,
        "runs": [asdict(r) for r in runs],
        "summary": summarized,
        "failed": failed,
    }
    doc["machine"].update(run.steal())
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"results: {args.out}")
    return 0


def create_objects(kube: Clients, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        try:
            utils.create_from_dict(kube.api, obj)
        except utils.FailToCreateError as e:
            if not all(getattr(x, "status", None) == 409 for x in e.api_exceptions):
                raise


if __name__ == "__main__":
    sys.exit(main())
