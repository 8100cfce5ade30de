"""The attack suite's repeats summarized (bench/channel_attacks.py ``summarize``) and shown
(bench/pages.py): the server's figures a median over the repeats with an interval, the
latencies pooled, a goal met only where every repeat and the interval say so."""

from __future__ import annotations

from typing import Any

from bench import channel_attacks, pages

OK = "HTTP/1.1 200 OK"
THREE = ((10, 0.1, 2), (14, 0.3, 4), (12, 0.2, 3))  # RSS growth, CPU share, loop lag p99


def _repeat(
    rss: float, cpu: float, lag: float, *, slow: float = 1.0, lost: int = 0
) -> dict[str, Any]:
    """One repeat's suite of one attack: the agent's latencies ``slow`` times quiet's."""
    quiet = [0.010 + i * 0.0001 for i in range(20)]
    answers = {OK: 20 - lost} | ({"no answer": lost} if lost else {})
    agent = {
        "answers": answers,
        "samples_s": {"quiet": quiet, "during": [t * slow for t in quiet]},
    }
    return {
        "limits": {},
        "idle": {"rss_mib": 80.0},
        "end": {"peak_mib": 80.0 + rss},
        "attacks": {
            "plain-tcp": {
                **agent,
                "new_pod": dict(agent),
                "attacker": {"opened": 100},
                "server": {
                    "rss_growth_mib": rss,
                    "peak_growth_mib": rss,
                    "cpu_share": cpu,
                    "loop_lag_ms": {"median": 1.0, "p99": lag},
                    "refused": {"preauth_timeout": 10},
                },
            }
        },
    }


def test_the_servers_figures_are_medians_over_the_repeats_with_their_interval() -> None:
    runs = [_repeat(*figures) for figures in THREE]
    s = channel_attacks.summarize(runs)["plain-tcp"]
    assert s["repeats"] == 3
    rss = s["server"]["rss_growth_mib"]
    assert (rss["median"], rss["max"], rss["n"]) == (12, 14, 3)
    assert 10 <= rss["low"] <= 12 <= rss["high"] <= 14
    assert s["server"]["cpu_share"]["median"] == 0.2
    assert s["server"]["loop_lag_p99_ms"]["median"] == 3
    # counts summed; the latencies of every repeat pooled: 60 samples a side
    assert s["answers"] == {OK: 60}
    assert s["attacker"] == {"opened": 300}
    assert s["refused"] == {"preauth_timeout": 30}
    assert (s["latency"]["n_a"], s["latency"]["n_b"]) == (60, 60)
    assert s["goals"] == {
        "every_report_answered": True,
        "latency_within_2x": True,
        "rss_within_100_mib": True,
    }


def test_a_goal_is_missed_by_one_repeat_or_by_an_interval_past_it() -> None:
    lost = channel_attacks.summarize([_repeat(10, 0.1, 2), _repeat(10, 0.1, 2, lost=1)])
    assert not lost["plain-tcp"]["goals"]["every_report_answered"]
    heavy = channel_attacks.summarize([_repeat(10, 0.1, 2), _repeat(120, 0.1, 2)])
    assert not heavy["plain-tcp"]["goals"]["rss_within_100_mib"]  # the worst repeat's
    slow = channel_attacks.summarize([_repeat(10, 0.1, 2, slow=2.5), _repeat(10, 0.1, 2)])
    assert slow["plain-tcp"]["latency"]["high"] > 2
    assert not slow["plain-tcp"]["goals"]["latency_within_2x"]


def test_one_repeat_gives_figures_without_an_interval() -> None:
    s = channel_attacks.summarize([_repeat(10, 0.1, 2)])["plain-tcp"]["server"]["cpu_share"]
    assert (s["median"], s["low"], s["high"], s["n"]) == (0.1, None, None, 1)


def test_the_table_shows_each_figure_with_its_interval_and_the_repeats() -> None:
    runs = [_repeat(*figures) for figures in THREE]
    doc = {
        "when": "2026-12-05T09:00:00+00:00",
        "commit": "abc1234",
        "command": "python -m bench.channel_attacks --repeats 3",
        "machine": {"cpus": 2},
        "addresses": 40,
        "seconds": 12.0,
        "attacks": channel_attacks.summarize(runs),
        "runs": runs,
    }
    text = pages.channel_attacks_table(doc)
    assert "the suite 3 times, each on a fresh server process" in text
    assert "at most +14.0 MiB over idle" in text
    row = next(line for line in text.splitlines() if line.startswith("| `plain-tcp`"))
    assert "60/60 answered 200" in row
    assert "+12.0 MiB (+10.0 to +14.0) MiB" not in row  # one unit, after the interval
    assert "+12.0 (+10.0 to +14.0) MiB" in row
    assert "20% (10% to 30%)" in row
    assert "3.0 (2.0 to 4.0) ms" in row
    assert row.endswith("| met |")
