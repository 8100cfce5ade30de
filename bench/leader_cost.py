"""The leader's CPU per member per recovery of ``python -m bench`` runs, side by side:

    python -m bench.leader_cost BEFORE/results.json AFTER/results.json
    python -m bench.leader_cost --where RUN/leader-*.txt


Prints each run's figures (:func:`bench.report.leader_cost`: commit, median with its 95 %
interval, user/system, planning passes; each process's CPU per recovery) and, per path and
size both runs have, the ratios of the second's medians to the first's (the leader's CPU per
member, the barrier's opening) with their bootstrap intervals. Runs compared this way are
like for like only if made on one machine the same day with the same arguments: the command
lines are printed to check. ``--where``: the leader's sampled CPU (py-spy, native or Python
frames; waiting threads left out) split by what the code does (:data:`PARTS`)."""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from .profile import WAITING_FRAMES
from .report import leader_cost, leader_ms_per_member
from .stats import ratio_of_medians

# What a leader's CPU sample is spent on, by the first pattern its stack matches (frames are
# "function (file:line)"; the leader's recovery loop runs on uvloop, its API calls on threads).
PARTS = (
    ("planning: plan()", r"Reconciler\._plan \([^;]*\);plan \("),
    (
        "planning: the snapshot (cache -> Snapshot)",
        r"Reconciler\._plan \([^;]*\);ClusterCache\.snapshot",
    ),
    ("planning: GangMembers rows", r"Reconciler\._write_members"),
    ("planning: the rest of a pass", r"Reconciler\."),
    ("reports: the members' views made again (new epoch)", r"ClusterCache\._merged"),
    ("reports: taking a report (token, decode, cache)", r"ReportServer\."),
    ("reports: TLS", r"_ssl__SSLObject|SSLObject\.|Connection\._decrypt|Connection\._send"),
    ("reports: HTTP framing", r"RequestReader\."),
    # (Python frames only: the event loop's own C work, sockets and epoll, is a stack that
    # ends at the loop's runner)
    (
        "reports: the connection and the event loop",
        r"Connection\.|uv__|loop\.c|Runner\.run \([^;]*\)$",
    ),
    ("watches (pods, node Leases, GangStates)", r"RawWatch\.|watches\.py"),
    ("API calls (threads)", r"Executor\.|api_client\.py|rest\.py"),
    ("garbage collection", r"gc_collect"),
)


def where(files: list[Path]) -> list[str]:
    """The sampled CPU of ``files`` (py-spy raw stacks) by :data:`PARTS`, largest first."""
    counts: collections.Counter[str] = collections.Counter()
    for path in files:
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack or not n.isdigit() or WAITING_FRAMES.search(stack):
                continue
            part = next((name for name, rx in PARTS if re.search(rx, stack)), "other")
            counts[part] += int(n)
    total = sum(counts.values())
    return [f"{100 * n / total:5.1f}% {part}" for part, n in counts.most_common()] + [
        f"({total} samples of CPU in {len(files)} files)"
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.leader_cost", description=__doc__)
    p.add_argument("results", type=Path, nargs="+", help="results.json of python -m bench")
    p.add_argument("--where", action="store_true", help="the files are leader-*.txt profiles")
    args = p.parse_args(argv)
    if args.where:
        missing = [str(f) for f in args.results if not f.is_file()]
        if missing:
            p.error(f"no such profile: {', '.join(missing)}")
        print("\n".join(where(args.results)))
        return 0
    runs = []
    for path in args.results:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            p.error(f"{path}: not a results file of python -m bench ({e})")
    for path, doc in zip(args.results, runs, strict=True):
        print(f"{path}: commit {doc.get('commit')}, `{doc.get('command')}`")
        print("\n".join(f"  {line}" for line in leader_cost(doc) if not line.startswith("  ")))
    for path, doc in zip(args.results, runs, strict=True):
        for (name, size), cpu in sorted(cpu_by_process(doc).items()):
            shares = ", ".join(f"{p} {v:.2f}" for p, v in sorted(cpu.items(), key=lambda i: -i[1]))
            print(f"{path}: {name} {size} pods, CPU-s per recovery by process (medians): {shares}")
    if len(runs) >= 2:
        for what, figures in (
            ("the leader's CPU per member", leader_ms_per_member),
            ("barrier open", barrier_open),
        ):
            first, second = figures(runs[0]), figures(runs[1])
            for key in sorted(first.keys() & second.keys()):
                r = ratio_of_medians(second[key], first[key])
                print(
                    f"{key[0]} {key[1]} pods, {what}: second / first {r.ratio:.2f}x "
                    f"(95 % {r.low:.2f}-{r.high:.2f}, n = {r.n_a}, {r.n_b})"
                )
    return 0


def _failures(doc: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return {
        (path, size): block["worker_failure"]
        for size, row in doc.get("sizes", {}).items()
        for path, block in row.items()
        if isinstance(block, dict) and block.get("worker_failure")
    }


def barrier_open(doc: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    """(path, size) -> each worker failure's time to the barrier's opening, in seconds."""
    return {
        key: [m["barrier_open_s"] for m in runs if m.get("barrier_open_s") is not None]
        for key, runs in _failures(doc).items()
    }


def cpu_by_process(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """(path, size) -> each process's CPU-s per recovery, the median over the failures (the
    leader, a report front, the fleet, the apiserver, ...)."""
    out = {}
    for key, runs in _failures(doc).items():
        seen: dict[str, list[float]] = collections.defaultdict(list)
        for m in runs:
            for process, cpu in (m.get("cpu_s_by_process") or {}).items():
                seen[process].append(cpu)
        out[key] = {p: statistics.median(v) for p, v in seen.items()}
    return out


if __name__ == "__main__":
    sys.exit(main())
