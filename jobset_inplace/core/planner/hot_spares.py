"""Hot spares in a pass (:mod:`..spares` decides the swaps): a recovering member takes a ready
spare's pod; a spare on a dead or leaving node is replaced, and so is one that shares a node
with a slot's holder while another node is free."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jobset_inplace import names
from jobset_inplace.core.detection import (
    current_spares,
    heartbeats,
    node_state,
    silent_for,
    unhealthy_since,
)
from jobset_inplace.core.model import Cause, PodView, Recovery, Snapshot
from jobset_inplace.core.planned_moves import leaving_members
from jobset_inplace.core.planner.base import PlanningPass, first_few
from jobset_inplace.core.policy import ForceDelete
from jobset_inplace.core.spares import (
    SPARE_MOVED,
    SPARE_SHORTFALL,
    SPARE_SWAPPED,
    fenced,
    plan_swaps,
    spares_job,
    spares_to_spread,
    swapped,
)
from jobset_inplace.core.statemachine import Phase

# A label every node carries a value of its own: no mark of a kind of node.
HOSTNAME_LABEL = "kubernetes.io/hostname"
KUBERNETES_TAINTS = "node.kubernetes.io/"  # not-ready, unreachable, the pressures, cordon, ...
TERMINAL = ("Failed", "Succeeded")
# Without the report channel (no lease to wait out), how long after a recovery started a member
# whose new pod shares a node with another member is held out of the barrier while its old pod,
# on a live node, is being stopped and a spare elsewhere could take its slot: a deletion that
# hangs does not hold the gang longer.
CROWDED_HOLD_S = 6.0


class Swaps(NamedTuple):
    """What :meth:`HotSpares.swap_spares` did in a pass: the slots given to a spare (on their
    spare's pod from now on), and the members held out of the barrier a moment (their Job's
    new pod shares a node with another member, and a spare elsewhere may take the slot once
    the old pod is fenced)."""

    on_spare: frozenset[str]
    held: frozenset[str]


class HotSpares(PlanningPass):
    """Swapping a member onto a spare, and moving spares off nodes that are going."""

    def swap_spares(self, rec: Recovery) -> Swaps:
        """Members of this recovery that get a new pod take a ready spare's instead of waiting
        for their Job's (scheduling, image pull, start): the slot is given to the spare's
        position once the old pod is fenced (it cannot be training any more: gone, terminal,
        or force-deleted on a silent node; with the report channel, its agent's lease surely
        ended), spares on a node that holds no other member first. A member of another
        replicatedJob than the spares' waits for its Job's new pod (a spare is a pod of its
        own template), as does one with no spare ready (the shortfall is said once per epoch).

        A member already on a Ready pod that is not the replaced one keeps it, unless that pod
        shares a node with another member (a drain's or a device fault's Job's new pod, which
        the scheduler placed where it could: that node's death would take both): it then
        takes a ready spare on a node that holds no member, if there is one, and its pod is a
        spare from then on. Such a pod is often made, and its agent reports, before the old
        pod is fenced: while a spare on a node of its own is ready for it, the member is held
        out of the barrier (``Swaps.held``) until the fence, so that the gang does not start
        training on the shared node a moment before the swap: with the report channel, until
        the old agent's lease ends (``LEASE_S + FENCE_MARGIN_S`` after its last answer, which
        came before the decision); without it, until its kubelet stopped the old pod, at most
        ``CROWDED_HOLD_S`` after the recovery started."""
        s, st = self.s, self.st
        if not s.gang.spares:
            return Swaps(frozenset(), frozenset())
        by_uid = {pod.uid: pod for pod in s.pods}
        force = s.policy.force_delete == ForceDelete.UNREACHABLE
        lease_end = names.LEASE_S + names.FENCE_MARGIN_S
        holder_nodes = {m: pod.node for m, pod in self.current.items() if _placed(pod)}
        wanting: list[str] = []  # on no Ready pod of their own: a spare, or a shortfall
        crowded: list[str] = []  # on a Ready pod beside another member: a spare elsewhere if any
        unfenced: list[str] = []  # on a pod beside another member, the old pod not fenced yet
        avoid: set[str] = set()
        for member, old_uid in sorted(rec.recreated.items()):
            if not spares_job(member, s.gang.spares):
                continue  # another replicatedJob's member: its Job's new pod, as without spares
            pod = self.current.get(member)
            new = pod if pod is not None and pod.uid != old_uid and _placed(pod) else None
            beside = new is not None and any(
                node == new.node for m, node in holder_nodes.items() if m != member
            )
            on_ready = new is not None and self.ready_pod(new)
            if on_ready and not beside:
                continue  # on a new pod already (a spare, or its Job's), on a node of its own
            waiting = crowded if on_ready else wanting
            old = by_uid.get(old_uid)
            dead = rec.causes.get(member) == Cause.NODE_UNHEALTHY
            if old is not None and old.node:
                avoid.add(old.node)
            if heartbeats(s) and old_uid in s.silent:
                # its agent held a lease: the slot moves once the lease has surely ended,
                # whatever became of the pod (deleted by force, or not)
                quiet = s.silent[old_uid]
                if quiet >= lease_end:
                    waiting.append(member)
                else:
                    self.p.wake_at(s.now, s.now + lease_end - quiet)
                    if beside:
                        unfenced.append(member)
            elif fenced(None if old is None else old.phase, force_deleted=force and dead):
                waiting.append(member)
            elif beside and s.now < rec.started + CROWDED_HOLD_S:
                unfenced.append(member)
                self.p.wake_at(s.now, rec.started + CROWDED_HOLD_S)
        if not wanting and not crowded and not unfenced:
            return Swaps(frozenset(), frozenset())
        taken = set(rec.recreated.values())
        ready = [p for p in current_spares(s).values() if self.ready_pod(p) and p.uid not in taken]
        occupied = frozenset(n for n in holder_nodes.values() if n is not None)
        swaps, short = plan_swaps(
            wanting, ready, frozenset(avoid), crowded=crowded, holder_nodes=occupied
        )
        used = {spare.uid for _, spare in swaps}
        would, _ = plan_swaps(
            [],
            [p for p in ready if p.uid not in used],
            frozenset(avoid),
            crowded=unfenced,
            holder_nodes=occupied | {spare.node for _, spare in swaps if spare.node},
        )
        for slot, spare in swaps:
            new = self.current.get(slot) if slot in crowded else None
            st.slots = swapped(st.slots, slot, spare.member)
            self.current[slot] = dataclasses.replace(spare, member=slot)
            why = (
                f"its pod {new.name}, which shares node {new.node} with another member, is a "
                "spare from now on"
                if new is not None
                else "its old pod is replaced as a spare"
            )
            self.event(
                SPARE_SWAPPED,
                f"epoch {st.epoch}: {slot} continues on hot spare {spare.name} (position "
                f"{spare.member}, node {spare.node}); {why}",
            )
        if short:
            self.event(
                SPARE_SHORTFALL,
                f"epoch {st.epoch}: no hot spare ready for {first_few(short)}: waiting for "
                "their Jobs' new pods",
                once_key=f"SpareShortfall/{st.epoch}",
            )
        return Swaps(frozenset(slot for slot, _ in swaps), frozenset(slot for slot, _ in would))

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
        moved: set[str] = set()
        for position, pod in sorted(current_spares(s).items()):
            if pod.phase in TERMINAL:
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
            moved.add(pod.uid)
            self.event(
                SPARE_MOVED,
                f"hot spare {pod.name} ({position}) on node {pod.node}: "
                f"{'the node is unhealthy' if dead else leaving[position]}; replaced",
                once_key=f"{SPARE_MOVED}/{pod.uid}",
            )
        self.spread_spares(moved)

    def spread_spares(self, moved: set[str]) -> None:
        """Spares that share a node with a slot's holder (a drain, a device fault or a
        recreation brought the holder there, or the spare was made while the other nodes
        were closed): when a node like the gang's is free (:func:`free_nodes`), the spare is
        replaced so that its Job makes it anew, and the scheduler, which scores the empty
        node above the shared one, places it there (:func:`~..spares.spares_to_spread` says
        which: at most one move per change, and per spare position every 30 s). Only while the
        gang trains with its barrier open, no planned move pending (a recovery or a move may
        be about to take the spare: a holder's node that starts leaving starts one in the same
        pass), no holder's node showing an unhealthy signal or its agent gone quiet (one that
        may yet become a recovery), and the cluster not disrupted; ``moved``: spares this pass
        replaced already."""
        s, st = self.s, self.st
        if (
            st.phase != Phase.RUNNING
            or not st.barrier_open
            or st.planned_stop is not None
            or self.disrupted is not None
        ):
            return
        holders = {slot: pod for slot, pod in self.current.items() if _placed(pod)}
        holding = {pod.uid for pod in holders.values()}  # (a spare this pass gave a slot)
        spare_pods = {
            position: pod
            for position, pod in current_spares(s).items()
            if _placed(pod) and pod.uid not in moved and pod.uid not in holding
        }
        if not {pod.node for pod in spare_pods.values()} & {pod.node for pod in holders.values()}:
            return  # (no spare shares a node with a holder: the nodes are not looked at)
        for pod in holders.values():
            node = s.nodes.get(pod.node or "")
            unwell = node is not None and (
                unhealthy_since(node, s.policy, s.now, s.leases_observed_since) is not None
            )
            if unwell or silent_for(s, pod) >= names.HEARTBEAT_S:  # a heartbeat missed
                return
        placed = [*spare_pods.values(), *holders.values()]
        spread, wake = spares_to_spread(spare_pods, holders, free_nodes(s, placed), s.now)
        if wake is not None:
            self.p.wake_at(s.now, wake)
        for spare, holder in spread:
            self.replace(spare, Cause.PLANNED_MOVE)
            self.event(
                SPARE_MOVED,
                f"hot spare {spare.name} ({spare.member}) shares node {spare.node} with "
                f"{holder.member}'s pod {holder.name}, whose place it could not take there, "
                "and another node is free: replaced",
                once_key=f"{SPARE_MOVED}/{spare.uid}",
            )


def _placed(pod: PodView) -> bool:
    return pod.node is not None and pod.phase not in TERMINAL and not pod.deleting


def free_nodes(s: Snapshot, placed: list[PodView]) -> dict[str, float]:
    """The nodes a pod of the gang could be placed on that hold none of its pods -> when each
    opened. The controller does not know the pods' node selectors, affinities, tolerations
    or the nodes' free resources, so "could" is judged from the nodes its ``placed`` pods
    (holders and spares, running) are on: a free node is Ready with no unhealthy signal, not
    cordoned or marked for maintenance, carries every label those nodes all share (their pool,
    instance type, zone where they agree; not the hostname) and no NoSchedule/NoExecute taint
    that none of them carries (Kubernetes' own ``node.kubernetes.io/`` taints and this
    controller's never count as carried: they mark a node's trouble, not a kind of node).
    Where that judgement is wrong the scheduler places the new spare back beside a holder,
    and it stays there (:func:`~..spares.spares_to_spread`)."""
    occupied = {pod.node for pod in s.pods if pod.node}
    on = {pod.node for pod in placed if pod.node}
    gang_nodes = [node for name in on if (node := s.cluster_nodes.get(name)) is not None]
    if not gang_nodes:
        return {}
    shared = set.intersection(*({*n.labels} for n in gang_nodes))
    shared = {(k, v) for k, v in shared if k != HOSTNAME_LABEL}
    tolerated = {
        key
        for node in gang_nodes
        for key, _ in node.taints
        if not key.startswith((KUBERNETES_TAINTS, names.PREFIX))
    }
    return {
        name: node.opened_at
        for name, node in s.cluster_nodes.items()
        if name not in occupied
        and not node.leaving
        and shared <= set(node.labels)
        and {key for key, _ in node.taints} <= tolerated
        and unhealthy_since(node, s.policy, s.now, s.leases_observed_since) is None
    }
