"""The recovery planner: a pure function from a :class:`~.model.Snapshot` (one JobSet's
pods, their nodes, the persisted gang status, the time) to a :class:`~.model.Plan` (the next
status, the actions, when to look again). No I/O: the controller's adapters build snapshots
and carry out plans; tests drive it directly.

What is failing and since when is :mod:`.detection`'s; the state machine's phases and edges are
a table (:mod:`.statemachine`); here each edge is one
method of :class:`_Planning`, and every phase change goes through ``_Planning.go``, which refuses
an edge the table does not allow. Besides the gang's plan: :func:`plan_node` (the unhealthy
taint comes off a node that is back) and :func:`refuse_policy` (a JobSet whose annotations do
not parse).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from jobset_inplace import names
from jobset_inplace.core import goodput, no_progress
from jobset_inplace.core.detection import (
    DISRUPTION_MIN_UNHEALTHY,
    DISRUPTION_SHARE,
    LEASE_RENEW_INTERVAL_S,
    OUT_OF_SERVICE_TAINT,
    current_pods,
    current_spares,
    disruption,
    first_signal,
    heartbeats,
    may_untaint,
    member_causes,
    node_state,
    silent,
    silent_for,
    unconfirmed_lease_nodes,
    unhealthy_since,
)
from jobset_inplace.core.gangstate import progress_only, progress_write_interval
from jobset_inplace.core.goodput import progress_steps_lost
from jobset_inplace.core.model import (
    HISTORY_LIMIT,
    RECREATE_CAUSES,
    WAITING_SHOWN,
    Action,
    Cause,
    EscalatePod,
    Event,
    GangSpec,
    NodeView,
    Plan,
    PlannedStop,
    PodView,
    ReadLeases,
    Recovery,
    ReplacePod,
    Snapshot,
    StepRecheck,
    UntaintNode,
)
from jobset_inplace.core.planned_moves import ANSWER_WAIT_S, leaving_members, stop_step
from jobset_inplace.core.policy import (
    ForceDelete,
    NoCommonCheckpoint,
    StragglerAction,
    barrier_within_kueue,
)
from jobset_inplace.core.spares import (
    SILENT_WITHOUT_SPARE,
    SPARE_SHORTFALL,
    SPARE_SWAPPED,
    fenced,
    plan_swaps,
    swapped,
)
from jobset_inplace.core.statemachine import (
    IN_PLACE_RESTART_EDGES,
    TRANSITIONS,
    Edge,
    EscalationReason,
    IllegalTransition,
    Phase,
    StandDownReason,
    target,
)
from jobset_inplace.core.stragglers import stragglers
from jobset_inplace.times import rfc3339
from jobset_inplace.trainer.checkpoints import DEFAULT_REPORT_LIMIT

IN_PLACE_CAUSES = frozenset(
    {
        Cause.TRAINER_EXITED,
        Cause.TRAINER_HUNG,
        Cause.RESTARTING,
        Cause.AGENT_WAITING,
        Cause.NOT_READY,
    }
)
# After a new leader starts, how long its barrier deadlines wait for the agents' reports to
# reach it: an agent sends its record again as soon as its GangState watch shows the new
# channel (well under a second), or, when that channel fails, writes it on its pod after its
# 2 s timeout and one retry.
REPORT_AGAIN_S = 15.0
# How long the barrier waits for the second look at the checkpoint steps (status.stepRecheck):
# an agent answers as soon as its GangState watch shows the ask (well under a second), or on
# its pod after its channel's 2 s timeout; an agent older than the ask never answers.
STEP_RECHECK_S = 5.0
# The most steps one second look names (as many as one report lists; the CRD's maxItems).
STEP_RECHECK_LIMIT = DEFAULT_REPORT_LIMIT


def _asked_to_recheck(pod: PodView, ask: StepRecheck) -> bool:
    """``pod``'s report lacks a step of the second look and does not answer it yet."""
    reported = pod.reported_steps or ()
    return pod.rechecked_epoch != ask.epoch and any(s not in reported for s in ask.steps)


def disputed_steps(pods: list[PodView]) -> tuple[int, ...]:
    """The steps newer than the common one that some of ``pods`` report (so not all), newest
    first, at most STEP_RECHECK_LIMIT: each may be missing from a report only because it was
    made before another member put it in a root they share."""
    common = common_resume_step(pods)
    steps = {s for pod in pods for s in pod.reported_steps or () if common is None or s > common}
    return tuple(sorted(steps, reverse=True)[:STEP_RECHECK_LIMIT])


def common_resume_step(pods: Iterable[PodView]) -> int | None:
    """The newest checkpoint step every member reports (None: no common step)."""
    common: set[int] | None = None
    for pod in pods:
        steps = set(pod.reported_steps or ())
        common = steps if common is None else common & steps
    return max(common) if common else None


# --- planning ---------------------------------------------------------------------------------
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


# How often an escalation not yet seen on any pod is looked at again (hold_escalation).
ESCALATION_RECHECK_S: Final = 5.0

# Phases in which only a JobSet-level transition can happen.
WAITING_FOR_JOBSET = frozenset({Phase.ESCALATED, Phase.STOOD_DOWN, Phase.FAILED})


class _Planning:
    """One planning pass: the snapshot, the status being built and the plan's actions.

    :meth:`run` picks the transition; each edge of :data:`~.statemachine.TRANSITIONS` has one
    method here named after it, and every phase change goes through :meth:`go`."""

    def __init__(self, s: Snapshot) -> None:
        self.s = s
        self.st = copy.deepcopy(s.status)
        self.p = Plan(self.st)
        self.current = current_pods(s)

    @property
    def recovery_timeout(self) -> float | None:
        """Kueue's waitForPodsReady.recoveryTimeout for this gang, if Kueue manages it."""
        return self.s.policy.kueue_recovery_timeout_s or self.s.gang.kueue_recovery_timeout_s

    @property
    def barrier_timeout(self) -> float:
        """The barrier deadline, kept inside Kueue's recoveryTimeout: the ladder can take two
        deadlines (laggards recreated once), which must fit in 80% of it."""
        return barrier_within_kueue(self.s.policy.barrier_timeout_s, self.recovery_timeout)

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
        if s.policy.force_delete != ForceDelete.UNREACHABLE or self.disrupted is not None:
            return
        current = {pod.uid for pod in self.current.values()}
        for pod in s.pods:
            if not pod.deleting or pod.uid in current:
                continue
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

    # -- what every pass records --
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
            f"to the report channel {endpoint.url} ({_some(members)}); acted on all the same. "
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

    @functools.cached_property
    def disrupted(self) -> tuple[int, int] | None:
        return disruption(self.s)

    def silent_node(self, member: str) -> bool:
        """Whether ``member``'s node is silent and no operator declared it out of service."""
        pod = self.current.get(member)
        node = self.s.nodes.get(pod.node or "") if pod is not None else None
        return (
            node is not None
            and silent(node, self.s.now, self.s.leases_observed_since)
            and not any(key == OUT_OF_SERVICE_TAINT for key, _ in node.taints)
        )

    def unless_disrupted(self, causes: dict[str, Cause]) -> dict[str, Cause]:
        """``causes`` without the failures of silent nodes while the cluster looks disrupted
        (then look again a renew interval later)."""
        d = self.disrupted
        if d is None:
            return causes
        self.event(
            "NodeDisruption",
            f"{d[0]} of {d[1]} nodes unhealthy at once: no pod is replaced for its node until "
            "they recover (a control-plane or network outage looks like this)",
            warning=True,
            once_key=f"NodeDisruption/{self.st.epoch}",
        )
        self.p.wake_at(self.s.now, self.s.now + LEASE_RENEW_INTERVAL_S)
        return {
            m: c for m, c in causes.items() if c != Cause.NODE_UNHEALTHY or not self.silent_node(m)
        }

    def unless_all_silent(self, causes: dict[str, Cause]) -> dict[str, Cause]:
        """``causes`` without the silent agents' when so many are silent at once that the
        channel or this leader is at fault, not their pods (the node rule's shares): their
        leases stop their trainers meanwhile, and nothing is given away on a guess."""
        silent = [m for m, c in causes.items() if c == Cause.AGENT_SILENT]
        members = len(self.s.gang.members)
        if len(silent) < DISRUPTION_MIN_UNHEALTHY or len(silent) < DISRUPTION_SHARE * members:
            return causes
        self.event(
            "AgentsSilent",
            f"{len(silent)} of {members} members' agents silent at once: no slot is given "
            "away for it (is the report channel reachable, is this leader overloaded?)",
            warning=True,
            once_key=f"AgentsSilent/{self.st.epoch}",
        )
        return {m: c for m, c in causes.items() if c != Cause.AGENT_SILENT}

    def only_where_a_spare_waits(self, causes: dict[str, Cause]) -> dict[str, Cause]:
        """A silent agent is a suspicion: for its first seconds a slow agent (or a busy
        leader) looks like a dead node. It is acted on only for as many silent members as
        ready spares can take (longest silent first), where a swap saves the replacement pod's
        whole start; the others are left to their nodes' signals, as without spares (their
        Job's new pod would wait for the old one to be fenced anyway, and a false suspicion
        would cost a healthy member its pod and the gang its recreate budget). Never in a
        fresh epoch (the gang starting, or after a JobSet restart): nothing trains yet that a
        swap would bring back sooner, and every agent starts at once then."""
        s, st = self.s, self.st
        rec = st.recovery if st.phase == Phase.RECOVERING else None
        decided = rec.recreated if rec is not None else {}
        silent = [m for m, c in causes.items() if c == Cause.AGENT_SILENT and m not in decided]
        if not silent:
            return causes
        taken = set(decided.values())
        ready = [p for p in current_spares(s).values() if self.ready_pod(p) and p.uid not in taken]
        awaiting = [
            m
            for m, uid in decided.items()
            if (pod := self.current.get(m)) is None or pod.uid == uid
        ]
        fresh = rec is not None and not rec.causes
        room = 0 if fresh else max(0, len(ready) - len(awaiting))
        longest = sorted(silent, key=lambda m: (-silent_for(s, self.current[m]), m))
        left = longest[room:]
        if not left:
            return causes
        why = (
            "the gang is starting"
            if fresh
            else f"no hot spare ready to take {'its slot' if len(left) == 1 else 'their slots'}"
        )
        self.event(
            SILENT_WITHOUT_SPARE,
            f"epoch {st.epoch}: {_some(left)} silent, {why}: left to the node's signals",
            once_key=f"{SILENT_WITHOUT_SPARE}/{st.epoch}",
        )
        self.p.wake_at(s.now, s.now + names.HEARTBEAT_S)  # a spare may be ready by then
        return {m: c for m, c in causes.items() if m not in left}

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

    # -- the one way the phase changes --
    def go(
        self,
        edge: Edge,
        reason: str,
        message: str = "",
        *,
        causes: Mapping[str, Cause] | None = None,
    ) -> None:
        """Take ``edge``: the phase the table says (refusing an edge it does not allow from
        here) and, for an edge that opens an epoch, epoch E+1 with a closed barrier and a new
        recovery record (``causes``: the failing members, none for a fresh epoch)."""
        st = self.st
        phase = target(edge, st.phase)
        if TRANSITIONS[edge].new_epoch:
            st.epoch += 1
            st.barrier_open = False
            st.resume_step = None
            st.straggler_hold_step = None
            st.planned_stop = None  # a new epoch (a failure's too) ends a planned stop
            st.step_recheck = None
            # nobody has reported the new epoch yet: the old one's counts are not written
            # with it (they would stand until the counts' next write)
            st.reported = st.on_pod = 0
            st.waiting = sorted(self.s.gang.members)[:WAITING_SHOWN]
            st.recovery = Recovery(
                epoch=st.epoch,
                started=self.s.now,
                deadline=self.s.now + self.barrier_timeout,
                causes=dict(causes or {}),
                # a failure's recovery restarts every member in place but the replaced ones
                in_place=len(self.s.gang.members) if causes else 0,
                opened_by=edge,
            )
        if edge in IN_PLACE_RESTART_EDGES:
            st.in_place_restarts += 1
        st.phase, st.reason, st.message = phase, reason, message
        self.p.edges.append(edge)

    # -- JobSet-level edges --
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

    def fresh_epoch(self, edge: Edge, why: str, cause: Cause = Cause.JOBSET_RESTARTED) -> None:
        """A new epoch every member joins (no failure to charge to a budget)."""
        self.go(edge, cause.value, why)
        self.event("EpochStarted", f"epoch {self.st.epoch}: {why}")

    # -- Running --
    def running(self, causes: dict[str, Cause]) -> None:
        st, request = self.st, self.s.gang.restart_request
        st.reported = sum(1 for p in self.current.values() if p.reported_epoch == st.epoch)
        st.waiting = []
        st.goodput = goodput.with_notes(st.goodput, self.s.progress_noted)
        slow = self.find_stragglers()
        if not slow:
            st.straggler_hold_step = None
        if causes:
            self.member_failed(causes)
        elif (
            slow
            and self.s.policy.straggler_action == StragglerAction.RECREATE
            and self.checkpointed_since_stragglers_found()
        ):
            self.member_failed(dict.fromkeys(slow, Cause.STRAGGLER))
        elif request and request != st.restart_request:
            st.restart_request = request
            self.fresh_epoch(
                Edge.MANUAL_RESTART, f"manual restart ({request})", Cause.MANUAL_RESTART
            )
        else:
            self.planned_move()

    # -- planned moves (core/planned_moves.py) --
    def planned_move(self) -> None:
        """Members on nodes being drained (or holding devices tainted NoSchedule): ask how far
        the trainers are, pick the step they
        stop at, wait for them to park there (or the deadline), then move those members."""
        s, st, policy = self.s, self.st, self.s.policy
        ps = st.planned_stop
        if ps is None:
            leaving = (
                leaving_members(s.nodes, self.current, s.devices_leaving)
                if policy.planned_moves
                else {}
            )
            if not leaving:
                return
            members = tuple(sorted(leaving))
            why = "; ".join(sorted(set(leaving.values())))
            deadline = s.now + policy.planned_move_timeout_s
            st.planned_stop = PlannedStop(st.epoch, members, why, s.now, deadline)
            self.event(
                "PlannedMove",
                f"epoch {st.epoch}: {len(members)} member(s) to move ({_some(list(members))}: "
                f"{why}); the gang stops at one step first, the move happens by "
                f"{rfc3339(deadline)} at the latest",
            )
            self.p.wake_at(s.now, s.now + ANSWER_WAIT_S)
            return
        if ps.step is None:
            self.planned_stop_step(ps)
            return
        parked = [p for p in self.current.values() if p.parked_in_epoch == st.epoch]
        if len(parked) == len(s.gang.members):
            self.start_planned_move(ps, f"every trainer stopped at step {ps.step}")
        elif s.now >= ps.deadline:
            self.start_planned_move(
                ps,
                f"planned-move-timeout: {len(parked)} of {len(s.gang.members)} member(s) "
                f"stopped at step {ps.step}",
            )
        else:
            self.p.wake_at(s.now, ps.deadline)

    def planned_stop_step(self, ps: PlannedStop) -> None:
        """Every agent said how far its trainers are: the gang stops a little ahead."""
        s, st = self.s, self.st
        answers = {
            m: p.progress_now[1]
            for m, p in self.current.items()
            if p.progress_now is not None and p.progress_now[0] == st.epoch
        }
        if len(answers) < len(s.gang.members):
            if s.now >= ps.requested + ANSWER_WAIT_S:
                self.start_planned_move(ps, f"{len(answers)} member(s) answered in time")
            else:
                self.p.wake_at(s.now, ps.requested + ANSWER_WAIT_S)
            return
        step = stop_step((span for span in answers.values() if span is not None), s.now)
        if step is None:
            self.start_planned_move(ps, "no trainer reports progress")
            return
        st.planned_stop = dataclasses.replace(ps, step=step)
        self.event("PlannedStop", f"epoch {st.epoch}: every trainer stops at step {step}")
        self.p.wake_at(s.now, ps.deadline)

    def start_planned_move(self, ps: PlannedStop, why: str) -> None:
        """The move: a new epoch in which the leaving members get new pods (their nodes take no
        new ones) and the others restart in place; no budget charged."""
        decided = dict.fromkeys(ps.members, Cause.PLANNED_MOVE)
        self.go(Edge.PLANNED_MOVE, Cause.PLANNED_MOVE.value, ps.reason, causes=decided)
        rec = self.recovery
        for member in ps.members:
            pod = self.current.get(member)
            self.mark_recreated(rec, member, pod.uid if pod else "", Cause.PLANNED_MOVE)
            if pod is not None:
                self.replace(pod, Cause.PLANNED_MOVE)
        self.event(
            "RecoveryStarted",
            f"epoch {self.st.epoch}: planned move of {_some(list(ps.members))} ({why}); "
            f"{rec.in_place} in place, {len(rec.recreated)} recreated",
        )
        self.p.wake_at(self.s.now, rec.deadline)

    def find_stragglers(self) -> dict[str, float]:
        """The members slower than the gang in the running epoch (status and Events); {} with
        straggler detection off."""
        st, policy = self.st, self.s.policy
        found: dict[str, float] = {}
        if policy.straggler_factor is not None and st.barrier_open:
            busy = {
                m: p.busy_ms
                for m, p in self.current.items()
                if p.reported_epoch == st.epoch and p.busy_ms and _busy_now(p, st.epoch)
            }
            found = stragglers(busy, policy.straggler_factor, policy.straggler_windows)
        for member in sorted(set(found) - set(st.stragglers)):
            self.event(
                "StragglerDetected",
                f"member {member}: busy time per step {found[member]:g}x the gang's median for "
                f"{policy.straggler_windows} windows of {policy.straggler_window_s:g}s",
                warning=True,
                once_key=f"Straggler/{st.epoch}/{member}",
            )
        st.stragglers = found
        return found

    def checkpointed_since_stragglers_found(self) -> bool:
        """straggler-action recreate replaces at the gang's next checkpoint, so that the
        replacement loses (almost) no progress: the first pass records the gang's newest common
        checkpoint (the minimum of the members' newest, published with their busy windows);
        the stragglers go once every member has a newer one. A gang whose agents publish no
        newest step (no checkpoint seen) gives no such signal: replaced at once."""
        st = self.st
        newest = [
            p.newest_step if _busy_now(p, st.epoch) else None
            for p in self.current.values()
            if p.reported_epoch == st.epoch
        ]
        if len(newest) < len(self.s.gang.members) or None in newest:
            return True
        common = min(n for n in newest if n is not None)
        if st.straggler_hold_step is None:
            st.straggler_hold_step = common
            self.event(
                "StragglerReplacementPending",
                f"replacing {', '.join(sorted(st.stragglers))} after the gang's next "
                f"checkpoint (every member past step {common})",
                once_key=f"StragglerPending/{st.epoch}",
            )
            return False
        return common > st.straggler_hold_step

    def member_failed(self, causes: dict[str, Cause]) -> None:
        s, st, policy = self.s, self.st, self.s.policy
        waiting = self.waiting_on_a_silent_peer(causes)
        decided = {
            m: Cause.REPEATED_FAILURE
            if c in IN_PLACE_CAUSES
            and m not in waiting
            and st.member_failures.get(m, 0) + 1 >= policy.member_repeat_limit
            else c
            for m, c in causes.items()
        }
        replaced = {m: c for m, c in decided.items() if c not in IN_PLACE_CAUSES}
        if not self.charge(inplace=1, recreate=len(replaced)):
            return
        for member in s.gang.members:
            if member in waiting:
                continue  # not its failure: neither counted nor forgiven
            if decided.get(member) in IN_PLACE_CAUSES:
                st.member_failures[member] = st.member_failures.get(member, 0) + 1
            else:
                st.member_failures.pop(member, None)
        self.go(Edge.MEMBER_FAILED, _main_cause(decided), causes=decided)
        rec = self.recovery
        rec.first_signal, rec.first_signal_at, rec.signal_window = first_signal(
            s, self.current, causes
        )
        for member, cause in sorted(replaced.items()):
            pod = self.current.get(member)
            self.mark_recreated(rec, member, pod.uid if pod else "", cause)
            if pod is not None:
                self.replace(pod, cause)
        self.event(
            "RecoveryStarted",
            f"epoch {st.epoch}: {_describe(decided)}; {rec.in_place} in place, "
            f"{len(rec.recreated)} recreated",
        )
        self.swap_spares(rec)
        self.p.wake_at(s.now, rec.deadline)

    def waiting_on_a_silent_peer(self, causes: Mapping[str, Cause]) -> frozenset[str]:
        """The members whose trainer hung while another member's node is silent (not yet
        declared unhealthy): a gang whose members wait for each other (every data-parallel
        step ends in a collective) stops with a member whose node went, and the others' hang
        timeouts can run out first. Their hang is the gang waiting, not a failure of theirs:
        it does not count toward ``member-repeat-limit``."""
        hung = {m for m, c in causes.items() if c == Cause.TRAINER_HUNG}
        if hung and any(self.silent_node(m) for m in self.s.gang.members if m not in hung):
            return frozenset(hung)
        return frozenset()

    # -- Recovering --
    @property
    def recovery(self) -> Recovery:
        rec = self.st.recovery
        if rec is None:  # every edge into Recovering records one; GANG_SEEN makes the first
            raise IllegalTransition(f"phase {self.st.phase} without a recovery record")
        return rec

    def recovering(self, causes: dict[str, Cause]) -> None:
        s, st = self.s, self.st
        if st.recovery is None:
            self.gang_seen()
        rec = self.recovery
        if not self.fold_failures(rec, causes):
            return
        self.swap_spares(rec)
        members = sorted(s.gang.members)
        joined = [
            pod
            for m in members
            if (pod := self.live(m)) is not None
            and pod.reported_epoch == st.epoch
            and pod.uid != rec.recreated.get(m)
            and m not in causes  # still failing: not back yet
        ]
        st.reported = len(joined)
        back = {p.member for p in joined}
        missing = [m for m in members if m not in back]
        st.waiting = missing[:WAITING_SHOWN]
        if not missing:
            if self.steps_settled(joined):
                self.barrier_opened(rec, joined)
        elif not rec.causes:  # a fresh epoch (start, JobSet restart, resume): nothing failed
            self.fresh_epoch_waits(rec, missing)
        elif s.now < rec.deadline:
            self.p.wake_at(s.now, rec.deadline)
        elif s.now < (heard := s.reports_since + REPORT_AGAIN_S):
            # a new leader: members that reported to the one before send again first, and
            # none of them is recreated for not having reported to this one (guarantee 6)
            self.p.wake_at(s.now, heard)
        elif self.disrupted is not None:  # laggards on silent nodes: no replacement on a guess
            self.p.wake_at(s.now, s.now + LEASE_RENEW_INTERVAL_S)
        else:
            self.barrier_deadline(rec, missing)

    def fresh_epoch_waits(self, rec: Recovery, missing: list[str]) -> None:
        """Pods of a fresh epoch are still being made: wait, with no deadline to act on (nothing
        failed), but never silently: past the barrier timeout, say who has not reported."""
        s = self.s
        if s.now < rec.deadline:
            self.p.wake_at(s.now, rec.deadline)
            return
        shown = _some(missing)
        message = (
            f"epoch {self.st.epoch}: {len(missing)} member(s) have not reported after "
            f"{self.barrier_timeout:.0f}s ({shown}): are their pods scheduled, and may their "
            "agents report (their ServiceAccount's RBAC, the agent's log)?"
        )
        # constant in the status (each change is a write every agent's watch receives)
        self.st.message = "members have not reported: see the MembersNotReporting Event"
        self.event(
            "MembersNotReporting", message, warning=True, once_key=f"NotReporting/{rec.epoch}"
        )

    def gang_seen(self) -> None:
        """First look at a gang: epoch 1 opens like any other (the status starts Recovering)."""
        s, st = self.s, self.st
        self.go(Edge.GANG_SEEN, st.reason, st.message)
        st.recovery = Recovery(
            st.epoch, s.now, s.now + self.barrier_timeout, opened_by=Edge.GANG_SEEN
        )

    def fold_failures(self, rec: Recovery, causes: dict[str, Cause]) -> bool:
        """Failures while the barrier waits join this recovery: members restarting in place
        rejoin the same epoch; a member whose (new) pod fails again gets another pod.
        False when that escalated."""
        for member, cause in sorted(causes.items()):
            pod = self.current.get(member)
            uid = pod.uid if pod else ""
            if cause in IN_PLACE_CAUSES:
                continue
            if not rec.causes and cause in (Cause.POD_DELETED, Cause.POD_FAILED):
                continue  # a fresh epoch: JobSet is still making (or remaking) its pods
            if pod is None and member not in rec.recreated:
                # No pod at all: its Job is making one (a gang still starting up, or a pod
                # that vanished). Nothing to replace or charge; the barrier waits for it and
                # its deadline bounds the wait.
                continue
            recorded = rec.recreated.get(member)
            if recorded is not None and (pod is None or recorded in ("", uid)):
                # Already decided (and charged): repeat the replacement, which is idempotent,
                # in case the last pass stopped (a crash) before carrying it out.
                if pod is not None:
                    self.replace(pod, cause)
                continue
            if not self.charge(recreate=1):
                return False
            self.go(Edge.FAILURE_WHILE_WAITING, self.st.reason, self.st.message)
            self.mark_recreated(rec, member, uid, cause)
            if pod is not None:
                self.replace(pod, cause)
            self.event(
                "RecoveryExtended", f"epoch {self.st.epoch}: {member} {cause.value}, recreated"
            )
        return True

    # -- hot spares (core/spares.py) --
    def swap_spares(self, rec: Recovery) -> None:
        """Members of this recovery that get a new pod take a ready spare's instead of waiting
        for their Job's (scheduling, image pull, start): the slot is given to the spare's
        position once the old pod is fenced (it cannot be training any more: gone, terminal,
        or force-deleted on a silent node). A member already on a Ready pod that is not the
        replaced one keeps it; one with no spare ready waits for its Job's new pod, as
        without spares (the shortfall is said once per epoch)."""
        s, st = self.s, self.st
        if not s.gang.spares:
            return
        by_uid = {pod.uid: pod for pod in s.pods}
        force = s.policy.force_delete == ForceDelete.UNREACHABLE
        lease_end = names.LEASE_S + names.FENCE_MARGIN_S
        wanting, avoid = [], set()
        for member, old_uid in sorted(rec.recreated.items()):
            pod = self.current.get(member)
            if pod is not None and pod.uid != old_uid and self.ready_pod(pod):
                continue  # on a new pod already (a spare, or its Job's replacement)
            old = by_uid.get(old_uid)
            dead = rec.causes.get(member) == Cause.NODE_UNHEALTHY
            if old is not None and old.node:
                avoid.add(old.node)
            if heartbeats(s) and old_uid in s.silent:
                # its agent held a lease: the slot moves once the lease has surely ended,
                # whatever became of the pod (deleted by force, or not)
                quiet = s.silent[old_uid]
                if quiet >= lease_end:
                    wanting.append(member)
                else:
                    self.p.wake_at(s.now, s.now + lease_end - quiet)
            elif fenced(None if old is None else old.phase, force_deleted=force and dead):
                wanting.append(member)
        if not wanting:
            return
        taken = set(rec.recreated.values())
        ready = [p for p in current_spares(s).values() if self.ready_pod(p) and p.uid not in taken]
        swaps, short = plan_swaps(wanting, ready, frozenset(avoid))
        for slot, spare in swaps:
            st.slots = swapped(st.slots, slot, spare.member)
            self.current[slot] = dataclasses.replace(spare, member=slot)
            self.event(
                SPARE_SWAPPED,
                f"epoch {st.epoch}: {slot} continues on hot spare {spare.name} (position "
                f"{spare.member}, node {spare.node}); its old pod is replaced as a spare",
            )
        if short:
            self.event(
                SPARE_SHORTFALL,
                f"epoch {st.epoch}: no hot spare ready for {_some(short)}: waiting for "
                "their Jobs' new pods",
                once_key=f"SpareShortfall/{st.epoch}",
            )

    def move_spares(self) -> None:
        """Spares on a node that is dead, or being drained (its device tainted to move): no
        one else moves them (the disruption budget counts them, and a silent node's pod is
        never deleted by its kubelet), and a spare holds no training: its pod is replaced at
        once (force-deleted on a dead node, as a member's would be) and its Job makes a new
        spare elsewhere."""
        s = self.s
        if not s.gang.spares:
            return
        leaving = leaving_members(s.nodes, current_spares(s), s.devices_leaving)
        for position, pod in sorted(current_spares(s).items()):
            if pod.phase in ("Failed", "Succeeded"):
                continue  # its Job makes a new one by itself
            node = s.nodes.get(pod.node or "")
            dead, _ = node_state(node, s.policy, s.now, s.leases_observed_since)
            if dead and self.disrupted is None:
                cause = Cause.NODE_UNHEALTHY
            elif position in leaving:
                cause = Cause.PLANNED_MOVE
            else:
                continue
            if pod.deleting and cause != Cause.NODE_UNHEALTHY:
                continue
            self.replace(pod, cause)
            self.event(
                "SpareMoved",
                f"hot spare {pod.name} ({position}) on node {pod.node}: "
                f"{'the node is unhealthy' if dead else leaving[position]}; replaced",
                once_key=f"SpareMoved/{pod.uid}",
            )

    def ready_pod(self, pod: PodView) -> bool:
        """Running and Ready, not being deleted, on a node that is healthy and staying."""
        s = self.s
        node = s.nodes.get(pod.node or "")
        return (
            pod.phase == "Running"
            and not pod.deleting
            and pod.not_ready_since is None
            and not pod.escalated
            and (not heartbeats(s) or silent_for(s, pod) < names.SILENT_AFTER_S)
            and node is not None
            and not node.leaving
            and not node_state(node, s.policy, s.now, s.leases_observed_since)[0]
        )

    def barrier_deadline(self, rec: Recovery, lagging: list[str]) -> None:
        st = self.st
        names_ = _some(lagging)
        if rec.deadline_extended:
            self.escalate(
                EscalationReason.BARRIER_TIMEOUT,
                f"epoch {st.epoch}: {len(lagging)} member(s) never joined ({names_})",
            )
            return
        live = [pod for m in lagging if (pod := self.live(m)) is not None]
        if not self.charge(
            recreate=len(live), what=f"barrier timeout needs {len(live)} more recreations"
        ):
            return
        self.go(Edge.BARRIER_DEADLINE, st.reason, st.message)
        for pod in live:
            self.mark_recreated(rec, pod.member, pod.uid, Cause.BARRIER_TIMEOUT)
            self.replace(pod, Cause.BARRIER_TIMEOUT)
        rec.deadline_extended = True
        rec.deadline = self.s.now + self.barrier_timeout
        self.event(
            "BarrierTimeout",
            f"epoch {st.epoch}: {len(lagging)} member(s) did not join in time ({names_}); "
            f"{len(live)} recreated",
            warning=True,
        )
        self.p.wake_at(self.s.now, rec.deadline)

    def steps_settled(self, joined: list[PodView]) -> bool:
        """Whether the barrier may open on the reports of ``joined`` (every member). Where one
        member reports a step some others do not, their reports may be from before it was
        there: a member whose trainer stopped first reports at once what a root they share
        held, and the others' trainers keep their interrupted step after. So once per epoch
        those members are asked to look again (status.stepRecheck), each member lacking any
        of those steps (one killed past a local checkpoint the others never reached lacks the
        step they kept; they lack its local one); their answers, made after every member's
        trainer stopped, or the ask's deadline settle it."""
        s, st = self.s, self.st
        ask = st.step_recheck
        if ask is None or ask.epoch != st.epoch:
            disputed = disputed_steps(joined)
            if not disputed:
                return True
            ask = st.step_recheck = StepRecheck(st.epoch, disputed, s.now + STEP_RECHECK_S)
        pending = [pod.member for pod in joined if _asked_to_recheck(pod, ask)]
        if not pending:
            return True
        if s.now < ask.deadline:
            self.p.wake_at(s.now, ask.deadline)
            return False
        self.event(
            "StepRecheckTimeout",
            f"epoch {st.epoch}: {len(pending)} member(s) did not look again for steps "
            f"[{','.join(map(str, ask.steps))}] within {STEP_RECHECK_S:g}s "
            f"({_some(pending)}): the barrier opens on their first reports",
            warning=True,
        )
        return True

    def barrier_opened(self, rec: Recovery, joined: list[PodView]) -> None:
        st = self.st
        st.step_recheck = None
        step = common_resume_step(joined)
        # The stop rule first: a failure that keeps coming back is the cause to name, also
        # where its repeats got a member recreated without the checkpoints the others have.
        if rec.causes:  # a failure's recovery: the stop rule learns how far its epoch got
            st.repeats = no_progress.observe(
                st.repeats, no_progress.signature(rec), no_progress.furthest_step(joined, step)
            )
            if no_progress.stop(st.repeats, self.s.policy.no_progress_limit):
                r = st.repeats
                assert r is not None
                self.escalate(
                    EscalationReason.NO_PROGRESS,
                    f"epoch {st.epoch}: the same failure ({r.signature}) {r.count} times in a "
                    f"row, the gang never past step {r.furthest}",
                )
                return
        no_common = step is None and any(pod.reported_steps for pod in joined)
        if no_common and self.s.policy.no_common_checkpoint == NoCommonCheckpoint.ESCALATE:
            self.escalate(
                EscalationReason.NO_COMMON_CHECKPOINT,
                f"epoch {st.epoch}: no checkpoint step is available to every member",
            )
            return
        self.go(Edge.BARRIER_OPENED, "BarrierOpen")
        st.barrier_open = True
        st.resume_step = step
        rec.opened = self.s.now
        rec.resume_step = step
        rec.progress_lost = progress_steps_lost(joined, step)
        spans = goodput.epoch_spans(joined, self.s.progress_noted, st.goodput)
        own = [p.progress_span for p in joined if p.progress_span is not None]
        st.goodput = goodput.barrier_opened(st.goodput, rec, spans, own)
        if rec.causes:
            st.history.append(_summary(rec))
            del st.history[:-HISTORY_LIMIT]
        where = "from scratch" if step is None else f"at step {step}"
        if rec.causes:
            detected = "" if rec.detection is None else f" (detected in {rec.detection:.1f}s)"
            redo = "" if rec.progress_lost is None else f"; {rec.progress_lost} step(s) to redo"
            how = (
                f"{rec.duration or 0.0:.1f}s after the first signal{detected}; "
                f"{rec.in_place} in place, {len(rec.recreated)} recreated{redo}"
            )
        else:
            how = f"all {len(joined)} members joined"
        self.event("BarrierOpened", f"epoch {st.epoch}: resume {where}; {how}")

    # -- escalation and budgets --
    def charge(self, *, inplace: int = 0, recreate: int = 0, what: str = "") -> bool:
        """Charge a recovery to the budgets; when one would be exceeded, escalate instead."""
        st, policy = self.st, self.s.policy
        if inplace and st.inplace_used + inplace > policy.inplace_budget:
            self.escalate(
                EscalationReason.INPLACE_BUDGET,
                f"in-place budget of {policy.inplace_budget} recoveries used up",
            )
            return False
        if st.recreate_used + recreate > policy.recreate_budget:
            self.escalate(
                EscalationReason.RECREATE_BUDGET,
                what or f"recreate budget of {policy.recreate_budget} pods used up",
            )
            return False
        st.inplace_used += inplace
        st.recreate_used += recreate
        return True

    def escalate(self, reason: EscalationReason, message: str) -> None:
        self.go(Edge.ESCALATED, reason, message)
        self.st.barrier_open = False
        self.escalate_through_a_pod()
        self.event("Escalated", f"{reason}: {message}; restarting the JobSet", warning=True)

    def escalate_through_a_pod(self) -> None:
        """Mark the first live member's pod with the escalation condition (none when no member
        has a live pod: :meth:`hold_escalation` tries again once one has)."""
        live = [pod for m in sorted(self.current) if (pod := self.live(m)) is not None]
        if live:
            message = f"{self.st.reason}: {self.st.message}"
            self.p.actions.append(EscalatePod(live[0].name, live[0].uid, message))

    def hold_escalation(self) -> None:
        """Escalated, JobSet not yet restarted: until a pod of this JobSet attempt carries the
        escalation condition, mark one again. The status is written before the actions, so an
        EscalatePod lost to a crash or an API error after that write, or impossible then (no
        live pod), would otherwise leave the gang waiting for a JobSet restart that never
        comes. Looked at again every :data:`ESCALATION_RECHECK_S` until it is seen."""
        s = self.s
        if any(p.escalated for p in s.pods if p.restart_attempt == s.gang.restart_attempt):
            return
        self.escalate_through_a_pod()
        self.p.wake_at(s.now, s.now + ESCALATION_RECHECK_S)

    # -- helpers --
    def event(
        self, reason: str, message: str, *, warning: bool = False, once_key: str | None = None
    ) -> None:
        """Post an Event; one with a ``once_key`` only if none with that key was posted."""
        if once_key is None or once_key not in self.s.posted:
            self.p.actions.append(Event(reason, message, warning, once_key))

    def mark_recreated(self, rec: Recovery, member: str, uid: str, cause: Cause) -> None:
        """Record that ``member`` gets a new pod in this recovery (its pod ``uid`` replaced)."""
        if member not in rec.recreated:
            rec.in_place -= 1
        rec.recreated[member] = uid
        rec.causes.setdefault(member, cause)

    def replace(self, pod: PodView, cause: Cause) -> None:
        """Replace ``pod`` for ``cause`` (if the cause calls for a new pod and it is not being
        deleted already, but on a dead node: its deletion would never end there)."""
        dead = cause == Cause.NODE_UNHEALTHY
        if cause not in RECREATE_CAUSES or (pod.deleting and not dead):
            return
        unreachable = self.s.policy.force_delete == ForceDelete.UNREACHABLE
        # A straggler's node is slow: taint it as a failed device's (removed by people).
        device = cause == Cause.STRAGGLER or (
            cause == Cause.DEVICE_UNHEALTHY and self.s.policy.taint_on_device_fault
        )
        node = self.s.nodes.get(pod.node or "")
        self.p.actions.append(
            ReplacePod(
                pod.name,
                pod.uid,
                pod.member,
                cause,
                fail_first=dead and unreachable,
                taint_node=pod.node if dead or device else None,
                taint_key=names.UNHEALTHY_TAINT if dead else names.DEVICE_UNHEALTHY_TAINT,
                failed_since=unhealthy_since(
                    node, self.s.policy, self.s.now, self.s.leases_observed_since
                )
                if node and dead
                else None,
            )
        )

    def live(self, member: str) -> PodView | None:
        pod = self.current.get(member)
        ok = pod is not None and not pod.deleting and pod.phase in ("Pending", "Running")
        return pod if ok else None


def _busy_now(pod: PodView, epoch: int) -> bool:
    """Whether ``pod``'s busy windows (and newest step) are of ``epoch``: an agent on the report
    channel leaves its older ones on the pod (unmarked ones were cleared by its reports)."""
    return pod.busy_epoch is None or pod.busy_epoch == epoch


def _some(members: list[str], shown: int = 5) -> str:
    """The first few of ``members`` for a message (a gang may have thousands)."""
    return ", ".join(members[:shown]) + (" ..." if len(members) > shown else "")


def _main_cause(causes: Mapping[str, Cause]) -> str:
    return Counter(causes.values()).most_common(1)[0][0].value if causes else ""


def _describe(causes: Mapping[str, Cause]) -> str:
    counts = Counter(c.value for c in causes.values())
    first = sorted(causes)[:3]
    more = f" +{len(causes) - 3}" if len(causes) > 3 else ""
    kinds = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
    return f"{kinds} ({', '.join(first)}{more})"


def _summary(rec: Recovery) -> dict[str, object]:
    return {
        "epoch": rec.epoch,
        "causes": dict(Counter(c.value for c in rec.causes.values())),
        "inPlace": rec.in_place,
        "recreated": len(rec.recreated),
        "startedAt": rfc3339(rec.started),
        "openedAt": rfc3339(rec.opened),
        "durationSeconds": rec.duration,
        "resumeStep": rec.resume_step,
        "progressStepsLost": rec.progress_lost,
    }
