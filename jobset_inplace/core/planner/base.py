"""One planning pass: the snapshot, the status being built, the plan's actions, and the moves
every state makes (take an edge, charge a budget, escalate, replace a pod, post an Event)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Final

from jobset_inplace import names
from jobset_inplace.core.detection import (
    OUT_OF_SERVICE_TAINT,
    current_pods,
    disruption,
    heartbeats,
    node_state,
    silent,
    silent_for,
    unhealthy_since,
)
from jobset_inplace.core.model import (
    RECREATE_CAUSES,
    WAITING_SHOWN,
    Cause,
    EscalatePod,
    Event,
    Plan,
    PodView,
    Recovery,
    ReplacePod,
    Snapshot,
)
from jobset_inplace.core.policy import ForceDelete, barrier_within_kueue
from jobset_inplace.core.statemachine import (
    IN_PLACE_RESTART_EDGES,
    TRANSITIONS,
    Edge,
    EscalationReason,
    IllegalTransition,
    target,
)

IN_PLACE_CAUSES = frozenset(
    {
        Cause.TRAINER_EXITED,
        Cause.TRAINER_HUNG,
        Cause.RESTARTING,
        Cause.AGENT_WAITING,
        Cause.NOT_READY,
    }
)

# How often an escalation not yet seen on any pod is looked at again (hold_escalation).
ESCALATION_RECHECK_S: Final = 5.0


class PlanningPass:
    """One planning pass: the snapshot, the status being built and the plan's actions.

    Every phase change goes through :meth:`go`; the states' own edges are methods of the
    passes built on this one (:mod:`.running`, :mod:`.recovering`)."""

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
            st.waiting = list(self.s.gang.ordered[:WAITING_SHOWN])
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

    @property
    def recovery(self) -> Recovery:
        rec = self.st.recovery
        if rec is None:  # every edge into Recovering records one; GANG_SEEN makes the first
            raise IllegalTransition(f"phase {self.st.phase} without a recovery record")
        return rec

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

    def live(self, member: str) -> PodView | None:
        pod = self.current.get(member)
        ok = pod is not None and not pod.deleting and pod.phase in ("Pending", "Running")
        return pod if ok else None

    def fresh_epoch(self, edge: Edge, why: str, cause: Cause = Cause.JOBSET_RESTARTED) -> None:
        """A new epoch every member joins (no failure to charge to a budget)."""
        self.go(edge, cause.value, why)
        self.event("EpochStarted", f"epoch {self.st.epoch}: {why}")

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
        """Escalated, JobSet not yet restarted: until a pod of this JobSet attempt is Failed
        with the escalation condition, mark one again. The status is written before the
        actions, so an EscalatePod lost to a crash or an API error after that write, or
        impossible then (no live pod), would otherwise leave the gang waiting for a JobSet
        restart that never comes; and the pod's kubelet, whose own status of a running pod
        says Running, writes that phase back over the Failed one (its periodic reconcile),
        keeping the condition: a Job controller that has not synced meanwhile never counts the
        failure. Looked at again every :data:`ESCALATION_RECHECK_S` until it is seen."""
        s = self.s
        attempt = s.gang.restart_attempt
        if any(p.escalated and p.phase == "Failed" for p in s.pods if p.restart_attempt == attempt):
            return
        self.escalate_through_a_pod()
        self.p.wake_at(s.now, s.now + ESCALATION_RECHECK_S)

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


def first_few(members: list[str], shown: int = 5) -> str:
    """The first few of ``members`` for a message (a gang may have thousands)."""
    return ", ".join(members[:shown]) + (" ..." if len(members) > shown else "")
