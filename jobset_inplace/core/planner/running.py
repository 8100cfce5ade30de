"""The Running phase: the barrier is open and the gang trains. A pass records the reports and
progress notes, finds stragglers, and takes the edge a failure, a straggler, a manual restart
or a planned move calls for."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from jobset_inplace.core import goodput
from jobset_inplace.core.detection import first_signal
from jobset_inplace.core.model import Cause, PodView
from jobset_inplace.core.planner.base import IN_PLACE_CAUSES
from jobset_inplace.core.planner.hot_spares import HotSpares
from jobset_inplace.core.planner.planned_moves import PlannedMoves
from jobset_inplace.core.policy import StragglerAction
from jobset_inplace.core.statemachine import Edge
from jobset_inplace.core.stragglers import stragglers


class Running(PlannedMoves, HotSpares):
    """The Running phase's edges: a member failed (or straggles), a manual restart, a move."""

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
        waiting = self.waiting_on_a_peer(causes)
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
        rec.hangs_counted = any(
            c == Cause.TRAINER_HUNG and m not in waiting for m, c in decided.items()
        )
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

    def waiting_on_a_peer(self, causes: Mapping[str, Cause]) -> frozenset[str]:
        """The members whose trainer hung while another member failed for another cause in
        the same pass, or sits on a node gone silent (not yet declared unhealthy): a gang whose
        members wait for each other (every data-parallel step ends in a collective) stops
        with a member that went, and the others' hang timeouts can run out first (or at once,
        with a short ``hang-timeout``). Their hang is the gang waiting, not a failure of theirs:
        it does not count toward ``member-repeat-limit`` (nor where the other failure shows
        only later in the recovery: ``forgive_waiting_hangs``)."""
        hung = {m for m, c in causes.items() if c == Cause.TRAINER_HUNG}
        if not hung:
            return frozenset()
        others = [m for m in self.s.gang.members if m not in hung]
        if any(m in causes for m in others) or any(self.silent_node(m) for m in others):
            return frozenset(hung)
        return frozenset()


def _busy_now(pod: PodView, epoch: int) -> bool:
    """Whether ``pod``'s busy windows (and newest step) are of ``epoch``: an agent on the report
    channel leaves its older ones on the pod (unmarked ones were cleared by its reports)."""
    return pod.busy_epoch is None or pod.busy_epoch == epoch


def _main_cause(causes: Mapping[str, Cause]) -> str:
    return Counter(causes.values()).most_common(1)[0][0].value if causes else ""


def _describe(causes: Mapping[str, Cause]) -> str:
    counts = Counter(c.value for c in causes.values())
    first = sorted(causes)[:3]
    more = f" +{len(causes) - 3}" if len(causes) > 3 else ""
    kinds = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
    return f"{kinds} ({', '.join(first)}{more})"
