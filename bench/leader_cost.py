"""The leader's CPU per member per recovery of ``python -m bench`` runs, side by side:

    python -m bench.leader_cost BEFORE/results.json AFTER/results.json
    python -m bench.leader_cost --where RUN/leader-*.txt


Prints each run's figures (:func:`bench.report.leader_cost`: commit, median with its 95 %
interval, user/system, planning passes) and, per path and size both runs have, the ratio of
the second's median to the first's with its bootstrap interval. Runs compared this way are
like for like only if made on one machine the same day with the same arguments: the command
lines are printed to check. ``--where``: the leader's sampled CPU (py-spy, native or Python
frames; waiting threads left out) split by what the code does (:data:`PARTS`)."""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

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
    if len(runs) >= 2:
        first, second = leader_ms_per_member(runs[0]), leader_ms_per_member(runs[1])
        for key in sorted(first.keys() & second.keys()):
            r = ratio_of_medians(second[key], first[key])
            print(
                f"{key[0]} {key[1]} pods: second / first {r.ratio:.2f}x "
                f"(95 % {r.low:.2f}-{r.high:.2f}, n = {r.n_a}, {r.n_b})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
