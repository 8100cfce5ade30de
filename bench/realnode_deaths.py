"""A node's death -> every trainer running again, on the local cluster's real kubelet nodes, side
by side (issue: hot spares on real nodes against the paths without them).

    python -m bench.realnode_deaths --reps 3     (make bench-realnode-deaths)

The demo gang of :mod:`bench.realnode` (2 members, a step every 0.2 s, a checkpoint every 10
steps to the pod's volume and to the persistent tier the nodes share), its pods on nodes of
their own where they can be (the preferred anti-affinity the soak's gang has), on 3 real nodes
(a third is added if the cluster has 2). Member 1's node loses power (its kubelet and every
container on it killed, then its containerd: ``LocalCluster.power_off``), and the time runs
until both members' trainers log "resuming" again, each on a live node. Paths:

* ``jsi-spare``: jobset-inplace, process scope, one hot spare (``hot-spares: "1"``): its agents
  heartbeat to the leader, and the spare takes the dead member's slot once its lease has ended;
* ``jsi-process``: jobset-inplace, process scope, no spare: the node's Lease decides, the pod
  is force-deleted and its Job's new pod starts on the free third node;
* ``upstream-sidecar``: JobSet's own InPlaceRestart (v0.12, its agent as a sidecar), the node
  tainted out-of-service as soon as the node lifecycle controller declares it not ready (its
  best configuration: without the taint the dead node's pod stays Terminating), so that the pod
  garbage collector deletes the pod and its Job makes a new one.

Repetitions interleave the paths; the node is powered on again, and every taint on it gone,
before the next run. Ratios are within the run, to ``jsi-spare`` and to ``jsi-process``.
Results: ``docs/bench/realnode-node-deaths.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import provenance, realnode, upstream
from bench.realnode import NAMESPACE, RESUMING, Run, create_objects, log, write_counts
from bench.remediation import OutOfService
from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.names import INSTALL_NAMESPACE
from jobset_inplace.times import parse_time
from testbed import images, workloads
from testbed.controller import gang_state, prepare
from testbed.demo import demo_jobset, timed_log
from testbed.install import Installation
from testbed.kube import create_jobset, delete_jobset, namespace_gone, wait_for
from testbed.versions import ensure_binaries, versions

PATHS = ("jsi-spare", "jsi-process", "upstream-sidecar")
BASES = ("jsi-spare", "jsi-process")
DEFAULT_OUT = realnode.RESULTS / "realnode-node-deaths.json"
NODES = 3  # the two members' and a third: the spare's, or the replacement's
MEMBERS = realnode.MEMBERS
STANDING_BY = "this pod holds no slot; standing by"  # a spare's agent, ready
RECOVERY_TIMEOUT_S = 300.0
FAILURE = "power-off"  # what the tables time from


def jobset_for(path: str, name: str, shared: Path) -> dict[str, Any]:
    """Each path's gang, its pods spread over the nodes alike."""
    if path == "jsi-spare":
        js = demo_jobset(
            name,
            MEMBERS,
            scope="process",
            persistent=shared / name,
            shared_root=True,
            spares=1,
            env={"JSI_DEMO_PERSIST_EVERY": "10"},
        )
    elif path == "jsi-process":
        js = realnode.demo(name, shared, scope="process")
    else:
        js = realnode.upstream_jobset(
            name, shared, path.removeprefix("upstream-"), realnode.GRACE_S
        )
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["affinity"] = workloads.spread_over_nodes(name)
    return js


def nth_after(times: dict[str, float | None], n: int) -> float | None:
    """The ``n``-th earliest of the pods' times (None: fewer than ``n`` have one)."""
    seen = sorted(t for t in times.values() if t is not None)
    return seen[n - 1] if len(seen) >= n else None


class Colocated(RuntimeError):
    """The scheduler put two of the gang's pods on one node: that repetition is not run (the
    path is tried again in the next one)."""


class DeathBench(realnode.Bench):
    def live_pods(self, name: str, dead: str | None = None) -> list[Any]:
        """The gang's pods not being deleted and not on ``dead``."""
        return [p for p in self.pods(name) if p.spec.node_name and p.spec.node_name != dead]

    def members_after(
        self, name: str, container: str, after: float, text: str, dead: str | None = None
    ) -> float | None:
        """When the MEMBERS-th live pod logged ``text`` after ``after`` (a spare logs
        nothing until it holds a slot; the dead node's pod cannot)."""
        times = {
            p.metadata.name: self.first_after(p.metadata.name, container, after, text)
            for p in self.live_pods(name, dead)
        }
        return nth_after(times, MEMBERS)

    def ready(self, path: str, name: str) -> None:
        wait_for(
            f"{name}: every trainer training",
            lambda: self.members_after(name, "trainer", 0, RESUMING),
            300,
            0.5,
        )
        wait_for(
            f"{name}: a checkpoint on every member",
            lambda: self.members_after(name, "trainer", 0, "checkpoint saved"),
            60,
            0.5,
        )
        if path == "jsi-spare":
            wait_for(
                f"{name}: the spare's agent standing by",
                lambda: any(
                    STANDING_BY in line
                    for p in self.pods(name)
                    for _, line in self._log(p.metadata.name, AGENT_CONTAINER)
                ),
                300,
                0.5,
            )

    def _log(self, pod: str, container: str) -> list[tuple[float, str]]:
        try:
            return timed_log(self.kubeconfig, NAMESPACE, pod, container)
        except subprocess.CalledProcessError:
            return []

    def victim(self, name: str, avoid: str) -> str:
        """The node of member 1 (job index 1: a member on every path, never the spare), or of
        member 0 where member 1's is ``avoid`` (the controller's leader's node: this bench is
        of a member's death, not of a failover)."""
        pods = {p.metadata.labels[names.JOB_INDEX_LABEL]: p for p in self.pods(name)}
        nodes = {i: p.spec.node_name for i, p in pods.items()}
        if len(set(nodes.values())) != len(nodes):
            raise Colocated(f"{name}: two pods share a node ({nodes}): not one death each")
        return str(nodes["1"] if nodes["1"] != avoid else nodes["0"])

    def death(self, path: str, rep: int, leader: str) -> Run:
        """One death of ``path``'s gang; ``leader``: the controller's leader's node."""
        name = f"{path}-{rep}"
        node: str | None = None
        create_jobset(self.kube, NAMESPACE, jobset_for(path, name, self.shared))
        try:
            self.ready(path, name)
            node = self.victim(name, avoid=leader)
            dead = node
            remedy: AbstractContextManager[Any] = (
                OutOfService(self.kube, node) if path.startswith("upstream-") else nullcontext()
            )
            before = write_counts(self.cluster)
            t0 = time.time()
            with remedy:
                self.cluster.power_off(node)
                log(f"{name}: {node} powered off ({time.time() - t0:.1f} s)")
                running = wait_for(
                    f"{name}: every trainer running again",
                    lambda: self.members_after(name, "trainer", t0, RESUMING, dead=dead),
                    RECOVERY_TIMEOUT_S,
                    0.5,
                )
                writes = write_counts(self.cluster) - before
                barrier = self.lifted(path, name, t0, node)
                resumed = self.resumed_steps(name, t0, node)
                if isinstance(remedy, OutOfService) and remedy.tainted_at is None:
                    # (a read or a conflicting write it retried is no failure: only no taint)
                    raise RuntimeError(f"{name}: no out-of-service taint: {remedy.errors[:3]}")
        finally:
            try:
                if node is not None:
                    self.cluster.power_on(node)
            finally:
                delete_jobset(self.kube, NAMESPACE, name)
                if node is not None:
                    self.node_open(node)
        return Run.since(
            t0, path, rep, barrier=barrier, running=running, writes=writes, resume_steps=resumed
        )

    def lifted(self, path: str, name: str, t0: float, dead: str) -> float | None:
        """When the path let the trainers go (jobset-inplace: the controller's ``openedAt``;
        upstream: its agents' log line that lifts their barrier)."""
        if path.startswith("jsi-"):
            rec = gang_state(self.kube, NAMESPACE, name).get("recovery") or {}
            return parse_time(rec.get("openedAt"))
        return self.members_after(name, upstream.AGENT, t0, "starting startup probe server", dead)

    def resumed_steps(self, name: str, t0: float, dead: str) -> dict[str, int]:
        """The step each trainer that resumed after ``t0`` resumed at, by pod name."""
        out = {}
        for pod in self.live_pods(name, dead):
            line = next(
                (
                    ln
                    for t, ln in self._log(pod.metadata.name, "trainer")
                    if t > t0 and RESUMING in ln
                ),
                None,
            )
            match = realnode.RESUME_STEP.search(line or "")
            if match:
                out[pod.metadata.name] = int(match.group(1))
        return out

    def node_open(self, node: str) -> None:
        """Until ``node`` is Ready with none of the taints a death leaves (Kubernetes'
        not-ready and unreachable ones, jobset-inplace's unhealthy one once the node renews its
        Lease, the out-of-service one with its context): the next run's gang needs every node
        (its anti-affinity is only preferred)."""

        def clear() -> bool:
            n = self.kube.core.read_node(node)
            ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            keys = {t.key for t in n.spec.taints or []}
            # (the node lifecycle controller's not-ready/unreachable taints go after Ready)
            left = {k for k in keys if k.startswith(("node.kubernetes.io/", names.PREFIX))}
            return ready and not left

        wait_for(f"{node} Ready and untainted", clear, 120, 1.0)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.realnode_deaths", description=__doc__.split("\n")[0]
    )
    p.add_argument("--reps", type=int, default=3, help="node deaths per path (default 3)")
    p.add_argument(
        "--paths",
        type=lambda raw: [x for x in raw.split(",") if x],
        default=list(PATHS),
        help=f"comma-separated subset of {','.join(PATHS)} (default: all)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results JSON ({DEFAULT_OUT})")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    a = p.parse_args(argv)
    realnode.check_runs(p, a.paths, a.reps, PATHS)
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run = provenance.begin("bench.realnode_deaths", argv, args.allow_dirty)
    cluster = realnode.local_cluster()
    added = []
    while len(cluster.real_nodes()) < NODES:
        added.append(cluster.add_real_node())
    nodes = cluster.real_nodes()
    shared = cluster.logs_dir.parent / "bench-realnode-deaths-shared"  # the persistent tier
    shutil.rmtree(shared, ignore_errors=True)
    bench = DeathBench(cluster, shared)
    kube = bench.kube
    namespace_gone(kube, NAMESPACE)
    prepare(kube, cluster.kubeconfig, NAMESPACE)
    create_objects(kube, upstream.rbac(NAMESPACE))
    upstream_paths = [p for p in args.paths if p.startswith("upstream-")]
    if upstream_paths:
        agent = ensure_binaries("jobset_ipr_agent").jobset_ipr_agent
        image = images.build_upstream_agent(
            agent, imports=[str(images.node_socket(n)) for n in nodes]
        )
        log(f"upstream agent image {image.name} ({image.size_mib():.0f} MiB) on {nodes}")
    runs: list[Run] = []
    failed: dict[str, str] = {}
    # installed as users install it: the agents reach its report channel (hot spares' heartbeats)
    installation = Installation(cluster.kubeconfig, cluster)
    installation.install()
    try:
        for rep in range(args.reps):
            for path in args.paths:
                if path in failed:
                    continue
                gates = (
                    cluster.jobset_feature_gates(upstream.GATES)
                    if path in upstream_paths
                    else nullcontext()
                )
                leader = kube.core.read_namespaced_pod(installation.leader(), INSTALL_NAMESPACE)
                try:
                    with gates:
                        r = bench.death(path, rep, leader.spec.node_name)
                except Colocated as e:
                    log(f"{path} rep {rep} not run: {e}")
                    continue
                except (TimeoutError, RuntimeError, AssertionError) as e:
                    failed[path] = f"rep {rep}: {e}"
                    log(f"{path} rep {rep} failed, not run again: {e}")
                    continue
                runs.append(r)
                b = "-" if r.barrier is None else f"{r.barrier:.2f}s"
                log(
                    f"{path} rep {rep}: barrier {b}, every trainer running {r.running:.2f}s, "
                    f"resumed at {sorted(set(r.resume_steps.values()))}, "
                    f"API writes {sum(r.writes.values())}"
                )
    finally:
        installation.uninstall()
        for node in added:
            cluster.remove_real_node(node)
    s = realnode.summary(runs, PATHS)
    done = [asdict(r) for r in runs]
    print(realnode.table(s, realnode.running_by_path(done), bases=BASES, failure=FAILURE))
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **run.origin,
        "kubernetes": versions().kubernetes,
        "jobset": versions().jobset,
        "members": MEMBERS,
        "nodes": NODES,
        "runs": done,
        "summary": {k: asdict(v) for k, v in s.items()},
        "failed": failed,
    }
    doc["machine"].update(run.steal())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
