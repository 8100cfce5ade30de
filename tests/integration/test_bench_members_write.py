"""``bench.members_write`` runs end to end (its own control plane, 3 writes each way of 50
rows): both ways write the object the leader reads back, and every figure is measured. Which
way is cheaper is the benchmark's to report."""

from __future__ import annotations

from bench import members_write


def test_the_members_write_bench_writes_both_ways_and_measures_each() -> None:
    out = members_write.measure_sizes([50], 3)
    r = out["sizes"]["50"]
    assert r["rows"] == 50
    assert r["writes"] == 3
    for way in ("client", "encoded"):
        assert len(r[way]["cpu_values_s"]) == 3
        assert r[way]["cpu_s"]["median"] > 0
        assert r[way]["wall_s"]["median"] >= r[way]["cpu_s"]["median"] * 0.5
    assert r["cpu_ratio"]["n_a"] == r["cpu_ratio"]["n_b"] == 3
    assert "50 rows" in members_write.line(r)
