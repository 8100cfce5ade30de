"""A namespace's first running pod with jobset-inplace installed: ``python -m bench.first_pod``.

Each repetition makes a new namespace (nothing in it: no ServiceAccount but the ``default`` one
kube-controller-manager makes), creates the e2e suite's demo JobSet in it (``--members`` pods
on the local cluster's real kubelet nodes, opted in: the webhook injects the agent, whose pods
run as the agents' own ServiceAccount) and reads, from the moment before the create: when the
first of its pods was Running and when all were, polled every 0.1 s, and the pod creations the
apiserver refused meanwhile (the Job controller's ``FailedCreate`` Events; the race issue 62
item 7 names is ``error looking up service account``). The namespace is deleted after each.

jobset-inplace is installed first the way the e2e suite installs it (``testbed.install``: its
images onto the real nodes, ``kubectl apply -k``), from the checkout ``--checkout`` names (its
``jobset_inplace``, ``testbed`` and manifests; default: this one), and uninstalled at the end.
Two versions are compared by a run of each and ``--compare A.json B.json`` (the ratio of the
medians with its 95 % interval). Needs the local cluster with real nodes
(``make cluster-up REAL_NODES=2``)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import provenance
from bench.stats import ratio_of_medians
from testbed.cluster import LocalCluster
from testbed.controller import prepare
from testbed.demo import demo_jobset
from testbed.install import Installation
from testbed.kube import Clients, clients, create_jobset, temporary_namespace

POLL_S = 0.1
TIMEOUT_S = 180.0


def first_pods(kube: Clients, kubeconfig: Path, members: int) -> dict[str, Any]:
    """One repetition: a new namespace, the JobSet, its pods until all Running."""
    with temporary_namespace(kube, "first-pod") as ns:
        prepare(kube, kubeconfig, ns)
        body = demo_jobset("gang", members)
        started = time.monotonic()
        create_jobset(kube, ns, body)
        first = everyone = None
        while everyone is None:
            now = time.monotonic() - started
            if now > TIMEOUT_S:
                raise SystemExit(f"{ns}: not every pod Running within {TIMEOUT_S:g} s")
            pods = kube.core.list_namespaced_pod(ns).items
            running = [p for p in pods if p.status.phase == "Running"]
            if running and first is None:
                first = now
            if len(running) >= members:
                everyone = now
            time.sleep(POLL_S)
        refused = [
            e.message or ""
            for e in kube.core.list_namespaced_event(ns).items
            if e.reason == "FailedCreate"
        ]
    return {
        "first_running_s": round(first or everyone, 3),
        "all_running_s": round(everyone, 3),
        "refused": len(refused),
        "refused_for_the_account": sum("service account" in m for m in refused),
        "refusals": refused[:3],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = LocalCluster(args.cluster)
    if len(cluster.real_nodes()) < 1:
        raise SystemExit("no real kubelet node in the local cluster: make cluster-up REAL_NODES=2")
    installation = Installation(cluster.kubeconfig, cluster)
    installation.install()
    kube = clients(cluster.kubeconfig)
    reps = []
    try:
        for rep in range(args.reps):
            r = first_pods(kube, cluster.kubeconfig, args.members)
            print(
                f"  {rep + 1}/{args.reps}: first pod Running {r['first_running_s']:.2f} s, all "
                f"{r['all_running_s']:.2f} s, {r['refused']} creations refused",
                file=sys.stderr,
            )
            reps.append(r)
    finally:
        installation.uninstall()
    return {"members": args.members, "reps": reps}


def summary(doc: dict[str, Any]) -> str:
    reps = doc["reps"]
    first = statistics.median(r["first_running_s"] for r in reps)
    every = statistics.median(r["all_running_s"] for r in reps)
    refused = sum(r["refused_for_the_account"] for r in reps)
    return (
        f"commit {doc['commit']}: first pod Running {first:.2f} s, all {every:.2f} s (medians of "
        f"{len(reps)}); {refused} creations refused for want of the account in "
        f"{sum(r['refused_for_the_account'] > 0 for r in reps)} of {len(reps)} namespaces"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.first_pod", description=__doc__)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--members", type=int, default=2)
    p.add_argument("--cluster", default="jsi", help="the local cluster's name")
    p.add_argument("--checkout", type=Path, help="install and run another checkout's code")
    p.add_argument("--out", type=Path)
    p.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="two runs' files")
    p.add_argument("--allow-dirty", action="store_true")
    args = p.parse_args(argv)
    if args.compare:
        a, b = (json.loads(f.read_text()) for f in args.compare)
        print(summary(a))
        print(summary(b))
        for what in ("first_running_s", "all_running_s"):
            r = ratio_of_medians([x[what] for x in b["reps"]], [x[what] for x in a["reps"]])
            interval = f"95 % {r.low:.2f}-{r.high:.2f}, n = {r.n_a}, {r.n_b}"
            print(f"{what}: B / A {r.ratio:.2f}x ({interval})")
        return 0
    if args.reps < 1 or args.members < 1:
        p.error("--reps and --members: 1 or more")
    if args.checkout is not None:  # this file, that checkout's code
        here = str(Path(__file__).resolve())
        rest = list(argv if argv is not None else sys.argv[1:])
        at = rest.index("--checkout")
        rest[at : at + 2] = []
        root = str(args.checkout.resolve())
        code = (
            f"import runpy, sys; sys.path.insert(0, {root!r}); "
            f"sys.argv = [{here!r}, *{rest!r}]; runpy.run_path({here!r}, run_name='__main__')"
        )
        return subprocess.run([sys.executable, "-c", code], cwd=root, check=False).returncode
    started = provenance.begin(
        "bench.first_pod", sys.argv[1:] if argv is None else argv, args.allow_dirty
    )
    doc = started.origin | run(args)
    print(summary(doc))
    provenance.write(doc, str(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
