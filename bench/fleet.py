"""Simulated agents and kubelets for the kwok members of one gang (kwok nodes run no containers).

What is real and what is not:

* **Real**: the agent's decision code (:class:`~jobset_inplace.agent.logic.AgentLogic`, one
  per simulated agent process), its status parser, its HTTP client
  (:class:`~jobset_inplace.agent.kubeapi.KubeApi`), its reporter
  (:class:`~jobset_inplace.agent.runner.Reporter`: the report channel with its own kept-alive
  HTTPS connection per agent, or a merge patch of its pod's report annotations when the
  channel is off or fails; with ``leases``, the same merge patch on a Lease of its own:
  bench/member_leases.py) and every request an agent makes per pod: a GET of the GangState
  when an agent process starts and its report for each epoch. API requests carry a real
  ServiceAccount token; channel reports carry a token bound to their pod for the channel's
  audience, requested when the pod's agent first starts and again at 80 % of its life (as the
  kubelet mounts and rotates the projected volume: :data:`TOKEN_ROTATE_AT`).
* **Simulated**: (1) the GangState watch: one watch feeds every simulated agent instead of one
  watch per agent (the apiserver's watch fan-out is not measured here: ``bench.gangstate_fanout``
  measures it apart); (2) the kubelet's in-place
  restart (``RestartAllContainers``): two pod-status patches, ``AllContainersRestarting=True``
  (plus the trainer's terminated state for an injected crash), then after ``restart_delay``
  seconds ``AllContainersRestarting=False`` with every container running again and its
  ``restartCount`` incremented, after which a new agent "process" starts; (3) checkpoint tiers:
  every agent reports the same steps, each epoch one checkpoint interval further than the last
  (:func:`epoch_steps`: the gang progresses between failures, as the stop rule
  ``no-progress-limit`` expects; with the same steps every time the 3rd repetition escalated).

Hot spares (a gang with ``jobset-inplace.dev/hot-spares``): each agent's place comes from the
variables the webhook gave its container (``JSI_SLOTS``, the job index from its pod's label:
:func:`~jobset_inplace.agent.config.position_from_env`), so its decision code knows which slot
it holds, stands by as a spare, and opens as the slot the status gives it; and every agent
heartbeats to the leader every ``HEARTBEAT_S`` once it has read a status naming the channel,
from a process of their own (bench/heartbeats.py: why, and what differs from a real agent).

A node death (:meth:`Fleet.silence`): the agent of the node's pod stops doing anything, as a
dead node's does (no report, no heartbeat, no reaction to the status); a new pod its Job makes
elsewhere gets a new agent.

``scope`` is the gang's restart scope. ``pod``: as above. ``process``: no container restarts,
so no kubelet write and no new agent process: a crash is the failed member's agent writing
``exited-in-epoch`` on its pod; on a new epoch each agent "stops its trainer" (``stop_delay``
seconds, no request: its launcher's work) and reports the new epoch from the same process.

With ``kubelet_writes=False`` (``--protocol-only``) the simulated kubelet writes the failed
member's pod status only: the other members restart silently, so what is left on the
apiserver is the recovery protocol itself (each new agent's GET and report) and the cluster's
background load. The controller does not need the kubelet's writes to run a recovery.
"""

from __future__ import annotations

import heapq
import itertools
import re
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.heartbeats import Agent as HeartbeatAgent
from bench.heartbeats import Counts, HeartbeatSender
from bench.member_leases import lease_path, member_lease
from bench.podwatch import watch_pods
from jobset_inplace import names
from jobset_inplace.agent.channel import ReportChannel
from jobset_inplace.agent.config import Config, ConfigError, position_from_env
from jobset_inplace.agent.kubeapi import ApiError, KubeApi, TransportErrors
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.logic import AgentLogic, Open, Position, Report, Restart, Standby
from jobset_inplace.agent.runner import Reporter
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.protocol.gangstate import Endpoint, GangView, MalformedStatus, parse_gangstate
from jobset_inplace.protocol.report import AgentReport
from jobset_inplace.times import format_time
from testbed.kube import pod_token

RESTARTING = "AllContainersRestarting"
FLEET_WORKERS = 32  # the simulated agents' and kubelets' threads (a MeasuredPool)
API_ERRORS = (ApiError, ValueError, *TransportErrors)
# The kubelet requests a pod's projected token again at 80 % of its life (or after 24 h).
TOKEN_ROTATE_AT = 0.8
ROTATE_RETRY_S = 5.0


@dataclass
class SimAgent:
    pod: str
    uid: str
    containers: list[str]
    logic: AgentLogic = field(default_factory=AgentLogic)
    busy: bool = False  # an API call of this agent is in flight
    restarting: bool = False  # the simulated kubelet is restarting the pod's containers
    crashed: bool = False  # its trainer crashed (the injected failure): status always written
    restarts: int = 0
    view: GangView | None = None  # the newest status this agent process has seen
    service_account: str = "default"
    token_file: Path | None = None  # its projected channel token (None: not mounted yet)
    reporter: Reporter | None = None  # the agent process's (None: not started yet)
    channel: ReportChannel | None = None
    position: Position | None = None  # hot spares: its place (None: no spares in the gang)
    silent: bool = False  # its node died: it does nothing any more
    standby: int | None = None  # the epoch in which it last stood by as a spare
    beats_to: Endpoint | None = None  # where its heartbeats go (None: it sends none)


class _AgentLog(Log):
    """The simulated agents' log: their warnings (a report that fell back from the channel to
    the pod, and why) become fleet errors, in the results; the rest is dropped."""

    def __init__(self, keep: Callable[[str], None]) -> None:
        super().__init__()
        self._keep = keep

    def _write(self, level: str, message: str) -> None:
        if level != "INFO":
            self._keep(f"agent {level}: {message}")


@dataclass
class EpochMarks:
    """When (time.monotonic()) the fleet saw things happen for one epoch."""

    seen: float | None = None  # the GangState first showed this epoch
    reports: dict[str, float] = field(default_factory=dict)  # pod -> its report was accepted
    barrier_open: float | None = None  # the GangState showed the barrier open
    opened: dict[str, float] = field(default_factory=dict)  # pod -> its agent opened


class MeasuredPool:
    """The fleet's thread pool, with what it would take to show it is not a recovery's
    bottleneck: how long each task waited for a worker (submit to start) and the most workers
    busy at once. A task that never waits and a pool never full cannot have delayed a path."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._busy = 0
        self.waits: list[float] = []  # seconds, in start order
        self.peak_busy = 0  # since the last ``mark``

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        queued = time.monotonic()

        def run() -> None:
            with self._lock:
                self.waits.append(time.monotonic() - queued)
                self._busy += 1
                self.peak_busy = max(self.peak_busy, self._busy)
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._busy -= 1

        self._pool.submit(run)

    def mark(self) -> int:
        """Start a window (one at a time: the previous window's waits are dropped, so a long
        run keeps only its current failure's): its peak counts from now; its waits are those
        after the index returned."""
        with self._lock:
            self.waits.clear()
            self.peak_busy = self._busy
            return 0

    def since(self, mark: int) -> dict[str, Any]:
        """The window's tasks, their wait for a worker (median, p99, largest, in seconds) and
        the most workers busy at once, of how many."""
        with self._lock:
            waits = sorted(self.waits[mark:])
            peak = self.peak_busy
        n = len(waits)
        return {
            "tasks": n,
            "wait_p50_s": round(waits[n // 2], 6) if n else None,
            "wait_p99_s": round(waits[min(n - 1, int(0.99 * n))], 6) if n else None,
            "wait_max_s": round(waits[-1], 6) if n else None,
            "peak_busy": peak,
            "workers": self.workers,
        }

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def epoch_steps(steps: tuple[int, ...], epoch: int) -> tuple[int, ...]:
    """The checkpoints the simulated trainers hold when they report for ``epoch``: ``steps``
    (newest first) moved on by the interval between the two newest once per epoch."""
    interval = steps[0] - steps[1] if len(steps) > 1 else max(steps[0], 1)
    return tuple(step + interval * epoch for step in steps)


class Fleet:
    """Agents for every Running member pod of gang ``gang`` in ``namespace``."""

    first_epoch = 1  # the epoch whose barrier opens when the gang first starts

    def __init__(
        self,
        kube: client.ApiClient,
        *,
        server: str,
        token_file: Path,
        ca_file: Path,
        namespace: str,
        gang: str,
        restart_delay: float,
        steps: tuple[int, ...] = (100, 200),
        workers: int = FLEET_WORKERS,
        kubelet_writes: bool = True,
        scope: str = "pod",
        stop_delay: float = 0.05,
        channel: bool = True,
        leases: bool = False,
    ) -> None:
        self.core = client.CoreV1Api(kube)
        self.namespace, self.gang = namespace, gang
        self.restart_delay = restart_delay
        self.kubelet_writes = kubelet_writes
        self.scope, self.stop_delay = scope, stop_delay
        self.channel = channel  # agents use the report channel the GangState names
        # agents write their reports on a Lease of their own (bench/member_leases.py), not on
        # their pod; no channel
        self.leases = leases
        if leases and channel:
            raise ValueError("a fleet reports over the channel or on member Leases, not both")
        self._tokens = Path(tempfile.mkdtemp(prefix="fleet-tokens-"))
        self._agent_log = _AgentLog(self._error)
        self.steps = tuple(sorted(set(steps), reverse=True))  # newest first, as reported
        self._api = threading.local()
        self._server, self._token_file, self._ca_file = server, token_file, ca_file
        self._pool = MeasuredPool(workers, "fleet")
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self.agents: dict[str, SimAgent] = {}  # pod name -> agent
        self.view: GangView | None = None
        self._gang_uid: str | None = None
        self.marks: dict[int, EpochMarks] = {}
        self.requests = 0  # the agents' API requests
        self.channel_reports = 0  # reports the leader's channel accepted
        self._heartbeats = HeartbeatSender()
        self.errors: list[str] = []
        path = KubeApi.gangstates_path(
            names.GROUP, names.VERSION, namespace, names.GANGSTATE_PLURAL
        )
        self._gang_collection, self._gang_object = path, f"{path}/{gang}"
        # delayed work (simulated restart times, retries): one timer thread, never a pool
        # worker asleep
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._timer_wake = threading.Condition(self._lock)
        self._threads = [
            threading.Thread(target=self._watch_gang, daemon=True, name="fleet-gang"),
            threading.Thread(target=self._watch_pods, daemon=True, name="fleet-pods"),
            threading.Thread(target=self._run_timers, daemon=True, name="fleet-timers"),
        ]

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._heartbeats.start()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._halt.set()
        with self._timer_wake:
            self._timer_wake.notify()
        self._pool.shutdown()
        self._heartbeats.close()

    def heartbeats(self) -> Counts:
        """The agents' heartbeats so far: answered, late, failed."""
        return self._heartbeats.counts()

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the pool after ``delay`` seconds."""
        with self._timer_wake:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), fn))
            self._timer_wake.notify()

    def _run_timers(self) -> None:
        with self._timer_wake:
            while not self._halt.is_set():
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, fn = heapq.heappop(self._timers)
                    self._pool.submit(fn)
                wait = self._timers[0][0] - now if self._timers else None
                self._timer_wake.wait(wait)

    def pool_mark(self) -> int:
        """Start counting the pool's waits and peak (see :meth:`pool_since`)."""
        return self._pool.mark()

    def pool_since(self, mark: int) -> dict[str, Any]:
        """The simulated agents' and kubelets' pool since ``mark``: tasks, their waits for a
        worker, the most workers busy at once."""
        return self._pool.since(mark)

    @property
    def restarts_on_path(self) -> int:
        """How many simulated kubelet restarts sit, one after the other, on a recovery's
        critical path (the process scope restarts no container)."""
        return 1 if self.scope == "pod" else 0

    def epoch(self) -> int:
        """The gang's epoch as the agents last saw it."""
        if self.view is None:
            raise RuntimeError("the fleet has not seen the GangState")
        return self.view.epoch

    def silence(self, pod: str) -> None:
        """``pod``'s node died: its agent stops (no report, no heartbeat, no action)."""
        with self._lock:
            agent = self.agents.get(pod)
            if agent is not None:
                agent.silent = True
                self._heartbeats.stop(agent.uid)

    def holders(self) -> list[str]:
        """Pods whose agents run a trainer (opened the barrier of their epoch): without hot
        spares every running member; with them, the slots' holders."""
        with self._lock:
            return sorted(
                a.pod
                for a in self.agents.values()
                if not a.silent and a.logic.opened and a.logic.epoch == self.epoch()
            )

    def place(self, pod: str) -> tuple[str, str] | None:
        """Hot spares: the slot ``pod``'s trainer runs as and the pod's own position (both
        member names); None: it runs none, or the gang has no spares."""
        with self._lock:
            agent = self.agents.get(pod)
            if agent is None or agent.position is None or agent.logic.slot is None:
                return None
            at = agent.position
            return at.name(agent.logic.slot), at.name(at.job_index)

    def spares_standing_by(self) -> int:
        """Spares whose agents stood by in the gang's current epoch and heartbeat."""
        with self._lock:
            epoch = self.epoch()
            return sum(
                1
                for a in self.agents.values()
                if not a.silent and a.standby == epoch and a.logic.epoch == epoch
            )

    def marks_for(self, epoch: int) -> EpochMarks:
        with self._lock:
            return self.marks.setdefault(epoch, EpochMarks())

    # --- API calls (thread-local kept-alive connections, like one agent each) ------------

    def _make_api(self) -> KubeApi:
        return KubeApi(self._server, self._token_file, self._ca_file, timeout=30.0)

    def _kube(self) -> KubeApi:
        api_: KubeApi | None = getattr(self._api, "kube", None)
        if api_ is None:
            api_ = self._api.kube = self._make_api()
        return api_

    def _call(self, fn: Callable[[KubeApi], Any]) -> Any:
        with self._lock:
            self.requests += 1
        return fn(self._kube())

    def _pod_path(self, pod: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{pod}"

    # --- the GangState, seen by every agent -----------------------------------------------

    def _watch_gang(self) -> None:
        kube = self._make_api()
        rv: str | None = None
        while not self._halt.is_set():
            try:
                if rv is None:
                    obj = kube.get(self._gang_object)
                    rv = obj["metadata"]["resourceVersion"]
                    self._observe(obj)
                for ev in kube.watch(self._gang_collection, self.gang, rv, 300):
                    if ev.get("type") == "ERROR":
                        rv = None
                        break
                    obj = ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self._observe(obj)
            except ApiError as e:
                if e.status != 404:
                    self._error(f"gang watch: {e}")
                rv = None
                self._halt.wait(0.2)
            except (*TransportErrors, ValueError) as e:
                self._error(f"gang watch: {e}")
                rv = None
                self._halt.wait(0.2)

    def _observe(self, obj: dict[str, Any]) -> None:
        try:
            view = parse_gangstate(obj)
        except MalformedStatus as e:
            self._error(f"malformed GangState: {e}")
            return
        if view is None:
            return
        now = time.monotonic()
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            if uid != self._gang_uid:
                # a new GangState (an earlier gang of the same name had its own epochs)
                self._gang_uid, self.marks = uid, {}
            self.view = view
            marks = self.marks.setdefault(view.epoch, EpochMarks())
            if marks.seen is None:
                marks.seen = now
            if view.barrier_open and marks.barrier_open is None:
                marks.barrier_open = now
            agents = list(self.agents.values())
        for agent in agents:
            self._dispatch(agent, view)

    # --- pods: a Running member pod gets an agent (the kubelet started its containers) ----

    def _watch_pods(self) -> None:
        watch_pods(
            self.core,
            self.namespace,
            f"{names.JOBSET_NAME_LABEL}={self.gang}",
            self._pod_event,
            self._halt,
            on_error=self._error,
        )

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        name, deleting = meta["name"], bool(meta.get("deletionTimestamp"))
        live = kind != "DELETED" and status.get("phase") == "Running" and not deleting
        with self._lock:
            agent = self.agents.get(name)
            if not live:
                if agent is not None and (kind == "DELETED" or deleting):
                    del self.agents[name]
                    self._heartbeats.stop(agent.uid)
                return
            if agent is not None and agent.uid == meta["uid"]:
                return
            containers = [c["name"] for c in pod["spec"]["containers"]]
            agent = self._new_agent(name, meta["uid"], containers)
            agent.service_account = pod["spec"].get("serviceAccountName") or "default"
            try:
                agent.position = position_from_env(agent_env(pod), self.gang)
            except ConfigError as e:
                self._error(f"{name}: its agent's configuration: {e}")
                return
            agent.logic = AgentLogic(agent.position)
            # its process is starting: no GangState event acts on it before its own start
            # (a real agent reads the status only once it runs)
            agent.restarting = True
            self.agents[name] = agent
        self._pool.submit(self._agent_starts, agent)

    # --- one agent ------------------------------------------------------------------------

    def _new_agent(self, pod: str, uid: str, containers: list[str]) -> SimAgent:
        return SimAgent(pod, uid, containers)

    def _new_process(self, agent: SimAgent) -> None:
        """The agent container restarted: a new process (the lock held)."""
        agent.logic = AgentLogic(agent.position)
        agent.view = None
        if agent.channel is not None:
            agent.channel.close()
        agent.reporter = agent.channel = None

    def _start_reporter(self, agent: SimAgent) -> None:
        """The agent process's reporter, as the webhook configures a real one: its pod's UID
        and, with the channel, the token the kubelet mounted (requested here once per pod, then
        rotated: :meth:`_rotate`)."""
        if self.channel and agent.token_file is None:
            agent.token_file = self._mount_token(agent)
            self._later(TOKEN_ROTATE_AT * names.REPORT_TOKEN_SECONDS, lambda: self._rotate(agent))
        cfg = Config(
            pod_name=agent.pod, namespace=self.namespace, gangstate=self.gang,
            state_dir=self._tokens, local_dir=None, persistent_dir=None, restart_exit_code=88,
            probe_port=1, server=self._server, token_file=None, ca_file=None,
            pod_uid=agent.uid, report_token_file=agent.token_file,
        )  # fmt: skip
        reporter = Reporter(cfg, self._agent_log)
        if self.leases:
            self._create_lease(agent)
            reporter.pod = lease_path(self.namespace, agent.pod)  # its writes go there
        with self._lock:
            agent.reporter, agent.channel = reporter, reporter.channel_for()

    def _mount_token(self, agent: SimAgent) -> Path:
        """A new channel token of ``agent``'s pod in its file (replaced whole: the agent reads
        the file at every report, as a real one reads its projected volume)."""
        token = pod_token(
            self.core,
            self.namespace,
            service_account=agent.service_account,
            pod=agent.pod,
            uid=agent.uid,
            audience=names.REPORT_TOKEN_AUDIENCE,
            seconds=names.REPORT_TOKEN_SECONDS,
        )
        path = self._tokens / agent.uid
        new = path.with_suffix(".new")
        new.write_text(token)
        new.replace(path)
        return path

    def _rotate(self, agent: SimAgent) -> None:
        """The kubelet's rotation of the projected token: a new one at TOKEN_ROTATE_AT of the
        old one's life (a 10,000-pod gang takes most of an hour to start here: without it the
        first pods' tokens expired during the measured failures, 2026-12-07); retried after an
        API error; not for a pod that is gone (its agent is no longer the fleet's) or whose
        node died."""
        with self._lock:
            current = self.agents.get(agent.pod) is agent
        if not current or agent.silent or self._halt.is_set():
            return
        try:
            self._mount_token(agent)
        except Exception as e:  # (the client's and urllib3's errors): a timer must not die silently
            self._error(f"{agent.pod}: token rotation: {type(e).__name__}: {e}")
            self._later(ROTATE_RETRY_S, lambda: self._rotate(agent))
            return
        self._later(TOKEN_ROTATE_AT * names.REPORT_TOKEN_SECONDS, lambda: self._rotate(agent))

    def _create_lease(self, agent: SimAgent) -> None:
        """The member Lease its agent writes its reports on (once per pod: an agent that
        starts again in the same pod finds it)."""
        body = member_lease(self.gang, agent.pod, agent.uid)
        try:
            self._call(lambda k: k.request("POST", lease_path(self.namespace), body))
        except ApiError as e:
            if e.status != 409:
                raise

    def _agent_starts(self, agent: SimAgent) -> None:
        """A new agent process: read the GangState (its first request), then act."""
        if agent.silent:
            return
        try:
            if agent.reporter is None:
                self._start_reporter(agent)
            obj = self._call(lambda k: k.get(self._gang_object))
            view = parse_gangstate(obj)
        except (*API_ERRORS, MalformedStatus, client.exceptions.ApiException) as e:
            self._error(f"{agent.pod}: agent start: {e}")
            self._retry(lambda: self._agent_starts(agent))
            return
        with self._lock:
            agent.restarting = False
        if view is not None:
            self._dispatch(agent, view)

    def _dispatch(self, agent: SimAgent, view: GangView) -> None:
        """Run the agent's decision for ``view`` and start the resulting action."""
        with self._lock:
            old = agent.view
            # keep the newest: a closed barrier never follows an open one within an epoch
            if old is not None and old.epoch == view.epoch and old.barrier_open:
                view = old
            agent.view = view
            if agent.silent:
                return
            self._beat_to(agent, view.endpoint)
            if agent.busy or agent.restarting:
                return
            if self.agents.get(agent.pod) is not agent:
                return
            while True:
                action = agent.logic.step(view)
                if isinstance(action, Open):
                    agent.logic.opened_barrier(action.epoch, action.slot)
                    self.marks.setdefault(action.epoch, EpochMarks()).opened[agent.pod] = (
                        time.monotonic()
                    )
                    continue
                if isinstance(action, Standby):
                    agent.standby = action.epoch
                elif isinstance(action, Report):
                    agent.busy = True
                    self._pool.submit(self._report, agent, action)
                elif isinstance(action, Restart) and self.scope == "process":
                    agent.busy = True  # its launcher stops the trainer (a crashed one is gone)
                    delay = 0.0 if agent.crashed else self.stop_delay
                    self._later(delay, lambda: self._trainers_stopped(agent))
                elif isinstance(action, Restart):
                    agent.restarting = True
                    self._pool.submit(self._kubelet_restart, agent, None)
                return

    def _trainers_stopped(self, agent: SimAgent) -> None:
        """Process scope: the agent joins the new epoch in place, as a new AgentLogic."""
        with self._lock:
            agent.logic = AgentLogic(agent.position)
            agent.busy = agent.crashed = False
        self._redispatch(agent)

    def _report(self, agent: SimAgent, action: Report) -> None:
        report = AgentReport(  # as the real agent's report (agent/runner.py)
            reported_epoch=action.epoch,
            reported_steps=epoch_steps(self.steps, action.epoch),
            late_for_epoch=None if action.barrier_closed else action.epoch,
        )
        try:
            self._deliver(agent, report, fresh=True)
        except API_ERRORS as e:
            with self._lock:
                agent.busy = False
            if isinstance(e, ApiError) and e.status == 404:
                return  # the pod is gone
            self._error(f"{agent.pod}: report: {e}")
            self._retry(lambda: self._redispatch(agent))
            return
        with self._lock:
            agent.logic.reported_epoch(action.epoch, action.barrier_closed)
            agent.busy = False
            self.marks.setdefault(action.epoch, EpochMarks()).reports[agent.pod] = time.monotonic()
        self._redispatch(agent)

    def _deliver(self, agent: SimAgent, report: AgentReport, *, fresh: bool) -> None:
        """The agent's report, the real agent's way (``Reporter``: the channel, or the pod
        when there is none or it fails)."""
        reporter = agent.reporter
        assert reporter is not None, "an agent process starts with its reporter"
        reporter.endpoint = agent.view.endpoint if agent.view is not None else None
        where = reporter.report(report, fresh=fresh, channel=agent.channel, kube=self._kube())
        with self._lock:
            if where == "channel":
                self.channel_reports += 1
            else:
                self.requests += 1

    def _redispatch(self, agent: SimAgent) -> None:
        with self._lock:
            view = agent.view if agent.view is not None else self.view
        if view is not None:
            self._dispatch(agent, view)

    # --- heartbeats (hot spares) ----------------------------------------------------------

    def _beat_to(self, agent: SimAgent, endpoint: Endpoint | None) -> None:
        """A spare gang's agent heartbeats to the channel its newest status names, once its
        reporter (and so its token) is set up (the lock held)."""
        if agent.position is None or agent.token_file is None or endpoint is None:
            return
        if endpoint == agent.beats_to:
            return
        agent.beats_to = endpoint
        who = HeartbeatAgent(self.namespace, self.gang, agent.pod, agent.uid, agent.token_file)
        self._heartbeats.beat(who, endpoint)

    def _retry(self, fn: Callable[[], None]) -> None:
        if not self._halt.is_set():
            self._later(0.5, fn)

    # --- the simulated kubelet ------------------------------------------------------------

    def crash_trainer(self, pod: str) -> float:
        """Inject a trainer crash into ``pod``; the time its signal was accepted. Pod scope:
        exit 3, the pod's restart rule restarts all its containers in place (the kubelet's
        status update). Process scope: its agent reports the exit on the pod."""
        if self.scope == "process":
            with self._lock:
                agent = self.agents[pod]
                agent.crashed = True
                epoch = agent.logic.epoch
            if epoch is None:  # (the real agent reports an exit only in an epoch it joined)
                raise ValueError(f"{pod}: a trainer crash before its agent's first report")
            self._deliver(agent, AgentReport(exited_in_epoch=epoch), fresh=False)
            return time.monotonic()
        with self._lock:
            agent = self.agents[pod]
            agent.restarting = agent.crashed = True
        self._kubelet_status(agent, restarting=True, crashed=True)
        t = time.monotonic()
        self._pool.submit(self._kubelet_restart, agent, t)
        return t

    def _kubelet_restart(self, agent: SimAgent, already_signalled: float | None) -> None:
        """Containers stop (status written), and come back ``restart_delay`` s later."""
        if already_signalled is None and self.kubelet_writes:
            try:
                self._kubelet_status(agent, restarting=True, crashed=False)
            except API_ERRORS as e:
                if isinstance(e, ApiError) and e.status == 404:
                    return
                self._error(f"{agent.pod}: kubelet: {e}")
                self._retry(lambda: self._kubelet_restart(agent, already_signalled))
                return
        self._later(self.restart_delay, lambda: self._containers_back(agent))

    def _containers_back(self, agent: SimAgent) -> None:
        try:
            with self._lock:
                restarts = agent.restarts + 1
                write = self.kubelet_writes or agent.crashed
            if write:
                self._kubelet_status(agent, restarting=False, crashed=False, restarts=restarts)
        except API_ERRORS as e:
            if isinstance(e, ApiError) and e.status == 404:
                return
            self._error(f"{agent.pod}: kubelet: {e}")
            self._retry(lambda: self._containers_back(agent))
            return
        with self._lock:
            agent.restarts, agent.crashed = restarts, False
            self._new_process(agent)
        self._agent_starts(agent)

    def _kubelet_status(
        self, agent: SimAgent, *, restarting: bool, crashed: bool, restarts: int | None = None
    ) -> None:
        now = format_time(micro=False)
        count = agent.restarts if restarts is None else restarts
        statuses = []
        for name in agent.containers:
            if crashed and name == "trainer":
                state: dict[str, Any] = {
                    "terminated": {"exitCode": 3, "reason": "Error", "finishedAt": now}
                }
            elif restarting:
                state = {"waiting": {"reason": "RestartingAllContainers"}}
            else:
                state = {"running": {"startedAt": now}}
            statuses.append(
                {
                    "name": name,
                    "image": "sim",
                    "imageID": "sim",
                    "ready": not restarting,
                    "restartCount": count,
                    "started": not restarting,
                    "state": state,
                }
            )
        body = {
            "status": {
                "conditions": [
                    {"type": RESTARTING, "status": str(restarting), "lastTransitionTime": now}
                ],
                "containerStatuses": statuses,
            }
        }
        path = self._pod_path(agent.pod) + "/status"
        self._call(
            lambda k: k.request("PATCH", path, body, "application/strategic-merge-patch+json")
        )

    def _error(self, msg: str) -> None:
        with self._lock:
            if len(self.errors) < 200:
                self.errors.append(msg)


def agent_env(pod: dict[str, Any]) -> dict[str, str]:
    """The environment of ``pod``'s agent container as its kubelet gives it: literal values,
    and the downward API's ``metadata.name``, ``metadata.namespace`` and labels resolved from
    the pod (what the webhook's fieldRefs name)."""
    meta, spec = pod["metadata"], pod["spec"]
    labels = meta.get("labels") or {}
    env: dict[str, str] = {}
    for c in (*(spec.get("initContainers") or ()), *spec["containers"]):
        if c["name"] != AGENT_CONTAINER:
            continue
        for e in c.get("env") or ():
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            if path in ("metadata.name", "metadata.namespace"):
                env[e["name"]] = meta[path.split(".")[1]]
            elif (label := re.fullmatch(r"metadata\.labels\['(.+)'\]", path)) is not None:
                env[e["name"]] = labels.get(label.group(1), "")
    return env
