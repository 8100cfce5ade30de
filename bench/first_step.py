"""Crash -> every rank's first productive step again, on a real PyTorch trainer, side by side.

    python -m bench.realnode --trainer torch --reps 5      (make bench-realnode BENCH_ARGS=...)
    python -m bench.realnode --trainer torch --model transformer --reps 10

The gang is the PyTorch one of the e2e suite (testbed/torchgang.py): 2 members on the 2 real
nodes, each ``torchrun``, DDP over gloo, DCP checkpoints in one shared directory that survives
every path (a persistent tier: stock JobSet too resumes from the newest complete step, not
from step 0), PyTorch's CUDA build imported from a host-mounted site. ``--model``: ``linear``
(the tests' 8 parameters, 2 workers a pod: 4 ranks, past step 40 before the crash) or
``transformer`` (110 M parameters, AdamW, 1.3 GB checkpoints every 5 steps, 1 worker a pod:
2 ranks, past step 12), testbed.torchgang's ``MODELS``. For each path of
:mod:`bench.realnode` (same JobSet otherwise), and ``jsi-prestart`` (the process scope with
``prestart-imports``: the next epoch's ``torchrun`` started and PyTorch imported beside the
running epoch, its workers forked from it) and ``torchrun-restarts`` (no jobset-inplace, stock
JobSet: torchrun's own recovery, ``--max-restarts`` over its c10d rendezvous, every torchrun
restarting all its local workers in place on any worker's failure: the natural peer of the
process scope), once every rank is trained that far (and, for ``jsi-prestart``, its standby is
ready, as it is for a failure long into training): one worker process of member 1 is
SIGKILLed at a set time, and every milestone is read from the components' own timestamps (the
container runtime's time of each log line; the controller's status for jobset-inplace):

* ``detected`` (jobset-inplace: the recovery's start in its status), ``stopped`` (process
  scope: the launchers' "stopped"), ``barrier`` (as :mod:`bench.realnode` reads it);
* per rank, of the run that resumed: ``process started`` (the trainer's first line, before its
  imports), ``imported torch``, ``process group ready``, ``model built`` (model, DDP and
  optimizer), ``resumed at step S`` (its DCP load done), and its first step after the resume
  (``step S+1``: training is productive again).

A milestone is the latest rank's (the gang is productive when its last rank is), in seconds
after the crash. Each rank's resume step is checked against the others' (and jobset-inplace's
``resumeStep``); steps lost = the newest step any rank had logged before the crash minus the
resume step (work done again). Each path's ratio to ``jsi-prestart`` comes with a 95 %
interval (:mod:`bench.stats`).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import upstream
from bench.stats import Ratio, median_interval, ratio_of_medians
from jobset_inplace import names
from jobset_inplace.times import parse_time
from jobset_inplace.trainer.standby import LOADED_AGAIN
from testbed import images
from testbed.controller import gang_state
from testbed.demo import timed_log
from testbed.kube import create_jobset, wait_for
from testbed.torchgang import (
    LINEAR,
    MEMBERS,
    LogFollower,
    Model,
    RankResume,
    create_trainer_config_map,
    kill_worker,
    last_step_before,
    newest_steps,
    rank_resumes,
    released_pid,
    standby_held,
    torch_jobset,
    warm_held,
    with_prestart,
    with_warm,
    worker_pids,
)

if TYPE_CHECKING:
    from bench.realnode import Bench

# bench.realnode's paths, and jobset-inplace's process scope with its trainers pre-started
PATHS = (
    "jsi-process",
    "jsi-prestart",
    "jsi-warm",
    "jsi-pod",
    "upstream-sidecar",
    "upstream-main",
    "torchrun-restarts",
    "stock",
    "stock-grace0",
)
TORCHRUN_RESTARTS = 100  # torchrun-restarts: its --max-restarts (never the limit here)
CRASH_LEAD_S = 2.0  # the kill is set this far ahead (a kubectl exec takes ~0.3 s here)
RECOVERY_CAP_S = 240.0
# The milestones, in the order a recovery reaches them.
MILESTONES = (
    "detected",
    "stopped",
    "barrier",
    "started",
    "imported",
    "group_ready",
    "built",
    "restored",
    "first_step",
)


@dataclass
class Recovery:
    path: str
    rep: int
    # seconds after the crash, by milestone (None: the path has no such milestone)
    milestones: dict[str, float | None]
    resume_steps: dict[int, int]  # rank -> the step it resumed from
    gang_resume_step: int | None  # jobset-inplace's resumeStep (None: other paths)
    consistent: bool  # every rank resumed from one step (and the controller's, if any)
    last_step: int  # the newest step logged before the crash
    steps_lost: int  # last_step - the resume step (the lowest, if inconsistent)
    writes: dict[str, int] = field(default_factory=dict)
    # jsi-warm: how many ranks' standbys loaded again at the word (the step they held was not
    # the gang's); None: other paths
    warm_reloads: int | None = None


def torch_path_jobset(
    path: str, name: str, shared: Path, site: Path, model: Model = LINEAR
) -> dict[str, Any]:
    """The PyTorch gang as ``path`` runs it (the same trainer, model, gang and checkpoints)."""
    restarts = TORCHRUN_RESTARTS if path == "torchrun-restarts" else 0
    js = torch_jobset(shared, site, name=name, max_restarts=restarts, model=model)
    annotations = js["metadata"]["annotations"]
    if path == "jsi-prestart":
        return with_prestart(js)
    if path == "jsi-warm":
        if model.workers != 1:
            raise ValueError(f"jsi-warm runs one worker a pod, not {model.name}'s {model.workers}")
        return with_warm(js, name)
    if path.startswith("jsi-"):
        annotations[names.RESTART_SCOPE] = path.removeprefix("jsi-")
        return js
    js["metadata"]["annotations"] = {}
    js["spec"]["failurePolicy"] = {"maxRestarts": 1000}
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = job["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 0 if path == "stock-grace0" else 2
    if path.startswith("upstream-"):
        return upstream.in_place_restart(
            js,
            path.removeprefix("upstream-"),
            image=images.UPSTREAM_AGENT_IMAGE,
            agent_path=images.UPSTREAM_AGENT_PATH,
        )
    job["backoffLimit"] = 0  # stock: a failed pod fails its Job, JobSet recreates the gang
    return js


class TorchBench:
    """One recovery per call on the PyTorch gang training ``model``, with ``bench``'s cluster,
    clients and helpers."""

    def __init__(
        self, bench: Bench, namespace: str, kubectl: list[str], model: Model = LINEAR
    ) -> None:
        self.bench = bench
        self.model = model
        self.namespace = namespace
        self.kubectl = kubectl
        self.site = images.torch_site()
        create_trainer_config_map(bench.kube, namespace)

    def logs(self, name: str) -> list[tuple[float, str]]:
        lines: list[tuple[float, str]] = []
        for pod in self.bench.pods(name):
            try:
                lines += timed_log(
                    self.bench.kubeconfig, self.namespace, pod.metadata.name, "trainer"
                )
            except subprocess.CalledProcessError:  # not started yet, or being replaced
                continue
        return sorted(lines)

    def trained(self, name: str) -> bool:
        steps = newest_steps(self.logs(name))
        return len(steps) == self.model.ranks and min(steps.values()) > self.model.trained_step

    def trainer_log(self, pod: str) -> str:
        lines = timed_log(self.bench.kubeconfig, self.namespace, pod, "trainer")
        return "\n".join(line for _, line in lines)

    def held(self, name: str, warm: bool = False) -> bool:
        """Every pod's standby for the next epoch has done its imports and waits (``warm``:
        holds a checkpoint step)."""
        logs = [self.trainer_log(p.metadata.name) for p in self.bench.pods(name)]
        ready = warm_held if warm else standby_held
        return len(logs) == MEMBERS and all(ready(text) for text in logs)

    def back(self, name: str, crash: float) -> dict[int, RankResume] | None:
        if len(self.bench.pods(name)) != MEMBERS:
            return None
        ranks = rank_resumes(self.logs(name), crash)
        done = len(ranks) == self.model.ranks and all(
            r.first_step is not None for r in ranks.values()
        )
        return ranks if done else None

    def run(self, path: str, rep: int) -> Recovery:
        name = f"{path}-{rep}"
        shared = Path(tempfile.mkdtemp(prefix=f"jsi-bench-torch-{name}-"))
        shared.chmod(0o777)
        try:
            create_jobset(
                self.bench.kube,
                self.namespace,
                torch_path_jobset(path, name, shared, self.site, self.model),
            )
            wait_for(
                f"{name}: every rank past step {self.model.trained_step}",
                lambda: self.trained(name),
                300,
                1,
            )
            if path in ("jsi-prestart", "jsi-warm"):  # a failure long into training:
                warm = path == "jsi-warm"  # the standby is ready
                wait_for(
                    f"{name}: the next epoch's standby held",
                    lambda: self.held(name, warm=warm),
                    300,
                    1,
                )
            pods = {
                p.metadata.labels[names.JOB_INDEX_LABEL]: p.metadata.name
                for p in self.bench.pods(name)
            }
            victim = pods["1"]
            pid = min(worker_pids(self.kubectl, victim))
            if path == "jsi-warm":  # the standby runs the trainer's command line too
                released = released_pid(self.trainer_log(victim))
                if released is None:
                    raise RuntimeError(f"{victim}: no trainer released by the launcher")
                pid = released
            followers = [LogFollower(self.kubectl, pod, "trainer") for pod in pods.values()]
            crash = time.time() + CRASH_LEAD_S
            before = self.bench.writes()
            kill_worker(self.kubectl, victim, pid, at=crash)
            ranks = wait_for(
                f"{name}: every rank's first step after the resume",
                lambda: self.back(name, crash),
                RECOVERY_CAP_S,
                1,
            )
            writes = self.bench.writes() - before
            old = [line for f in followers for line in f.stop()]
            return self.recovery(
                path, rep, name=name, crash=crash, ranks=ranks, old=old, writes=dict(writes)
            )
        finally:
            self.bench.delete(name)
            shutil.rmtree(shared, ignore_errors=True)

    def recovery(
        self,
        path: str,
        rep: int,
        *,
        name: str,
        crash: float,
        ranks: dict[int, RankResume],
        old: list[tuple[float, str]],
        writes: dict[str, int],
    ) -> Recovery:
        at: dict[str, float | None] = {m: None for m in MILESTONES}
        gang_step: int | None = None
        if path.startswith("jsi-"):
            st = gang_state(self.bench.kube, self.namespace, name)
            rec = st.get("recovery") or {}
            at["detected"] = parse_time(rec.get("startedAt"))
            gang_step = st.get("resumeStep")
            if path in ("jsi-process", "jsi-prestart", "jsi-warm"):
                stopped = [
                    t for t, line in self.logs(name) if t > crash and "launcher: stopped" in line
                ]
                at["stopped"] = max(stopped, default=None)
        at["barrier"] = self.bench.barrier(path, name, crash)
        for m in ("started", "imported", "group_ready", "built", "restored", "first_step"):
            times = [getattr(r, m) for r in ranks.values()]
            at[m] = max(times) if None not in times else None
        steps = {rank: r.resume_step for rank, r in ranks.items() if r.resume_step is not None}
        agreed = set(steps.values())
        consistent = len(steps) == self.model.ranks and len(agreed) == 1
        if gang_step is not None:
            consistent = consistent and agreed == {gang_step}
        last = last_step_before(old, crash)
        if last is None:
            raise RuntimeError(f"{name}: no step logged before the crash")
        reloads = None
        if path == "jsi-warm":
            reloads = sum(t > crash and LOADED_AGAIN in line for t, line in self.logs(name))
        return Recovery(
            path,
            rep,
            {m: None if t is None else round(t - crash, 3) for m, t in at.items()},
            steps,
            gang_step,
            consistent,
            last,
            last - min(agreed, default=0),
            writes,
            reloads,
        )


# --- the summary -----------------------------------------------------------------------------


# each path's ratio: this path's first productive step to it (the first of them in the run)
RATIO_BASES = ("jsi-warm", "jsi-prestart")


def summary(runs: list[Recovery], paths: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per path: the median of every milestone, the range of the first productive step, the
    median steps lost, whether every recovery resumed consistently, and the ratio base's
    (:func:`ratio_base`) median first productive step to this path's with its 95 % interval
    (:mod:`bench.stats`; None: fewer than 2 of either)."""
    out: dict[str, dict[str, Any]] = {}
    firsts = {
        path: [t for r in runs if r.path == path and (t := r.milestones["first_step"]) is not None]
        for path in paths
    }
    base_path = ratio_base({r.path for r in runs})
    base = firsts.get(base_path, [])
    for path in paths:
        mine = [r for r in runs if r.path == path]
        if not mine:
            continue
        med: dict[str, float | None] = {}
        spread: dict[str, list[float]] = {}  # each milestone's median's 95 % interval
        for m in MILESTONES:
            values = [t for r in mine if (t := r.milestones.get(m)) is not None]
            med[m] = round(statistics.median(values), 3) if values else None
            if len(values) > 1:
                spread[m] = [round(v, 3) for v in median_interval(values)]
        lost = [float(r.steps_lost) for r in mine]
        first = firsts[path]
        ratio = None
        if path != base_path and len(first) >= 2 and len(base) >= 2:
            ratio = ratio_of_medians(base, first).as_dict()
        out[path] = {
            "reps": len(mine),
            "median": med,
            "intervals": spread,
            "first_step_min": min(first, default=None),
            "first_step_max": max(first, default=None),
            "steps_lost_median": statistics.median(r.steps_lost for r in mine),
            "steps_lost_max": max(r.steps_lost for r in mine),
            "steps_lost_interval": list(median_interval(lost)) if len(lost) > 1 else None,
            "consistent": all(r.consistent for r in mine),
            "writes_median": statistics.median(sum(r.writes.values()) for r in mine),
            "prestart_ratio": ratio,  # (the ratio base's to this path's)
            "ratio_base": base_path,
            "first_steps": first,  # each repetition's (the other ratios' intervals)
            # jsi-warm: repetitions in which a standby loaded again at the word
            "warm_reloaded": sum(bool(r.warm_reloads) for r in mine)
            if path == "jsi-warm"
            else None,
        }
    return out


def ratio_base(paths: set[str]) -> str:
    """The path every other path's ratio is to: the first of RATIO_BASES run."""
    return next((p for p in RATIO_BASES if p in paths), RATIO_BASES[-1])


def table(s: dict[str, dict[str, Any]]) -> str:
    """Markdown: each milestone's median (seconds after the crash; "-": the path has none, or
    the run predates it), the first productive step with its range, its ratio to
    jobset-inplace's process scope and to upstream's main-container mode, the ratio base's to
    it with an interval, steps lost."""
    base_path = ratio_base(set(s))

    def ratio(path: str, v: float, mine: list[float]) -> str:
        """``v`` (a path's median) over ``path``'s, with the 95 % interval where both paths
        have 2 or more repetitions."""
        base = s.get(path, {}).get("median", {}).get("first_step")
        if not base:
            return "-"
        theirs = s[path].get("first_steps") or []
        if len(mine) < 2 or len(theirs) < 2 or mine is theirs:
            return f"{v / base:.2f}x"
        r = ratio_of_medians(mine, theirs)
        return f"{r.ratio:.2f}x ({r.low:.2f}-{r.high:.2f})"

    def interval(v: dict[str, Any]) -> str:
        r = v.get("prestart_ratio")
        return "-" if r is None else Ratio(**r).text()

    head = [
        "| path | n | detected | stopped | barrier | process started | imported torch "
        "| process group | model built | restored "
        "| **first productive step** (95 % interval; range) "
        f"| / jsi-process (95 % interval) | / upstream-main (95 % interval) | {base_path} / path "
        "| steps lost (median (95 % interval), max) "
        "| one resume step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for path, v in s.items():
        med, spread = v["median"], v.get("intervals") or {}
        cells = [_milestone(med.get(m), spread.get(m)) for m in MILESTONES[:-1]]
        first, mine = med["first_step"], v.get("first_steps") or []
        if first is None:
            continue  # (every recovery waits for it: not reached in none)
        lo_hi = median_interval(mine) if len(mine) > 1 else None
        within = f"95 % {lo_hi[0]:.2f}-{lo_hi[1]:.2f}; " if lo_hi else ""
        lost = v.get("steps_lost_interval")
        lost_within = f" ({lost[0]:g}-{lost[1]:g})" if lost else ""
        rows.append(
            f"| {path} | {v['reps']} | {' | '.join(cells)} | **{first:.2f}** ({within}range "
            f"{v['first_step_min']:.2f}-{v['first_step_max']:.2f}) "
            f"| {ratio('jsi-process', first, mine)} | "
            f"{ratio('upstream-main', first, mine)} | {interval(v)} | {v['steps_lost_median']:g}"
            f"{lost_within}, {v['steps_lost_max']} | {'yes' if v['consistent'] else '**no**'} |"
        )
    return "\n".join(
        head
        + rows
        + [
            "",
            "(seconds after the crash: medians over the n repetitions, each with its 95 % "
            "bootstrap interval)",
        ]
    )


def _milestone(median: float | None, interval: list[float] | None) -> str:
    """``1.65 (1.60-1.72)``; ``-`` where the path has none."""
    if median is None:
        return "-"
    return f"{median:.2f}" + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")
