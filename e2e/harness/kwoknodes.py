"""Levers on kwok's simulated nodes.

A kwok node is "alive" because the kwok controller heartbeats it (node status and its Lease in
``kube-node-lease``). :func:`set_heartbeat` stops or resumes that for one node, which is what a
dead or partitioned kubelet looks like to the control plane: the Lease goes stale at once and the
node lifecycle controller marks the node ``Ready=Unknown`` (taint
``node.kubernetes.io/unreachable``) once ``node-monitor-grace-period`` has passed since the last
heartbeat, checked every ``node-monitor-period``.

Expected time from the lever to ``Ready=Unknown``, with the local cluster's settings:
at most grace + period + one heartbeat interval = 50 s + 5 s + 10 s
(:data:`NODE_UNHEALTHY_BOUND_SECONDS`).
"""

from __future__ import annotations

from .cluster import KWOK_NODE_ANNOTATION, NODE_MONITOR_GRACE_SECONDS, NODE_MONITOR_PERIOD_SECONDS
from .kube import Clients

KWOK_HEARTBEAT_SECONDS = 10  # kwokctl nodeStatusUpdateFrequency with heartbeatFactor 1
NODE_UNHEALTHY_BOUND_SECONDS = (
    NODE_MONITOR_GRACE_SECONDS + NODE_MONITOR_PERIOD_SECONDS + KWOK_HEARTBEAT_SECONDS
)


def is_kwok_node(c: Clients, name: str) -> bool:
    node = c.core.read_node(name)
    return (node.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == "fake"


def set_heartbeat(c: Clients, name: str, *, alive: bool) -> None:
    """Stop (``alive=False``) or resume kwok's heartbeats for node ``name``: kwok manages
    only nodes annotated ``kwok.x-k8s.io/node=fake``."""
    value = "fake" if alive else None  # a null in a merge patch removes the key
    c.core.patch_node(name, {"metadata": {"annotations": {KWOK_NODE_ANNOTATION: value}}})
