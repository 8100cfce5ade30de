"""Hybrid recovery end to end on the local cluster: the real controller, real agents and the
demo trainer in real containers on the real kubelet nodes, JobSet and its Job controller."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from e2e.marks import POD_SCOPE
from jobset_inplace import names
from testbed.demo import run_demo, trainer_log
from testbed.install import Installation
from testbed.kube import Clients, wait_for

pytestmark = pytest.mark.e2e


def _resumed_at(kubeconfig: Path, namespace: str, pod: str) -> list[int]:
    out = trainer_log(kubeconfig, namespace, pod)
    return [int(m) for m in re.findall(r"resuming at step (\d+)", out)]


def _barrier_openings(kube: Clients, namespace: str, name: str) -> int:
    events = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return sum(1 for e in events if e.reason == "BarrierOpened")


@pytest.mark.parametrize("scope", ["process", "prestart", POD_SCOPE])
def test_trainer_crash_restarts_the_gang_in_place_from_one_step(
    cluster_kubeconfig: Path, controller: Installation, kube: Clients, namespace: str, scope: str
) -> None:
    """Process scope (the default): only the trainer processes restart, no container does.
    Prestart: the same, each epoch's trainer started and its imports done while the epoch
    before it ran (``prestart-imports``; the standby at once, not 15 s into an epoch).
    Pod scope: every container of every member restarts (RestartAllContainers), same pods."""
    prestart = scope == "prestart"
    result = run_demo(
        cluster_kubeconfig,
        name="gang",
        namespace=namespace,
        members=2,
        scope="process" if prestart else scope,
        annotations={names.PRESTART_IMPORTS: "json,decimal"} if prestart else None,
        env={"JSI_PRESTART_AFTER_SECONDS": "0"} if prestart else None,
    )

    assert result.webhook_injected, "the admission webhook injected the agent at create"
    assert result.uids_after == result.uids_before, "every member kept its pod (in place)"
    assert result.state["epoch"] == 2
    assert result.state["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}
    assert result.resume_step is not None
    assert result.resume_step > 0, "the gang resumed from a checkpoint, not from scratch"
    # The BarrierOpened Event is posted after the status write that opened the barrier, which
    # the demo may have read before it: count the Events once they are there.
    openings = wait_for(
        "2 BarrierOpened events",
        lambda: n if (n := _barrier_openings(kube, namespace, "gang")) >= 2 else None,
        30,
    )
    assert openings == 2, "epoch 1 at start, epoch 2 once after the failure"
    pods = kube.core.list_namespaced_pod(namespace).items
    assert len(pods) == 2
    # The agents reported over the leader's report channel, which the status names: nothing
    # on the pods (a failed channel would have left its report there).
    endpoint = result.state.get("reportEndpoint") or {}
    assert endpoint.get("url", "").startswith("https://"), result.state
    reports_on_pods = {
        p.metadata.name: (p.metadata.annotations or {}).get(names.REPORT_EPOCH) for p in pods
    }
    assert set(reports_on_pods.values()) == {None}, reports_on_pods
    kubeconfig = cluster_kubeconfig
    for pod in pods:
        # The trainer's log says where it resumed in the new epoch (the demo waited for it).
        name = pod.metadata.name
        resumed = _resumed_at(kubeconfig, namespace, name)
        assert resumed[-1] == result.resume_step
        restarts = {
            c.name: c.restart_count
            for c in [*pod.status.init_container_statuses, *pod.status.container_statuses]
        }
        if scope == "pod":
            assert resumed == [result.resume_step], "a new container: only the new epoch"
            assert min(restarts.values()) >= 1, f"{name}: every container restarted: {restarts}"
        else:
            assert resumed == [0, result.resume_step], "one container's log: both epochs"
            assert set(restarts.values()) == {0}, f"{name}: no container restarted: {restarts}"
        if prestart:  # each epoch's trainer was the one pre-started and held for it
            log = trainer_log(kubeconfig, namespace, name)
            released = re.findall(r"epoch (\d+): released pre-started pid", log)
            assert released == ["1", "2"], log[-3000:]
            assert "imported json,decimal in" in log
            assert not re.search(r"epoch \d+: started ", log), "no epoch started cold"
    # Training to redo (core/goodput.py), against the trainers' own account: at least the
    # steps the crashed trainer itself had made past the resume step (it logs the step it died
    # at; its log survives only in the process scope). Not an upper bound here: the demo's
    # members are not in lockstep as a synchronous trainer's are (the crashed one waited for
    # its set crash time while the other went on), so the healthy member's progress, which the
    # figure includes, is ahead of the crashed one's by up to seconds.
    lost = (result.state.get("recovery") or {}).get("progressStepsLost")
    assert lost is not None, result.state.get("recovery")
    if scope != "pod":
        [died_at] = [
            int(m)
            for pod in pods
            for m in re.findall(
                r"injected failure at step (\d+)",
                trainer_log(kubeconfig, namespace, pod.metadata.name),
            )
        ]
        assert lost >= died_at - result.resume_step, (lost, died_at, result.resume_step)
    steps = "; ".join(f"+{t:.2f}s {w}" for w, t in result.phases)
    print(
        f"\nreal in-place gang recovery ({scope} scope): crash -> every trainer running "
        f"{result.crash_to_running:.2f}s; {steps}; {lost} step(s) to redo"
    )
