"""``python -m bench.first_pod --compare``: two runs' files side by side (the runs themselves
need the local cluster with jobset-inplace installed; they are the bench's, not a test's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import first_pod


def run(commit: str, firsts: list[float], refused: list[int]) -> dict[str, object]:
    reps = [
        {"first_running_s": f, "all_running_s": f + 1, "refused": r, "refused_for_the_account": r}
        for f, r in zip(firsts, refused, strict=True)
    ]
    return {"commit": commit, "members": 2, "reps": reps}


def test_two_runs_are_compared_with_the_ratio_and_the_refusals_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run("aaaaaaa", [4.0, 6.0, 5.0, 5.0], [2, 0, 1, 0])))
    b.write_text(json.dumps(run("bbbbbbb", [2.0, 2.5, 2.5, 3.0], [0, 0, 0, 0])))
    assert first_pod.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "commit aaaaaaa: first pod Running 5.00 s, all 6.00 s (medians of 4); 3 creations "
        "refused for want of the account in 2 of 4 namespaces"
    )
    assert out[1].endswith("0 creations refused for want of the account in 0 of 4 namespaces")
    assert out[2].startswith("first_running_s: B / A 0.50x (95 % ")
    assert out[3].startswith("all_running_s: B / A 0.58x (95 % ")
