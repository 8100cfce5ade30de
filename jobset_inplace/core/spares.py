"""Hot spares (docs/design/hot-spares.md), as pure functions: slots, the pods that hold them,
and when a slot may be given to a spare.

A gang declared with N hot spares has R + N **positions**, the pods JobSet makes
(``<replicatedJob>/<jobIndex>/<completionIndex>``, :func:`~jobset_inplace.names.member_name`),
and R
**slots**, the members its trainers know (their ranks: the user's ``replicas``). At first slot
k is held by position k; positions R..R+N-1 hold none: they are the spares. A **swap** gives a
slot whose holder must get a new pod to a ready spare: the old position, once its pod is
replaced, is a spare in turn. The GangState status keeps the slots whose holder is another
position than their own name (``status.slots``: slot -> position), so it stays empty, and
small, until a spare is used.

The rule that makes a swap safe (docs/guarantees.md, hybrid recovery): **a slot is given to
another pod only when its old holder cannot be training any more**: with a report channel, once
its agent's lease has surely ended (the planner's ``swap_spares``, agent/heartbeat.py); without
one, by the controller's other signals (:func:`fenced`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from jobset_inplace import names
from jobset_inplace.core.policy import PolicyError
from jobset_inplace.trainer.checkpoints import parse_canonical_int

Slots = Mapping[str, str]  # slot -> the position holding it, where that is not the slot itself

# The planner's Events (and the metrics counted from them, core/telemetry.py): a slot given to
# a spare; slots that wanted one and found none ready.
SPARE_SWAPPED = "SpareSwapped"
SPARE_SHORTFALL = "SpareShortfall"
# agents silent with no spare ready to take their slots: left to their nodes' signals
SILENT_WITHOUT_SPARE = "SilentWithoutSpare"
# a spare replaced so that its Job makes it anew elsewhere: its node is going, or it shares a
# node with a slot's holder while another node is free
SPARE_MOVED = "SpareMoved"

SPARES_FORM = "a whole number from 0 to the replicatedJob's replicas (at most one spare a member)"


@dataclass(frozen=True)
class SpareSpec:
    """The spares a JobSet declared: ``spares`` pods of ``replicated_job`` beyond its
    ``members`` (the webhook raised its ``replicas`` by ``spares``)."""

    replicated_job: str
    members: int
    spares: int


def spare_spec(jobset: Mapping[str, Any], *, prepared: bool = True) -> SpareSpec | None:
    """The spares a JobSet declares, None when it declares none. ``prepared``: the webhook has
    raised the spares' ``replicas`` by their number already (every JobSet the controller sees);
    else its ``replicas`` are the members alone (the JobSet as its owner wrote it). Raises
    :class:`~.policy.PolicyError` naming the annotation and the accepted form."""
    annotations = (jobset.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(names.HOT_SPARES)
    if raw is None:
        return None
    count = parse_canonical_int(raw)
    if count is None:
        raise PolicyError(names.HOT_SPARES, raw, SPARES_FORM)
    jobs = {  # (replicas that are no integer: the JobSet's schema refuses them)
        str(rj.get("name")): replicas
        for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []
        if isinstance(replicas := rj.get("replicas", 1), int) and not isinstance(replicas, bool)
    }
    job = annotations.get(names.HOT_SPARES_JOB)
    if job is None:
        if len(jobs) != 1:
            raise PolicyError(
                names.HOT_SPARES_JOB,
                "",
                f"the replicatedJob the spares belong to (one of {', '.join(sorted(jobs))}), "
                "required when the JobSet has more than one",
            )
        job = next(iter(jobs))
    if job not in jobs:
        raise PolicyError(
            names.HOT_SPARES_JOB, job, f"one of the JobSet's replicatedJobs: {', '.join(jobs)}"
        )
    members = jobs[job] - count if prepared else jobs[job]
    if not 0 <= count <= members:
        raise PolicyError(names.HOT_SPARES, raw, SPARES_FORM)
    if count == 0:
        return None
    return SpareSpec(job, members, count)


def spares_job(position: str, spare_positions: frozenset[str]) -> bool:
    """Whether ``position`` is of the spares' replicatedJob (``spare_positions``: the gang's
    spares at first, all of one replicatedJob): only its agents hold a lease and heartbeat,
    and only its slots can go to a spare (a spare is a pod of that replicatedJob's template).
    Other replicatedJobs of the gang recover as without spares."""
    job = position.partition("/")[0]
    return any(job == spare.partition("/")[0] for spare in spare_positions)


def holder(slots: Slots, slot: str) -> str:
    """The position that holds ``slot``."""
    return slots.get(slot, slot)


def moved_positions(slots: Slots) -> dict[str, str | None]:
    """The positions whose slot is not their own name: a position holding another's slot ->
    that slot; a slot's own position that gave it away and holds none -> None (a spare).
    Every other position holds the slot of its own name, if it is one."""
    out: dict[str, str | None] = dict.fromkeys(slots)
    out.update({position: slot for slot, position in slots.items()})
    return out


def valid_slots(raw: Slots, members: frozenset[str], positions: frozenset[str]) -> bool:
    """Whether ``raw`` (as read from a status) maps slots of ``members`` to distinct
    ``positions`` (members and spares), each slot held by exactly one of them."""
    held = [holder(raw, m) for m in members]
    return (
        all(slot in members and slot != position for slot, position in raw.items())
        and set(held) <= positions
        and len(set(held)) == len(held)
    )


def swapped(slots: Slots, slot: str, position: str) -> dict[str, str]:
    """``slots`` with ``slot`` given to ``position`` (which held none)."""
    out = dict(slots)
    if position == slot:
        out.pop(slot, None)
    else:
        out[slot] = position
    return out


def spares(slots: Slots, members: frozenset[str], positions: frozenset[str]) -> frozenset[str]:
    """The positions that hold no slot."""
    return positions - {holder(slots, m) for m in members}


def fenced(old_phase: str | None, *, force_deleted: bool) -> bool:
    """Whether a slot's old holder, a pod in phase ``old_phase`` (None: gone from the API),
    cannot be training any more: gone, or terminal (its kubelet said so), or force-deleted on
    a silent node (``force_deleted``: the planner does it with ``force-delete: unreachable``,
    which states that such a node is fenced, as every replacement of a silent node's pod
    already assumes). A pod being deleted on a live node is not fenced until its kubelet has
    stopped it."""
    return old_phase is None or force_deleted or old_phase in ("Failed", "Succeeded")


class Placed(Protocol):
    """A pod as :func:`plan_swaps` sees it: its position, and its node."""

    @property
    def member(self) -> str: ...

    @property
    def node(self) -> str | None: ...


P = TypeVar("P", bound=Placed)


def plan_swaps(
    wanting: Sequence[str],
    ready: Sequence[P],
    avoid_nodes: frozenset[str],
    *,
    crowded: Sequence[str] = (),
    holder_nodes: frozenset[str] = frozenset(),
) -> tuple[list[tuple[str, P]], list[str]]:
    """Ready spares (their pods: on a node that holds no slot's holder first, then lowest
    position first) for the slots in ``wanting`` (in that order), none on ``avoid_nodes`` (the
    nodes of the pods being replaced): ((slot, spare's pod) for each swap, the slots left
    without a spare: the shortfall). Then, with the spares left, the slots in ``crowded``:
    each is on a Ready pod already, one that shares a node with another slot's holder (where
    that node's death would take both), and takes a spare only from a node that holds no
    slot's holder (``holder_nodes``, with the nodes of this call's swaps added as it goes);
    one that finds none keeps its pod (no shortfall)."""
    order = sorted(ready, key=lambda p: (p.node in holder_nodes, _job_order(p.member)))
    free = [pod for pod in order if pod.node and pod.node not in avoid_nodes]
    swaps = list(zip(wanting, free))  # noqa: B905 (the shorter; no strict= on 3.9: strenum.py)
    short = list(wanting[len(swaps) :])
    left, held = free[len(swaps) :], set(holder_nodes) | {pod.node for _, pod in swaps}
    for slot in crowded:
        spare = next((pod for pod in left if pod.node not in held), None)
        if spare is not None:
            swaps.append((slot, spare))
            left.remove(spare)
            held.add(spare.node)
    return swaps, short


class PlacedSince(Placed, Protocol):
    """A pod as :func:`spares_to_spread` sees it: also when it was made."""

    @property
    def created(self) -> float: ...


S = TypeVar("S", bound=PlacedSince)


# A spare made less than this ago is not moved off a holder's node (wait for it): at most one
# move of a spare position every 30 s, whatever a flapping node does.
SPREAD_MIN_AGE_S = 30.0
# A node opened after a spare was placed only if later by more than this: creation times are
# whole seconds, and the controller's clock (its own sightings) may run a little ahead.
OPENED_MARGIN_S = 2.0


def spares_to_spread(
    spare_pods: Mapping[str, S],
    holders: Mapping[str, S],
    free_nodes: Mapping[str, float],
    now: float,
) -> tuple[list[tuple[S, S]], float | None]:
    """The spares to move off a holder's node, each with that holder, and when to look again
    (None: no need): a spare that shares a node with a slot's holder cannot take that holder's
    place (the node's death takes both). ``spare_pods``: position -> pod; ``holders``: slot ->
    the pod holding it; ``free_nodes``: the nodes a pod of the gang could go to that hold none
    of its pods -> when each opened (:attr:`~.model.NodeView.opened_at`). A spare is moved only
    where the holder came to its node after it, or a free node opened after it was made
    (by more than ``OPENED_MARGIN_S``): else the scheduler placed it there knowing every free
    node, and would again (so a spare that lands beside a holder once more stays: one move per
    change), and only once it is ``SPREAD_MIN_AGE_S`` old. At most one spare per free node,
    lowest position first."""
    if not free_nodes:
        return [], None
    newest_holder: dict[str, S] = {}
    for pod in holders.values():
        have = newest_holder.get(pod.node or "")
        if pod.node and (have is None or pod.created > have.created):
            newest_holder[pod.node] = pod
    out, wake = [], None
    for position in sorted(spare_pods, key=_job_order):
        spare = spare_pods[position]
        beside = newest_holder.get(spare.node or "")
        if beside is None:
            continue
        if not (
            beside.created > spare.created
            or any(opened > spare.created + OPENED_MARGIN_S for opened in free_nodes.values())
        ):
            continue
        due = spare.created + SPREAD_MIN_AGE_S
        if now < due:
            wake = due if wake is None else min(wake, due)
            continue
        out.append((spare, beside))
    return out[: len(free_nodes)], wake


def _job_order(position: str) -> tuple[str, int, str]:
    job, _, rest = position.partition("/")
    index, _, completion = rest.partition("/")
    return job, int(index) if index.isdigit() else -1, completion
