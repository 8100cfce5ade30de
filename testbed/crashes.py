"""The ways a user's PyTorch trainer dies, made on the local cluster's real nodes, and what a
recovery from each must show (issue: real trainers, real failures): the crash matrix of
``e2e/test_crash_matrix.py`` and ``python -m bench.crash_matrix`` (``make bench-crashes``).

The gang is the PyTorch one (:mod:`testbed.torchgang`: ``torchrun`` with 2 workers on each of
the 2 real nodes, DDP over gloo, DCP checkpoints), in one of jobset-inplace's restart scopes
(``process``, ``prestart``: the process scope with the next epoch pre-started, ``pod``). Once
every rank is past step 40 (and the standby is held, with pre-start), one crash is made in
member 1 (an *early* crash as soon as every rank is past its first checkpoint, in the epoch's
first seconds, before a pre-started standby can be ready): a fault of the trainer's own
(:data:`testbed.frameworks` ``torch_dcp_trainer.py``: a segfault, SIGABRT as NCCL's watchdog
sends, an uncaught exception, a real cgroup OOM kill past a memory limit, one rank stuck while
the others wait in a collective), or a process SIGKILLed from the node (a worker as the OOM
killer picks it, a pre-started worker's stand-in, ``torchrun`` itself, the launcher, the
agent).

Processes are read from this host's ``/proc`` (the real nodes' containers run here): by the
container ID in each process's cgroup, so host pids tell old processes from new ones even
across a container restart. A recovery passes when:

* it happened once: one recovery in the GangState's history after the crash, and none more
  once every rank has trained 5 steps past the resume;
* every rank resumed at one step, the controller's ``resumeStep``;
* no process of the crashed epoch is left in any trainer container (``torchrun``, its
  workers and their stand-ins, its worker forker);

and its time is from the crash (the kill's set time, or the faulting rank's ``fault:`` line)
to every rank's first productive step after the resume (each from the container runtime's
timestamps)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.prestart import FORKER_NAME, STAND_IN_NAME
from testbed.controller import gang_state, member_pods
from testbed.demo import timed_log
from testbed.kube import Clients, create_jobset, delete_jobset, wait_for
from testbed.torchgang import (
    MEMBERS,
    RANKS,
    TRAINER,
    create_trainer_config_map,
    newest_steps,
    rank_resumes,
    standby_held,
    torch_jobset,
    with_prestart,
)

SCOPES = ("process", "prestart", "pod")
TRAINED_STEP = 40  # every rank past this step before the crash
EARLY_STEP = 10  # an early crash: every rank past this step (its first checkpoint) only
STEPS_AFTER = 5  # and this many steps past the resume before "once" is judged
RECOVERY_CAP_S = 240.0
CRASH_LEAD_S = 1.0  # a kill is set this far ahead (the pids are read first)
VICTIM = "1"  # the member crashed (job index)
FAULT_RANK = 3  # member 1's second worker (torchrun's ranks: node rank 1 has 2 and 3)
# The hang case's hang-timeout: room for the torch trainers' steps and DCP saves on a loaded
# 2-core node (shorter ones are shown with the demo trainer: e2e/test_hang_detection.py).
HANG_TIMEOUT = "10s"
OOM_LIMIT = "4Gi"  # the oom case's trainer memory limit (the gang's own use: ~2.5 GiB)


@dataclass(frozen=True)
class Crash:
    name: str
    what: str
    fault: str | None = None  # the trainer's own fault (torch_dcp_trainer.py), or
    kills: str | None = None  # the process SIGKILLed from the node
    scopes: tuple[str, ...] = SCOPES
    early: bool = False  # made before a pre-started standby is held (the epoch's first seconds)


CRASHES = (
    Crash("worker-sigkill", "a worker SIGKILLed (as the OOM killer kills)", kills="worker"),
    Crash(
        "stand-in-sigkill",
        "a pre-started worker's stand-in (the process torchrun started) SIGKILLed",
        kills="stand-in",
        scopes=("prestart",),
    ),
    Crash(
        "worker-sigkill-early",
        "a worker SIGKILLed in the epoch's first seconds, before the standby is ready",
        kills="worker",
        scopes=("prestart",),
        early=True,
    ),
    Crash("oom", "a worker allocates past its container's memory limit", fault="oom"),
    Crash("segv", "a segmentation fault in native code", fault="segv"),
    Crash("abort", "SIGABRT, as NCCL's watchdog ends a process", fault="abort"),
    Crash("exception", "an uncaught Python exception", fault="exception"),
    Crash("hang", "one rank stops; the others wait in their next collective", fault="hang"),
    Crash("torchrun-sigkill", "torchrun itself SIGKILLed", kills="torchrun"),
    Crash(
        "launcher-sigkill",
        "the launcher SIGKILLed (the trainer container's main process)",
        kills="launcher",
        scopes=("process", "prestart"),
    ),
    Crash("agent-sigkill", "the agent sidecar SIGKILLed", kills="agent"),
)
BY_NAME = {c.name: c for c in CRASHES}


def cases(crashes: tuple[Crash, ...] = CRASHES) -> list[tuple[str, str]]:
    """Every (scope, crash) that exists."""
    return [(scope, c.name) for c in crashes for scope in SCOPES if scope in c.scopes]


# --- the processes of a container, from this host ---------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int  # this host's
    ppid: int
    comm: str
    argv: tuple[str, ...]
    init: bool  # its container's first process (pid 1 there)


def container_id(pod: Any, container: str) -> str:
    """The runtime's ID of ``container`` of ``pod`` (a V1Pod), running now ('' if none)."""
    statuses = [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]
    for st in statuses:
        if st.name == container and st.container_id and st.state and st.state.running:
            return str(st.container_id).rpartition("//")[2]
    return ""


def processes(cid: str) -> dict[int, Proc]:
    """The live processes of container ``cid`` (by its ID in their cgroup), by host pid."""
    out: dict[int, Proc] = {}
    if not cid:
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        base = Path("/proc", entry)
        try:
            if cid not in (base / "cgroup").read_text():
                continue
            stat = (base / "stat").read_text()
            status = (base / "status").read_text()
            argv = (base / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] == "Z":
            continue
        nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
        out[int(entry)] = Proc(
            int(entry),
            int(fields[1]),
            stat.partition("(")[2].rpartition(")")[0],
            tuple(a.decode(errors="replace") for a in argv if a),
            nspid[-1:] == ["1"],
        )
    return out


def is_worker(p: Proc, procs: dict[int, Proc]) -> bool:
    """A trainer worker: a process running TRAINER that torchrun started, or (pre-start) one
    the worker forker forked (its command line is torchrun's); not the forker, not a stand-in."""
    if p.comm in (FORKER_NAME, STAND_IN_NAME) or not any(a.endswith(TRAINER) for a in p.argv):
        return False
    parent = procs.get(p.ppid)
    launched_by_torchrun = "torch.distributed.run" not in p.argv
    return launched_by_torchrun or (parent is not None and parent.comm == FORKER_NAME)


def epoch_tree(procs: dict[int, Proc]) -> set[int]:
    """The running epoch's torchrun and every process under it (not a held standby)."""
    running: set[int] = set()
    for w in procs.values():
        if not is_worker(w, procs):
            continue
        p = procs.get(w.ppid)  # up to the torchrun above: past a forker (a forked worker's)
        while p is not None and p.comm in (FORKER_NAME, STAND_IN_NAME):
            p = procs.get(p.ppid)
        if p is not None and "torch.distributed.run" in p.argv:
            running.add(p.pid)
    tree = set(running)
    while more := {p.pid for p in procs.values() if p.ppid in tree} - tree:
        tree |= more
    return tree


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def target(kind: str, trainer: dict[int, Proc], agent: dict[int, Proc]) -> int:
    """The host pid of the process a ``kills`` crash ends."""
    tree = epoch_tree(trainer)
    mine = {pid: trainer[pid] for pid in tree}
    if kind == "worker":
        pids = [p.pid for p in mine.values() if is_worker(p, trainer)]
    elif kind == "stand-in":
        pids = [p.pid for p in mine.values() if p.comm == STAND_IN_NAME]
    elif kind == "torchrun":
        pids = [p.pid for p in mine.values() if p.ppid not in tree]
    elif kind == "launcher":
        pids = [p.pid for p in trainer.values() if p.init]
    elif kind == "agent":
        pids = [p.pid for p in agent.values() if p.init]
    else:
        raise ValueError(f"no such process to kill: {kind!r}")
    if not pids:
        raise RuntimeError(f"no {kind} process found (trainer: {sorted(trainer)}, epoch {tree})")
    return min(pids)


# --- one case ---------------------------------------------------------------------------------


@dataclass
class CaseResult:
    scope: str
    crash: str
    first_step: float | None = None  # crash -> every rank's first productive step (s)
    milestones: dict[str, float | None] = field(default_factory=dict)  # per rank's latest
    resume_steps: dict[int, int] = field(default_factory=dict)
    gang_resume_step: int | None = None
    recoveries: int = 0  # recoveries in the GangState's history after the crash
    causes: dict[str, str] = field(default_factory=dict)
    standbys_held: int | None = None  # pre-start: members whose standby was held at the crash
    left: list[str] = field(default_factory=list)  # processes of the old epoch still there
    problems: list[str] = field(default_factory=list)  # why it failed (none: passed)

    @property
    def passed(self) -> bool:
        return not self.problems


def case_jobset(scope: str, crash: Crash, name: str, shared: Path, site: Path) -> dict[str, Any]:
    js = torch_jobset(shared, site, name=name)
    annotations = js["metadata"]["annotations"]
    if scope == "prestart":
        with_prestart(js)
    else:
        annotations[names.RESTART_SCOPE] = scope
    if crash.fault == "hang":
        annotations[names.HANG_TIMEOUT] = HANG_TIMEOUT
    if crash.fault == "oom":
        pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        trainer = next(c for c in pod["containers"] if c["name"] == "trainer")
        trainer["resources"]["limits"] = {"memory": OOM_LIMIT}
    return js


class CrashRunner:
    """Runs cases in ``namespace`` (prepared: the CRDs, the agents' role; a controller
    running), each in a JobSet of its own, deleted after."""

    def __init__(
        self,
        kube: Clients,
        namespace: str,
        kubeconfig: Path,
        site: Path,
        log: Callable[[str], None],
    ) -> None:
        self.kube, self.namespace, self.kubeconfig, self.site = kube, namespace, kubeconfig, site
        self.log = log
        create_trainer_config_map(kube, namespace)

    def logs(self, name: str) -> list[tuple[float, str]]:
        lines: list[tuple[float, str]] = []
        for pod in member_pods(self.kube, self.namespace, name).values():
            with contextlib.suppress(Exception):  # not started yet, or being replaced
                lines += timed_log(self.kubeconfig, self.namespace, pod.metadata.name, "trainer")
        return sorted(lines)

    def steps(self, name: str, after: float = 0.0) -> dict[int, int]:
        """Each rank's newest step logged after ``after``."""
        return newest_steps(self.logs(name), after)

    def pods(self, name: str) -> dict[str, Any]:
        return member_pods(self.kube, self.namespace, name, include_failed=False)

    def tree(self, name: str) -> dict[str, set[int]]:
        """Per member, the host pids of its running epoch's processes."""
        return {
            i: epoch_tree(processes(container_id(p, "trainer"))) for i, p in self.pods(name).items()
        }

    def run(self, scope: str, crash_name: str, name: str) -> CaseResult:
        crash = BY_NAME[crash_name]
        result = CaseResult(scope, crash_name)
        shared = Path(tempfile.mkdtemp(prefix=f"jsi-crash-{name}-"))
        shared.chmod(0o777)
        try:
            self._run(crash, name, shared, result)
        except (TimeoutError, AssertionError, RuntimeError) as e:
            result.problems.append(f"{type(e).__name__}: {e}")
        finally:
            self.delete(name)
            shutil.rmtree(shared, ignore_errors=True)
        return result

    def _run(self, crash: Crash, name: str, shared: Path, result: CaseResult) -> None:
        js = case_jobset(result.scope, crash, name, shared, self.site)
        create_jobset(self.kube, self.namespace, js)
        trained = EARLY_STEP if crash.early else TRAINED_STEP
        wait_for(
            f"{name}: every rank past step {trained}",
            lambda: len(s := self.steps(name)) == RANKS and min(s.values()) > trained,
            300,
            0.2 if crash.early else 1,
        )
        if result.scope == "prestart" and not crash.early:
            wait_for(f"{name}: the standby held", lambda: self.held(name), 300, 1)
        old = self.tree(name)
        if sorted(old) != sorted(str(i) for i in range(MEMBERS)) or not all(old.values()):
            raise RuntimeError(f"{name}: the running epoch's processes not found: {old}")
        crash_at = self.crash(crash, name, shared)
        self.log(f"{name}: {crash.what} at {crash_at:.3f}")
        if result.scope == "prestart":
            # a late crash waited for every standby; an early one (a worker: its container
            # and log stay) is checked from the log lines' times
            result.standbys_held = self.held_at(name, crash_at) if crash.early else MEMBERS
            if result.standbys_held and crash.early:
                raise RuntimeError(
                    f"{name}: {result.standbys_held} standby(s) already held at the crash: "
                    "not an early crash"
                )
        ranks = wait_for(
            f"{name}: every rank's first step after the resume",
            lambda: self.back(name, crash_at),
            RECOVERY_CAP_S,
            1,
        )
        resume = {rank: r.resume_step for rank, r in ranks.items() if r.resume_step is not None}
        result.resume_steps = resume
        firsts = [r.first_step for r in ranks.values() if r.first_step is not None]
        result.first_step = round(max(firsts) - crash_at, 3)
        for m in ("started", "imported", "group_ready", "built", "restored"):
            times = [getattr(r, m) for r in ranks.values()]
            result.milestones[m] = None if None in times else round(max(times) - crash_at, 3)
        target_step = max(resume.values()) + STEPS_AFTER
        wait_for(
            f"{name}: every rank {STEPS_AFTER} steps past the resume",
            lambda: (
                len(s := self.steps(name, crash_at)) == RANKS and min(s.values()) >= target_step
            ),
            120,
            1,
        )
        st = gang_state(self.kube, self.namespace, name)
        history = [h for h in st.get("history") or [] if h.get("epoch", 0) > 1]
        result.recoveries = len(history)
        result.causes = dict((st.get("recovery") or {}).get("causes") or {})
        result.gang_resume_step = st.get("resumeStep")
        still = {i: sorted(p for p in pids if alive(p)) for i, pids in old.items()}
        result.left = [f"member {i}: {pids}" for i, pids in still.items() if pids]
        if result.recoveries != 1:
            result.problems.append(f"{result.recoveries} recoveries after the crash, not 1")
        if len(resume) != RANKS or len(set(resume.values())) != 1:
            result.problems.append(f"ranks resumed at {resume}")
        elif set(resume.values()) != {result.gang_resume_step}:
            result.problems.append(
                f"resumed at {resume}, the gang's step {result.gang_resume_step}"
            )
        if result.left:
            result.problems.append(f"old processes left: {result.left}")

    def held(self, name: str) -> bool:
        pods = self.pods(name).values()
        logs = [
            timed_log(self.kubeconfig, self.namespace, p.metadata.name, "trainer") for p in pods
        ]
        return len(logs) == MEMBERS and all(
            standby_held("\n".join(line for _, line in lines)) for lines in logs
        )

    def held_at(self, name: str, when: float) -> int:
        """How many members' standbys for the next epoch were held at ``when`` (wall time),
        from the times of their trainer containers' log lines."""
        held = 0
        for pod in self.pods(name).values():
            lines = timed_log(self.kubeconfig, self.namespace, pod.metadata.name, "trainer")
            held += standby_held("\n".join(line for t, line in lines if t <= when))
        return held

    def crash(self, crash: Crash, name: str, shared: Path) -> float:
        """Make ``crash`` in member VICTIM; when it happened (wall time)."""
        if crash.fault is not None:
            began = time.time()
            tmp = shared / f".fault-rank-{FAULT_RANK}"
            tmp.write_text(crash.fault)
            tmp.replace(shared / f"fault-rank-{FAULT_RANK}")
            line = f"[rank {FAULT_RANK}] fault: {crash.fault}"
            return wait_for(
                f"{name}: rank {FAULT_RANK}'s fault",
                lambda: next((t for t, ln in self.logs(name) if t > began and line in ln), None),
                30,
                0.2,
            )
        pod = self.pods(name)[VICTIM]
        trainer = processes(container_id(pod, "trainer"))
        agent = processes(container_id(pod, AGENT_CONTAINER))
        assert crash.kills is not None
        pid = target(crash.kills, trainer, agent)
        at = time.time() + CRASH_LEAD_S
        time.sleep(max(0.0, at - time.time()))
        os.kill(pid, signal.SIGKILL)
        return at

    def back(self, name: str, crash_at: float) -> dict[int, Any] | None:
        if len(self.pods(name)) != MEMBERS:
            return None
        ranks = rank_resumes(self.logs(name), crash_at)
        done = len(ranks) == RANKS and all(r.first_step is not None for r in ranks.values())
        return ranks if done else None

    def delete(self, name: str) -> None:
        delete_jobset(self.kube, self.namespace, name, 180)
