"""The hybrid-recovery demo on the local cluster (``make demo``), also driven by the e2e suite.

It installs the GangState CRD and agent RBAC, runs the controller, submits a training JobSet
(transformed by :func:`jobset_inplace.core.transform.transform`) whose members run the demo trainer
on the real kubelet nodes, lets it train, injects a worker failure, and records a timeline of
what the API shows: detection, in-place restarts, barrier opening, training again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.transform import AGENT_CONTAINER, STATE_DIR
from jobset_inplace.times import parse_time

from . import workloads
from .cluster import REAL_NODE_LABEL, LocalCluster
from .controller import IMAGE, ControllerProcess, gang_state, member_pods, prepare, slot_holders
from .demo_trainer import FAILURE_FILE, HANG_FILE, SLOW_FILE
from .kube import Clients, clients, create_jobset, wait_for
from .versions import binaries

NAMESPACE = "jsi-demo"
PERSISTENT_MOUNT = "/ckpt-shared"  # the persistent tier in the demo trainer (demo_jobset)
# ... and beside it, a directory the whole gang shares whatever the tier's layout (its
# members' lockstep: testbed/demo_trainer.py, ENV_LOCKSTEP_DIR)
GANG_MOUNT = "/gang"
GANG_SUBDIR = "gang"  # its host directory, under the persistent tier's
# The member's JobSet job index in the trainer's environment values (Kubernetes expands it):
# with a ``persistent`` tier, e.g. a file of the member's own in a root the gang shares.
JOB_INDEX_REF = "$(JOB_INDEX)"


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
    # (phase, seconds after the crash) from the components' own log timestamps
    phases: list[tuple[str, float]] = field(default_factory=list)

    @property
    def crash_to_running(self) -> float:
        """Crash -> every trainer running again (resumed in the new epoch)."""
        return self.phases[-1][1]


def demo_jobset(
    name: str,
    members: int,
    labels: dict[str, str] | None = None,
    scope: str | None = None,
    *,
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    claims: dict[str, str] | None = None,
    persistent: Path | None = None,
    security: dict[str, Any] | None = None,
    service_account: str | None = None,
    shared_root: bool = False,
    spares: int = 0,
    together: bool = False,
) -> dict[str, Any]:
    """The demo JobSet as a user writes it: opted in, no agent (the webhook injects it);
    ``scope``: the restart-scope annotation (None: the default); ``annotations``: more of
    them; ``env``: more of the trainer's environment; ``limits``: its resource limits (e.g. a
    device per member); ``claims``: the trainer's DRA resource claims (pod claim name ->
    ResourceClaimTemplate name: a claim of its own per pod); ``persistent``: a host directory as
    the persistent checkpoint tier, one subdirectory per member (its JobSet job index: the Job
    completion index is 0 in every one-pod Job), shared by the local cluster's real nodes as
    nodes share a network filesystem, so a member recreated on another node finds its steps;
    ``security``: the trainer container's securityContext; ``service_account``: the
    ServiceAccount its pods run as (None: none named); ``shared_root``: ``persistent`` is one
    root for the whole gang instead (its state is replicated: docs/trainer-contract.md, "One
    root for a replicated gang"). With ``persistent``, ``GANG_MOUNT`` is a directory every
    member shares either way (``persistent``/``GANG_SUBDIR``). ``spares``: that many hot
    spares (``jobset-inplace.dev/hot-spares``), the pods spread over the real nodes where they
    can be; the trainer then knows its member by the slot the launcher gives it
    (``JSI_SLOT``), not by its pod's job index, which the webhook refuses to expose (a spare's
    is not the member's), so ``persistent`` must be ``shared_root``. ``together``: every pod
    on one node (`workloads.on_one_node`: where the nodes share no host directory, as kind's).
    """
    if spares and together:
        raise ValueError("spares spread the gang over nodes; together puts it on one: not both")
    if spares and persistent is not None and not shared_root:
        raise ValueError(
            "spares: a spare takes a member's slot and must read its checkpoints: give the "
            "gang one persistent root (shared_root=True)"
        )
    volumes: list[dict[str, Any]] = [{"name": "ckpt", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    tiers: list[dict[str, Any]] = [{"name": "JSI_CHECKPOINT_LOCAL_DIR", "value": "/ckpt/local"}]
    if persistent is not None:
        volumes.append(
            {"name": "shared", "hostPath": {"path": str(persistent), "type": "DirectoryOrCreate"}}
        )
        mount = {"name": "shared", "mountPath": PERSISTENT_MOUNT}
        if not spares:  # the member's index, for its own subdirectory or files (JOB_INDEX_REF)
            index = {"fieldRef": {"fieldPath": f"metadata.labels['{names.JOB_INDEX_LABEL}']"}}
            tiers.append({"name": "JOB_INDEX", "valueFrom": index})
        if not shared_root:
            mount["subPathExpr"] = JOB_INDEX_REF
        mounts.append(mount)
        gang = str(persistent / GANG_SUBDIR)
        volumes.append({"name": "gang", "hostPath": {"path": gang, "type": "DirectoryOrCreate"}})
        mounts.append({"name": "gang", "mountPath": GANG_MOUNT})
        tiers.append({"name": "JSI_CHECKPOINT_PERSISTENT_DIR", "value": PERSISTENT_MOUNT})
    trainer: dict[str, Any] = {
        "name": "trainer",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "-m", "demo_trainer"],
        "env": [
            *tiers,
            *(
                {"name": k, "value": v}
                for k, v in ({"JSI_DEMO_STEP_SECONDS": "0.2"} | (env or {})).items()
            ),
        ],
        "volumeMounts": mounts,
    }
    resources: dict[str, Any] = {
        **({"limits": limits} if limits else {}),
        **({"claims": [{"name": c} for c in claims]} if claims else {}),
    }
    if resources:
        trainer["resources"] = resources
    if security:
        trainer["securityContext"] = security
    js = workloads.jobset(
        name,
        [("workers", members, 1)],
        labels=labels,
        annotations={
            names.ENABLED: "true",
            **({names.RESTART_SCOPE: scope} if scope else {}),
            **({names.HOT_SPARES: str(spares)} if spares else {}),
            **(annotations or {}),
        },
        node_selector={REAL_NODE_LABEL: "true"},
        pod={
            "terminationGracePeriodSeconds": 2,
            "volumes": volumes,
            "containers": [trainer],
            **(
                {
                    "resourceClaims": [
                        {"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()
                    ]
                }
                if claims
                else {}
            ),
            **({"serviceAccountName": service_account} if service_account else {}),
            **({"affinity": workloads.spread_over_nodes(name)} if spares else {}),
            **({"affinity": workloads.on_one_node(name)} if together else {}),
        },
    )
    return js


def _agent_injected(jobset: dict[str, Any]) -> bool:
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return any(c["name"] == AGENT_CONTAINER for c in spec.get("initContainers") or [])


RESUMED = re.compile(r"epoch (\d+): resuming at step (\d+)")


def assert_resumed(kubeconfig: Path, ns: str, pods: Iterable[Any], epoch: int, step: int) -> None:
    """Every demo trainer of ``pods`` resumed in ``epoch`` at ``step``."""
    for p in pods:
        log = trainer_log(kubeconfig, ns, p.metadata.name)
        assert f"epoch {epoch}: resuming at step {step}" in log, (
            f"{p.metadata.name}:\n{log[-2000:]}"
        )


def one_replaced_others_in_place(
    kube: Clients,
    kubeconfig: Path,
    ns: str,
    name: str,
    *,
    before: dict[str, Any],
    replaced: str,
    epoch: int,
    resume: int,
) -> dict[str, Any]:
    """After a recovery to ``epoch`` that replaced member ``replaced`` (its job index) and
    restarted the others in place: every trainer runs again, the others kept their pods (UIDs
    of ``before``), ``replaced`` has a new one, and every trainer resumed at ``resume``. The
    pods then, by job index."""
    wait_for(
        "every trainer running again",
        lambda: trainers_running(kube, kubeconfig, ns, name, len(before), epoch=epoch),
        120,
    )
    after: dict[str, Any] = member_pods(kube, ns, name, include_failed=False)
    for i, pod in before.items():
        if i == replaced:
            assert after[i].metadata.uid != pod.metadata.uid, f"member {i} replaced"
        else:
            assert after[i].metadata.uid == pod.metadata.uid, f"member {i} in place"
    assert_resumed(kubeconfig, ns, after.values(), epoch, resume)
    return after


def member_uids(kube: Clients, ns: str, name: str) -> dict[str, str]:
    """The gang's pod UIDs by job index."""
    return {i: p.metadata.uid for i, p in member_pods(kube, ns, name).items()}


def barrier_opened(kube: Clients, ns: str, name: str, epoch: int, timeout: float = 180) -> Any:
    """The gang's GangState status once ``epoch``'s barrier is open (waits up to ``timeout``)."""
    return wait_for(
        f"barrier of epoch {epoch}",
        lambda: (
            s
            if (s := gang_state(kube, ns, name)).get("epoch") == epoch and s.get("barrierOpen")
            else None
        ),
        timeout,
    )


def assert_recovered_in_place(
    kube: Clients,
    kubeconfig: Path,
    ns: str,
    name: str,
    members: int,
    *,
    state: dict[str, Any],
    before: dict[str, str],
) -> None:
    """One member failure of a trained gang recovered in place: ``state`` (the GangState's
    status once epoch 2 opened) charged one in-place recovery and no recreation and resumed
    from a common checkpoint; every trainer runs in epoch 2; every member kept its pod (its
    UIDs ``before``, :func:`member_uids`)."""
    assert state["epoch"] == 2, state
    assert state["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}, state["budgets"]
    assert (state["resumeStep"] or 0) > 0, "from the common checkpoint, not from scratch"
    wait_for(
        "every trainer running again",
        lambda: trainers_running(kube, kubeconfig, ns, name, members, epoch=2),
        120,
    )
    assert member_uids(kube, ns, name) == before, "every member kept its pod (in place)"


def trainers_running(
    kube: Clients, kubeconfig: Path, ns: str, name: str, members: int, *, epoch: int
) -> bool:
    """Every member's trainer container runs and its trainer resumed in ``epoch`` or later
    (its log says so: the same test for every restart scope); with hot spares, the trainers
    of the pods that hold the ``members`` slots."""
    pods = slot_holders(kube, ns, name, members)
    if len(pods) != members:
        return False
    for p in pods.values():
        cs = {c.name: c for c in p.status.container_statuses or []}
        t = cs.get("trainer")
        if t is None or t.state.running is None:
            return False
        try:
            log = trainer_log(kubeconfig, ns, p.metadata.name)
        except subprocess.CalledProcessError:
            return False  # restarting: no log to read yet
        if max((int(e) for e, _ in RESUMED.findall(log)), default=-1) < epoch:
            return False
    return True


def trainer_log(kubeconfig: Path, namespace: str, pod: str) -> str:
    """What the demo trainer of ``pod`` printed (its current container)."""
    return "".join(line + "\n" for _, line in timed_log(kubeconfig, namespace, pod, "trainer"))


def started_trainer_log(kubeconfig: Path, namespace: str, pod: str) -> str:
    """:func:`trainer_log`, empty while the trainer container has not started (the barrier
    holds it)."""
    try:
        return trainer_log(kubeconfig, namespace, pod)
    except subprocess.CalledProcessError:
        return ""


def timed_log(
    kubeconfig: Path, namespace: str, pod: str, container: str
) -> list[tuple[float, str]]:
    """The container's log lines, each with the time the runtime received it.

    CalledProcessError also when kubectl answers with a notice instead of the log (exit 0, e.g.
    "unable to retrieve container logs for containerd://..." while the container is replaced):
    callers that poll treat it as "not yet", like a failed kubectl."""
    cmd = [str(binaries().kubectl), "--kubeconfig", str(kubeconfig), "-n", namespace, "logs"]
    cmd += [pod, "-c", container, "--timestamps"]
    # bytes, decoded here: text=True would read a carriage return as a line end
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode(errors="replace")
    try:
        return parse_timed_log(out)
    except ValueError as e:
        raise subprocess.CalledProcessError(1, cmd, output=out, stderr=str(e)) from None


def parse_timed_log(out: str) -> list[tuple[float, str]]:
    """``kubectl logs --timestamps`` output -> (time, line) pairs; ValueError for a line with
    no timestamp. A line ends at "\n" only: a carriage return inside one (a progress bar's)
    stays in it."""
    lines = []
    for raw in out.removesuffix("\n").split("\n") if out else []:
        stamp, _, line = raw.partition(" ")
        try:
            lines.append((log_time(stamp), line))
        except ValueError:
            raise ValueError(f"not a timestamped log line: {raw[:80]!r}") from None
    return lines


def log_time(text: str) -> float:
    """RFC 3339 with nanoseconds (the runtime's log timestamps) -> seconds since the epoch."""
    whole, _, frac = text.rstrip("Z").partition(".")
    base = datetime.fromisoformat(whole + "+00:00").timestamp()
    return base + float("0." + (frac or "0"))


def checkpointed(
    kube: Clients,
    kubeconfig: Path,
    namespace: str,
    name: str,
    members: int,
    *,
    persistent: bool = False,
) -> bool:
    """Every member's trainer (the holder of each of the ``members`` slots) saved a checkpoint
    (so the gang has a common step to resume); with ``persistent``, one in the persistent tier
    too (a recreated member's step)."""
    said = "checkpoint saved (both)" if persistent else "checkpoint saved"
    pods = slot_holders(kube, namespace, name, members)
    return bool(pods) and all(
        said in trainer_log(kubeconfig, namespace, p.metadata.name) for p in pods.values()
    )


def training_gang(
    kube: Clients,
    kubeconfig: Path,
    namespace: str,
    name: str,
    members: int,
    *,
    scope: str | None = None,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    claims: dict[str, str] | None = None,
    persistent: Path | None = None,
    security: dict[str, Any] | None = None,
    service_account: str | None = None,
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    shared_root: bool = False,
    spares: int = 0,
    together: bool = False,
) -> None:
    """A demo gang in ``namespace`` (prepared for gangs), trained to a checkpoint on every
    member: epoch 1's barrier open, every trainer running, a common step to resume from (in
    the ``persistent`` tier too if given: see `demo_jobset`; ``env``: more of the trainer's
    environment; ``labels``: the JobSet's, e.g. Kueue's queue)."""
    prepare(kube, kubeconfig, namespace)
    create_jobset(
        kube,
        namespace,
        demo_jobset(
            name,
            members,
            scope=scope,
            annotations=annotations,
            limits=limits,
            claims=claims,
            persistent=persistent,
            security=security,
            service_account=service_account,
            env=env,
            labels=labels,
            shared_root=shared_root,
            spares=spares,
            together=together,
        ),
    )
    wait_for(
        "barrier of epoch 1", lambda: gang_state(kube, namespace, name).get("barrierOpen"), 180
    )
    wait_for(
        "trainers running",
        lambda: trainers_running(kube, kubeconfig, namespace, name, members, epoch=1),
        120,
    )
    wait_for(
        "a checkpoint on every member" + (" (persistent tier too)" if persistent else ""),
        lambda: checkpointed(
            kube, kubeconfig, namespace, name, members, persistent=bool(persistent)
        ),
        60,
    )


def inject_failure(kubeconfig: Path, namespace: str, pod: str, at: float | None = None) -> None:
    """Make the demo trainer in ``pod`` exit 3 at its next step, or at the time ``at``
    (seconds since the epoch: at least a step's time ahead)."""
    _lever(kubeconfig, namespace, pod, FAILURE_FILE, "" if at is None else f"{at:.3f}")


def inject_hang(kubeconfig: Path, namespace: str, pod: str) -> None:
    """Make the demo trainer in ``pod`` hang at its next step (alive, no progress, SIGTERM
    ignored)."""
    _lever(kubeconfig, namespace, pod, HANG_FILE, "")


def inject_slowdown(kubeconfig: Path, namespace: str, pod: str, factor: float) -> None:
    """Make the demo trainer in ``pod`` compute ``factor`` times longer per step (a straggler)."""
    _lever(kubeconfig, namespace, pod, SLOW_FILE, f"{factor:g}")


def python_in_trainer(
    kubectl: list[str], pod: str, code: str, args: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``python3`` (``args``: its ``sys.argv[1:]``) in ``pod``'s trainer
    container (``kubectl``: the command with its kubeconfig and namespace); its output,
    unchecked."""
    cmd = [*kubectl, "exec", pod, "-c", "trainer", "--", "python3", "-c", code, *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True)


def _lever(kubeconfig: Path, namespace: str, pod: str, lever: str, text: str) -> None:
    cmd = [str(binaries().kubectl), "--kubeconfig", str(kubeconfig), "-n", namespace, "exec"]
    cmd += [pod, "-c", "trainer", "--", "sh", "-c", f"echo {text} > {STATE_DIR}/{lever}"]
    subprocess.run(cmd, check=True, capture_output=True)


# How far ahead of the injection the crash is set: kubectl exec takes ~0.2 s, a step 0.2 s.
CRASH_LEAD_S = 1.5


def _first_after(lines: list[tuple[float, str]], after: float, pattern: str) -> float | None:
    return next((t for t, line in lines if t > after and re.search(pattern, line)), None)


def recovery_phases(
    kube: Clients, kubeconfig: Path, namespace: str, name: str, *, crash: float, epoch: int
) -> list[tuple[str, float]]:
    """Where the time from the crash to every trainer running in ``epoch`` went, from the
    components' own timestamps: the controller's status (detection, barrier open), the agents'
    and launchers' logs (stopped, reported), the trainers' logs (running). Seconds after the
    crash; a phase is the latest member's."""
    st = gang_state(kube, namespace, name)
    rec = st.get("recovery") or {}
    stopped: list[float] = []
    reported: list[float] = []
    running: list[float] = []
    for pod in member_pods(kube, namespace, name).values():
        pname = pod.metadata.name
        trainer = timed_log(kubeconfig, namespace, pname, "trainer")
        agent = timed_log(kubeconfig, namespace, pname, AGENT_CONTAINER)
        at = _first_after(trainer, crash, r"launcher: stopped")
        if at is not None:
            stopped.append(at)
        at = _first_after(agent, crash, rf"reported epoch {epoch}\b")
        if at is not None:
            reported.append(at)
        at = _first_after(trainer, crash, rf"epoch {epoch}: resuming")
        assert at is not None, f"{pname}: no resume in epoch {epoch} in its trainer's log"
        running.append(at)
    phases = [("first signal -> recovery started (controller)", parse_time(rec.get("startedAt")))]
    if stopped:
        phases.append(("healthy trainers stopped (launchers)", max(stopped)))
    if reported:
        phases.append((f"every agent reported epoch {epoch}", max(reported)))
    phases.append(("barrier open (controller)", parse_time(rec.get("openedAt"))))
    phases.append(("every trainer running again", max(running)))
    return [(what, t - crash) for what, t in phases if t is not None]


def run_demo(
    kubeconfig: Path,
    *,
    name: str = "demo",
    namespace: str = NAMESPACE,
    members: int = 2,
    labels: dict[str, str] | None = None,
    scope: str | None = None,
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> DemoResult:
    """The demo: a gang of the demo trainer, one crash, the in-place recovery; ``annotations``
    and ``env``: more of the JobSet's and of the trainer's (:func:`demo_jobset`)."""
    kube = clients(kubeconfig)
    prepare(kube, kubeconfig, namespace)
    print(
        f"demo: JobSet {namespace}/{name}, {members} members on real kubelet nodes, "
        f"restart scope {scope or 'default'}"
    )
    created = create_jobset(
        kube,
        namespace,
        demo_jobset(name, members, labels, scope, annotations=annotations, env=env),
    )
    injected = _agent_injected(created)
    print(f"demo: admission webhook injected the agent: {injected}")

    wait_for(
        "barrier of epoch 1 open",
        lambda: gang_state(kube, namespace, name).get("barrierOpen"),
        180,
        0.5,
    )
    epoch = int(gang_state(kube, namespace, name)["epoch"])
    wait_for(
        "trainers running",
        lambda: trainers_running(kube, kubeconfig, namespace, name, members, epoch=epoch),
        120,
        0.5,
    )
    wait_for(  # every member has a checkpoint (step 10 at 0.2 s/step): a step to resume from
        "a checkpoint on every member",
        lambda: checkpointed(kube, kubeconfig, namespace, name, members),
        60,
    )
    before = {i: p.metadata.uid for i, p in member_pods(kube, namespace, name).items()}
    victim = sorted(before)[-1]
    victim_pod = member_pods(kube, namespace, name)[victim].metadata.name

    tl = Timeline()
    crash = time.time() + CRASH_LEAD_S
    inject_failure(kubeconfig, namespace, victim_pod, crash)
    tl.t0 -= time.time() - crash  # the timeline counts from the crash
    tl.mark(f"crash set: trainer of member {victim} ({victim_pod}) exits 3 at t+0")
    seen: set[str] = set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        st = gang_state(kube, namespace, name)
        if "detected" not in seen and st.get("epoch", 0) > epoch:
            rec = st.get("recovery") or {}
            tl.mark(
                f"detected: epoch {st['epoch']} opened, causes {rec.get('causes')}, "
                f"{rec.get('inPlace')} in place, {len(rec.get('recreated') or {})} recreated"
            )
            seen.add("detected")
        if "opened" not in seen and st.get("barrierOpen") and st.get("epoch", 0) > epoch:
            tl.mark(
                f"barrier opened for epoch {st['epoch']}: resume at step "
                f"{st.get('resumeStep')} (recovery {st['recovery']['durationSeconds']}s)"
            )
            seen.add("opened")
        if "opened" in seen and trainers_running(
            kube, kubeconfig, namespace, name, members, epoch=epoch + 1
        ):
            tl.mark("training running again on every member")
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"recovery did not complete in 180 s; timeline {tl.entries}")
    st = gang_state(kube, namespace, name)
    phases = recovery_phases(kube, kubeconfig, namespace, name, crash=crash, epoch=epoch + 1)
    print("demo: where the time went (components' own timestamps, after the crash):")
    for what, t in phases:
        print(f"  t+{t:6.2f}s  {what}")
    return DemoResult(
        timeline=tl,
        uids_before=before,
        uids_after={i: p.metadata.uid for i, p in member_pods(kube, namespace, name).items()},
        resume_step=st.get("resumeStep"),
        recovery_seconds=float(st["recovery"]["durationSeconds"]),
        state=st,
        webhook_injected=injected,
        phases=phases,
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
        f"recovery: crash -> every trainer running again {result.crash_to_running:.2f}s "
        f"({result.recovery_seconds:.2f}s from the first signal to barrier open); "
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
