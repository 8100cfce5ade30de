"""The Recovering phase: the barrier is closed and waits for every member to report the new
epoch. Failures meanwhile join the recovery; the barrier opens once all have joined, or its
deadline acts on the laggards."""

from __future__ import annotations

from jobset_inplace.core.detection import LEASE_RENEW_INTERVAL_S
from jobset_inplace.core.model import WAITING_SHOWN, Cause, Recovery
from jobset_inplace.core.planner.barrier import Barrier
from jobset_inplace.core.planner.base import IN_PLACE_CAUSES, first_few
from jobset_inplace.core.planner.hot_spares import HotSpares
from jobset_inplace.core.statemachine import Edge

# After a new leader starts, how long its barrier deadlines wait for the agents' reports to
# reach it: an agent sends its record again as soon as its GangState watch shows the new
# channel (well under a second), or, when that channel fails, writes it on its pod after its
# 2 s timeout and one retry.
REPORT_AGAIN_S = 15.0


class Recovering(Barrier, HotSpares):
    """The Recovering phase's edges (``GANG_SEEN`` opens the first epoch like any other)."""

    def recovering(self, causes: dict[str, Cause]) -> None:
        s, st = self.s, self.st
        if st.recovery is None:
            self.gang_seen()
        rec = self.recovery
        if not self.fold_failures(rec, causes):
            return
        # a slot given to a spare now is on the spare's pod: its cause was its old pod's
        on_spare, held = self.swap_spares(rec)
        members = s.gang.ordered
        joined = [
            pod
            for m in members
            if (pod := self.live(m)) is not None
            and pod.reported_epoch == st.epoch
            and pod.uid != rec.recreated.get(m)
            and (m not in causes or m in on_spare)  # still failing: not back yet
            and m not in held  # a spare may take its slot in a moment
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
        elif set(missing) <= held:
            pass  # a spare takes their slots once their old pods are fenced (a wake is set)
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
        shown = first_few(missing)
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
