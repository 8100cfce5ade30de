"""The fan-out bench's summary and table (bench/gangstate_fanout.py, bench/pages.py): medians
over the writes with their interval, a recovery's CPU from the writes it makes, the status the
leader writes at the end of a full history."""

from __future__ import annotations

from bench import gangstate_fanout, pages
from jobset_inplace.core.gangstate import status_from_dict
from jobset_inplace.core.model import HISTORY_LIMIT


def _writes(cpu: list[float]) -> list[dict[str, float]]:
    return [
        {"apiserver_cpu_s": c, "write_s": 0.01, "fanout_s": 0.1 + c, "bytes_per_watcher": 9000}
        for c in cpu
    ]


def test_a_sizes_figures_are_medians_over_its_writes() -> None:
    s = gangstate_fanout.summary(_writes([0.10, 0.30, 0.20]))
    assert s["n_writes"] == 3
    assert s["apiserver_cpu_s"]["median"] == 0.2
    assert 0.1 <= s["apiserver_cpu_s"]["low"] <= 0.2 <= s["apiserver_cpu_s"]["high"] <= 0.3
    assert s["apiserver_cpu_s"]["max"] == 0.3
    assert s["apiserver_cpu_per_recovery_s"] == 0.2 * gangstate_fanout.WRITES_PER_RECOVERY
    assert s["bytes_per_watcher"] == 9000


def test_the_status_written_is_one_the_leader_reads_back_with_a_full_history() -> None:
    status = status_from_dict(gangstate_fanout.status_after_recoveries(5000))
    assert len(status.history) == HISTORY_LIMIT
    assert status.barrier_open
    assert status.expected == 5000
    assert status.recovery is not None
    assert status.recovery.in_place == 4999


def test_the_table_shows_each_count_of_watchers() -> None:
    sizes = {
        str(n): {"watchers": n, "apiserver_rss_mib": 300.0, "writes": _writes(cpu)}
        | gangstate_fanout.summary(_writes(cpu))
        for n, cpu in ((1000, [0.02, 0.03]), (10000, [0.2, 0.3, 0.25]))
    }
    doc = {
        "when": "2026-12-05T10:00:00+00:00",
        "commit": "abc1234",
        "command": "python -m bench.gangstate_fanout",
        "kubernetes": "the integration control plane",
        "machine": {"cpus": 2},
        "writes_per_recovery": 2,
        "sizes": sizes,
    }
    text = pages.gangstate_fanout_table(doc)
    row = next(line for line in text.splitlines() if line.startswith("| 10,000 |"))
    assert row.startswith("| 10,000 | 3 | 250.0 ms (200.0-300.0) |")
    assert "**500 ms (400-600)**" in row  # 2 writes a recovery
    assert row.endswith("(400) | 9,000 | 300 MiB |")
