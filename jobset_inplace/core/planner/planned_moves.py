"""Planned moves in a pass (:mod:`..planned_moves` picks the members and the step): ask how far
the trainers are, pick the step the gang stops at, wait for it to park there (or the
deadline), then move the leaving members in a new epoch."""

from __future__ import annotations

import dataclasses

from jobset_inplace.core.model import Cause, PlannedStop
from jobset_inplace.core.planned_moves import ANSWER_WAIT_S, leaving_members, stop_step
from jobset_inplace.core.planner.base import PlanningPass, first_few
from jobset_inplace.core.statemachine import Edge
from jobset_inplace.times import rfc3339


class PlannedMoves(PlanningPass):
    """The Running phase's planned-stop states (``status.plannedStop``) and the move."""

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
                f"epoch {st.epoch}: {len(members)} member(s) to move ({first_few(list(members))}: "
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
            f"epoch {self.st.epoch}: planned move of {first_few(list(ps.members))} ({why}); "
            f"{rec.in_place} in place, {len(rec.recreated)} recreated",
        )
        self.p.wake_at(self.s.now, rec.deadline)
