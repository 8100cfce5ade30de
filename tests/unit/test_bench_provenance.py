"""What a benchmark's results file records of its origin (bench/provenance.py), in a real git
checkout made for the test: the commit, whether tracked files changed, the command line, the
machine with its steal; and a dirty checkout refused unless asked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench import provenance


def git(repo: Path, *args: str) -> str:
    who = {
        f"GIT_{role}_{what}": "t" for role in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")
    }
    run = subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **who},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "add", "code.py")
    git(tmp_path, "commit", "-qm", "first")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_clean_checkout_is_recorded_by_its_commit(checkout: Path) -> None:
    (checkout / "notes.txt").write_text("untracked: not the measured code\n")
    origin = provenance.provenance("bench", ["--sizes", "5000", "--label", "a b"])
    assert origin["commit"] == git(checkout, "rev-parse", "--short", "HEAD")
    assert origin["dirty"] is False
    assert origin["command"].endswith("-m bench --sizes 5000 --label 'a b'")
    assert origin["machine"]["cpus"] == os.cpu_count()
    provenance.refuse_dirty(allow=False)  # nothing to refuse


def test_a_dirty_checkout_is_refused_unless_asked(checkout: Path) -> None:
    (checkout / "code.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match=r"uncommitted changes \(code.py\).*--allow-dirty"):
        provenance.refuse_dirty(allow=False)
    provenance.refuse_dirty(allow=True)
    origin = provenance.provenance("bench", [])
    assert origin["dirty"] is True
    assert origin["commit"].endswith("-dirty")


def test_steal_is_read_from_the_cpu_line_and_shared_over_the_cores() -> None:
    stat = "cpu  100 0 50 1000 5 0 2 300 0 0\ncpu0 50 0 25 500 2 0 1 150 0 0\n"
    ticks = os.sysconf("SC_CLK_TCK")
    assert provenance.steal_seconds(stat) == 300 / ticks
    assert provenance.steal_seconds("cpu  1 2 3 4\n") == 0.0, "no steal column"
    assert provenance.steal_seconds(None) >= 0.0  # this machine's own /proc/stat
    cores = os.cpu_count() or 1
    during = provenance.steal_during(10.0, 10.0 + 0.5 * cores, 10.0)
    assert during == {"steal_s": round(0.5 * cores, 2), "steal_pct": 5.0}
