"""``bench.gangstate_fanout`` runs end to end (its own control plane, a watcher process with
30 watches of a GangState, 3 status writes): every watch gets every write, and each figure is
measured. How the apiserver's CPU grows with the watches is the benchmark's to report."""

from __future__ import annotations

import json

from bench import gangstate_fanout


def test_the_fanout_bench_gets_every_write_to_every_watch() -> None:
    out = gangstate_fanout.run([0, 30], 3)
    alone, watched = out["sizes"]["0"], out["sizes"]["30"]
    assert alone["n_writes"] == watched["n_writes"] == 3
    assert alone["bytes_per_watcher"] == 0
    # each write reached all 30 watches (the watcher process says so only then), whole
    status = json.dumps(gangstate_fanout.status_after_recoveries(30), separators=(",", ":"))
    assert watched["bytes_per_watcher"] > len(status)
    for w in watched["writes"]:
        assert w["fanout_s"] > 0
        assert w["apiserver_cpu_s"] > -0.05  # less the idle rate: may be a little below 0
    assert watched["apiserver_cpu_per_recovery_s"] == round(
        watched["apiserver_cpu_s"]["median"] * gangstate_fanout.WRITES_PER_RECOVERY, 3
    )
