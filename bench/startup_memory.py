"""The controller's memory when it starts on a large cluster: peak RSS once its cache is primed.

A real etcd + kube-apiserver (the integration control plane, nothing else: the objects are only
listed and watched) gets ``--nodes`` Node objects and ``--pods`` pods of one JobSet, shaped like
the benchmark's (kwok-like node status, a trainer and the agent sidecar, JobSet's labels). Then
``jobset-inplace run`` starts for each code tree given (this checkout, and ``--baseline REF``
checked out into a temporary git worktree), and its peak RSS (VmHWM) is read once it logged
``cache primed``. Each start is a fresh process, so the figures compare like with like.

    python -m bench.startup_memory --nodes 5000 --pods 5000 --baseline HEAD~1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.scenarios import status_mib
from jobset_inplace import names
from testbed.cluster import KWOK_NODE_ANNOTATION
from testbed.controlplane import start_control_plane
from testbed.kube import Clients, clients, temporary_namespace

REPO = Path(__file__).resolve().parents[2]
JOBSET = "train"
PRIMED = "cache primed"


def log(msg: str) -> None:
    print(f"[startup-memory {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def node_body(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    now = "2026-11-23T00:00:00Z"
    conditions = [
        {
            "type": t,
            "status": "True" if t == "Ready" else "False",
            "reason": f"Kubelet{t}",
            "message": f"kubelet reports {t}",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "Ready")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "topology.kubernetes.io/zone": f"zone-{i % 4}",
                "cloud.example.com/rack": f"rack-{i // 32}",
            },
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": f"10.{i // 256}.{i % 256}.0/24"},
        "status": {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.255.{i // 256}.{i % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "containerRuntimeVersion": "kwok",
                "osImage": "",
                "kernelVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        },
    }


def pod_body(i: int, pods_per_job: int = 10) -> dict[str, Any]:
    job, index = divmod(i, pods_per_job)
    env = [{"name": f"ENV_{k}", "value": f"value-{k}"} for k in range(8)]
    mounts = [{"name": "checkpoints", "mountPath": "/checkpoints"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{JOBSET}-workers-{job}-{index}-abcde",
            "labels": {
                names.JOBSET_NAME_LABEL: JOBSET,
                names.REPLICATED_JOB_LABEL: "workers",
                names.JOB_INDEX_LABEL: str(job),
                names.COMPLETION_INDEX_LABEL: str(index),
                names.RESTART_ATTEMPT_LABEL: "0",
                "jobset.sigs.k8s.io/job-key": f"{job:040x}",
                "jobset.sigs.k8s.io/global-replicas": "5000",
                "batch.kubernetes.io/job-name": f"{JOBSET}-workers-{job}",
                "batch.kubernetes.io/controller-uid": f"{job:032x}",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": f"{JOBSET}-workers-{job}",
                    "uid": f"{job:032x}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "annotations": {
                names.REPORT_EPOCH: "3",
                names.REPORT_STEPS: "100,200,300",
                "batch.kubernetes.io/job-completion-index": str(index),
            },
        },
        "spec": {
            "nodeName": f"node-{i:05d}",
            "restartPolicy": "Never",
            "subdomain": JOBSET,
            "volumes": [{"name": "checkpoints", "emptyDir": {}}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "example.com/trainer:v1",
                    "command": ["python", "-m", "train", "--resume-from", "/checkpoints"],
                    "env": env,
                    "resources": {"requests": {"cpu": "24"}, "limits": {"cpu": "24"}},
                    "volumeMounts": mounts,
                },
                {
                    "name": "jobset-inplace-agent",
                    "image": "example.com/jobset-inplace-agent:v1",
                    "command": ["python", "-m", "jobset_inplace.agent"],
                    "env": env[:4],
                    "volumeMounts": mounts,
                },
            ],
        },
    }


def create_all(kubeconfig: Path, what: str, n: int, create: Callable[[Clients, int], Any]) -> None:
    local = threading.local()

    def one(i: int) -> None:
        if not hasattr(local, "kube"):
            local.kube = clients(kubeconfig)
        create(local.kube, i)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        for done, _ in enumerate(pool.map(one, range(n)), 1):
            if done % 1000 == 0 or done == n:
                log(f"{what}: {done}/{n} created ({time.monotonic() - started:.0f} s)")


@contextmanager
def baseline_tree(ref: str) -> Iterator[Path]:
    """``ref`` of this repository checked out in a temporary worktree."""
    with tempfile.TemporaryDirectory(prefix="jsi-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )


def measure(tree: Path, kubeconfig: Path, logfile: Path, timeout: float) -> dict[str, float]:
    """Start the controller from ``tree``; its memory once the cache is primed."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(tree)}
    # the controller's command line moved to controller/main.py; a baseline may predate it
    new = (tree / "jobset_inplace" / "controller" / "main.py").exists()
    entry = "jobset_inplace.controller.main" if new else "jobset_inplace.cli"
    started = time.monotonic()
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", entry, "run"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tree,
        )
    try:
        while PRIMED not in logfile.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"controller exited {proc.returncode}: see {logfile}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"no {PRIMED!r} in {timeout:.0f} s: see {logfile}")
            time.sleep(0.2)
        primed_s = time.monotonic() - started
        time.sleep(3)  # the watches start after the prime
        return {
            "primed_s": round(primed_s, 1),
            "peak_rss_mib": round(status_mib(proc.pid, "VmHWM"), 1),
            "rss_mib": round(status_mib(proc.pid, "VmRSS"), 1),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup_memory", description=__doc__)
    p.add_argument("--nodes", type=int, default=5000, help="Node objects (default 5000)")
    p.add_argument("--pods", type=int, default=5000, help="pods of one JobSet (default 5000)")
    p.add_argument("--baseline", metavar="REF", help="also measure this git revision")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the prime")
    args = p.parse_args(argv)
    if args.nodes < 0 or args.pods < 0 or args.pods > max(args.nodes, 1) * 110:
        p.error("--nodes and --pods must be >= 0 (and pods <= 110 per node)")
    cp = start_control_plane()
    try:
        kube = clients(cp.kubeconfig)
        with temporary_namespace(kube, "startup-memory", default_sa=True) as ns:
            create_all(
                cp.kubeconfig, "nodes", args.nodes, lambda c, i: c.core.create_node(node_body(i))
            )
            create_all(
                cp.kubeconfig,
                "pods",
                args.pods,
                lambda c, i: c.core.create_namespaced_pod(ns, pod_body(i)),
            )
            with tempfile.TemporaryDirectory(prefix="jsi-startup-") as logs:
                rows: dict[str, dict[str, float]] = {}
                if args.baseline:
                    with baseline_tree(args.baseline) as tree:
                        log(f"controller of {args.baseline} ...")
                        rows[args.baseline] = measure(
                            tree, cp.kubeconfig, Path(logs) / "baseline.log", args.timeout
                        )
                log("controller of this checkout ...")
                rows["this checkout"] = measure(
                    REPO, cp.kubeconfig, Path(logs) / "this.log", args.timeout
                )
        print(f"\ncontroller start on {args.nodes} nodes and {args.pods} pods of one JobSet:\n")
        print("| code | cache primed after | peak RSS | RSS 3 s later |")
        print("|---|---|---|---|")
        for label, m in rows.items():
            print(f"| {label} | {m['primed_s']} s | {m['peak_rss_mib']} MiB | {m['rss_mib']} MiB |")
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
