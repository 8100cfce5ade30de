"""The hybrid-recovery demo on the local cluster (``make demo``), also driven by the e2e suite.

It installs the GangState CRD and agent RBAC, runs the controller, submits a training JobSet
(transformed by :func:`jobset_inplace.core.transform.transform`) whose members run the demo trainer
on the real kubelet nodes, lets it train, injects a worker failure, and records a timeline of
what the API shows: detection, in-place restarts, barrier opening, training again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.transform import AGENT_CONTAINER, STATE_DIR

from . import workloads
from .cluster import REAL_NODE_LABEL, LocalCluster
from .controller import IMAGE, ControllerProcess, gang_state, member_pods, prepare
from .demo_trainer import FAILURE_FILE
from .kube import Clients, clients, create_jobset, wait_for
from .versions import binaries

NAMESPACE = "jsi-demo"


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    entries: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.entries.append((time.monotonic() - self.t0, what))
        print(f"  t+{self.entries[-1][0]:6.2f}s  {what}", flush=True)

    def at(self, prefix: str) -> float:
        return next(t for t, w in self.entries if w.startswith(prefix))


@dataclass
class DemoResult:
    timeline: Timeline
    uids_before: dict[str, str]
    uids_after: dict[str, str]
    resume_step: int | None
    recovery_seconds: float
    state: dict[str, Any]
    webhook_injected: bool


def demo_jobset(name: str, members: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The demo JobSet as a user writes it: opted in, no agent (the webhook injects it)."""
    trainer = {
        "name": "trainer",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "-m", "demo_trainer"],
        "env": [
            {"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/ckpt/local"},
            {"name": "JSI_DEMO_STEP_SECONDS", "value": "0.2"},
        ],
        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
    }
    js = workloads.jobset(
        name,
        [("workers", members, 1)],
        labels=labels,
        annotations={names.ENABLED: "true"},
        node_selector={REAL_NODE_LABEL: "true"},
        pod={
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "ckpt", "emptyDir": {}}],
            "containers": [trainer],
        },
    )
    return js


def _agent_injected(jobset: dict[str, Any]) -> bool:
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return any(c["name"] == AGENT_CONTAINER for c in spec.get("initContainers") or [])


def trainers_running(kube: Clients, ns: str, name: str, members: int, restarts: int) -> bool:
    pods = member_pods(kube, ns, name)
    if len(pods) != members:
        return False
    for p in pods.values():
        cs = {c.name: c for c in p.status.container_statuses or []}
        t = cs.get("trainer")
        if t is None or t.state.running is None or t.restart_count < restarts:
            return False
    return True


def trainer_log(kubeconfig: Path, namespace: str, pod: str) -> str:
    """What the demo trainer of ``pod`` printed (its current container)."""
    cmd = [str(binaries().kubectl), "--kubeconfig", str(kubeconfig), "-n", namespace, "logs"]
    return subprocess.run(
        [*cmd, pod, "-c", "trainer"], capture_output=True, text=True, check=True
    ).stdout


def checkpointed(kube: Clients, kubeconfig: Path, namespace: str, name: str) -> bool:
    """Every member's trainer saved a checkpoint (so the gang has a common step to resume)."""
    pods = member_pods(kube, namespace, name)
    return bool(pods) and all(
        "checkpoint saved" in trainer_log(kubeconfig, namespace, p.metadata.name)
        for p in pods.values()
    )


def training_gang(kube: Clients, kubeconfig: Path, namespace: str, name: str, members: int) -> None:
    """A demo gang in ``namespace`` (prepared for gangs), trained to a checkpoint on every
    member: epoch 1's barrier open, every trainer running, a common step to resume from."""
    prepare(kube, kubeconfig, namespace)
    create_jobset(kube, namespace, demo_jobset(name, members))
    wait_for(
        "barrier of epoch 1", lambda: gang_state(kube, namespace, name).get("barrierOpen"), 180
    )
    wait_for("trainers running", lambda: trainers_running(kube, namespace, name, members, 0), 120)
    wait_for(
        "a checkpoint on every member",
        lambda: checkpointed(kube, kubeconfig, namespace, name),
        60,
    )


def inject_failure(kubeconfig: Path, namespace: str, pod: str) -> None:
    """Make the demo trainer in ``pod`` exit 3 at its next step."""
    cmd = [str(binaries().kubectl), "--kubeconfig", str(kubeconfig), "-n", namespace, "exec"]
    cmd += [pod, "-c", "trainer", "--", "touch", f"{STATE_DIR}/{FAILURE_FILE}"]
    subprocess.run(cmd, check=True, capture_output=True)


def run_demo(
    kubeconfig: Path,
    *,
    name: str = "demo",
    namespace: str = NAMESPACE,
    members: int = 2,
    labels: dict[str, str] | None = None,
) -> DemoResult:
    kube = clients(kubeconfig)
    prepare(kube, kubeconfig, namespace)
    print(f"demo: JobSet {namespace}/{name}, {members} members on real kubelet nodes")
    created = create_jobset(kube, namespace, demo_jobset(name, members, labels))
    injected = _agent_injected(created)
    print(f"demo: admission webhook injected the agent: {injected}")

    wait_for(
        "barrier of epoch 1 open",
        lambda: gang_state(kube, namespace, name).get("barrierOpen"),
        180,
        0.5,
    )
    wait_for(
        "trainers running", lambda: trainers_running(kube, namespace, name, members, 0), 120, 0.5
    )
    wait_for(  # every member has a checkpoint (step 10 at 0.2 s/step): a step to resume from
        "a checkpoint on every member",
        lambda: checkpointed(kube, kubeconfig, namespace, name),
        60,
    )
    before = {i: p.metadata.uid for i, p in member_pods(kube, namespace, name).items()}
    victim = sorted(before)[-1]
    victim_pod = member_pods(kube, namespace, name)[victim].metadata.name
    st0 = gang_state(kube, namespace, name)

    tl = Timeline()
    inject_failure(kubeconfig, namespace, victim_pod)
    tl.mark(f"failure injected: trainer of member {victim} ({victim_pod}) will exit 3")
    epoch = int(st0["epoch"])
    seen: set[str] = set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        st = gang_state(kube, namespace, name)
        pods = member_pods(kube, namespace, name)
        if "detected" not in seen and st.get("epoch", 0) > epoch:
            rec = st.get("recovery") or {}
            tl.mark(
                f"detected: epoch {st['epoch']} opened, causes {rec.get('causes')}, "
                f"{rec.get('inPlace')} in place, {len(rec.get('recreated') or {})} recreated"
            )
            seen.add("detected")
        if (
            "restarted" not in seen
            and pods
            and all(
                (p.status.init_container_statuses or [None])[0] is not None
                and p.status.init_container_statuses[0].restart_count >= 1
                for p in pods.values()
            )
        ):
            same = {i: p.metadata.uid for i, p in pods.items()} == before
            tl.mark(f"all {len(pods)} members restarted in place (same pod UIDs: {same})")
            seen.add("restarted")
        if "opened" not in seen and st.get("barrierOpen") and st.get("epoch", 0) > epoch:
            tl.mark(
                f"barrier opened for epoch {st['epoch']}: resume at step "
                f"{st.get('resumeStep')} (recovery {st['recovery']['durationSeconds']}s)"
            )
            seen.add("opened")
        if "opened" in seen and trainers_running(kube, namespace, name, members, 1):
            tl.mark("training running again on every member")
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"recovery did not complete in 180 s; timeline {tl.entries}")
    st = gang_state(kube, namespace, name)
    return DemoResult(
        timeline=tl,
        uids_before=before,
        uids_after={i: p.metadata.uid for i, p in member_pods(kube, namespace, name).items()},
        resume_step=st.get("resumeStep"),
        recovery_seconds=float(st["recovery"]["durationSeconds"]),
        state=st,
        webhook_injected=injected,
    )


def main() -> int:
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    cluster.up()
    ctl = ControllerProcess(cluster, cluster.logs_dir / "controller-demo.log")
    kube = clients(cluster.kubeconfig)
    if or_none(kube.core.delete_namespace, NAMESPACE) is not None:
        wait_for("old demo namespace gone", lambda: _gone(kube), 120, 1)
    try:
        result = run_demo(cluster.kubeconfig)
    finally:
        ctl.stop()
    print()
    print(
        f"recovery: {result.recovery_seconds:.2f}s from first signal to barrier open; "
        f"resumed at step {result.resume_step}; pods kept: "
        f"{result.uids_before == result.uids_after}"
    )
    print(f"controller log: {ctl.log}")
    print(f"inspect: kubectl --kubeconfig {cluster.kubeconfig} -n {NAMESPACE} get gangstates,pods")
    return 0


def _gone(kube: Clients) -> bool:
    return or_none(kube.core.read_namespace, NAMESPACE) is None


if __name__ == "__main__":
    sys.exit(main())
