"""Install, upgrade and uninstall with the Helm chart, with a gang training throughout
(docs/operations.md): the chart installs a working controller; upgrading it (a rolling
replacement of both replicas) changes nothing for the gang, and the upgraded controller
recovers it; uninstalling leaves the gang training (no pod deleted or restarted) and keeps
the GangState CRD. The session's kustomize install is put back afterwards."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from testbed.controller import barrier_open, gang_state, member_pods
from testbed.demo import inject_failure, trainer_log, trainers_running, training_gang
from testbed.helm import LOCAL_VALUES, Helm
from testbed.install import CRD, Installation, webhook_injects
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e

MEMBERS = 2
STEP = re.compile(r"step (\d+): checkpoint saved")


def _members(kube: Clients, namespace: str) -> dict[str, Any]:
    """Each member's pod UID and its containers' restart counts: what must not change."""
    return {
        i: (p.metadata.uid, {c.name: c.restart_count for c in p.status.container_statuses or []})
        for i, p in member_pods(kube, namespace, "gang").items()
    }


def _newest_steps(kubeconfig: Path, kube: Clients, namespace: str) -> dict[str, int]:
    """Each member's newest checkpoint step (from its trainer's log)."""
    out = {}
    for i, p in member_pods(kube, namespace, "gang").items():
        steps = STEP.findall(trainer_log(kubeconfig, namespace, p.metadata.name))
        out[i] = int(steps[-1]) if steps else -1
    return out


def _still_training(
    kubeconfig: Path, kube: Clients, namespace: str, since: dict[str, int], what: str
) -> None:
    """Every member checkpoints a newer step than ``since``."""
    wait_for(
        f"every member checkpoints again {what}",
        lambda: all(s > since[i] for i, s in _newest_steps(kubeconfig, kube, namespace).items()),
        60,
    )


@contextmanager
def _chart_instead_of(controller: Installation, helm: Helm) -> Iterator[None]:
    """The chart takes the session's kustomize install's place for the block; the kustomize
    install comes back afterwards whatever failed, uninstalls included: every later test needs
    a controller."""
    try:
        controller.uninstall()
        try:
            yield
        finally:
            try:
                helm.uninstall()
            except RuntimeError as e:
                if "not found" not in str(e):
                    raise
    finally:
        controller.install()


def test_helm_install_upgrade_uninstall_leave_a_training_gang_alone(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str
) -> None:
    helm = Helm(cluster_kubeconfig)
    with _chart_instead_of(controller, helm):
        helm.upgrade_install(LOCAL_VALUES)
        wait_for(
            "the chart's webhook injects the agent", lambda: webhook_injects(controller.kubectl), 60
        )
        training_gang(kube, cluster_kubeconfig, namespace, "gang", MEMBERS)
        members, state = _members(kube, namespace), gang_state(kube, namespace, "gang")
        replicas = {p["metadata"]["name"] for p in controller.pods()}

        # Upgrade: a changed pod template replaces both replicas, one after the other.
        steps = _newest_steps(cluster_kubeconfig, kube, namespace)
        helm.upgrade_install({**LOCAL_VALUES, "leaderElection": {"retryPeriod": "3s"}})
        wait_for(
            "both replicas replaced",
            lambda: not replicas & {p["metadata"]["name"] for p in controller.pods()},
            120,
        )
        _still_training(cluster_kubeconfig, kube, namespace, steps, "after the upgrade")
        assert _members(kube, namespace) == members, "no member pod replaced or restarted"
        after = gang_state(kube, namespace, "gang")
        assert (after["epoch"], after.get("history")) == (state["epoch"], state.get("history"))
        assert after["budgets"] == state["budgets"], "no budget charged"

        # The upgraded controller recovers the gang.
        inject_failure(
            cluster_kubeconfig,
            namespace,
            member_pods(kube, namespace, "gang")["1"].metadata.name,
        )
        barrier_open(kube, namespace, "gang", 2, 120)
        wait_for(
            "every trainer running again",
            lambda: trainers_running(kube, cluster_kubeconfig, namespace, "gang", MEMBERS, epoch=2),
            120,
        )
        members = _members(kube, namespace)

        # Uninstall: the controller and the webhook go; the gang trains on, untouched.
        steps = _newest_steps(cluster_kubeconfig, kube, namespace)
        helm.uninstall()
        # within the pods' 30 s grace period: every replica, the standby too, stops at SIGTERM
        wait_for("every controller pod gone", lambda: not controller.pods(), 25)
        _still_training(cluster_kubeconfig, kube, namespace, steps, "after the uninstall")
        assert _members(kube, namespace) == members, "no member pod deleted or restarted"
        controller.kubectl.run("get", f"crd/{CRD}")  # kept by helm.sh/resource-policy
        assert gang_state(kube, namespace, "gang")["epoch"] == 2, "the GangState is kept"
