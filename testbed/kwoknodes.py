"""Levers on kwok's simulated nodes.

kwok keeps a node alive by holding and renewing its Lease in ``kube-node-lease`` and, while it
holds the Lease, by updating the node's and its pods' status. :func:`set_heartbeat` with
``alive=False`` hands the Lease to another holder for a long time, so kwok stops renewing it and
stops touching the node and its pods. That is what a dead or partitioned kubelet looks like to
the control plane: the Lease goes stale at once, pod status freezes, and the node lifecycle
controller marks the node ``Ready=Unknown`` (taint ``node.kubernetes.io/unreachable``) once
``node-monitor-grace-period`` has passed since the last renewal, checked every
``node-monitor-period``.

Expected time from the lever to ``Ready=Unknown`` with the local cluster's settings: at most
grace + period + one renew interval = 50 s + 5 s + 10 s (:data:`NODE_UNHEALTHY_BOUND_SECONDS`).
"""

from __future__ import annotations

import time

from jobset_inplace.names import NODE_LEASE_NAMESPACE
from jobset_inplace.times import format_time

from .cluster import KWOK_NODE_ANNOTATION, NODE_MONITOR_GRACE_SECONDS, NODE_MONITOR_PERIOD_SECONDS
from .kube import Clients

KWOK_LEASE_RENEW_SECONDS = 10  # kwok renews node Leases about every 10 s
NODE_UNHEALTHY_BOUND_SECONDS = (
    NODE_MONITOR_GRACE_SECONDS + NODE_MONITOR_PERIOD_SECONDS + KWOK_LEASE_RENEW_SECONDS
)
SILENCED_HOLDER = "jobset-inplace-e2e/silenced"


def is_kwok_node(c: Clients, name: str) -> bool:
    node = c.core.read_node(name)
    return (node.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == "fake"


def set_heartbeat(c: Clients, name: str, *, alive: bool) -> None:
    """Silence (``alive=False``) or revive kwok's heartbeats for node ``name``."""
    if not alive:
        # renewTime is left as kwok last wrote it: the node died just after its last
        # heartbeat, at a random point of its renew interval, as a real node does.
        spec = {"holderIdentity": SILENCED_HOLDER, "leaseDurationSeconds": 24 * 3600}
    else:
        # An expired Lease: kwok takes it over on its next try and manages the node again.
        spec = {"leaseDurationSeconds": 1, "renewTime": format_time(time.time() - 3600)}
    # A merge patch carries no resourceVersion: it wins over kwok's concurrent renewal, whose
    # update then conflicts and re-reads the Lease.
    c.coordination.patch_namespaced_lease(name, NODE_LEASE_NAMESPACE, {"spec": spec})
