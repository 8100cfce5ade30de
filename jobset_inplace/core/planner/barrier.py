"""The barrier: its deadline (laggards recreated once, then escalation), the second look at
disputed checkpoint steps, and its opening at the newest step every member has (the stop rule
and goodput's account of the ended epoch first)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from jobset_inplace.core import goodput, no_progress
from jobset_inplace.core.goodput import progress_steps_lost
from jobset_inplace.core.model import HISTORY_LIMIT, Cause, PodView, Recovery, StepRecheck
from jobset_inplace.core.planner.base import PlanningPass, first_few
from jobset_inplace.core.policy import NoCommonCheckpoint
from jobset_inplace.core.statemachine import Edge, EscalationReason
from jobset_inplace.times import rfc3339
from jobset_inplace.trainer.checkpoints import DEFAULT_REPORT_LIMIT

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


class Barrier(PlanningPass):
    """The barrier's deadline, second look and opening."""

    def barrier_deadline(self, rec: Recovery, lagging: list[str]) -> None:
        st = self.st
        names_ = first_few(lagging)
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
            f"({first_few(pending)}): the barrier opens on their first reports",
            warning=True,
        )
        return True

    def barrier_opened(self, rec: Recovery, joined: list[PodView]) -> None:
        st = self.st
        st.step_recheck = None
        forgive_waiting_hangs(rec, st.member_failures)
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
        failed = [
            p.progress_span
            for p in joined
            if p.member in rec.causes and p.progress_span is not None
        ]
        st.goodput = goodput.barrier_opened(st.goodput, rec, spans, own, failed)
        if rec.causes:
            st.history.append(history_entry(rec))
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


def history_entry(rec: Recovery) -> dict[str, object]:
    """A recovery as the GangState's history keeps it once its barrier opened."""
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


def forgive_waiting_hangs(rec: Recovery, member_failures: dict[str, int]) -> None:
    """Take back the counts of a recovery's hung members where another member turned out to
    have failed for another cause after it started (its node declared unhealthy, its agent
    silent, a crash): they were waiting on it (``PlanningPass.waiting_on_a_peer``)."""
    if not rec.hangs_counted:
        return
    hung = [m for m, c in rec.causes.items() if c == Cause.TRAINER_HUNG]
    if len(hung) == len(rec.causes):
        return  # hangs alone: counted
    for member in hung:
        left = member_failures.get(member, 0) - 1
        if left > 0:
            member_failures[member] = left
        else:
            member_failures.pop(member, None)
    rec.hangs_counted = False
