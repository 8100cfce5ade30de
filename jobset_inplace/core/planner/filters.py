"""Which failing members a pass acts on: none for its silent node while the cluster looks
disrupted; no silent agent while so many are silent that the channel or the leader is at fault;
a silent agent only where a ready hot spare can take its slot."""

from __future__ import annotations

from jobset_inplace import names
from jobset_inplace.core.detection import (
    DISRUPTION_MIN_UNHEALTHY,
    DISRUPTION_SHARE,
    LEASE_RENEW_INTERVAL_S,
    current_spares,
    silent_for,
)
from jobset_inplace.core.model import Cause
from jobset_inplace.core.planner.base import PlanningPass, first_few
from jobset_inplace.core.spares import SILENT_WITHOUT_SPARE
from jobset_inplace.core.statemachine import Phase


class CauseFilters(PlanningPass):
    """The failures of :func:`~..detection.member_causes` that this pass acts on."""

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
            f"epoch {st.epoch}: {first_few(left)} silent, {why}: left to the node's signals",
            once_key=f"{SILENT_WITHOUT_SPARE}/{st.epoch}",
        )
        self.p.wake_at(s.now, s.now + names.HEARTBEAT_S)  # a spare may be ready by then
        return {m: c for m, c in causes.items() if m not in left}
