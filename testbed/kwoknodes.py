"""Levers on kwok's simulated nodes.

kwok keeps a node alive by holding and renewing its Lease in ``kube-node-lease`` and, while it
holds the Lease, by updating the node's and its pods' status. :func:`set_heartbeat` with
``alive=False`` hands the Lease to another holder for a long time, so kwok stops renewing it and
stops touching the node and its pods. That is what a dead or partitioned kubelet looks like to
the control plane: the Lease goes stale at once, pod status freezes, and the node lifecycle
controller marks the node ``Ready=Unknown`` (taint ``node.kubernetes.io/unreachable``) once
``node-monitor-grace-period`` has passed since the last renewal it observed (on 1.37 the
lever's own write, see :func:`set_heartbeat`), checked every ``node-monitor-period``.

Expected time from the lever to ``Ready=Unknown`` with the local cluster's settings: at most
grace + period + one renew interval = 50 s + 5 s + 10 s (:data:`NODE_UNHEALTHY_BOUND_SECONDS`;
the renew interval is the margin for 1.35, which counts from kwok's last renewal).
"""

from __future__ import annotations

import time
from http import HTTPStatus

from kubernetes.client.exceptions import ApiException

from jobset_inplace.names import NODE_LEASE_NAMESPACE
from jobset_inplace.times import format_time

from .cluster import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_LEASE_SECONDS,
    NODE_MONITOR_GRACE_SECONDS,
    NODE_MONITOR_PERIOD_SECONDS,
)
from .kube import Clients, node_ready_status
from .workloads import KWOK_NODE_SELECTOR

# kwok renews node Leases every quarter of their duration (10 s; a cluster made with longer
# Leases has its own timing, and no test silences its nodes)
KWOK_LEASE_RENEW_SECONDS = KWOK_NODE_LEASE_SECONDS // 4
NODE_UNHEALTHY_BOUND_SECONDS = (
    NODE_MONITOR_GRACE_SECONDS + NODE_MONITOR_PERIOD_SECONDS + KWOK_LEASE_RENEW_SECONDS
)
SILENCED_HOLDER = "jobset-inplace-e2e/silenced"
SILENCE_ATTEMPTS = 5
# The node lifecycle controller's taints on a node that is not (or not yet again) Ready.
NODE_DOWN_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
KWOK_LABEL_SELECTOR = ",".join(f"{k}={v}" for k, v in KWOK_NODE_SELECTOR.items())


def is_kwok_node(c: Clients, name: str) -> bool:
    node = c.core.read_node(name)
    return (node.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == "fake"


def kwok_nodes(c: Clients) -> list[str]:
    """The names of the cluster's kwok nodes, sorted."""
    return sorted(
        n.metadata.name for n in c.core.list_node(label_selector=KWOK_LABEL_SELECTOR).items
    )


def silenced(c: Clients) -> list[str]:
    """The nodes whose heartbeats :func:`set_heartbeat` stopped (their Lease is held by
    :data:`SILENCED_HOLDER`)."""
    leases = c.coordination.list_namespaced_lease(NODE_LEASE_NAMESPACE).items
    return sorted(x.metadata.name for x in leases if x.spec.holder_identity == SILENCED_HOLDER)


def unhealthy(c: Clients, taints: tuple[str, ...]) -> dict[str, list[str]]:
    """Each kwok node that is not Ready or carries one of ``taints``, with what is wrong."""
    out = {}
    for node in c.core.list_node(label_selector=KWOK_LABEL_SELECTOR).items:
        ready = node_ready_status(node)
        wrong = [] if ready == "True" else [f"Ready={ready}"]
        wrong += [t.key for t in node.spec.taints or [] if t.key in taints]
        if wrong:
            out[node.metadata.name] = wrong
    return out


def set_heartbeat(c: Clients, name: str, *, alive: bool) -> None:
    """Silence (``alive=False``) or revive kwok's heartbeats for node ``name``."""
    if alive:
        # An expired Lease: kwok takes it over on its next try and manages the node again. A
        # merge patch carries no resourceVersion: it wins over a concurrent renewal.
        spec = {"leaseDurationSeconds": 1, "renewTime": format_time(time.time() - 3600)}
        c.coordination.patch_namespaced_lease(name, NODE_LEASE_NAMESPACE, {"spec": spec})
        return
    for _ in range(SILENCE_ATTEMPTS):
        lease = c.coordination.read_namespaced_lease(name, NODE_LEASE_NAMESPACE)
        # renewTime moves on by 10 us only: the node died just after its last heartbeat, at a
        # random point of its renew interval, as a real node does. It must move on at all:
        # from 1.37 the node lifecycle controller (NodeControllerLeaseCircuitBreaker, beta, on)
        # GETs a Lease that looks expired and, if its resourceVersion differs from the last
        # renewal it saw, waits for its cache instead of marking the node; a write that leaves
        # renewTime as it was is never taken as a renewal, so the node would never go Unknown.
        renewed = lease.spec.renew_time.timestamp() + 1e-5
        body = {
            # Optimistic concurrency: a kwok renewal between the read and this write conflicts
            # (409) and is read again, so renewTime never moves backwards.
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {
                "holderIdentity": SILENCED_HOLDER,
                "leaseDurationSeconds": 24 * 3600,
                "renewTime": format_time(renewed),
            },
        }
        try:
            c.coordination.patch_namespaced_lease(name, NODE_LEASE_NAMESPACE, body)
            return
        except ApiException as e:
            if e.status != HTTPStatus.CONFLICT:
                raise
    raise RuntimeError(f"could not silence node {name}: its Lease changed {SILENCE_ATTEMPTS} times")
