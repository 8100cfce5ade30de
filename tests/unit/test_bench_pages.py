"""The published figures come from stored result files: the pages are up to date with them, a
figure without its commit is refused, ratios are within one run and like for like."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import pages
from bench.pages import PagesError


def test_the_pages_are_what_their_result_files_give() -> None:
    assert pages.main(["--check"]) == 0, "make bench-pages, then commit the pages"


def _summary(running: float, reps: int = 5) -> dict[str, Any]:
    return {
        "running_median": running,
        "running_min": running,
        "running_max": running,
        "barrier_median": None,
        "reps": reps,
        "writes_median": 9,
        "consistent": reps,
    }


DOC: dict[str, Any] = {
    "when": "2026-11-28T03:00:00Z",
    "commit": "abc1234",
    "dirty": False,
    "command": "python -m bench.realnode --reps 5",
    "kubernetes": "v1.37.2",
    "jobset": "v0.12.0",
    "machine": {"cpus": 2, "steal_pct": 0.4},
    "summary": {
        "jsi-process": _summary(0.2),
        "jsi-pod": _summary(2.0),
        "upstream-sidecar": _summary(4.0),
        "upstream-main": _summary(3.0),
        "stock-grace0": _summary(5.0),
    },
}


def test_the_headline_compares_like_with_like_from_one_run() -> None:
    text = pages.realnode_headline(DOC)
    assert "`abc1234`" in text
    pod_row, process_row = text.splitlines()[-4:-2]
    assert "| 2.00 s | 3.00 s (`upstream-main`: 1.50x) | 5.00 s (2.50x) |" in pod_row
    assert "**0.20 s** | no such mode | no such mode |" in process_row, "no unlike ratio"


def test_the_table_names_its_commit_and_machine() -> None:
    text = pages.realnode_table(DOC)
    assert "commit `abc1234`" in text
    assert "2 cores (steal 0.4 %)" in text
    assert "| upstream-sidecar |" in text


def test_a_result_file_without_its_commit_is_not_published(tmp_path: Path) -> None:
    f = tmp_path / "old.json"
    f.write_text('{"when": "2026-11-24T02:28:36Z", "summary": {}}')
    with pytest.raises(PagesError, match="without its commit is not published"):
        pages.load(f)


def test_a_page_without_its_markers_is_an_error() -> None:
    with pytest.raises(PagesError, match="needs exactly one block"):
        pages.replace_block("no markers", "realnode-table", "x", pages.ROOT / "README.md")
    begin, end = pages.BEGIN.format("b"), pages.END.format("b")
    text = f"a\n{begin}\nold\n{end}\nz"
    assert pages.replace_block(text, "b", "new", pages.ROOT / "README.md") == (
        f"a\n{begin}\nnew\n{end}\nz"
    )
