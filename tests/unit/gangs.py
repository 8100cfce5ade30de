"""Builders of planner snapshots for unit tests: a gang of N members, one pod per member on
its own node, all healthy unless a test says otherwise."""

from __future__ import annotations

import dataclasses
from typing import Any

from jobset_inplace.core.model import GangSpec, GangStatus, NodeView, PodView, Snapshot
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Phase

NOW = 1_000_000.0


def member(i: int) -> str:
    return f"workers/{i}/0"


def pods(n: int, *, epoch: int | None, steps: tuple[int, ...] = (100, 200)) -> list[PodView]:
    return [
        PodView(
            name=f"p{i}",
            uid=f"uid-{i}",
            member=member(i),
            node=f"n{i}",
            phase="Running",
            created=NOW - 3600,
            reported_epoch=epoch,
            reported_steps=steps,
        )
        for i in range(n)
    ]


def nodes(n: int, now: float = NOW) -> dict[str, NodeView]:
    return {f"n{i}": NodeView(f"n{i}", lease_renewed=now - 1) for i in range(n)}


def running(epoch: int = 2, **kw: Any) -> GangStatus:
    """A gang training in ``epoch`` with its barrier open."""
    fields: dict[str, Any] = {"phase": Phase.RUNNING, "barrier_open": True, "resume_step": 100}
    return GangStatus(epoch=epoch, **(fields | kw))


def snapshot(
    n: int = 4,
    *,
    status: GangStatus | None = None,
    pod_list: list[PodView] | None = None,
    node_map: dict[str, NodeView] | None = None,
    policy: Policy | None = None,
    now: float = NOW,
    hot_spares: int = 0,
    **gang: Any,
) -> Snapshot:
    """``n`` members, then ``hot_spares`` spare positions (pods and nodes n.. of their own)."""
    status = status or running()
    total = n + hot_spares
    node_map = node_map if node_map is not None else nodes(total, now)
    spares = frozenset(member(i) for i in range(n, total))
    return Snapshot(
        now=now,
        gang=GangSpec("ns", "train", frozenset(member(i) for i in range(n)), spares=spares, **gang),
        policy=policy or Policy(),
        pods=tuple(pod_list if pod_list is not None else pods(total, epoch=status.epoch)),
        nodes=node_map,
        status=status,
        cluster_nodes=node_map,  # the gang's nodes are the whole cluster
    )


def with_pod(pod_list: list[PodView], i: int, **changes: Any) -> list[PodView]:
    out = list(pod_list)
    out[i] = dataclasses.replace(out[i], **changes)
    return out
