"""The soak (``make soak``): a demo gang trains on the local cluster's real nodes for a long
time, with a failure every few minutes, in turn: a trainer crash, a silent node (its kubelet and
containerd stopped: its containers die, nothing reports; powered on again after the recovery),
a hung trainer, a device turning Unhealthy (the test device plugin, as a GPU's on an XID
error; healthy again after the recovery), a drained node. The controller's own goodput account
(GangState ``status.goodput``) is printed at the end: goodput, badput by bucket, steps lost per
recovery, the failure rate and the step time, so the figures compare with the field's
(docs/benchmarks.md, "Goodput under failures (soak)"); and beside it the trainers' own account
(each member logs every step, resume and injected crash to a file of its own on the persistent
tier, which outlives its pods): each member's goodput and wasted progress, how many points
apart from the controller's, and per failure kind how often the steps lost agree.

jobset-inplace is installed in the cluster as users install it (a drain evicts its pods too, a
silent node takes its replica); the trainer reports progress every step (goodput's signal),
checkpoints every 10 steps locally and every 20 to a persistent tier the real nodes share (a
moved member's steps). Results: ``bench/results/soak.json`` with the commit and the machine
(bench/provenance.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import provenance
from bench.report import require_plots
from bench.stats import stratified_sum_interval
from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core import goodput
from jobset_inplace.core.gangstate import status_from_dict
from jobset_inplace.core.model import Mark
from jobset_inplace.core.spares import (
    SILENT_WITHOUT_SPARE,
    SPARE_MOVED,
    SPARE_SHORTFALL,
    SPARE_SWAPPED,
)
from jobset_inplace.times import parse_time
from testbed.cluster import LocalCluster, log
from testbed.controller import gang_state, slot_holders
from testbed.demo import (
    GANG_MOUNT,
    PERSISTENT_MOUNT,
    barrier_opened,
    inject_failure,
    inject_hang,
    trainers_running,
    training_gang,
)
from testbed.demo_trainer import (
    ENV_GANG_SIZE,
    ENV_LOCKSTEP_DIR,
    ENV_TRUTH_FILE,
    MEMBER_REF,
    Truth,
    gang_began,
    parse_truth,
)
from testbed.devices import RESOURCE, TestDevices, pod_devices
from testbed.install import Installation, leader_node
from testbed.kube import Clients, clients, namespace_gone, wait_for
from testbed.kubectl import Kubectl
from testbed.prometheus import Prometheus, running
from testbed.versions import binaries, versions

NAMESPACE, NAME = "jsi-soak", "soak"
KINDS = ("crash", "silence", "hang", "device", "drain")
# On the node --controller-node adds: keeps every pod but the controller's replicas off it.
CONTROLLER_TAINT = "jobset-inplace.dev/soak-role=controller:NoSchedule"
# The gang's hang-timeout: six of the soak's 0.5 s steps (its trainers save a checkpoint in
# well under a step), so a hang costs a few seconds, not the 10 s the policy's floor once was.
HANG_TIMEOUT = "3s"
DEFAULT_OUT = Path("bench/results/soak.json")
RECOVERY_TIMEOUT_S = 900.0
SCRAPE_INTERVAL = "5s"  # Prometheus's, when the soak runs one
# the buckets a failure costs (the gang's first start, scheduling and startup, is none's)
FAILURE_BUCKETS = tuple(
    b.value
    for b in (
        goodput.Bucket.DETECTION,
        goodput.Bucket.RECOVERY,
        goodput.Bucket.RESTORE,
        goodput.Bucket.WASTED_PROGRESS,
    )
)
TRUTH_PREFIX = "truth-"  # each member's own account: truth-<the member>.log (its slot)


@dataclass
class Failure:
    kind: str
    epoch: int  # the recovery's epoch
    at: float  # seconds into the soak
    member: str
    recovery_s: float | None  # first signal -> barrier open (the GangState's)
    steps_lost: int | None  # progressStepsLost
    resume_step: int | None
    causes: dict[str, str]  # the recovery's, per member
    wall: float = 0.0  # when it was injected (seconds since the epoch)
    began: float = 0.0  # when its injection began (a power-off takes seconds)
    # the recovery's first signal (its cause) and that signal's window (how long before it the
    # failure may have come), and the goodput buckets summed at its barrier (seconds): with
    # the ones before, each failure's own
    first_signal: str = ""
    signal_window_s: float | None = None
    badput_s: dict[str, float] = field(default_factory=dict)
    # with hot spares: the slots held by another pod after the recovery (slot -> position)
    slots: dict[str, str] = field(default_factory=dict)
    # with hot spares: the controller's spare Events from its injection to the next one
    # (seconds into the soak, reason, message)
    spare_events: list[tuple[float, str, str]] = field(default_factory=list)
    # the node of the controller's leader just before the injection ("": none led, or an older
    # record): a silence of that node takes the leader too
    leader_node: str = ""


@dataclass
class Injected:
    member: str
    settle: Callable[[], None]  # after the recovery: the drain's end, the node or device back


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="how long (default 60)")
    p.add_argument("--every", type=float, default=180.0, help="seconds between failures (180)")
    p.add_argument("--members", type=int, default=2, help="gang size (default 2)")
    p.add_argument(
        "--spares",
        type=int,
        default=0,
        help="hot spares (jobset-inplace.dev/hot-spares; default 0): a silent node's member "
        "goes on in a spare's pod; one more real node each; implies one persistent root for "
        "the gang, as --keep-step (a spare reads the member's checkpoints)",
    )
    p.add_argument(
        "--controller-node",
        action="store_true",
        help="the controller's replicas on a real node of their own, tainted so that nothing "
        "else runs there (docs/operations.md, 'Where the replicas run'); by default they run "
        "on the training nodes and a silence or drain there takes one of them too",
    )
    p.add_argument("--step-seconds", type=float, default=0.5, help="the trainer's step (0.5)")
    p.add_argument(
        "--kinds", default=",".join(KINDS), help=f"failures, in turn ({','.join(KINDS)})"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results JSON ({DEFAULT_OUT})")
    p.add_argument(
        "--no-prometheus",
        dest="prometheus",
        action="store_false",
        help="without a Prometheus scraping the controller (by default one does: the alerts "
        "that fired, and the dashboard drawn from the soak's series next to the results)",
    )
    p.add_argument(
        "--keep-step",
        action="store_true",
        help="the trainers keep the step a failure interrupts (JSI_DEMO_KEEP_STEP=1) in one "
        "persistent root for the gang (docs/trainer-contract.md, 'One root for a replicated "
        "gang'); by default each member has its own root and only periodic checkpoints",
    )
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    p.add_argument(
        "--recount",
        type=Path,
        metavar="RESULT",
        help="run nothing: add to a finished soak's results the productive time and wasted "
        "progress its members' own accounts give each failed epoch, by kind (from the truth "
        "logs it left on the persistent tier, until the next soak)",
    )
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in KINDS]:
        p.error(f"--kinds: unknown {unknown}; accepted: {', '.join(KINDS)}")
    if args.every < 60:
        p.error("--every: at least 60 (a recovery and a checkpoint between failures)")
    if not 0 <= args.spares <= args.members:
        p.error(f"--spares: 0 to --members ({args.members}), as the webhook accepts")
    args.kinds = kinds
    return args


class Soak:
    def __init__(self, cluster: LocalCluster, args: argparse.Namespace) -> None:
        self.cluster, self.args = cluster, args
        self.kubeconfig = cluster.kubeconfig
        self.kube: Clients = clients(self.kubeconfig)
        self.kubectl = [str(binaries().kubectl), "--kubeconfig", str(self.kubeconfig)]
        self.devices: TestDevices | None = None  # set for the device kind

    def fail(self, kind: str, i: int) -> Injected:
        """Inject failure ``kind`` into member ``i`` (mod the gang): the pod that holds its
        slot."""
        pods = slot_holders(self.kube, NAMESPACE, NAME, self.args.members)
        slot = sorted(pods)[i % len(pods)]
        pod = pods[slot]
        name, node = pod.metadata.name, pod.spec.node_name
        index = pod.metadata.labels[names.JOB_INDEX_LABEL]
        spare = "" if index == slot else f" (slot {slot})"
        member = f"workers/{index}/0{spare} on {node}"
        if kind == "crash":
            inject_failure(self.kubeconfig, NAMESPACE, name)
        elif kind == "hang":
            inject_hang(self.kubeconfig, NAMESPACE, name)
        elif kind == "silence":
            self.cluster.power_off(node)
            return Injected(member, lambda: self.cluster.power_on(node))
        elif kind == "device":
            assert self.devices is not None, "the soak starts the devices for this kind"
            held = wait_for(
                f"the kubelet reports {name}'s device",
                lambda: pod_devices(self.kube.core.read_namespaced_pod(name, NAMESPACE)),
                60,
            )
            device = held[0][0]
            self.devices.set_health(node, device, healthy=False)
            return Injected(
                f"{member}, device {device}",
                lambda: self.devices.set_health(node, device, healthy=True),  # type: ignore[union-attr]
            )
        else:
            return Injected(member, self._drain(node))
        return Injected(member, lambda: None)

    def _drain(self, node: str) -> Callable[[], None]:
        """Start ``kubectl drain`` of ``node``; the returned call waits for its end (it must
        complete) and uncordons."""
        cmd = [*self.kubectl, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data"]
        cmd += [f"--timeout={RECOVERY_TIMEOUT_S:.0f}s"]
        drain = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def settle() -> None:
            out, _ = drain.communicate(timeout=RECOVERY_TIMEOUT_S)
            if drain.returncode != 0:
                raise RuntimeError(f"drain of {node} failed ({drain.returncode}):\n{out}")
            self.uncordon()

        return settle

    def recovered(self, epoch: int) -> dict[str, Any]:
        st = barrier_opened(self.kube, NAMESPACE, NAME, epoch, RECOVERY_TIMEOUT_S)
        wait_for(
            f"every trainer running in epoch {epoch}",
            lambda: trainers_running(
                self.kube, self.kubeconfig, NAMESPACE, NAME, self.args.members, epoch=epoch
            ),
            RECOVERY_TIMEOUT_S,
        )
        return dict(st)

    def uncordon(self) -> None:
        for node in self.cluster.real_nodes():
            self.kube.core.patch_node(node, {"spec": {"unschedulable": None}})


# The controller's Events about hot spares (core/spares.py), kept with each failure.
SPARE_EVENTS = frozenset({SPARE_SWAPPED, SPARE_SHORTFALL, SPARE_MOVED, SILENT_WITHOUT_SPARE})


class SpareEvents:
    """The gang's hot-spare Events, read before each failure and at the end (an Event lives an
    hour in the apiserver: read once at the end, the first ones of an hour are gone)."""

    def __init__(self, kube: Clients, started_wall: float) -> None:
        self.kube, self.started = kube, started_wall
        self.seen: dict[str, tuple[float, str, str]] = {}

    def read(self) -> None:
        events = self.kube.core.list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={NAME}"
        ).items
        for e in events:
            if e.reason not in SPARE_EVENTS:
                continue
            when = e.last_timestamp or e.event_time or e.first_timestamp
            at = when.timestamp() - self.started if when is not None else -1.0
            self.seen[e.metadata.uid] = (round(at, 1), e.reason, e.message or "")

    def assign(self, failures: list[Failure]) -> None:
        self.read()
        assign_events(failures, self.seen.values())


def assign_events(failures: list[Failure], events: Iterable[tuple[float, str, str]]) -> None:
    """Each failure gets the ``events`` (seconds into the soak, reason, message) from its
    injection's start to the next one's."""
    events = sorted(events)
    for f, after in zip(failures, [*failures[1:], None], strict=True):
        end = _injected_at(after) if after is not None else float("inf")
        f.spare_events = [e for e in events if _injected_at(f) <= e[0] < end]


def _injected_at(f: Failure) -> float:
    """When ``f``'s injection began, seconds into the soak, less a second (an Event's time is
    whole seconds; ``at`` is when the injection, a power-off of seconds, had ended)."""
    took = f.wall - f.began if f.wall and f.began else 0.0
    return f.at - took - 1.0


def run(
    soak: Soak, args: argparse.Namespace, shared: Path
) -> tuple[list[Failure], float, str | None]:
    """The soak: failures injected in turn until ``--minutes``; the failures, the wall time and
    why it stopped early (None: it did not; a failure not recovered ends it, its account kept)."""
    kube = soak.kube
    namespace_gone(kube, NAMESPACE, 300)
    training_gang(
        kube,
        soak.kubeconfig,
        NAMESPACE,
        NAME,
        args.members,
        # budgets for every failure the soak injects: it measures recoveries, not the budget
        # policy (the defaults, 10 and 5, are sized for real failure rates; a soak exhausted
        # them after 36 min and escalated to a JobSet restart)
        annotations={
            names.HANG_TIMEOUT: HANG_TIMEOUT,
            names.INPLACE_BUDGET: "10000",
            names.RECREATE_BUDGET: "10000",
        },
        persistent=shared,
        shared_root=args.keep_step or args.spares > 0,
        spares=args.spares,
        env={
            "JSI_DEMO_STEP_SECONDS": f"{args.step_seconds:g}",
            # the trainers' own account, on the persistent tier: a recreated pod goes on
            ENV_TRUTH_FILE: f"{PERSISTENT_MOUNT}/{TRUTH_PREFIX}{MEMBER_REF}.log",
            # in lockstep, as data-parallel trainers are: while a member is gone the others
            # wait (they would train alone, and keep steps no real gang has, otherwise)
            ENV_LOCKSTEP_DIR: f"{GANG_MOUNT}/lockstep",
            ENV_GANG_SIZE: str(args.members),
            **({"JSI_DEMO_KEEP_STEP": "1"} if args.keep_step else {}),
        },
        limits={RESOURCE: "1"} if soak.devices is not None else None,
    )
    started = time.monotonic()
    spare_events = SpareEvents(kube, time.time()) if args.spares else None
    failures: list[Failure] = []
    epoch, i = 1, 0
    while (due := started + (i + 1) * args.every) < started + args.minutes * 60:
        time.sleep(max(0.0, due - time.monotonic()))
        kind = args.kinds[i % len(args.kinds)]
        if spare_events is not None:
            spare_events.read()
        leader = leader_node(soak.kube)
        began = time.time()
        injected = soak.fail(kind, i)
        at, wall = time.monotonic() - started, time.time()
        epoch += 1
        log(f"soak t+{at:.0f}s: {kind} of {injected.member} -> waiting for epoch {epoch}")
        try:
            st = soak.recovered(epoch)
        except AssertionError as e:  # not recovered in RECOVERY_TIMEOUT_S: the soak ends here
            failures.append(
                Failure(
                    kind,
                    epoch,
                    round(at, 1),
                    injected.member,
                    None,
                    None,
                    None,
                    {},
                    wall,
                    began,
                    leader_node=leader,
                )
            )
            log(f"soak: STOPPED, {kind} of {injected.member} not recovered: {e}")
            if spare_events is not None:
                spare_events.assign(failures)
            return failures, time.monotonic() - started, f"{kind} not recovered: {e}"
        injected.settle()
        rec, buckets = st.get("recovery") or {}, (st.get("goodput") or {}).get("badputSeconds")
        failures.append(
            Failure(
                kind, epoch, round(at, 1), injected.member, rec.get("durationSeconds"),
                rec.get("progressStepsLost"), rec.get("resumeStep"), rec.get("causes") or {},
                round(wall, 3), round(began, 3), rec.get("firstSignal") or "",
                rec.get("signalWindowSeconds"), buckets or {},
                dict(st.get(names.STATUS_SLOTS) or {}), leader_node=leader,
            )
        )  # fmt: skip
        log(f"soak: {asdict(failures[-1])}")
        i += 1
    # the account as of the end (the whole --minutes): the running epoch counted productive
    # since its barrier
    time.sleep(max(0.0, started + args.minutes * 60 - time.monotonic()))
    if spare_events is not None:
        spare_events.assign(failures)
    return failures, time.monotonic() - started, None


def read_truths(shared: Path) -> dict[str, Truth]:
    """Each member's own account (member -> its truth), from the persistent tier."""
    return {
        path.stem.removeprefix(TRUTH_PREFIX): parse_truth(path.read_text())
        for path in sorted(shared.rglob(f"{TRUTH_PREFIX}*.log"))
    }


def trainers_account(
    truths: dict[str, Truth], failures: list[Failure], since: float, end: float
) -> dict[str, Any]:
    """The trainers' own account of the soak from ``since`` (the controller's account's start)
    to ``end``: per member, the share of the time spent on steps the gang keeps (goodput) and
    on steps it threw away (wasted progress: from when the gang began to train in the epoch,
    its last member's first step (:func:`gang_began`), to the failure, a step under way
    included, less the steps kept); per failure, the steps the gang redid (the newest step any
    member finished in the epoch that failed, less the resume). An epoch ends at its injected
    crash (the trainer's own line) or else when the soak began to inject the failure (a node
    powered off, a hang, a device fault, a drain)."""
    ended = _epoch_ends(truths, failures)
    after = max((e for t in truths.values() for e in t.resumes), default=0) + 1
    began = gang_began(truths.values())
    window = end - since
    members = {
        index: {
            "goodput": round(truth.kept_seconds(after, began) / window, 4),
            "wasted": round(truth.wasted_seconds(after, began, ended) / window, 4),
        }
        for index, truth in truths.items()
    }
    lost: list[int | None] = []
    for f in failures:
        newest = [n for t in truths.values() if (n := t.newest_step(f.epoch - 1)) is not None]
        resumes = {t.resumes[f.epoch] for t in truths.values() if f.epoch in t.resumes}
        lost.append(max(newest) - resumes.pop() if newest and len(resumes) == 1 else None)
    return {"members": members, "steps_lost": lost}


def _epoch_ends(truths: dict[str, Truth], failures: list[Failure]) -> dict[int, float]:
    """When each epoch that failed ended: at its injected crash (the trainer's own line) or
    else when the soak began to inject the failure."""
    ended = {f.epoch - 1: f.began or f.wall for f in failures if f.began or f.wall}
    for truth in truths.values():
        ended.update(truth.crashes)
    return ended


def wasted_apart_by_kind(
    truths: dict[str, Truth], failures: list[Failure], window: float
) -> dict[str, dict[str, float]]:
    """Per failure kind and member, how far apart the controller and the member's own account
    are on the wasted progress of the epochs that kind's failures ended, in points of
    ``window``: the controller's from the buckets summed at the failure's barrier less those
    at the barrier before (the failure of the epoch before, or none for the first), the
    member's from its steps (:meth:`Truth.wasted_seconds` of that epoch alone); each
    failure's difference counts, whatever its sign."""
    ended, began = _epoch_ends(truths, failures), gang_began(truths.values())
    after = max((e for t in truths.values() for e in t.resumes), default=0) + 1
    sums = {f.epoch: f.badput_s for f in failures if f.badput_s}
    apart: dict[str, dict[str, float]] = {}
    for f in failures:
        if f.epoch not in sums or f.epoch - 1 not in ended:
            continue  # not recovered, or recorded before failures carried their buckets
        before = sums.get(f.epoch - 1) if f.epoch > 2 else {}
        if before is None:
            continue
        key = goodput.Bucket.WASTED_PROGRESS.value
        ours = sums[f.epoch].get(key, 0.0) - before.get(key, 0.0)
        one = {f.epoch - 1: ended[f.epoch - 1]}
        for member, truth in truths.items():
            theirs = truth.wasted_seconds(after, began, one)
            by_member = apart.setdefault(f.kind, {})
            by_member[member] = by_member.get(member, 0.0) + abs(ours - theirs)
    return {
        kind: {member: round(100 * s / window, 2) for member, s in sorted(m.items())}
        for kind, m in apart.items()
    }


def own_badput(failures: Sequence[Failure]) -> list[tuple[Failure, dict[str, float]]]:
    """Each failure's own badput by bucket (seconds): its buckets at its barrier less those at
    the barrier before (the failure of the epoch before; none before the first), the gang's
    first start (scheduling, startup) left out. A failure whose record or whose
    predecessor's carries no buckets is left out."""
    sums = {f.epoch: f.badput_s for f in failures if f.badput_s}
    out: list[tuple[Failure, dict[str, float]]] = []
    for f in failures:
        before = {} if f.epoch == 2 else sums.get(f.epoch - 1)
        if f.epoch not in sums or before is None:
            continue
        costs = {b: sums[f.epoch].get(b, 0.0) - before.get(b, 0.0) for b in FAILURE_BUCKETS}
        out.append((f, costs))
    return out


def badput_by_kind(failures: Sequence[Failure]) -> dict[str, dict[str, float]]:
    """Per failure kind, the badput its failures cost (:func:`own_badput`), by bucket
    (seconds, summed), and how many were counted (``"failures"``)."""
    out: dict[str, dict[str, float]] = {}
    for f, costs in own_badput(failures):
        of_kind = out.setdefault(f.kind, {"failures": 0})
        of_kind["failures"] += 1
        for bucket, cost in costs.items():
            of_kind[bucket] = round(of_kind.get(bucket, 0.0) + cost, 3)
    return out


def goodput_interval(
    failures: Sequence[Failure], goodput_share: float, measured_s: float
) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of a soak's goodput (``goodput_share`` of ``measured_s``)
    over its failures: each kind's failures' own badput (:func:`own_badput`) resampled with
    replacement within the kind (the soak injects the kinds in turn: every resample keeps the
    run's mix), the rest of the time as measured. What it says: how much the goodput owes to
    which failures of each kind happened to come, at this rate and mix; not a run-to-run
    interval (one run). None where a kind has fewer than 2 failures counted."""
    by_kind: dict[str, list[float]] = {}
    for f, costs in own_badput(failures):
        by_kind.setdefault(f.kind, []).append(sum(costs.values()))
    groups = list(by_kind.values())
    if not groups or measured_s <= 0 or any(len(g) < 2 for g in groups):
        return None
    actual = sum(sum(g) for g in groups)
    low, high = stratified_sum_interval(groups)
    # more badput, less goodput: the high total gives the low goodput
    return goodput_share - (high - actual) / measured_s, goodput_share - (low - actual) / measured_s


def productive_apart_by_kind(
    truths: dict[str, Truth], failures: list[Failure], marks: Sequence[Mark], window: float
) -> dict[str, dict[str, float]]:
    """Per failure kind and member, how far apart the controller and the member's own account
    are on the productive time of the epochs that kind's failures ended, in points of
    ``window``: the controller's between the GangState's marks at the barriers around the
    failure (the last before it was injected, the first after), the member's its steps of that
    epoch the gang keeps; each failure's difference counts, whatever its sign. The rest of
    each interval (detection, recovery, restore, wasted progress) differs by as much."""
    after = max((e for t in truths.values() for e in t.resumes), default=0) + 1
    began = gang_began(truths.values())
    apart: dict[str, dict[str, float]] = {}
    for f in failures:
        if not f.wall:
            continue
        before = [m for m in marks if m.at < f.wall]
        later = [m for m in marks if m.at > f.wall]
        if not before or not later:
            continue  # not recovered, or its epoch's start not marked any more
        theirs = later[0].productive - before[-1].productive
        for member, truth in truths.items():
            kept = truth.kept_seconds(after, began, f.epoch - 1)
            by_member = apart.setdefault(f.kind, {})
            by_member[member] = by_member.get(member, 0.0) + abs(theirs - kept)
    return {
        kind: {member: round(100 * s / window, 2) for member, s in sorted(m.items())}
        for kind, m in apart.items()
    }


def report(
    st: dict[str, Any],
    failures: list[Failure],
    wall_s: float,
    truths: dict[str, Truth],
    now: float,
) -> dict[str, Any]:
    """The controller's account as of ``now`` (when ``st`` was read), and beside it the
    trainers' own: each member's goodput and wasted progress, and the steps lost per failure,
    with how far apart."""
    status = status_from_dict(st)
    led = status.goodput
    account = goodput.live(led, now, status.recovery)
    measured = account.productive + sum(account.badput.values())
    theirs = trainers_account(truths, failures, now - measured, now) if truths else None
    ratio = None if account.ratio is None else round(account.ratio, 4)
    wasted = account.badput.get(goodput.Bucket.WASTED_PROGRESS, 0.0) / measured if measured else 0
    if theirs is not None:
        for m in theirs["members"].values():
            m["goodput_points_apart"] = round(100 * abs(m["goodput"] - (ratio or 0)), 2)
            m["wasted_points_apart"] = round(100 * abs(m["wasted"] - wasted), 2)
        agree: dict[str, list[bool]] = {}
        for f, n in zip(failures, theirs["steps_lost"], strict=True):
            if n is not None and f.steps_lost is not None:
                agree.setdefault(f.kind, []).append(n == f.steps_lost)
        theirs["steps_lost_agree"] = {k: f"{sum(v)}/{len(v)}" for k, v in agree.items()}
        theirs["productive_points_apart_by_kind"] = productive_apart_by_kind(
            truths, failures, led.marks, measured
        )
        theirs["wasted_points_apart_by_kind"] = wasted_apart_by_kind(truths, failures, measured)
    by_kind: dict[str, list[int]] = {}
    for f in failures:
        if f.steps_lost is not None:
            by_kind.setdefault(f.kind, []).append(f.steps_lost)
    return {
        "wall_s": round(wall_s, 1),
        "failures": len(failures),
        "failures_per_hour": round(len(failures) / (wall_s / 3600), 1) if wall_s else None,
        "kinds": dict(Counter(f.kind for f in failures)),
        "step_s": led.step_seconds,
        "goodput": ratio,
        "measured_s": round(measured, 1),
        "productive_s": round(account.productive, 1),
        "badput_s": {b.value: round(account.badput.get(b, 0.0), 1) for b in goodput.Bucket},
        "unmeasured_s": round(led.unmeasured, 1),
        "steps_lost": {
            k: {"mean": round(sum(v) / len(v), 1), "max": max(v)} for k, v in by_kind.items()
        },
        "trainers": theirs,
        "slot_moves": slot_moves(failures),
        "spare_events": dict(
            sorted(Counter(reason for f in failures for _, reason, _ in f.spare_events).items())
        ),
        "badput_by_kind": badput_by_kind(failures),
    }


def slot_moves(failures: Sequence[Failure]) -> dict[str, int]:
    """Per failure kind, how many of its recoveries gave a member's slot to another pod (a hot
    spare's swap: the GangState's ``status.slots`` after it differs from the one before)."""
    moves: Counter[str] = Counter()
    before: dict[str, str] = {}
    for f in failures:
        if f.recovery_s is None:
            continue
        moves[f.kind] += f.slots != before
        before = f.slots
    return {kind: moves[kind] for kind in sorted(moves) if moves[kind]}


def table(r: dict[str, Any]) -> str:
    lines = [
        f"soak: {r['wall_s'] / 60:.0f} min, {r['failures']} failures "
        f"({r['failures_per_hour']}/h: {r['kinds']}), step {r['step_s'] or 0:.3f}s",
        f"goodput {100 * (r['goodput'] or 0):.1f}% of {r['measured_s']:.0f}s measured "
        f"({r['unmeasured_s']:.0f}s unmeasured)",
    ]
    for bucket, s in sorted(r["badput_s"].items(), key=lambda kv: -kv[1]):
        share = 100 * s / r["measured_s"] if r["measured_s"] else 0.0
        lines.append(f"  badput {bucket:15} {s:8.1f}s  {share:5.2f}%")
    for kind, v in r["steps_lost"].items():
        lines.append(f"  steps lost per {kind:6} mean {v['mean']}, max {v['max']}")
    for kind, cost in (r.get("badput_by_kind") or {}).items():
        buckets = ", ".join(f"{b} {cost[b]:.1f}s" for b in FAILURE_BUCKETS)
        lines.append(f"  badput of {int(cost['failures'])} {kind}: {buckets}")
    if moves := r.get("slot_moves"):
        lines.append(f"  recoveries that moved a member to another pod (a spare): {moves}")
    theirs = r.get("trainers")
    for index, m in sorted((theirs or {}).get("members", {}).items()):
        lines.append(
            f"  member {index}'s own account: goodput {100 * m['goodput']:.2f}% "
            f"({m['goodput_points_apart']} points apart), wasted progress "
            f"{100 * m['wasted']:.2f}% ({m['wasted_points_apart']} points apart)"
        )
    if theirs:
        lines.append(
            f"  steps lost as the trainers count them, agreeing: {theirs['steps_lost_agree']}"
        )
        for kind, apart in (theirs.get("productive_points_apart_by_kind") or {}).items():
            lines.append(f"  productive time of the epochs {kind} ended, points apart: {apart}")
        for kind, apart in (theirs.get("wasted_points_apart_by_kind") or {}).items():
            lines.append(f"  wasted progress of the epochs {kind} ended, points apart: {apart}")
    return "\n".join(lines)


KIND_COLORS = {
    "crash": "tab:red",
    "silence": "black",
    "hang": "tab:orange",
    "device": "tab:purple",
    "drain": "tab:green",
}


def figure(doc: dict[str, Any], out: Path) -> Path:
    """The soak as a picture: the goodput so far at every barrier (the GangState's marks) and
    each failure, by kind, with the steps it lost (matplotlib: the bench extra)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    marks = (doc.get("goodput_status") or {}).get("marks") or []
    # the account at each barrier once the gang trained (the start's marks hold no training)
    points = [
        (parse_time(m["at"]) or 0.0, 100 * m["productiveSeconds"] / m["measuredSeconds"])
        for m in marks
        if m["productiveSeconds"] > 0
    ]
    if doc["result"]["goodput"] is not None:  # and at the end, live
        points.append((parse_time(doc["when"]) or 0.0, 100 * doc["result"]["goodput"]))
    # (a result file without failures' wall times: the loop began wall_s before it ended)
    began = (parse_time(doc["when"]) or 0.0) - doc["result"]["wall_s"]
    walls = [f.get("wall") or began + f["at"] for f in doc["failures"]]
    t0 = (parse_time(marks[0]["at"]) or 0.0) if marks else began
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.step([(t - t0) / 60 for t, _ in points], [g for _, g in points], where="post",
            color="tab:blue", label="goodput so far (at each barrier)")  # fmt: skip
    seen: set[str] = set()
    for f, wall in zip(doc["failures"], walls, strict=True):
        x, kind = (wall - t0) / 60, f["kind"]
        ax.axvline(x, color=KIND_COLORS.get(kind, "grey"), alpha=0.6, lw=1.2,
                   label=kind if kind not in seen else None)  # fmt: skip
        seen.add(kind)
        if f["steps_lost"] is not None:
            ax.annotate(str(f["steps_lost"]), (x, 100.5), fontsize=7, ha="center")
    r = doc["result"]
    ax.set_title(
        f"{r['wall_s'] / 60:.0f} min, {r['failures']} failures ({r['failures_per_hour']}/h), "
        f"step {r['step_s'] or 0:.2f}s: goodput {100 * (r['goodput'] or 0):.1f}% "
        "(numbers: steps lost)",
        fontsize=9,
    )
    ax.set_xlabel("minutes since the gang started")
    ax.set_ylabel("goodput %")
    ax.set_ylim(min([80.0, *(g - 2 for _, g in points)]), 102)
    ax.legend(fontsize=7, loc="lower left", ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def monitoring(prom: Prometheus, start: float, end: float, out: Path) -> dict[str, Any]:
    """What Prometheus saw of the soak: every alert that fired (the shipped rules, on the
    controller's series) and the dashboard drawn over the soak (``out``'s name + -dashboard.png;
    needs matplotlib, the bench extra)."""
    step = max(5.0, (end - start) / 720)
    fired = sorted(
        {
            ", ".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k != "__name__")
            for s in prom.query_range('ALERTS{alertstate="firing"}', start, end, step)
        }
    )
    log(f"soak: alerts that fired: {fired or 'none'}")
    picture: str | None = None
    try:
        from bench.dashboard import render  # noqa: PLC0415  (matplotlib)

        path = out.with_name(out.stem + "-dashboard.png")
        render(
            prom,
            path,
            start=start,
            end=end,
            variables={"namespace": NAMESPACE, "jobset": NAME},
            title=f"jobset-inplace dashboard over the soak ({(end - start) / 60:.0f} min)",
        )
        picture = str(path)
        log(f"dashboard: {path}")
    except ImportError:
        log(
            "no dashboard picture: matplotlib is not installed (make soak installs the bench extra)"
        )
    return {"scrape_interval": SCRAPE_INTERVAL, "alerts_fired": fired, "dashboard": picture}


def recount(path: Path, shared: Path) -> dict[str, Any]:
    """``path``'s trainers' account with the productive time and wasted progress of each
    failed epoch by kind (:func:`productive_apart_by_kind`, :func:`wasted_apart_by_kind`),
    from the truth logs in ``shared``; written back."""
    doc: dict[str, Any] = json.loads(path.read_text())
    theirs = doc["result"].get("trainers")
    if theirs is None:
        raise SystemExit(f"{path}: no trainers' account (a soak before d2d5130)")
    truths = read_truths(shared)
    if set(truths) != set(theirs["members"]):
        raise SystemExit(f"{shared}: truth logs of {sorted(truths)}, not of this soak's members")
    failures = [Failure(**f) for f in doc["failures"]]
    marks = _ledger_marks(doc.get("goodput_status"))
    measured = doc["result"]["measured_s"]
    theirs["productive_points_apart_by_kind"] = productive_apart_by_kind(
        truths, failures, marks, measured
    )
    theirs["wasted_points_apart_by_kind"] = wasted_apart_by_kind(truths, failures, measured)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _ledger_marks(goodput_status: Any) -> tuple[Mark, ...]:
    """The marks of a stored ``status.goodput`` (read as the status they came from)."""
    return status_from_dict({names.STATUS_EPOCH: 1, "goodput": goodput_status}).goodput.marks


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.recount is not None:
        cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
        doc = recount(args.recount, cluster.logs_dir.parent / "soak-shared")
        print(table(doc["result"]))
        return 0
    require_plots("python -m bench.soak")  # its figure is drawn at the end
    measuring = provenance.begin("bench.soak", argv, args.allow_dirty)
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    created = not cluster.is_up()
    cluster.up()
    if len(cluster.real_nodes()) < 2:
        raise SystemExit("needs 2 real nodes (a drained node's member moves): make cluster-up")
    added: list[str] = []  # a node of its own for each spare (and the controller's)
    controller_node = ""
    installation = Installation(cluster.kubeconfig, cluster)
    soak = Soak(cluster, args)
    shared = cluster.logs_dir.parent / "soak-shared"
    shutil.rmtree(shared, ignore_errors=True)  # an earlier soak's checkpoints are not this gang's
    try:  # from the first node added: whatever stops the run, the cluster is left as found
        while len(cluster.real_nodes()) < args.members + args.spares:
            added.append(cluster.add_real_node())
        if args.controller_node:
            controller_node = cluster.add_real_node()
            added.append(controller_node)
            Kubectl(cluster.kubeconfig).run(
                "taint", "node", controller_node, CONTROLLER_TAINT, "--overwrite"
            )
        installation.install()
        if controller_node:
            installation.pin_to(controller_node, CONTROLLER_TAINT)
        with contextlib.ExitStack() as stack:
            if "device" in args.kinds:
                soak.devices = stack.enter_context(
                    TestDevices(
                        soak.kube,
                        [n for n in cluster.real_nodes() if n != controller_node],
                        shared.parent / "soak-devices",
                    )
                )
            prom = None
            if args.prometheus:
                work = shared.parent / "soak-prometheus"
                shutil.rmtree(work, ignore_errors=True)  # this soak's series only
                prom = stack.enter_context(running(cluster.kubeconfig, work, SCRAPE_INTERVAL))
            began = time.time()
            failures, wall_s, stopped = run(soak, args, shared)
            st, read_at = gang_state(soak.kube, NAMESPACE, NAME), time.time()
            truths = read_truths(shared)
            if prom is not None:
                monitored = monitoring(prom, began, time.time(), args.out)
    finally:
        for node in cluster.real_nodes():  # a run stopped between a power-off and its power-on
            cluster.power_on(node)
        soak.uncordon()
        or_none(soak.kube.core.delete_namespace, NAMESPACE)
        installation.uninstall()
        if created and not os.environ.get("JSI_KEEP_CLUSTER"):
            cluster.down()
        else:
            for node in added:
                cluster.remove_real_node(node)
    result = report(st, failures, wall_s, truths, read_at)
    print(table(result))
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **measuring.origin,
        "kubernetes": versions().kubernetes,
        "members": args.members,
        "spares": args.spares,
        "every_s": args.every,
        "keep_step": args.keep_step,
        "controller_node": controller_node,  # "": the replicas ran on the training nodes
        "hang_timeout": HANG_TIMEOUT,
        "result": result,
        "failures": [asdict(f) for f in failures],
        "stopped_early": stopped,
        "goodput_status": st.get("goodput"),
        "prometheus": monitored if args.prometheus else None,
    }
    doc["machine"].update(measuring.steal(wall_s))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"results: {args.out}")
    try:
        log(f"figure: {figure(doc, args.out.with_suffix('.png'))}")
    except ImportError:
        log("no figure: matplotlib is not installed (make soak installs the bench extra)")
    if stopped:
        log(f"the soak stopped early: {stopped}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
