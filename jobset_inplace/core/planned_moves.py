"""Planned moves, free of I/O: which members sit on nodes that are being drained (or hold a
device being taken out of service: core.device_taints), and the step the gang stops at before
they move.

A member whose node is cordoned (``kubectl cordon``/``drain``) or marked for maintenance, or
whose DRA device is tainted ``NoSchedule``, is moved with no step lost: the controller asks
every agent how far its trainers are, picks a step a few seconds ahead of the newest
(:func:`stop_step`), the trainers stop there with a checkpoint of it and park, and then the
leaving members get new pods elsewhere while the others restart in place, all resuming from
that step. The controller's PodDisruptionBudget holds the
drain's evictions meanwhile; the planner's states are in :mod:`.planner` (``planned_move``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from jobset_inplace.core.model import NodeView, PodView
from jobset_inplace.trainer.progress import ProgressSpan

# How far ahead of the newest step any member reached the gang stops: the time the status takes
# to reach every agent and the stop file every trainer, with room to spare.
STOP_MARGIN_S = 5.0
# How long the agents have to answer how far their trainers are; past it the move happens at
# once (from the newest common checkpoint), as for a trainer that reports no progress.
ANSWER_WAIT_S = 15.0


def leaving_members(
    nodes: Mapping[str, NodeView],
    current: Mapping[str, PodView],
    devices_leaving: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Member -> why it should move ("node n1 cordoned"; a device's reason from
    ``devices_leaving``, by pod UID), for running pods only."""
    out: dict[str, str] = {}
    for member, pod in current.items():
        if pod.phase != "Running" or pod.deleting:
            continue
        node = nodes.get(pod.node or "")
        if node is not None and node.leaving:
            out[member] = f"node {node.name} {node.leaving}"
        elif why := (devices_leaving or {}).get(pod.uid):
            out[member] = why
    return out


def stop_step(
    spans: Iterable[ProgressSpan], now: float, margin_s: float = STOP_MARGIN_S
) -> int | None:
    """The step the gang stops at: where the newest step any member's trainers reached will be
    ``margin_s`` after ``now`` at the gang's pace (an answer may be seconds old: a new leader
    gets it again as it was sent), at least one step ahead; None without any progress."""
    spans = list(spans)
    if not spans:
        return None
    first = min(spans, key=lambda s: (s.first_at, s.first_step))
    last = max(spans, key=lambda s: (s.last_step, s.last_at))
    if last.last_step > first.first_step and last.last_at > first.first_at:
        pace = (last.last_at - first.first_at) / (last.last_step - first.first_step)
        ahead = (max(0.0, now - last.last_at) + margin_s) / pace
        return last.last_step + max(1, math.ceil(ahead))
    return last.last_step + 1
