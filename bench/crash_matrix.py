"""Every way a real PyTorch trainer dies, in every restart scope, on the real nodes.

    python -m bench.crash_matrix               (make bench-crashes; BENCH_ARGS="--reps 2")
    python -m bench.crash_matrix --cases prestart/oom,pod/segv

The cases, how each crash is made and what a recovery must show (once, every rank at one
step, no process of the crashed epoch left): :mod:`testbed.crashes`. Each case runs in a
JobSet of its own on the local cluster's 2 real nodes with the controller as a local process;
its time is crash -> every rank's first productive step after the resume, with where it went
(the latest rank's process start, torch imported, process group ready, checkpoint restored).
Results: ``docs/bench/crash-matrix.json`` (with their provenance) and a table on stdout; a
case that fails is recorded with why, and the run exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import provenance
from testbed import images
from testbed.cluster import LocalCluster
from testbed.controller import ControllerProcess, prepare
from testbed.crashes import BY_NAME, CRASHES, SCOPES, CaseResult, CrashRunner, cases
from testbed.kube import clients, namespace_gone
from testbed.versions import versions

OUT = Path(__file__).resolve().parents[1] / "docs" / "bench" / "crash-matrix.json"
NAMESPACE = "bench-crashes"
MILESTONES = ("started", "imported", "group_ready", "built", "restored")


def log(msg: str) -> None:
    print(f"[crashes {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_cases(raw: str) -> list[tuple[str, str]]:
    known = cases()
    chosen = []
    for item in filter(None, (x.strip() for x in raw.split(","))):
        scope, _, crash = item.partition("/")
        if (scope, crash) not in known:
            accepted = ", ".join(f"{s}/{c}" for s, c in known)
            raise argparse.ArgumentTypeError(f"{item!r} is not a case; accepted: {accepted}")
        chosen.append((scope, crash))
    return chosen


def summary(results: list[CaseResult]) -> dict[str, dict[str, Any]]:
    """Per case (``scope/crash``): repetitions, passed, the median first productive step and
    milestones (seconds after the crash), the causes the controller gave."""
    out: dict[str, dict[str, Any]] = {}
    for scope, crash in cases():
        mine = [r for r in results if (r.scope, r.crash) == (scope, crash)]
        if not mine:
            continue
        firsts = [r.first_step for r in mine if r.first_step is not None]
        med = {
            m: statistics.median(v)
            if (v := [x for r in mine if (x := r.milestones.get(m))])
            else None
            for m in MILESTONES
        }
        out[f"{scope}/{crash}"] = {
            "reps": len(mine),
            "passed": sum(r.passed for r in mine),
            "first_steps": firsts,
            "first_step_median": statistics.median(firsts) if firsts else None,
            "first_step_range": [min(firsts), max(firsts)] if firsts else None,
            "milestones_median": med,
            "causes": sorted({c for r in mine for c in r.causes.values()}),
        }
    return out


def range_coverage(n: int) -> float:
    """The chance that the range of ``n`` independent samples holds the true median (of any
    continuous distribution): ``1 - 2 * 0.5**n`` (75 % for 3, 97 % for 6)."""
    return 1 - 2 * 0.5**n


def table(s: dict[str, dict[str, Any]]) -> str:
    """Markdown: a row per crash, a column per scope: the median time to every rank's first
    productive step, with the range where there are several (passed/repetitions)."""
    rows = [
        "| crash | " + " | ".join(SCOPES) + " |",
        "|---|" + "---|" * len(SCOPES),
    ]
    for crash in CRASHES:
        cells = []
        for scope in SCOPES:
            v = s.get(f"{scope}/{crash.name}")
            if v is None:
                cells.append("-" if scope not in crash.scopes else "not run")
                continue
            t, span = v["first_step_median"], v["first_step_range"]
            spread = f"{span[0]:.2f}-{span[1]:.2f}, " if span and span[1] > span[0] else ""
            cells.append(
                f"{'-' if t is None else f'{t:.2f} s'} ({spread}{v['passed']}/{v['reps']})"
            )
        rows.append(f"| {crash.name}: {crash.what} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m bench.crash_matrix", description=__doc__.split("\n")[0]
    )
    p.add_argument("--cases", type=parse_cases, help="scope/crash,... (default: every case)")
    p.add_argument("--reps", type=int, default=1, help="repetitions per case (default 1)")
    p.add_argument("--out", type=Path, default=OUT, help=f"results JSON (default {OUT})")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    chosen = args.cases or cases()
    run = provenance.begin("bench.crash_matrix", argv, args.allow_dirty)
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    cluster.up()
    kube = clients(cluster.kubeconfig)
    namespace_gone(kube, NAMESPACE)
    prepare(kube, cluster.kubeconfig, NAMESPACE)
    runner = CrashRunner(kube, NAMESPACE, cluster.kubeconfig, images.torch_site(), log)
    controller = ControllerProcess(cluster, cluster.logs_dir / "controller-bench-crashes.log")
    results: list[CaseResult] = []
    try:
        for rep in range(args.reps):
            for i, (scope, crash) in enumerate(chosen):
                log(f"[{i + 1}/{len(chosen)}, rep {rep}] {scope}/{crash}: {BY_NAME[crash].what}")
                r = runner.run(scope, crash, f"{scope}-{crash}-{rep}")
                results.append(r)
                how = "passed" if r.passed else f"FAILED: {'; '.join(r.problems)}"
                first = "-" if r.first_step is None else f"{r.first_step:.2f} s"
                log(f"{scope}/{crash}: first productive step {first}, causes {r.causes}: {how}")
    finally:
        controller.stop()
    s = summary(results)
    print(table(s))
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **run.origin,
        "kubernetes": versions().kubernetes,
        "jobset": versions().jobset,
        "results": [asdict(r) | {"passed": r.passed} for r in results],
        "summary": s,
    }
    doc["machine"].update(run.steal())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"results: {args.out}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
