"""The benchmark's scenarios on the local cluster: a gang of N kwok members (one pod per kwok
node), recovered by jobset-inplace (with the simulated agent fleet), by JobSet's own
InPlaceRestart (with a simulated fleet of its agents) and by stock JobSet, in the same run.
Every figure is wall-clock time measured here, from the moment the failure was injected (the
simulated kubelet's or agent's write, or the node's heartbeat stopping, was accepted by the
apiserver)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.controller.metrics import PREFIX as METRICS_PREFIX
from jobset_inplace.core.policy import (
    INPLACE_BUDGET_RANGE,
    RECREATE_BUDGET_RANGE,
    Policy,
    format_duration,
    parse_duration,
)
from jobset_inplace.core.transform import AgentSettings, transform
from jobset_inplace.times import format_time
from testbed import workloads
from testbed.controller import gang_state
from testbed.kube import Clients, create_jobset, wait_for
from testbed.kwoknodes import set_heartbeat

from . import upstream
from .fleet import FLEET_WORKERS, Fleet
from .podwatch import GangPods, Goal
from .profile import ApiserverProfile, PySpyProfile, summarise_stacks
from .remediation import NONE, REMEDIATED, NodeDeath, OutOfService, free_after_cap
from .upstream_fleet import UpstreamFleet

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
# kwok nodes offer 32 CPUs (kwokctl's node template): asking for 24 leaves room for one pod
# per node, as for a training worker that takes all of a node's accelerators.
WORKER_CPU = "24"
# The leader's samples per second in a sampled recovery (native frames: each pauses it).
LEADER_HZ = 250
MAX_BUDGET = INPLACE_BUDGET_RANGE[1]  # the largest inplace-budget the policy accepts
MAX_RECREATE = RECREATE_BUDGET_RANGE[1]  # and recreate-budget
FLEET_SA = "bench-fleet"
CONTROLLER = "jobset-inplace"  # the controller's key in a window's CPU by process
REPORT_FRONT = "jobset-inplace report front"  # a standby replica serving as report front
# the recovery paths: jobset-inplace, upstream InPlaceRestart (sidecar mode), stock Recreate,
# jobset-inplace with its agents' reports on member Leases instead of the report channel
# (bench/member_leases.py: the alternative the channel is measured against; not by default),
# jobset-inplace with hot spares (bench/spares.py; one pod per Job), and jobset-inplace in the
# pod scope whatever --scope says (hybrid-pod: both scopes in one run, hybrid in the process
# scope beside it)
PATHS = ("hybrid", "hybrid-pod", "upstream", "stock", "leases", "spares")
DEFAULT_PATHS = ("hybrid", "upstream", "stock")
# the ones with a simulated agent fleet
IN_PLACE_PATHS = ("hybrid", "hybrid-pod", "leases", "spares", "upstream")
JSI_PATHS = ("hybrid", "hybrid-pod", "leases", "spares")  # jobset-inplace's gangs
POD_SCOPE_PATH = "hybrid-pod"
# A node-death scenario's runs per path: jobset-inplace as it ships (it force-deletes the dead
# node's pod) and, like the others, waiting for a platform's out-of-service taint; the others
# without and with that remediation (without it their pod stays Terminating: reported so).
_JSI_DEATHS = (NodeDeath(NONE, "unreachable"), NodeDeath(REMEDIATED, "never"))
NODE_DEATHS = {
    "hybrid": _JSI_DEATHS,
    "hybrid-pod": _JSI_DEATHS,
    "leases": _JSI_DEATHS,
    "spares": _JSI_DEATHS[:1],  # as it ships: no platform's taint in its way
    "upstream": (NodeDeath(NONE), NodeDeath(REMEDIATED)),
    "stock": (NodeDeath(NONE), NodeDeath(REMEDIATED)),
}


def run_deaths(
    deaths: Sequence[NodeDeath], run: Callable[[NodeDeath], dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """``run`` each of ``deaths`` in order, but not one of a kind (the same remediation and
    ``force-delete``) that already did not recover within the cap: another would take the
    whole cap again for the same verdict. Returns the records and the labels of the deaths
    not run."""
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    capped: set[NodeDeath] = set()
    for death in deaths:
        if death in capped:
            skipped.append(death.label)
            log(f"node death ({death.label}) not repeated: the last did not recover in the cap")
            continue
        m = run(death)
        records.append(m)
        if m.get("capped"):
            capped.add(death)
    return records, skipped


def node_unhealthy_after(size: int, defaults: bool = False) -> str:
    """The gang's node-unhealthy-after. kwok's simulated heartbeats for 5000 nodes on 2 cores
    run late: while a 5000-pod gang was being created, node Leases went more than 70 s
    unrenewed (confirmed by fresh reads), which any Lease reader rightly calls dead nodes (the
    gang escalated after 5 replacements, with 15 s and with 60 s). Real kubelets renew on their
    own machines. So gangs above 2000 pods measure the worker-failure path only, with node
    detection out of the way; the node-death scenario runs at 1000 pods with the default.
    ``defaults``: the default at every size."""
    default = format_duration(Policy().node_unhealthy_after_s)
    return default if size <= 2000 or defaults else "1h"


def jsi_settings(size: int, scope: str, defaults: bool = False) -> dict[str, str]:
    """The annotations of the bench's jobset-inplace gangs of ``size`` pods besides its opt-in
    (and hot spares), each where it differs from the product's default, and why. With
    ``defaults`` only the restart scope (where not the default): then a gang must see no more
    failures than the default budgets allow (:func:`within_default_budgets`)."""
    out: dict[str, str] = {}
    if scope != names.DEFAULT_RESTART_SCOPE:
        out[names.RESTART_SCOPE] = scope  # the scope the simulated fleet models (bench/fleet.py)
    if defaults:
        return out
    return out | {
        # A barrier deadline for thousands of members on 2 shared cores (the default 5m
        # would recreate laggards of a slow-but-progressing recovery).
        names.BARRIER_TIMEOUT: "20m",
        # Every repetition one in-place recovery: the default budget (10) would escalate
        # the 11th to a restart of the whole gang (seen: 70 s at 500 pods, 146 s at 1000)
        names.INPLACE_BUDGET: str(MAX_BUDGET),
        # and every node death recreates a pod (a spare's swap too): the default (5)
        # would restart the whole JobSet at the 6th (seen: bench.spares, 2026-11-29)
        names.RECREATE_BUDGET: str(MAX_RECREATE),
        **(
            {}
            if parse_duration(names.NODE_UNHEALTHY_AFTER, node_unhealthy_after(size))
            == Policy().node_unhealthy_after_s
            else {names.NODE_UNHEALTHY_AFTER: node_unhealthy_after(size)}
        ),
    }


def within_default_budgets(failures: int, recreations: int) -> str | None:
    """Why a gang with the defaults cannot take ``failures`` in-place recoveries and
    ``recreations`` pod recreations as the bench counts them (None: it can)."""
    policy = Policy()
    if failures > policy.inplace_budget:
        return (
            f"{failures} in-place recoveries of one gang, more than the default inplace-budget "
            f"({policy.inplace_budget}): the next would escalate"
        )
    if recreations > policy.recreate_budget:
        return (
            f"{recreations} pod recreations in one gang, more than the default recreate-budget "
            f"({policy.recreate_budget})"
        )
    return None


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def status_mib(pid: int, key: str = "VmRSS") -> float:
    """A memory figure of /proc/<pid>/status (VmRSS, VmHWM: the peak), MiB; 0 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, every thread's ((0, 0) if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (0 if it is gone)."""
    return sum(cpu_split(pid))


def pin(pid: int, cpus: set[int]) -> int:
    """Every thread of process ``pid`` onto ``cpus`` (``taskset -a -p``; threads made later
    inherit their maker's): how many threads were pinned (0: the process is gone)."""
    pinned = 0
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            pinned += 1
        except OSError:  # (a thread that ended meanwhile)
            continue
    return pinned


# Processes whose CPU use is reported per measured window (the 2 cores are shared by all).
WATCHED_PROCESSES = {
    "kube-apiserver": "kube-apiserver",
    "etcd": "etcd",
    "kube-controller": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "kwok-controller": "kwok-controller",
    "jobset": "jobset",
    "kueue": "kueue",
}


def watched_pids() -> dict[str, int]:
    out: dict[str, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                continue
            for name, label in WATCHED_PROCESSES.items():
                if comm == name:
                    out[label] = int(d.name)
    return out


# Before the first measured recovery the cluster must be done with the gang's creation: at 5000
# pods the Job, JobSet and endpoint controllers still wrote for minutes after the last pod ran
# (2026-11-26: recoveries measured in that load took 3.6x as long as in a quiet cluster).
# Quiet: fewer than SETTLE_WRITES_PER_S apiserver writes per second over SETTLE_INTERVAL_S,
# the background aside (node Lease renewals, node status heartbeats, Events).
SETTLE_WRITES_PER_S = 1.0
SETTLE_INTERVAL_S = 10.0
SETTLE_TIMEOUT_S = 900.0
BACKGROUND = ("leases", "nodes/status", "events")
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def settling_writes(before: dict[str, float], after: dict[str, float], seconds: float) -> float:
    """Writes per second between two :func:`apiserver_requests` readings, the background
    aside: what the cluster still does about the gang."""
    writes = sum(
        count - before.get(key, 0.0)
        for key, count in after.items()
        if key.split(" ")[0] in WRITES and key.split(" ")[-1] not in BACKGROUND
    )
    return writes / seconds


_REQUESTS = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def apiserver_requests(metrics: str) -> dict[str, float]:
    """``apiserver_request_total`` from the apiserver's /metrics text, summed by verb and
    resource (``"PATCH pods/status"``)."""
    out: dict[str, float] = {}
    for labels_text, value in _REQUESTS.findall(metrics):
        labels = dict(_LABEL.findall(labels_text))
        sub = labels.get("subresource")
        key = f"{labels.get('verb')} {labels.get('resource')}{'/' + sub if sub else ''}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


def planning(metrics: str) -> tuple[float, float]:
    """(planning passes run, CPU seconds in plan()) from the controller's /metrics text."""
    passes = cpu = 0.0
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == f"{METRICS_PREFIX}passes_total":
                passes = sample.value
            elif sample.name == f"{METRICS_PREFIX}planning_cpu_seconds_sum":
                cpu = sample.value
    return passes, cpu


@dataclass
class ProcessMeter:
    """CPU seconds and peak RSS of the controller per measured window, and the CPU seconds of
    every other process on the machine's 2 cores that takes part (control plane, kwok, JobSet,
    Kueue, this benchmark with its simulated fleet)."""

    pid: int
    metrics: Callable[[], str] | None = None  # the apiserver's /metrics text
    # the controller's core of its own (None: every process shares every core): the controller
    # is pinned to it, every other process that takes part to the other cores, at each window
    leader_core: int | None = None
    controller_metrics: Callable[[], str] | None = None  # the controller's /metrics text
    front_pid: int | None = None  # a standby replica serving as report front (--front)

    def _stat(self) -> float:
        return cpu_seconds(self.pid)

    def rss_mib(self, key: str = "VmRSS") -> float:
        return status_mib(self.pid, key)

    def _procs(self) -> dict[str, int]:
        """The processes a window measures, looked up again per window: the JobSet controller
        restarts for the upstream path; the jobset-inplace controller is counted in every
        path's window (it watches every pod)."""
        front = {} if self.front_pid is None else {REPORT_FRONT: self.front_pid}
        return {
            **watched_pids(),
            CONTROLLER: self.pid,
            **front,
            "benchmark (fleet)": os.getpid(),
        }

    def pin(self, procs: Mapping[str, int]) -> None:
        """The controller onto its own core, the rest (the simulated fleet, the apiserver,
        etcd, ...) onto the others; looked up again per window (a restarted process)."""
        assert self.leader_core is not None
        rest = set(range(os.cpu_count() or 1)) - {self.leader_core}
        if not rest:
            raise ValueError(f"--leader-core {self.leader_core}: this machine has one core")
        for pid in procs.values():
            pin(pid, {self.leader_core} if pid == self.pid else rest)

    def share_cores(self) -> None:
        """With a leader core: every process back on every core until the next pinned window.
        A gang's set-up is made so: with the rest on one core, a 10,000-pod gang came at 2.6-4
        pods/s while about half of the machine's CPU was idle (2026-12-06)."""
        if self.leader_core is not None:
            every = set(range(os.cpu_count() or 1))
            for pid in self._procs().values():
                pin(pid, every)

    @contextmanager
    def window(self, out: dict[str, Any], *, own_core: bool = True) -> Iterator[None]:
        """Measure what happens in the block into ``out``; with a leader core, the controller
        on it and the rest on the other cores, unless ``own_core`` is False (as they were)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # reset the peak RSS (VmHWM)
        procs = self._procs()
        if self.leader_core is not None and own_core:
            self.pin(procs)
        out["leader_core_own"] = self.leader_core is not None and own_core
        requests0 = apiserver_requests(self.metrics()) if self.metrics else {}
        # (the controller's /metrics read before its CPU is: serving it is not the window's)
        passes0 = planning(self.controller_metrics()) if self.controller_metrics else None
        cpu0 = self._stat()
        split0 = cpu_split(self.pid)
        others0 = {k: cpu_seconds(p) for k, p in procs.items()}
        t0 = time.monotonic()
        try:
            yield
        finally:
            out["controller_cpu_s"] = round(self._stat() - cpu0, 3)
            user, system = (b - a for a, b in zip(split0, cpu_split(self.pid), strict=True))
            out["controller_cpu_user_s"], out["controller_cpu_system_s"] = (
                round(user, 3),
                round(system, 3),
            )
            out["controller_peak_rss_mib"] = round(self.rss_mib("VmHWM"), 1)
            if self.controller_metrics and passes0 is not None:
                passes, cpu = planning(self.controller_metrics())
                out["controller_passes"] = int(passes - passes0[0])
                out["controller_planning_cpu_s"] = round(cpu - passes0[1], 4)
            out["window_s"] = round(time.monotonic() - t0, 3)
            out["cpu_s_by_process"] = {
                k: round(cpu_seconds(p) - others0[k], 2) for k, p in procs.items()
            }
            if self.metrics:
                # every client's requests in the window (the metrics read itself included)
                requests = apiserver_requests(self.metrics())
                delta = {k: v - requests0.get(k, 0.0) for k, v in requests.items()}
                out["apiserver_requests"] = {
                    k: int(v) for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v
                }


@dataclass
class Bench:
    kube: Clients
    namespace: str
    server: str
    ca_file: Path
    token_file: Path
    meter: ProcessMeter
    restart_delay: float
    pods_per_job: int
    setup_timeout: float
    stock_cap: float
    node_cap: float
    kubectl: list[str] = field(default_factory=list)  # admin kubectl, for the apiserver profile
    # kube-apiserver CPU profile (seconds) over one extra recovery of each path, kept out of
    # the measured repetitions (profiling costs the apiserver CPU); 0: none
    profile_s: float = 0.0
    profile_paths: set[str] = field(default_factory=lambda: set(PATHS))
    profile_dir: Path = Path()
    kubelet_writes: bool = True  # False: the simulated kubelet writes the failed pod only
    scope: str = "process"  # the hybrid gangs' restart scope (what the fleet simulates)
    defaults: bool = False  # jobset-inplace's gangs with its defaults (see jsi_settings)
    fleet_workers: int = FLEET_WORKERS  # the simulated agents' and kubelets' thread pool
    channel: bool = True  # the hybrid fleet's agents report over the leader's channel
    hot_spares: int = 2  # the spares path's jobset-inplace.dev/hot-spares
    idle_s: float = 0.0  # an idle window of each in-place gang after it settled (0: none)
    # jobset-inplace's paths: this many more worker failures after the measured ones, the
    # leader sampled (native frames: paused per sample, so their times are not measurements)
    leader_profile_reps: int = 0
    # ... their Python frames only, the leader not paused (py-spy --nonblocking), py-spy on
    # the leader's core where it has one of its own
    leader_profile_python: bool = False
    results: dict[str, Any] = field(default_factory=dict)

    # --- gangs ----------------------------------------------------------------------------

    def _gang(self, name: str, size: int, path: str) -> dict[str, Any]:
        per_job = min(self.pods_per_job, size)
        if size % per_job:
            raise ValueError(f"gang size {size} is not a multiple of --pods-per-job {per_job}")
        spares: dict[str, str] = {}
        if path == "spares":
            if per_job != 1:
                raise ValueError(
                    f"the spares path needs --pods-per-job 1, got {per_job}: a hot spare "
                    "stands in for one member, a Job of one pod"
                )
            spares = {names.HOT_SPARES: str(self.hot_spares)}
        js = workloads.jobset(
            name,
            [("workers", size // per_job, per_job)],
            annotations={
                names.ENABLED: "true",
                **jsi_settings(size, self.scope_of(path), self.defaults),
                **spares,
            }
            if path in JSI_PATHS
            else {},
            node_selector=dict(workloads.KWOK_NODE_SELECTOR),
            pod=workloads.whole_node_trainer(WORKER_CPU),
        )
        for rj in js["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["backoffLimit"] = 0
        if path in JSI_PATHS:
            return transform(js, AgentSettings(image="agent:sim"))
        if path == "upstream":
            return upstream.in_place_restart(
                js, "sidecar", image="upstream-agent:sim", agent_path="/in-place-restart-agent"
            )
        # stock: any failed Job restarts the whole JobSet (every pod deleted and recreated)
        js["spec"]["failurePolicy"] = {"maxRestarts": 1000}
        return js

    def _any_pod(self, name: str) -> bool:
        """Whether any pod of gang ``name`` is left: a list of at most one (a full list of
        10,000 pods is about 95 MB of JSON for the apiserver to make)."""
        resp = self.kube.core.list_namespaced_pod(
            self.namespace,
            label_selector=f"{names.JOBSET_NAME_LABEL}={name}",
            limit=1,
            _preload_content=False,
        )
        return bool(json.loads(resp.data)["items"])

    def _create(self, name: str, size: int, path: str) -> float:
        """Create gang ``name`` and wait until its members (and spares) run, counted from one
        watch of its pods as their events arrive (:class:`.GangPods`): a list of every pod each
        second had cost the apiserver and this process seconds a poll at thousands of pods."""
        pods = size + self.spares(path)
        self.meter.share_cores()
        with GangPods(self.kube.core, self.namespace, name) as seen:
            seen.aim(Goal(pods))
            t0 = time.monotonic()
            create_jobset(self.kube, self.namespace, self._gang(name, size, path))
            while (met := seen.met(30.0)) is None:
                waited = time.monotonic() - t0
                if waited > self.setup_timeout:
                    raise TimeoutError(
                        f"{pods} pods of {name} running: {seen.counted()} after "
                        f"{self.setup_timeout:.0f}s"
                    )
                so_far = seen.counted()
                log(f"waiting for {pods} pods of {name} running ({waited:.0f}s, {so_far} so far)")
        took = met - t0
        log(f"{name}: {size} pods running {took:.1f}s after the JobSet was created")
        return took

    def scope_of(self, path: str) -> str:
        """The restart scope of ``path``'s jobset-inplace gang (and what its fleet simulates):
        the pod scope for ``hybrid-pod``, ``scope`` for the others."""
        return "pod" if path == POD_SCOPE_PATH else self.scope

    def spares(self, path: str) -> int:
        """The hot spares a gang of ``path`` has beside its members."""
        return self.hot_spares if path == "spares" else 0

    def _settle(self, name: str) -> float | None:
        """Wait until the cluster is quiet (SETTLE_WRITES_PER_S); how long that took (None:
        no apiserver metrics to tell)."""
        if self.meter.metrics is None:
            return None
        t0 = time.monotonic()
        before = apiserver_requests(self.meter.metrics())
        while True:
            time.sleep(SETTLE_INTERVAL_S)
            after = apiserver_requests(self.meter.metrics())
            rate = settling_writes(before, after, SETTLE_INTERVAL_S)
            took = time.monotonic() - t0
            if rate < SETTLE_WRITES_PER_S:
                log(f"{name}: cluster quiet after {took:.0f}s ({rate:.1f} writes/s)")
                return round(took, 1)
            if took > SETTLE_TIMEOUT_S:
                raise TimeoutError(f"{name}: still {rate:.1f} writes/s after {took:.0f}s")
            log(f"{name}: waiting for the cluster to settle ({rate:.1f} writes/s)")
            before = after

    def _wait(self, what: str, probe: Callable[[], Any], since: float) -> Any:
        """Poll ``probe`` (with progress lines) until truthy or the setup timeout."""
        last = 0.0
        while True:
            got = probe()
            if got:
                return got
            now = time.monotonic()
            if now - since > self.setup_timeout:
                raise TimeoutError(f"{what}: not after {self.setup_timeout:.0f}s")
            if now - last > 30:
                log(f"waiting for {what} ({now - since:.0f}s) ...")
                last = now
            time.sleep(1.0)

    def clean(self) -> None:
        """Delete JobSets a previous (interrupted) run left in the namespace."""
        for js in self.kube.custom.list_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSETS
        )["items"]:
            log(f"deleting {js['metadata']['name']} left by an earlier run")
            self._delete(js["metadata"]["name"])

    def _delete(self, name: str) -> None:
        or_none(
            self.kube.custom.delete_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSETS,
            name,
            body={"propagationPolicy": "Background"},
        )
        t0 = time.monotonic()
        self._wait(f"pods of {name} gone", lambda: not self._any_pod(name), t0)
        log(f"{name}: deleted, pods gone after {time.monotonic() - t0:.1f}s")

    def _fleet(self, path: str, name: str) -> Fleet:
        kind: Callable[..., Fleet]
        if path == "upstream":
            kind = UpstreamFleet
        elif path == "leases":
            kind = partial(Fleet, scope=self.scope, channel=False, leases=True)
        else:
            kind = partial(Fleet, scope=self.scope_of(path), channel=self.channel)
        fleet = kind(
            self.kube.api,
            server=self.server,
            token_file=self.token_file,
            ca_file=self.ca_file,
            namespace=self.namespace,
            gang=name,
            restart_delay=self.restart_delay,
            kubelet_writes=self.kubelet_writes,
            workers=self.fleet_workers,
        )
        fleet.start()
        return fleet

    # --- (a), (c) one worker fails, one node dies: the in-place paths ---------------------

    def in_place(
        self,
        path: str,
        size: int,
        reps: int,
        node_deaths: Sequence[NodeDeath] = (),
        *,
        profile: bool = True,
    ) -> dict[str, Any]:
        """``path``: hybrid (jobset-inplace), leases (the same, its reports on member Leases)
        or upstream (JobSet's InPlaceRestart; the JobSet controller must run with its gate
        on). After the worker failures, one node death per entry of ``node_deaths``."""
        name = f"{path}-{size}"
        out: dict[str, Any] = {"size": size, "worker_failure": [], "node_death": []}
        fleet = self._fleet(path, name)
        try:
            setup: dict[str, float] = {}
            with self.meter.window(setup, own_core=False):
                out["setup_s"] = self._create(name, size, path)
                t0 = time.monotonic()
                first = fleet.first_epoch
                self._wait(
                    f"barrier of epoch {first}",
                    lambda: _opened_all(fleet, first, size),
                    time.monotonic(),
                )
                out["first_barrier_s"] = round(time.monotonic() - t0, 2)
            out["setup_controller"] = setup
            out["settle_s"] = self._settle(name)
            if self.idle_s > 0:
                out["idle"] = self._idle(fleet)
            for rep in range(reps):
                out["worker_failure"].append(self._worker_failure(fleet, path, size, rep))
            if profile and self.profile_s > 0 and path in self.profile_paths:
                out["profiled"] = self._worker_failure(fleet, path, size, reps, profiled=True)
            if path in JSI_PATHS and self.leader_profile_reps > 0:
                out["leader_profiled"] = [
                    self._worker_failure(fleet, path, size, reps + 1 + k, leader_sampled=True)
                    for k in range(self.leader_profile_reps)
                ]
                files = [
                    self.profile_dir / m["leader_profile"]["file"]
                    for m in out["leader_profiled"]
                    if "file" in m["leader_profile"]
                ]
                out["leader_profile"] = {
                    "files": [f.name for f in files],
                    **summarise_stacks(files, top=40, waiting_out=True),
                }
            out["node_death"], out["node_deaths_not_run"] = run_deaths(
                node_deaths, lambda death: self._in_place_node_death(fleet, path, size, death)
            )
            out["fleet_requests"] = fleet.requests
            out["fleet_errors"] = fleet.errors[:20]
            out["heartbeats"] = dataclasses.asdict(fleet.heartbeats())
        finally:
            fleet.stop()
            self._delete(name)
        return out

    def _idle(self, fleet: Fleet) -> dict[str, Any]:
        """``idle_s`` seconds of a gang training undisturbed: what its agents' heartbeats (hot
        spares) cost the leader, the apiserver and the fleet that sends them."""
        m: dict[str, Any] = {"seconds": self.idle_s}
        spy = None
        if self.profile_s > 0:  # where the leader's CPU goes while it only hears heartbeats
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            out = self.profile_dir / f"controller-idle-{fleet.gang}.txt"
            spy = PySpyProfile(self.meter.pid, self.idle_s, out).start()
        before = fleet.heartbeats()
        with self.meter.window(m):
            time.sleep(self.idle_s)
        after = fleet.heartbeats()
        if spy is not None:
            m["controller_profile"] = spy.result(self.idle_s + 60)
        m["heartbeats"] = after.sent - before.sent
        m["heartbeats_late"] = after.late - before.late
        m["heartbeat_errors"] = after.errors - before.errors
        log(
            f"{fleet.gang}: idle {self.idle_s:.0f}s: leader {m['controller_cpu_s']:.2f} CPU-s, "
            f"{m['heartbeats']} heartbeats"
        )
        return m

    def _worker_failure(
        self,
        fleet: Fleet,
        path: str,
        size: int,
        rep: int,
        profiled: bool = False,
        *,
        leader_sampled: bool = False,
    ) -> dict[str, Any]:
        epoch = fleet.epoch()
        victim = random.choice(sorted(fleet.agents))
        m: dict[str, Any] = {"rep": rep, "victim": victim}
        before, reports_before = fleet.requests, fleet.channel_reports
        pool = fleet.pool_mark()
        spies: dict[str, PySpyProfile] = {}
        leader = None
        if leader_sampled:  # the failure to every member past the barrier, and no more
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            out = self.profile_dir / f"leader-{path}-{size}-{rep}.txt"
            python = self.leader_profile_python
            cpu = self.meter.leader_core if python else None  # (python: its core, see cpu)
            leader = PySpyProfile(
                self.meter.pid, 300, out, native=not python, rate=LEADER_HZ, cpu=cpu
            ).start()
            time.sleep(1.0)  # py-spy attached before the failure
        if profiled and self.profile_s > 0 and path in JSI_PATHS:  # Python's CPU: py-spy
            for who, pid in (("controller", self.meter.pid), ("fleet", os.getpid())):
                out = self.profile_dir / f"{who}-{path}-{size}.txt"
                spies[who] = PySpyProfile(pid, self.profile_s, out).start()
        profile = self._profile(f"{path}-{size}") if profiled else None
        with self.meter.window(m):
            t0 = fleet.crash_trainer(victim)
            _wait_recovered(fleet, epoch + 1, size, self.setup_timeout)
        if leader is not None:
            leader.stop()
            m["leader_profile"] = leader.result(60)
        m.update(_phases(fleet, epoch + 1, t0, fleet.restarts_on_path * self.restart_delay))
        if path in JSI_PATHS:
            self._in_place_only(fleet.gang, epoch + 1, f"{path} {size}: worker failure #{rep + 1}")
        if path == "upstream":  # the recovering controller is JobSet's (its RSS is not read)
            m["controller_cpu_s"] = m["cpu_s_by_process"].get("jobset", 0.0)
            del m["controller_peak_rss_mib"]
        if profile is not None:
            m["apiserver_profile"] = profile.result(self.profile_s + 60)
        for who, spy in spies.items():
            m[f"{who}_profile"] = spy.result(self.profile_s + 60)
        m["fleet_requests"] = fleet.requests - before
        m["fleet_channel_reports"] = fleet.channel_reports - reports_before
        m["fleet_pool"] = fleet.pool_since(pool)
        peak = m.get("controller_peak_rss_mib")
        rss = f", peak RSS {peak:.0f} MiB" if peak is not None else ""
        log(
            f"{path} {size}: worker failure #{rep + 1}{' (profiled)' * profiled}: "
            f"barrier open {m['barrier_open_s']:.2f}s "
            f"(detect {m['detection_s']:.2f}, restart+report {m['restart_s']:.2f}, "
            f"barrier {m['barrier_s']:.2f}), all running {m['all_running_s']:.2f}s; "
            f"recovering controller {m['controller_cpu_s']:.1f} CPU-s"
            f"{rss}; agents: "
            f"{m['fleet_requests']} API requests, {m['fleet_channel_reports']} channel reports; "
            f"{_pool_text(m['fleet_pool'])}"
        )
        time.sleep(2)  # let the last events settle before the next repetition
        return m

    def _in_place_node_death(
        self, fleet: Fleet, path: str, size: int, death: NodeDeath
    ) -> dict[str, Any]:
        name = fleet.gang
        if death.force_delete:
            self._annotate(name, {names.FORCE_DELETE: death.force_delete})
        epoch = fleet.epoch()
        # a member's node (a spare's death costs the training nothing)
        victim = random.choice(fleet.holders() if path in JSI_PATHS else sorted(fleet.agents))
        node = self.kube.core.read_namespaced_pod(victim, self.namespace).spec.node_name
        m: dict[str, Any] = {"victim": victim, "node": node, **_death_fields(death)}
        place = fleet.place(victim)
        beats, pool = fleet.heartbeats(), fleet.pool_mark()
        wanted = self.spares(path)
        # With hot spares the node stays dead until they stand by again: its replacement
        # (made within seconds of the swap, before the node is marked not ready) may be
        # bound to the dead node, and only the controller's replacement of a spare there
        # frees it, as on a cluster whose node stays down. (kwok would not start a pod bound
        # while the node was silenced once it is revived.)
        revive_at_once = not wanted
        with GangPods(self.kube.core, self.namespace, name) as pods:
            with self._remedy(death, node) as oos, self.meter.window(m):
                fleet.silence(victim)  # the node's agent with it
                set_heartbeat(self.kube, node, alive=False)
                t0 = time.monotonic()
                try:
                    ok = _poll(
                        lambda: _opened_all(fleet, epoch + 1, size),
                        t0,
                        self.node_cap,
                        progress=f"{path} {size}: gang past the barrier after node {node} died",
                    )
                    m["capped"] = not ok
                    if ok:
                        restarts = fleet.restarts_on_path * self.restart_delay
                        m.update(_phases(fleet, epoch + 1, t0, restarts))
                        m["running_s"] = m["all_running_s"]
                        if m["detection_s"] < 0:  # never a figure nor a ratio (bench.report)
                            m["invalid"] = (
                                f"its recovery was seen {-m['detection_s']:.1f} s before the "
                                "node died: the one before was still under way"
                            )
                    else:
                        m["running_s"] = round(time.monotonic() - t0, 2)
                    m["stuck_terminating"] = pods.terminating_on(node)
                    _remedied(m, oos, t0)
                finally:
                    if revive_at_once:
                        set_heartbeat(self.kube, node, alive=True)
            after = fleet.heartbeats()  # did the simulated agents keep beating on time?
            m["heartbeats_late"] = after.late - beats.late
            m["heartbeat_errors"] = after.errors - beats.errors
            m["fleet_pool"] = fleet.pool_since(pool)
            if place is not None:  # hot spares: the dead member's slot went to a spare?
                slot, position = place
                slots = gang_state(self.kube, self.namespace, name).get("slots") or {}
                m |= {"slot": slot, "position": position, "holder": slots.get(slot, slot)}
                m["swapped"] = m["holder"] != position
            if m["capped"] or wanted:
                # the gang must be past a barrier again, its spares standing by again, before
                # the next run
                def again() -> bool:
                    whole = _opened_all(fleet, fleet.epoch(), size)
                    if whole and fleet.spares_standing_by() >= wanted:
                        back.append(time.monotonic())
                        return True
                    return False

                what = f"{name} whole, past a barrier and {wanted} spares standing by again"
                back: list[float] = []
                try:
                    self._restore(pods, size + wanted, node, what, again)
                finally:
                    if not revive_at_once:
                        set_heartbeat(self.kube, node, alive=True)
                if wanted and back:  # the death to its spares standing by again
                    m["spares_back_s"] = round(back[0] - t0, 2)
        if death.force_delete:
            self._annotate(name, {names.FORCE_DELETE: None})
        log(
            f"{path} {size}: node {node} died ({death.label}): {_fmt(m, 'running_s')} "
            "to the gang running again"
        )
        return m

    def _in_place_only(self, name: str, epoch: int, what: str) -> None:
        """Stop the run if the recovery of ``epoch`` was not one in-place restart of the gang
        (an escalation, a recreated member): its time would be another path's."""
        history = gang_state(self.kube, self.namespace, name).get("history") or []
        rec = next((h for h in history if h.get("epoch") == epoch), None)
        if rec is None or rec.get("recreated") or not rec.get("inPlace"):
            raise RuntimeError(f"{what} was not one in-place recovery of the gang: {rec}")

    def _annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        self.kube.custom.patch_namespaced_custom_object(
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSETS,
            name,
            {"metadata": {"annotations": annotations}},
        )

    def _remedy(self, death: NodeDeath, node: str) -> AbstractContextManager[OutOfService | None]:
        if death.remediation == REMEDIATED:
            return OutOfService(self.kube, node)
        return nullcontext()

    def _restore(
        self,
        pods: GangPods,
        size: int,
        node: str,
        what: str,
        also: Callable[[], bool] = lambda: True,
    ) -> None:
        """After a capped node death (the node alive again): wait until every member runs in a
        pod not being deleted, none is Terminating on ``node`` and ``also()``, deleting the
        node's pods that stay Terminating (:func:`.remediation.free_after_cap`). Judged by the
        pods, not by ``also`` alone: a gang whose epoch never moved is past its barrier while
        its pod on the node stays Terminating (2026-11-28: upstream's gang then never recovered
        from the next node death)."""
        pods.aim(Goal(size))

        def whole() -> bool:
            if pods.met(0) is not None and not pods.terminating_on(node) and also():
                return True
            free_after_cap(self.kube, self.namespace, pods.terminating_on(node))
            return False

        wait_for(what, whole, self.node_cap, 1.0)
        # and quiet: a replaced member's pod may start one more restart of the gang (upstream's
        # did, 2026-11-28, and the next node death's window caught its end)
        self._settle(what)

    def _profile(self, what: str) -> ApiserverProfile | None:
        """Start a kube-apiserver CPU profile of the next ``profile_s`` seconds (the failure is
        injected once it runs)."""
        if self.profile_s <= 0:
            return None
        path = self.profile_dir / f"apiserver-{what}.pprof"
        profile = ApiserverProfile(self.kubectl, self.profile_s, path).start()
        time.sleep(0.5)  # the profile request reaches the apiserver before the failure
        return profile

    # --- (b), (c) the stock path ----------------------------------------------------------

    def stock(
        self, size: int, reps: int, node_deaths: Sequence[NodeDeath] = (), *, profile: bool = True
    ) -> dict[str, Any]:
        """Stock JobSet (any failed Job restarts the whole gang): its end, every member running
        in a pod of the next restart attempt, is the pod event that completes it (one watch)."""
        name = f"stock-{size}"
        out: dict[str, Any] = {"size": size, "worker_failure": [], "node_death": []}
        try:
            out["setup_s"] = self._create(name, size, "stock")
            with GangPods(self.kube.core, self.namespace, name) as pods:
                attempt = int(_stock_attempt(pods))
                # one more, profiled
                extra = int(profile and self.profile_s > 0 and "stock" in self.profile_paths)
                for rep in range(reps + extra):
                    m: dict[str, Any] = {"rep": rep}
                    victim = random.choice(sorted(n for n, p in pods.pods.items() if p.running))
                    m["victim"] = victim
                    attempt += 1
                    pods.aim(Goal(size, attempt=attempt))
                    prof = self._profile(f"stock-{size}") if rep == reps else None
                    with self.meter.window(m):
                        t0 = self._fail_pod(victim, pods.pods[victim].containers)
                        met = pods.met(self.stock_cap)
                    m["all_running_s"] = round((met or time.monotonic()) - t0, 2)
                    m["capped"] = met is None
                    m["controller_cpu_s"] = m["cpu_s_by_process"].get("jobset", 0.0)
                    del m["controller_peak_rss_mib"]
                    if prof is not None:
                        m["apiserver_profile"] = prof.result(self.profile_s + 60)
                    note = " (profiled)" if prof else ""
                    log(
                        f"stock {size}: worker failure #{rep + 1}{note}: {_fmt(m)} "
                        "to all pods running"
                    )
                    if prof:
                        out["profiled"] = m
                    else:
                        out["worker_failure"].append(m)
                    if met is None:
                        break  # a capped restart may still be under way: no next repetition
                    time.sleep(2)  # let the last events settle before the next repetition
                out["node_death"], out["node_deaths_not_run"] = run_deaths(
                    node_deaths, lambda death: self._stock_node_death(pods, size, death)
                )
            out["watch_errors"] = pods.errors[:20]
        finally:
            self._delete(name)
        return out

    def _fail_pod(self, pod: str, containers: Sequence[tuple[str, str]]) -> float:
        """What the kubelet reports when the trainer exits 3 under restartPolicy Never."""
        now = format_time(micro=False)
        statuses = [
            {
                "name": container,
                "image": image,
                "imageID": "sim",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 3, "reason": "Error", "finishedAt": now}},
            }
            for container, image in containers
        ]
        self.kube.core.patch_namespaced_pod_status(
            pod, self.namespace, {"status": {"phase": "Failed", "containerStatuses": statuses}}
        )
        return time.monotonic()

    def _stock_node_death(self, pods: GangPods, size: int, death: NodeDeath) -> dict[str, Any]:
        victim = random.choice(sorted(n for n, p in pods.pods.items() if p.running))
        node = pods.pods[victim].node
        m: dict[str, Any] = {"victim": victim, "node": node, **_death_fields(death)}
        pods.aim(Goal(size, avoid=node))
        with self._remedy(death, node) as oos, self.meter.window(m):
            set_heartbeat(self.kube, node, alive=False)
            t0 = time.monotonic()
            try:
                met = pods.met(self.node_cap)
                m["running_s"] = round((met or time.monotonic()) - t0, 2)
                m["capped"] = met is None
                m["stuck_terminating"] = pods.terminating_on(node)
                _remedied(m, oos, t0)
            finally:
                set_heartbeat(self.kube, node, alive=True)
        if met is None:  # the gang must be whole again (anywhere) before the next run
            self._restore(pods, size, node, f"stock-{size} running again")
        m["controller_cpu_s"] = m["cpu_s_by_process"].get("jobset", 0.0)
        del m["controller_peak_rss_mib"]
        log(
            f"stock {size}: node {node} died ({death.label}): {_fmt(m, 'running_s')} "
            "to the gang running again"
        )
        return m


def _stock_attempt(pods: GangPods) -> str:
    """The restart attempt every running member's pod is of (a freshly created gang: 0)."""
    attempts = {p.attempt for p in pods.pods.values() if p.running}
    if len(attempts) != 1:
        raise RuntimeError(
            f"the stock gang's pods are of restart attempts {sorted(map(str, attempts))}"
        )
    return attempts.pop() or "0"


def _pool_text(pool: dict[str, Any]) -> str:
    """``pool: 2001 tasks, peak 7/32 busy, wait p99 0.4 ms``"""
    p99 = pool["wait_p99_s"]
    wait = "" if p99 is None else f", wait p99 {p99 * 1000:.1f} ms"
    return f"pool: {pool['tasks']} tasks, peak {pool['peak_busy']}/{pool['workers']} busy{wait}"


def _death_fields(death: NodeDeath) -> dict[str, Any]:
    return {"remediation": death.remediation, "force_delete": death.force_delete}


def _remedied(m: dict[str, Any], oos: OutOfService | None, t0: float) -> None:
    """A node-death run's record of its remediation: when the node was declared dead and
    tainted out-of-service, from its heartbeat's end."""
    if oos is None:
        return
    for key, at in (
        ("declared_dead_s", oos.declared_dead_at),
        ("out_of_service_s", oos.tainted_at),
    ):
        m[key] = None if at is None else round(at - t0, 2)
    if oos.errors:
        m["remediation_errors"] = oos.errors[:5]


# --- measurements from the fleet's marks ----------------------------------------------------


def _opened_all(fleet: Fleet, epoch: int, size: int) -> bool:
    m = fleet.marks_for(epoch)
    return m.barrier_open is not None and len(m.opened) >= size


def _wait_recovered(fleet: Fleet, epoch: int, size: int, timeout: float) -> None:
    wait_for(
        f"every agent of epoch {epoch} past the barrier",
        lambda: _opened_all(fleet, epoch, size),
        timeout,
        0.05,
    )


def _phases(fleet: Fleet, epoch: int, t0: float, restart_delay: float) -> dict[str, Any]:
    m = fleet.marks_for(epoch)
    assert m.seen is not None
    assert m.barrier_open is not None
    last_report = max(m.reports.values())
    opened = max(m.opened.values())
    total = m.barrier_open - t0
    return {
        "detection_s": round(m.seen - t0, 3),
        "restart_s": round(last_report - m.seen, 3),
        "barrier_s": round(m.barrier_open - last_report, 3),
        "barrier_open_s": round(total, 3),
        # the simulated kubelet restart sits once on the critical path
        "protocol_s": round(total - restart_delay, 3),
        "all_running_s": round(opened - t0, 3),
        "reports": len(m.reports),
    }


def _poll(
    probe: Callable[[], bool], since: float, cap: float, progress: str = "", every: float = 30
) -> bool:
    last = since
    while time.monotonic() - since < cap:
        if probe():
            return True
        if progress and time.monotonic() - last > every:
            last = time.monotonic()
            log(f"{progress}: not yet ({last - since:.0f}s of at most {cap:.0f}s)")
        time.sleep(0.5)
    return False


def _fmt(m: dict[str, Any], key: str = "all_running_s") -> str:
    return (">= " if m.get("capped") else "") + f"{m[key]:.1f}s"


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }
