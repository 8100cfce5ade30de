"""The leader's CPU per member per recovery of ``python -m bench`` runs, side by side:

    python -m bench.leader_cost BEFORE/results.json AFTER/results.json

Prints each run's figures (:func:`bench.report.leader_cost`: commit, median with its 95 %
interval, user/system, planning passes) and, per path and size both runs have, the ratio of
the second's median to the first's with its bootstrap interval. Runs compared this way are
like for like only if made on one machine the same day with the same arguments: the command
lines are printed to check."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .report import leader_cost, leader_ms_per_member
from .stats import ratio_of_medians


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.leader_cost", description=__doc__)
    p.add_argument("results", type=Path, nargs="+", help="results.json of python -m bench")
    args = p.parse_args(argv)
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
