"""Simulated agents of JobSet's own InPlaceRestart (sidecar mode) for the kwok members of a gang.

The protocol is upstream's (bench/upstream.py); what is real and what is not, as for our own
fleet (bench/fleet.py):

* **Real**: the JobSet controller with the ``InPlaceRestart`` gate on, which reads the pods'
  attempts and writes the JobSet's status; and every request an upstream agent makes per pod:
  when an agent process starts, a LIST of its JobSet (controller-runtime's informer, field
  selector on the name) and one server-side apply of ``in-place-restart-attempt`` on its own
  pod (field manager ``in-place-restart-agent``, forced), with a real ServiceAccount token.
* **Simulated**: (1) the JobSet watch: one watch feeds every simulated agent instead of one per
  agent (as for our fleet's GangState watch); (2) the kubelet's ``RestartAllContainers``, the
  same status writes and ``restart_delay`` as for our pod scope: for the crashed trainer's pod,
  and for every pod whose agent exits with the in-place-restart code; (3) the startupProbe: an
  agent lifting its barrier counts as its member running (the probe period is not added).

So a recovery has two simulated restarts on its critical path, one after the other: the crashed
pod's (its new agent's attempt is what tells the controller), then every other pod's (their
agents exit once the controller raised ``previousInPlaceRestartAttempt``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from kubernetes import client

from jobset_inplace.agent.kubeapi import ApiError

from . import upstream
from .fleet import API_ERRORS, Fleet, SimAgent

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"


@dataclass(frozen=True)
class Attempts:
    """The JobSet's ``status.{current,previous}InPlaceRestartAttempt``."""

    current: int | None = None
    previous: int | None = None

    @classmethod
    def of(cls, jobset: dict[str, Any]) -> Attempts:
        status = jobset.get("status") or {}
        return cls(
            status.get("currentInPlaceRestartAttempt"), status.get("previousInPlaceRestartAttempt")
        )

    def newest(self, other: Attempts) -> Attempts:
        """Both only grow (the controller never lowers them): the newer of two reads."""
        return Attempts(_max(self.current, other.current), _max(self.previous, other.previous))


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class UpstreamAgent(SimAgent):
    attempt: int | None = None  # this agent process's PodInPlaceRestartAttempt
    barrier_active: bool = True
    seen: Attempts = Attempts()  # the newest JobSet status this process has seen


class UpstreamFleet(Fleet):
    """Upstream agents for every Running member pod of JobSet ``gang``. Its epochs are the
    restart attempts: the first barrier is attempt 0's; a recovery's marks are the next
    attempt's (``seen``: the controller raised ``previous``; ``reports``: each pod's attempt
    applied; ``barrier_open``: ``current`` reached it; ``opened``: each agent lifted its
    barrier)."""

    first_epoch = 0

    def __init__(self, kube: client.ApiClient, **kwargs: Any) -> None:
        super().__init__(kube, scope="pod", **kwargs)
        collection = JOBSETS.format(namespace=self.namespace)
        self._gang_collection, self._gang_object = collection, f"{collection}/{self.gang}"
        self.attempts = Attempts()

    @property
    def restarts_on_path(self) -> int:
        return 2

    def epoch(self) -> int:
        if self.attempts.current is None:
            raise RuntimeError("the JobSet has no current in-place restart attempt yet")
        return self.attempts.current

    def _observe(self, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            if uid != self._gang_uid:
                self._gang_uid, self.marks, self.attempts = uid, {}, Attempts()
            self.attempts = attempts = self.attempts.newest(Attempts.of(obj))
            if attempts.previous is not None:
                marks = self.marks_for(attempts.previous + 1)
                marks.seen = marks.seen if marks.seen is not None else now
            if attempts.current is not None:
                marks = self.marks_for(attempts.current)
                marks.barrier_open = marks.barrier_open if marks.barrier_open is not None else now
            agents = list(self.agents.values())
        for agent in agents:
            assert isinstance(agent, UpstreamAgent)
            self._reconcile(agent, attempts)

    def _new_agent(self, pod: str, uid: str, containers: list[str]) -> SimAgent:
        return UpstreamAgent(pod, uid, containers)

    def _new_process(self, agent: SimAgent) -> None:
        assert isinstance(agent, UpstreamAgent)
        agent.attempt, agent.barrier_active, agent.seen = None, True, Attempts()

    def _agent_starts(self, agent: SimAgent) -> None:
        """A new agent process: its informer LISTs the JobSet, then it reconciles."""
        assert isinstance(agent, UpstreamAgent)
        if agent.silent:
            return
        query = urlencode({"fieldSelector": f"metadata.name={self.gang}"})
        try:
            listed = self._call(lambda k: k.get(f"{self._gang_collection}?{query}"))
        except API_ERRORS as e:
            self._error(f"{agent.pod}: agent start: {e}")
            self._retry(lambda: self._agent_starts(agent))
            return
        items = listed.get("items") or []
        with self._lock:
            agent.restarting = False
        if items:
            self._reconcile(agent, Attempts.of(items[0]))

    def _reconcile(self, agent: UpstreamAgent, attempts: Attempts) -> None:
        """Upstream's ``Reconcile`` for one agent process (cmd/in-place-restart-agent)."""
        with self._lock:
            agent.seen = attempts = agent.seen.newest(attempts)
            if agent.silent or agent.busy or agent.restarting:
                return
            if self.agents.get(agent.pod) is not agent:
                return
            if agent.attempt is None:  # once per process: current + 1 (0 when none)
                agent.busy = True
                attempt = 0 if attempts.current is None else attempts.current + 1
                self._pool.submit(self._apply_attempt, agent, attempt)
                return
            if attempts.previous is not None and agent.attempt <= attempts.previous:
                agent.restarting = True  # exits with the in-place-restart code
                self._pool.submit(self._kubelet_restart, agent, None)
                return
            if agent.barrier_active and agent.attempt == attempts.current:
                agent.barrier_active = False
                self.marks_for(agent.attempt).opened[agent.pod] = time.monotonic()

    def _apply_attempt(self, agent: UpstreamAgent, attempt: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": agent.pod,
                "namespace": self.namespace,
                "annotations": {upstream.ATTEMPT_ANNOTATION: str(attempt)},
            },
        }
        path = (
            self._pod_path(agent.pod)
            + "?"
            + urlencode({"fieldManager": upstream.AGENT, "force": "true"})
        )
        try:
            self._call(lambda k: k.request("PATCH", path, body, "application/apply-patch+yaml"))
        except API_ERRORS as e:
            with self._lock:
                agent.busy = False
            if isinstance(e, ApiError) and e.status == 404:
                return  # the pod is gone
            self._error(f"{agent.pod}: apply attempt: {e}")
            self._retry(lambda: self._reconcile(agent, agent.seen))
            return
        with self._lock:
            agent.attempt, agent.busy = attempt, False
            self.marks_for(attempt).reports[agent.pod] = time.monotonic()
            attempts = self.attempts
        self._reconcile(agent, attempts)
