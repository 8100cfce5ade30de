"""bench.figures: a measured figure typed in the docs links the stored result it comes from."""

from __future__ import annotations

from bench import figures, pages

PAGE = figures.ROOT / "docs" / "page.md"  # links resolve from docs/, as benchmarks.md's do


def test_a_measured_figure_typed_without_its_stored_result_fails() -> None:
    text = "# A page\n\nThe pod scope restarts\nthe gang in 2.24 s on the real nodes.\n"
    (problem,) = figures.unlinked(PAGE, text)
    assert problem.startswith("docs/page.md:4: '2.24 s' is a measured figure")
    assert "move it into a block that bench.pages generates" in problem
    assert "link the stored file it comes from" in problem
    assert len(figures.unlinked(PAGE, "The leader used 1.44 cores, 6.9x, 20.3 KiB.")) == 3
    missing = "2.24 s ([run](bench/no-such-run.json)); [runs](bench/runs.md) 2.24 s."
    assert len(figures.unlinked(PAGE, missing)) == 2, "a file that exists, a heading"
    assert figures.unlinked(PAGE, "- crash -> 5 s\n- every member at 2 s")


def test_a_measured_figure_linked_to_its_stored_result_passes() -> None:
    for link in (
        "[bench/realnode.json](bench/realnode.json)",
        "[runs](bench/runs.md#the-scale-curve-500-to-5000-pods-2026-11-28)",
    ):
        assert not figures.unlinked(PAGE, f"Whole pods: 2.24 s and\n1.8x ({link}).")
    table = (
        "| path | time ([bench/realnode.json](bench/realnode.json)) |\n|---|---|\n"
        "| jsi-pod | 2.24 s |\n\n| path | time |\n|---|---|\n| jsi-pod | 2.24 s |\n"
    )
    (problem,) = figures.unlinked(PAGE, table)
    assert problem.startswith("docs/page.md:7: '2.24 s'"), "a row links by itself or its header"
    assert not figures.unlinked(PAGE, "2.24 s in one run of `make demo`, unrecorded.")


def test_a_figure_in_a_generated_block_or_in_code_is_not_looked_at() -> None:
    begin, end = pages.BEGIN.format("b"), pages.END.format("b")
    text = f"{begin}\nthe gang runs again in 2.24 s (1.6x)\n{end}\n\n```\n# about 2 h\n```\n"
    assert not figures.unlinked(PAGE, text + "The run of `python -m bench` for `0.05 s`.")
    assert figures.unlinked(PAGE, text + "Then 3.1 s.") != []


def test_a_setting_or_a_goal_is_not_a_measurement() -> None:
    settings = (
        "`hang-timeout: 10s`, a step every 0.5 s, `node-unhealthy-after` (default 15 s), "
        "a 10 s timeout, a 4 GiB memory limit, the 2 s grace period, the goal p50 <= 10 s "
        "and >= 20x, a 95 % interval, on 2 cores (24 GiB)."
    )
    assert not figures.unlinked(PAGE, settings)
    (problem,) = figures.unlinked(PAGE, "A hang is found after 10 s.")
    assert "'10 s'" in problem, "a setting not written as one counts as measured"
