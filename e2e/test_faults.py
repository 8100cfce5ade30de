"""Fault injection on the local cluster: each test is a class of fault a hostile operator (or a
bad day) brings, on real components (real kubelet nodes, real in-place restarts, real JobSet),
and what the product must still guarantee (docs/guarantees.md: the fault model).

Classes covered here:

* the controller down while a member fails and restarts in place (the failure must not be lost:
  guarantee 6);
* the crashed member's pod cut off from the leader's report channel (its packets dropped, or
  refused), so that its agent's reports reach the controller only through its pod: the
  failure is recovered exactly as over the channel, and the members reporting on their pods
  are surfaced, not waited on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.marks import POD_SCOPE
from jobset_inplace import names
from testbed.cluster import LocalCluster
from testbed.controller import gang_state, member_pods
from testbed.demo import (
    assert_recovered_in_place,
    inject_failure,
    member_uids,
    training_gang,
)
from testbed.install import Installation
from testbed.kube import Clients, wait_for
from testbed.podnet import Block, blocked

MEMBERS = 2


def _annotations(pod: Any) -> dict[str, str]:
    return dict(pod.metadata.annotations or {})


# restart scope -> (the trace the unseen failure leaves on the pod, the cause the controller
# finds there when it is back)
UNSEEN = {
    # the kubelet restarts the pod in place within seconds; its new agent finds epoch 1's
    # barrier open, reports late and waits
    "pod": (names.REPORT_LATE, "AgentWaiting"),
    # the container keeps running; the agent reports its trainer's exit
    "process": (names.REPORT_EXITED, "TrainerExited"),
}


@pytest.mark.parametrize("scope", ["process", POD_SCOPE])
def test_a_failure_while_the_controller_is_down_is_not_lost(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str, scope: str
) -> None:
    """Controller down (its Deployment scaled to 0); a trainer exits; the pod status shows
    nothing of it a few seconds later (pod scope: restarted in place; process scope: the
    launcher kept the container). The controller, started again, must recover the gang
    (epoch 2, everyone in place, one resume step) instead of seeing a Running gang with every
    member reported."""
    trace, cause = UNSEEN[scope]
    training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, scope=scope)
    before = member_uids(kube, namespace, "gang")
    victim = member_pods(kube, namespace, "gang")["1"]

    controller.scale(0)  # every replica gone (an outage of the controller)
    try:
        inject_failure(cluster_kubeconfig, namespace, victim.metadata.name)
        # The failure left only the agent's mark on the pod.
        wait_for(
            f"pod {victim.metadata.name}: {trace}=1",
            lambda: (
                _annotations(kube.core.read_namespaced_pod(victim.metadata.name, namespace)).get(
                    trace
                )
                == "1"
            ),
            60,
        )
        st = gang_state(kube, namespace, "gang")
        assert (st["epoch"], st["phase"], st["barrierOpen"]) == (1, "Running", True)
    finally:
        controller.scale(2)

    st = wait_for(
        "the controller recovers the gang into epoch 2",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 else None,
        60,
    )
    assert st["recovery"]["causes"] == {"workers/1/0": cause}
    st = wait_for(
        "barrier of epoch 2",
        lambda: s if (s := gang_state(kube, namespace, "gang")).get("barrierOpen") else None,
        120,
    )
    assert_recovered_in_place(
        kube, cluster_kubeconfig, namespace, "gang", MEMBERS, state=st, before=before
    )
    assert all(trace not in _annotations(p) for p in member_pods(kube, namespace, "gang").values())


@pytest.mark.parametrize("how", list(Block))
def test_a_crash_reported_only_through_the_pod_is_recovered_and_surfaced(  # noqa: PLR0917
    local_cluster: LocalCluster | None,
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    how: Block,
) -> None:
    """Process scope (nothing but the agent's report signals a trainer's exit there). Member
    1's pod cannot reach the report channel (its packets to the leader's channel and to the
    report fronts dropped, or refused) when its trainer exits: its agent writes the exit, then
    its epoch-2 report, on its pod. The gang recovers as over the channel: epoch 2, one
    in-place recovery charged, same pods, a common resume step; and it is not silent: the
    status counts the member reporting on its pod and a ReportChannelUnreachable Warning Event
    names it."""
    if local_cluster is None:
        pytest.skip("blocks a pod's traffic in its network namespace: the local real nodes")
    training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, scope="process")
    before = member_uids(kube, namespace, "gang")
    url = (gang_state(kube, namespace, "gang").get("reportEndpoint") or {}).get("url")
    assert url, "the leader serves the report channel"
    victim = member_pods(kube, namespace, "gang")["1"]

    # the leader's channel and every report front (the standbys serve theirs on its port)
    with blocked(victim.status.pod_ip, url, how, every_host=True):
        inject_failure(cluster_kubeconfig, namespace, victim.metadata.name)
        st = wait_for(
            "the controller recovers the gang into epoch 2",
            lambda: s if (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 else None,
            60,
        )
        assert st["recovery"]["causes"] == {"workers/1/0": "TrainerExited"}
        st = wait_for(
            "barrier of epoch 2",
            lambda: s if (s := gang_state(kube, namespace, "gang")).get("barrierOpen") else None,
            120,
        )
        reported = _annotations(kube.core.read_namespaced_pod(victim.metadata.name, namespace))
        # still cut off: its epoch-2 report can only have come through its pod
        assert reported.get(names.REPORT_EPOCH) == "2", reported
        healthy = member_pods(kube, namespace, "gang")["0"]
        assert names.REPORT_EPOCH not in _annotations(healthy), "member 0 used the channel"
        surfaced = wait_for(
            "the member reporting on its pod counted in the status",
            lambda: (
                s if (s := gang_state(kube, namespace, "gang"))["members"].get("onPod") else None
            ),
            30,
        )
        assert surfaced["members"]["onPod"] == 1, surfaced["members"]

    events = kube.core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=gang,reason=ReportChannelUnreachable"
    ).items
    said = [e.message for e in events if e.type == "Warning"]
    assert any("workers/1/0" in m and url in m for m in said), said
    assert_recovered_in_place(
        kube, cluster_kubeconfig, namespace, "gang", MEMBERS, state=st, before=before
    )
