"""Failure detection, free of I/O: whether a member's node is unhealthy (Ready, its Lease, taints,
conditions, each for the configured time), each failing member's cause and first signal, and
whether so many nodes are silent at once that replacing anything would be a guess (a
disruption). The planner (:mod:`.planner`) decides what to do about them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jobset_inplace import names
from jobset_inplace.core.model import Cause, NodeView, PodView, Snapshot
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.spares import Slots, moved_positions, spares, valid_slots
from jobset_inplace.core.statemachine import Phase

# The kubelet renews its node Lease every 10 s; a Lease older than this is a missed renewal.
LEASE_RENEW_INTERVAL_S = 10.0
# Taints that always mean the node's pods cannot run (besides the configured ones).
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
BUILTIN_UNHEALTHY_TAINTS = frozenset(
    {UNREACHABLE_TAINT, "node.kubernetes.io/not-ready", OUT_OF_SERVICE_TAINT}
)

# Kubernetes' node lifecycle controller stops evicting in a zone that looks disrupted: more than
# two of its nodes unhealthy and at least 55 % of them (its unhealthyZoneThreshold), or all of
# them. So many nodes silent at once is the control plane's or the network's trouble, not each
# node's: the controller replaces nothing on it (nothing deleted on a guess).
DISRUPTION_SHARE = 0.55
DISRUPTION_MIN_UNHEALTHY = 3


# --- node health ------------------------------------------------------------------------------
def lease_seen(node: NodeView, observed_since: float) -> float | None:
    """The latest moment the node's kubelet is known to have been alive: its last renewal, or
    when the controller started watching Leases without a break (a renewal made while it could
    not watch, during an outage or before its start, would not have been seen)."""
    return None if node.lease_renewed is None else max(node.lease_renewed, observed_since)


def lease_stale(node: NodeView, now: float, observed_since: float) -> bool:
    """Whether the node missed a Lease renewal the controller could have seen."""
    seen = lease_seen(node, observed_since)
    return seen is not None and now - seen > LEASE_RENEW_INTERVAL_S


def lease_signal(node: NodeView, observed_since: float) -> float:
    """When a stale Lease shows as a signal: a renew interval after the node was last known
    alive (:func:`lease_seen`; the Lease must have a renewal)."""
    seen = lease_seen(node, observed_since)
    assert seen is not None, "a Lease signal needs a renewal"
    return seen + LEASE_RENEW_INTERVAL_S


def observation_restarts(since: float, down_since: float, up_at: float) -> float:
    """Since when the controller has seen every Lease renewal, after its Lease watch was down
    from ``down_since`` to ``up_at``: a gap shorter than a renew interval lost nothing (the
    watch resumes from its last resourceVersion, or relists); a longer one is an outage, during
    which kubelets may not have been able to renew: silence counts again from ``up_at``."""
    return up_at if up_at - down_since >= LEASE_RENEW_INTERVAL_S else since


def unhealthy_since(
    node: NodeView, policy: Policy, now: float, observed_since: float
) -> float | None:
    """Since when the node shows any unhealthy signal (None: healthy now)."""
    since: list[float] = []
    if node.ready != "True":
        since.append(node.ready_since)
    if lease_stale(node, now, observed_since):
        since.append(lease_signal(node, observed_since))
    if node.taints:  # (most nodes have none: this runs for every member in every pass)
        taints = BUILTIN_UNHEALTHY_TAINTS | policy.unhealthy_taints
        since += [added for key, added in node.taints if key in taints]
    if node.conditions:
        since += [t for ctype, t in node.conditions if ctype in policy.unhealthy_conditions]
    return min(since) if since else None


def node_state(
    node: NodeView | None, policy: Policy, now: float, observed_since: float
) -> tuple[bool, float | None]:
    """(unhealthy, time it will count as unhealthy if the signal persists).

    A signal counts only once it has lasted ``node_unhealthy_after``: shorter flaps do nothing."""
    if node is None:
        return False, None
    if node.ready == "True" and not node.taints and not node.conditions:
        return lease_state(node, policy, now, observed_since)
    return signals_state(node, policy, now, observed_since)


def lease_state(
    node: NodeView, policy: Policy, now: float, observed_since: float
) -> tuple[bool, float | None]:
    """:func:`node_state` of a Ready node with no taint and no condition, where only its Lease
    can say anything: the same answer as :func:`signals_state` (a property test says so) in
    one call instead of five: it runs for every member in every pass."""
    renewed = node.lease_renewed
    if renewed is None:
        return False, None
    seen = renewed if renewed > observed_since else observed_since  # lease_seen
    due = seen + LEASE_RENEW_INTERVAL_S + policy.node_unhealthy_after_s
    if now - seen > LEASE_RENEW_INTERVAL_S and now >= due:  # stale for long enough
        return True, None
    return False, due


def signals_state(
    node: NodeView, policy: Policy, now: float, observed_since: float
) -> tuple[bool, float | None]:
    """:func:`node_state` from every signal the node shows."""
    since = unhealthy_since(node, policy, now, observed_since)
    if since is None:
        # Healthy now; a Lease that stops being renewed makes no event, so look again when
        # it would have gone stale for long enough.
        seen = lease_seen(node, observed_since)
        if seen is None:
            return False, None
        return False, seen + LEASE_RENEW_INTERVAL_S + policy.node_unhealthy_after_s
    due = since + policy.node_unhealthy_after_s
    return (True, None) if now >= due else (False, due)


def unconfirmed_lease_nodes(s: Snapshot) -> list[str]:
    """Ready nodes that count as unhealthy only because of their Lease, and whose Lease the
    controller has not read itself since it went stale: on a busy apiserver the watch can lag
    by tens of seconds, so these are read afresh before anything is decided."""
    limit = LEASE_RENEW_INTERVAL_S + s.policy.node_unhealthy_after_s
    return sorted(
        name
        for name, node in s.nodes.items()
        if node.ready == "True"
        and node.lease_renewed is not None
        and s.now - max(node.lease_renewed, s.leases_observed_since) >= limit
        and (node.lease_read_at is None or node.lease_read_at - node.lease_renewed <= limit)
    )


def may_untaint(node: NodeView, now: float) -> bool:
    """Whether the controller's unhealthy taint may come off ``node``: it carries the taint,
    is Ready, and its kubelet has just renewed its Lease (it is back)."""
    if node.lease_renewed is None or node.ready != "True":
        return False
    tainted = any(key == names.UNHEALTHY_TAINT for key, _ in node.taints)
    return tainted and now - node.lease_renewed < LEASE_RENEW_INTERVAL_S


# --- members ----------------------------------------------------------------------------------
def slot_map(s: Snapshot) -> Slots:
    """The status's slots (core/spares.py), or none when they do not fit this gang (a status
    written for another shape: each slot is then held by its own position)."""
    slots, gang = s.status.slots, s.gang
    if slots and not valid_slots(slots, gang.members, gang.members | gang.spares):
        return {}
    return slots


def current_pods(s: Snapshot) -> dict[str, PodView]:
    """Each member's current pod: of this JobSet restart attempt, live ones first, newest; the
    pod of the position holding its slot, under the slot's name."""
    moved = moved_positions(slot_map(s))
    best: dict[str, PodView] = {}
    for seen in s.pods:
        slot = moved.get(seen.member, seen.member)
        if slot not in s.gang.members or seen.restart_attempt != s.gang.restart_attempt:
            continue
        pod = seen if slot == seen.member else dataclasses.replace(seen, member=slot)
        have = best.get(slot)
        if have is None or _rank(pod) > _rank(have):
            best[slot] = pod
    return best


def current_spares(s: Snapshot) -> dict[str, PodView]:
    """Each spare position's current pod (core/spares.py), as :func:`current_pods` picks."""
    if not s.gang.spares:
        return {}
    free = spares(slot_map(s), s.gang.members, s.gang.members | s.gang.spares)
    best: dict[str, PodView] = {}
    for pod in s.pods:
        if pod.member not in free or pod.restart_attempt != s.gang.restart_attempt:
            continue
        have = best.get(pod.member)
        if have is None or _rank(pod) > _rank(have):
            best[pod.member] = pod
    return best


def heartbeats(s: Snapshot) -> bool:
    """Whether the gang's holders heartbeat (hot spares, and a report channel served): their
    silence is then a failure signal, and the end of their lease a fence."""
    return bool(s.gang.spares) and s.report_endpoint is not None


def silent_for(s: Snapshot, pod: PodView) -> float:
    """Seconds since this leader last heard ``pod``'s agent (0: not known to be silent)."""
    return s.silent.get(pod.uid, 0.0)


def _last_heard(s: Snapshot, pod: PodView) -> float | None:
    """When this leader last heard ``pod``'s agent; None: never (or no heartbeats)."""
    return s.now - s.silent[pod.uid] if pod.uid in s.silent else None


def _rank(pod: PodView) -> tuple[bool, float]:
    return (not pod.deleting and pod.phase != "Failed", pod.created)


def member_causes(
    s: Snapshot, current: Mapping[str, PodView], barrier_timeout: float
) -> tuple[dict[str, Cause], float | None]:
    """Failure cause per failing member (first signal), and when to look again for signals
    that are not old enough yet (node flaps under the threshold, a restarted member not Ready
    yet)."""
    causes: dict[str, Cause] = {}
    wake: float | None = None
    running = s.status.phase == Phase.RUNNING and s.status.barrier_open
    opened = (s.status.recovery.opened if s.status.recovery else None) or s.now
    beats = heartbeats(s)
    for member in s.gang.ordered:
        pod = current.get(member)
        if pod is not None and (pod.escalated or pod.by_kueue or pod.phase == "Succeeded"):
            continue  # ours, Kueue's own action (its replacement follows), or done
        if pod is not None and pod.device_taint_evicted:
            # Evicted (being, or already deleted) for a tainted DRA device: a new pod gets a
            # new claim, and the scheduler allocates no device with that taint.
            causes[member] = Cause.DEVICE_TAINTED
            continue
        if pod is None:
            causes[member] = Cause.POD_DELETED
            continue
        node = s.nodes.get(pod.node or "")
        bad_node, due = node_state(node, s.policy, s.now, s.leases_observed_since)
        if due is not None:
            wake = due if wake is None else min(wake, due)
        if pod.deleting:
            # Being deleted (evicted, by a person, by the taint manager): on a silent node that
            # never ends (no kubelet confirms it, and its Job makes no replacement meanwhile),
            # so its node's death is the cause: the pod is force-deleted like a live one there.
            causes[member] = Cause.NODE_UNHEALTHY if bad_node else Cause.POD_DELETED
            continue
        if pod.phase == "Failed":
            causes[member] = Cause.POD_FAILED
            continue
        quiet = silent_for(s, pod) if beats else 0.0
        if beats and pod.phase == "Running" and quiet < names.SILENT_AFTER_S:
            # look again when it would count as silent if no heartbeat came (~every second)
            due = s.now + names.SILENT_AFTER_S - quiet
            wake = due if wake is None else min(wake, due)
        if bad_node:
            causes[member] = Cause.NODE_UNHEALTHY
        elif quiet >= names.SILENT_AFTER_S:
            # its agent has stopped saying it is alive (a dead node before its Lease says so, a
            # partition from the leader, a hung agent): its slot goes to a spare once fenced
            causes[member] = Cause.AGENT_SILENT
        elif pod.devices_unhealthy:
            causes[member] = Cause.DEVICE_UNHEALTHY
        elif pod.trainer_failed or (running and pod.exited_in_epoch == s.status.epoch):
            # A container that exited non-zero (kubelet), or a trainer process that did in the
            # running epoch (process scope: its launcher keeps the container up; the agent says).
            causes[member] = Cause.TRAINER_EXITED
        elif running and pod.hung_in_epoch == s.status.epoch:
            # Every process lives but its trainer stopped advancing (its agent says: the
            # progress record, agent/hang.py); restarting it in place is a crash's recovery.
            causes[member] = Cause.TRAINER_HUNG
        elif pod.restarting:
            causes[member] = Cause.RESTARTING
        elif running and pod.late_for_epoch == s.status.epoch:
            # It restarted after the barrier opened and waits for a new epoch; the kubelet's
            # restart left no other trace (the controller was away, or missed it).
            causes[member] = Cause.AGENT_WAITING
        elif running and pod.not_ready_since is not None and (pod.agent_started or 0) > opened:
            # Every wait is bounded: a member restarted after the barrier opened (its agent
            # started since) that is still not Ready a barrier timeout later is stuck (its agent
            # cannot report, e.g. 403). Not a cold start: there the agent started before.
            due = max(pod.not_ready_since, pod.agent_started or 0) + barrier_timeout
            if s.now >= due:
                causes[member] = Cause.NOT_READY
            else:
                wake = due if wake is None else min(wake, due)
    return causes, wake


def first_signal(
    s: Snapshot, current: Mapping[str, PodView], causes: Mapping[str, Cause]
) -> tuple[Cause, float, float]:
    """The earliest of the failing members' signals (``causes``: not empty), since when it
    showed, and how long before that the failure may have come (its window: a missed Lease
    renewal's renew interval, else 0), from the times the snapshot carries: a node's first
    unhealthy signal (the threshold it must last is part of detection; a missed renewal after
    the member's heartbeating agent was last heard: that heartbeat); a pod's Ready condition
    turning False (for a stuck member: its agent's start, if later), when that lies between
    the barrier's opening and now (an older one is not this failure's). A signal without such
    a time (a pod deleted or gone) counts from now: the pass that saw it."""
    rec = s.status.recovery
    opened = (rec.opened if rec is not None else None) or 0.0
    seen: list[tuple[float, str, Cause, float]] = []
    for member, cause in causes.items():
        pod = current.get(member)
        node = s.nodes.get(pod.node or "") if pod is not None else None
        at, window = s.now, 0.0
        if cause == Cause.NODE_UNHEALTHY and node is not None:
            since = unhealthy_since(node, s.policy, s.now, s.leases_observed_since)
            at = s.now if since is None else min(since, s.now)
            if lease_stale(node, s.now, s.leases_observed_since) and at == lease_signal(
                node, s.leases_observed_since
            ):
                # the missed renewal: the node died after its last one (a renew interval, or
                # more where that renewal came before the controller could watch); where the
                # member's agent heartbeats (hot spares) and was heard after that renewal, its
                # silence is the earlier signal, dated as a silent agent's
                renewed = node.lease_renewed or at
                heard = _last_heard(s, pod) if pod is not None else None
                if heard is not None and renewed < heard <= at:
                    at = heard
                else:
                    window = at - renewed
        elif cause == Cause.AGENT_SILENT and pod is not None:
            at = s.now - silent_for(s, pod)  # its last heartbeat heard
        elif pod is not None and pod.not_ready_since is not None:
            since = max(pod.not_ready_since, pod.agent_started or 0.0)
            at = since if opened <= since <= s.now else s.now
        seen.append((at, member, cause, window))
    at, _, cause, window = min(seen)
    return cause, at, window


def silent(node: NodeView, now: float, observed_since: float) -> bool:
    """Whether nothing is heard from the node: Ready Unknown, a stale Lease, or the
    ``unreachable`` taint (not the signals an operator or a node problem detector sets, such as
    ``out-of-service`` or configured taints: those are never a disruption)."""
    unreachable = any(key == UNREACHABLE_TAINT for key, _ in node.taints)
    return node.ready == "Unknown" or lease_stale(node, now, observed_since) or unreachable


def disruption(s: Snapshot) -> tuple[int, int] | None:
    """(silent, all) nodes when so many are silent at once that replacing a pod for its node
    would be a guess (:data:`DISRUPTION_SHARE`); None otherwise. O(nodes): planned only when a
    node failure is at stake."""
    total = len(s.cluster_nodes)
    bad = sum(
        1 for node in s.cluster_nodes.values() if silent(node, s.now, s.leases_observed_since)
    )
    many = bad >= DISRUPTION_MIN_UNHEALTHY and bad >= DISRUPTION_SHARE * total
    return (bad, total) if bad and (bad == total or many) else None
