"""``bench.channel_fallback`` runs end to end (two repetitions: its own control plane, the
controller process, a gang of 4): every refused report goes to the pod and is both counted in
the status and named in an Event. Its timing goal is the benchmark's to report, not this
test's: only that each figure was measured is checked."""

from __future__ import annotations

from bench import channel_fallback


def test_the_fallback_bench_measures_every_refused_report() -> None:
    out = channel_fallback.run(2)
    assert [r["where"] for r in out["reps"]] == ["pod", "pod"], "the full leader refused it"
    for r in out["reps"]:
        assert 0 < r["fallback_s"] < channel_fallback.WAIT_S
        assert 0 < r["counted_s"] < channel_fallback.WAIT_S
        assert 0 < r["event_s"] < channel_fallback.WAIT_S
    summary = channel_fallback.summary(out["reps"])
    assert (summary["n"], summary["on_pod"]) == (2, 2)
