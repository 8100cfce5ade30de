"""A whole pass: what every pass records, the JobSet-level edges, then the Running or Recovering
phase's; and the planner's functions (:func:`plan`, :func:`plan_node`, :func:`refuse_policy`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Final

from jobset_inplace.core import goodput
from jobset_inplace.core.detection import (
    may_untaint,
    member_causes,
    node_state,
    unconfirmed_lease_nodes,
)
from jobset_inplace.core.gangstate import progress_only, progress_write_interval
from jobset_inplace.core.model import (
    Action,
    Cause,
    Event,
    GangSpec,
    NodeView,
    Plan,
    PodView,
    ReadLeases,
    ReplacePod,
    Snapshot,
    UntaintNode,
)
from jobset_inplace.core.planner.base import first_few
from jobset_inplace.core.planner.filters import CauseFilters
from jobset_inplace.core.planner.recovering import Recovering
from jobset_inplace.core.planner.running import Running
from jobset_inplace.core.policy import ForceDelete
from jobset_inplace.core.statemachine import Edge, Phase, StandDownReason


def plan(s: Snapshot) -> Plan:
    """The next status and actions for one gang."""
    planning = _Planning(s)
    unconfirmed = unconfirmed_lease_nodes(s)
    if unconfirmed and planning.disrupted is None:  # in a disruption nothing is replaced
        # Look before deciding anything: read those Leases, then plan again at once.
        return Plan(copy.deepcopy(s.status), [ReadLeases(tuple(unconfirmed))], requeue_after=0.0)
    return planning.run()


def plan_node(node: NodeView | None, now: float) -> list[Action]:
    """Actions for one node, whatever gang it served: the controller's unhealthy taint comes
    off once the node is back."""
    return [UntaintNode(node.name)] if node is not None and may_untaint(node, now) else []


def refuse_policy(error: str, posted: frozenset[str]) -> list[Action]:
    """A JobSet whose annotations do not parse is not recovered; say why, once."""
    key = f"InvalidPolicy/{error}"
    return [] if key in posted else [Event("InvalidPolicy", error, warning=True, once_key=key)]


def jobset_edge(gang: GangSpec, phase: Phase, restart_attempt: int) -> Edge | None:
    """The JobSet-level transition due, if any (these come before any member's failure)."""
    if gang.finished:
        return Edge.JOBSET_FAILED if phase == Phase.ESCALATED else Edge.JOBSET_FINISHED
    if gang.suspended or gang.kueue_stand_down:
        return None if phase == Phase.STOOD_DOWN else Edge.STOOD_DOWN
    if phase == Phase.STOOD_DOWN:
        return Edge.RESUMED
    if gang.restart_attempt != restart_attempt:
        return Edge.JOBSET_RESTARTED
    return None


# Phases in which only a JobSet-level transition can happen.
WAITING_FOR_JOBSET = frozenset({Phase.ESCALATED, Phase.STOOD_DOWN, Phase.FAILED})


class _Planning(Running, Recovering, CauseFilters):
    """One planning pass. :meth:`run` picks the transition; each edge of
    :data:`~..statemachine.TRANSITIONS` has one method named after it (here the JobSet-level
    ones; the phases' in :mod:`.running` and :mod:`.recovering`), and every phase change goes
    through :meth:`~.base.PlanningPass.go`."""

    def run(self) -> Plan:
        s, st = self.s, self.st
        self.observe()
        edge = jobset_edge(s.gang, st.phase, st.restart_attempt)
        if edge is not None:
            self.JOBSET_EDGES[edge](self)
        elif st.phase == Phase.ESCALATED:
            self.hold_escalation()
        elif st.phase not in WAITING_FOR_JOBSET:
            causes, wake = member_causes(s, self.current, self.barrier_timeout)
            if wake is not None:
                self.p.wake_at(s.now, wake)
            if Cause.NODE_UNHEALTHY in causes.values():
                causes = self.unless_disrupted(causes)
            if Cause.AGENT_SILENT in causes.values():
                causes = self.unless_all_silent(causes)
            if Cause.AGENT_SILENT in causes.values():
                causes = self.only_where_a_spare_waits(causes)
            if st.phase == Phase.RUNNING:
                self.running(causes)
            else:
                self.recovering(causes)
        self.release_stuck_deletions()
        if st.phase not in WAITING_FOR_JOBSET:
            self.move_spares()
        self.advertise_report_endpoint()
        self.defer_progress_only_write()
        return self.p

    def release_stuck_deletions(self) -> None:
        """The gang's pods that are no member's current one (an earlier JobSet attempt's, a
        replaced one) and are being deleted on a dead node: no kubelet will end their deletion,
        and what comes next waits for it (JobSet's restart deletes its Jobs in the foreground).
        Force-deleted as a member's pod there would be; never with force-delete off, nor while
        the cluster looks disrupted."""
        s = self.s
        if s.policy.force_delete != ForceDelete.UNREACHABLE:
            return
        deleting = [pod for pod in s.pods if pod.deleting]
        current = {pod.uid for pod in self.current.values()} if deleting else set()
        stuck = [pod for pod in deleting if pod.uid not in current]
        # the disruption, O(cluster nodes), only where a pod is at stake (at 10,000 nodes it
        # was about a fifth of a pass in a profile)
        if not stuck or self.disrupted is not None:
            return
        for pod in stuck:
            node = s.nodes.get(pod.node or "")
            if node_state(node, s.policy, s.now, s.leases_observed_since)[0]:
                self.p.actions.append(
                    ReplacePod(pod.name, pod.uid, pod.member, Cause.NODE_UNHEALTHY, True)
                )
                self.event(
                    "StuckPodDeleted",
                    f"pod {pod.name} (restart attempt {pod.restart_attempt}), being deleted on "
                    f"node {pod.node}, which is silent: deleted without waiting for its kubelet",
                    once_key=f"Stuck/{pod.uid}",
                )

    def observe(self) -> None:
        """Member counts, the Kueue margin, malformed reports (status and Events only)."""
        st = self.st
        self.check_kueue_margin()
        st.expected = len(self.s.gang.members)
        st.ready = sum(1 for pod in self.current.values() if pod.phase == "Running")
        on_pod: list[PodView] = []
        for pod in self.current.values():
            if pod.report_error:  # one Event per pod, however often its garbage changes
                msg = f"pod {pod.name}: {pod.report_error}"
                self.event("MalformedReport", msg, warning=True, once_key=f"Malformed/{pod.uid}")
            if (pod.pod_report_epoch or 0) >= st.epoch:
                on_pod.append(pod)
        self.reports_on_pods(on_pod)

    def reports_on_pods(self, on_pod: list[PodView]) -> None:
        """Members whose agents wrote their report of this epoch on their pods although this
        leader serves a report channel: acted on all the same (core/decode.py ranks both
        paths), but surfaced, as the channel failing them costs an API write per report and
        hides a broken route: their count in the status, and a Warning Event when it first
        reaches 1, 2, 4, 8, ... in an epoch (a broken channel of 5000 agents: 14 Events)."""
        endpoint, st = self.s.report_endpoint, self.st
        st.on_pod = 0 if endpoint is None else len(on_pod)
        if endpoint is None or not on_pod:
            return
        members = sorted(pod.member for pod in on_pod)
        self.event(
            "ReportChannelUnreachable",
            f"epoch {st.epoch}: {len(members)} member(s) wrote their reports on their pods, not "
            f"to the report channel {endpoint.url} ({first_few(members)}); acted on all the same. "
            "Can those pods reach the channel (NetworkPolicy, routes; their agents' logs say "
            "why), and are their agents as new as the controller?",
            warning=True,
            once_key=f"OnPod/{st.epoch}/{len(members).bit_length()}",
        )

    def check_kueue_margin(self) -> None:
        rt, st = self.recovery_timeout, self.st
        margin = None if rt is None else round(rt - 2 * self.barrier_timeout, 3)
        if margin != st.kueue_margin_s and rt is not None:
            bt = self.s.policy.barrier_timeout_s
            if self.barrier_timeout < bt:
                self.event(
                    "KueueRecoveryTimeout",
                    f"barrier-timeout {bt:.0f}s does not fit twice in Kueue's recoveryTimeout "
                    f"{rt:.0f}s: using {self.barrier_timeout:.0f}s",
                    warning=True,
                )
        st.kueue_margin_s = margin

    def advertise_report_endpoint(self) -> None:
        """The status names this leader's report channel: agents send their reports there (and
        send them again when it changes: a new leader learns every report this way)."""
        self.p.status.report_endpoint = self.s.report_endpoint

    def defer_progress_only_write(self) -> None:
        """A change of the member counts alone is written at most every
        :func:`~.gangstate.progress_write_interval` (each write reaches every agent's watch):
        until then the persisted status stands and the planner looks again when it is due."""
        s = self.s
        if not progress_only(s.status, self.p.status):
            return
        due = s.status_written_at + progress_write_interval(len(s.gang.members))
        if s.now < due:
            self.p.status = s.status
            self.p.wake_at(s.now, due)

    def jobset_failed(self) -> None:
        self.go(Edge.JOBSET_FAILED, "JobSetFailed", "the JobSet failed after escalation")
        self.st.goodput = goodput.training_ended(self.st.goodput, self.s.now, kept=False)

    def jobset_finished(self) -> None:
        self.go(Edge.JOBSET_FINISHED, self.st.reason, self.st.message)
        self.st.goodput = goodput.training_ended(self.st.goodput, self.s.now, kept=True)

    def stood_down(self) -> None:
        gang, st = self.s.gang, self.st
        why = gang.kueue_stand_down or "the JobSet is suspended"
        self.go(
            Edge.STOOD_DOWN,
            StandDownReason.KUEUE if gang.kueue_stand_down else StandDownReason.SUSPENDED,
            why,
        )
        st.barrier_open = False
        st.recovery = None  # an in-flight recovery is cancelled, not resumed later
        st.planned_stop = None
        st.slots = {}  # its pods are all made anew: each position holds its own slot again
        st.goodput = goodput.training_ended(st.goodput, self.s.now, kept=False)
        self.event("StoodDown", f"{why}: recovery stands down")

    def resumed(self) -> None:
        self.fresh_epoch(Edge.RESUMED, "resumed after suspension")

    def jobset_restarted(self) -> None:
        st, attempt = self.st, self.s.gang.restart_attempt
        st.restart_attempt = attempt
        st.inplace_used = st.recreate_used = 0
        st.member_failures.clear()
        st.repeats = None  # every pod is made anew: a run of failures starts again
        st.slots = {}  # every pod is made anew: each position holds its own slot again
        self.fresh_epoch(Edge.JOBSET_RESTARTED, f"JobSet restart {attempt}")

    JOBSET_EDGES: Final[Mapping[Edge, Callable[[_Planning], None]]] = {
        Edge.JOBSET_FAILED: jobset_failed,
        Edge.JOBSET_FINISHED: jobset_finished,
        Edge.STOOD_DOWN: stood_down,
        Edge.RESUMED: resumed,
        Edge.JOBSET_RESTARTED: jobset_restarted,
    }
