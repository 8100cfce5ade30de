"""Where a result file's figures come from (docs/benchmarks.md, "Method"): the commit and
whether the tree had uncommitted changes, the command line, the machine, and the CPU time the
hypervisor took from it (steal) while the benchmark ran. Every benchmark that writes a results
file records :func:`provenance` in it and refuses a dirty tree unless told otherwise
(:func:`refuse_dirty`): a figure must be traceable to the code that produced it."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")
ALLOW_DIRTY_HELP = "measure a checkout with uncommitted changes (the results say so)"
# A result file's ``kubernetes`` where the bench ran on testbed.controlplane alone.
CONTROL_PLANE = "the integration control plane (kube-apiserver and etcd only)"


def _git(*args: str) -> str:
    run = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    return run.stdout.rstrip("\n") if run.returncode == 0 else ""  # (status lines begin with " ")


def dirty() -> bool:
    """Uncommitted changes to tracked files (untracked files are not the measured code)."""
    return bool(_git("status", "--porcelain", "--untracked-files=no"))


def source_commit() -> str:
    """The checkout's commit for a results file (short hash; ``-dirty`` with uncommitted
    changes to tracked files; ``unknown`` outside a git checkout)."""
    return (_git("rev-parse", "--short", "HEAD") or "unknown") + "-dirty" * dirty()


def in_history(commit: str, repo: Path | None = None) -> bool:
    """``commit`` (a hash, short or not) is a commit of this checkout's history: HEAD or one
    of its ancestors. A shallow clone (CI's may be one) cannot tell for a commit older than
    its depth: there only a hash that is present and no ancestor is refused."""
    if not commit or commit.startswith("-"):
        return False

    def git(*args: str) -> bool:
        run = subprocess.run(["git", *args], capture_output=True, check=False, cwd=repo)
        return run.returncode == 0

    if git("merge-base", "--is-ancestor", f"{commit}^{{commit}}", "HEAD"):
        return True
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo,
    ).stdout.strip()
    return shallow == "true" and not git("cat-file", "-e", f"{commit}^{{commit}}")


def refuse_dirty(allow: bool) -> None:
    """Stop before measuring a checkout with uncommitted changes, unless ``allow``."""
    if not allow and dirty():
        changed = _git("status", "--short", "--untracked-files=no").splitlines()
        shown = ", ".join(line[3:] for line in changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise SystemExit(
            f"uncommitted changes ({shown}): commit them, or pass --allow-dirty to measure "
            "them anyway (the results then name the commit with -dirty)"
        )


def steal_seconds(stat: str | None = None) -> float:
    """CPU time stolen by the hypervisor since boot, all CPUs (``/proc/stat``'s ``cpu`` line,
    8th value, in USER_HZ ticks); 0 where it is not reported."""
    text = stat if stat is not None else PROC_STAT.read_text() if PROC_STAT.exists() else ""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = int(fields[8]) if len(fields) > 8 else 0
            return ticks / os.sysconf("SC_CLK_TCK")
    return 0.0


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def provenance(module: str, argv: list[str]) -> dict[str, Any]:
    """What a results file records of its origin (``argv``: the module's arguments)."""
    return {
        "commit": source_commit(),
        "dirty": dirty(),
        "command": shlex.join([Path(sys.executable).name, "-m", module, *argv]),
        "machine": machine(),
    }


def when() -> str:
    """Now, UTC, to the second: a result file's ``when``."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write(result: dict[str, Any], out: str | None) -> None:
    """Write ``result`` (with its :func:`provenance`) to ``out`` as JSON; no file: nothing."""
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


@dataclass(frozen=True)
class Run:
    """A measuring run's start: what it measures (``origin``: :func:`provenance`, read before
    anything can change the tree), when it began (``time.time()``) and the steal then."""

    origin: dict[str, Any]
    started: float
    steal_at_start: float

    def steal(self, wall_s: float | None = None) -> dict[str, float]:
        """The steal since the start (:func:`steal_during`) over ``wall_s`` (default: the
        time since the start)."""
        wall = time.time() - self.started if wall_s is None else wall_s
        return steal_during(self.steal_at_start, steal_seconds(), wall)


def begin(module: str, argv: list[str], allow_dirty: bool) -> Run:
    """Start a measuring run of ``module``: refuse uncommitted changes (unless
    ``allow_dirty``), then record its origin and start."""
    refuse_dirty(allow_dirty)
    return Run(provenance(module, argv), time.time(), steal_seconds())


def steal_during(started_s: float, ended_s: float, wall_s: float) -> dict[str, float]:
    """The steal between two :func:`steal_seconds` readings over ``wall_s`` seconds: seconds,
    and the share of the machine's CPU time (all cores) it was."""
    stolen = max(0.0, ended_s - started_s)
    cores = os.cpu_count() or 1
    share = stolen / (wall_s * cores) if wall_s > 0 else 0.0
    return {"steal_s": round(stolen, 2), "steal_pct": round(100 * share, 2)}
