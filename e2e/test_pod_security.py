"""A gang in a namespace that enforces Pod Security's `restricted` profile, on the real kubelet
nodes: the injected agent (restricted, as the trainer's user) and the launcher run there, and a
trainer crash is recovered in place in both restart scopes. The trainer satisfies the profile
itself (docs/operations.md, "A hardened cluster": what a trainer must set)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from e2e.marks import POD_SCOPE
from testbed.controller import member_pods
from testbed.demo import (
    assert_recovered_in_place,
    barrier_opened,
    inject_failure,
    member_uids,
    training_gang,
)
from testbed.install import Installation
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 2
ENFORCE = "pod-security.kubernetes.io/enforce"
# What `restricted` asks of a container, as a trainer would set it (a user of its own).
RESTRICTED_TRAINER = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _refusal(kube: Clients, namespace: str) -> str | None:
    """Why the namespace refuses a pod that asks nothing of `restricted` (a server-side dry
    run); None while it still admits it. Any refusal but Pod Security's fails the test."""
    privileged = {
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {}}]},
    }
    try:
        kube.core.create_namespaced_pod(namespace, privileged, dry_run="All")
    except ApiException as e:
        if e.status != 403:
            raise
        return str(e.body)
    return None


@pytest.mark.parametrize("scope", ["process", POD_SCOPE])
def test_a_restricted_namespace_gang_recovers_in_place(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str, scope: str
) -> None:
    labels = {ENFORCE: "restricted", f"{ENFORCE}-version": "latest"}
    kube.core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    # the namespace refuses what the profile forbids (the control: enforcement is on). Pod
    # Security admission reads the namespace's labels from the apiserver's informer, which
    # lags the patch on a loaded machine: a server-side dry run is asked until it refuses.
    refusal = wait_for(
        "Pod Security's enforcement of the new label",
        lambda: _refusal(kube, namespace),
        60,
    )
    assert "violates PodSecurity" in refusal, refusal

    training_gang(
        kube,
        cluster_kubeconfig,
        namespace,
        "gang",
        MEMBERS,
        scope=scope,
        security=RESTRICTED_TRAINER,
    )
    pods = member_pods(kube, namespace, "gang")
    before = member_uids(kube, namespace, "gang")
    for p in pods.values():
        [agent] = [c for c in p.spec.init_containers if c.name == "jobset-inplace-agent"]
        assert agent.security_context.run_as_user == 1000, "the agent runs as the trainer"
    inject_failure(cluster_kubeconfig, namespace, pods["1"].metadata.name)
    st = barrier_opened(kube, namespace, "gang", 2)
    assert_recovered_in_place(
        kube, cluster_kubeconfig, namespace, "gang", MEMBERS, state=st, before=before
    )
