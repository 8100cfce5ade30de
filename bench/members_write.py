"""The leader's side of a GangMembers write: ``python -m bench.members_write``.

The leader writes each gang's GangMembers object (one row per member,
:mod:`jobset_inplace.core.gangmembers`) by server-side apply, at most every
``max(5 s, 2 ms per member)``. This bench measures what that write costs the leader's own
thread, on a real etcd and kube-apiserver (the integration control plane, nothing else), two
ways, interleaved write by write on the same object with the same rows:

* ``client``: ``CustomObjectsApi.patch_namespaced_custom_object`` with the object as a dict
  (what the executor did before: the client validates the body with pydantic, walks it in
  Python to sanitize it, encodes it, and parses the answer, the whole object again);
* ``encoded``: :meth:`jobset_inplace.controller.executor.Executor.write_members` (the body
  encoded with ``json.dumps``, the answer read, not parsed).

Per write: the calling thread's CPU time (``time.thread_time``: the leader's cost; the
apiserver's is its own process's and the same request either way) and the wall time. The
ratio of the medians (encoded / client) with its 95 % bootstrap interval per row count. The
object (``members_object``, whose building both ways share) is built inside the timed call
both ways, as the executor builds it."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import provenance
from bench.arguments import counts
from bench.stats import median_interval, ratio_of_medians
from jobset_inplace import names
from jobset_inplace.controller.executor import COMPONENT, Executor
from jobset_inplace.core.gangmembers import MemberRow, members_object
from testbed.controller import MEMBERS_CRD
from testbed.controlplane import start_control_plane
from testbed.kube import Clients, clients

NAMESPACE = "members-write"
Write = Callable[[dict[str, Any], Sequence[MemberRow], float], None]


def client_write(kube: Clients) -> Write:
    """The write through the client's typed method (the executor's before)."""

    def write(jobset: dict[str, Any], rows: Sequence[MemberRow], now: float) -> None:
        meta = jobset["metadata"]
        kube.custom.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            meta["namespace"],
            names.GANGMEMBERS_PLURAL,
            meta["name"],
            members_object(jobset, rows, now),
            field_manager=COMPONENT,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    return write


def jobset_of(n: int) -> dict[str, Any]:
    """A JobSet as the watch gives it, as far as the object's metadata reads it (its owner:
    nothing garbage-collects here)."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": f"gang-{n}", "namespace": NAMESPACE, "uid": f"uid-{n:036d}"},
    }


def rows_of(n: int, epoch: int) -> list[MemberRow]:
    """``n`` rows as a recovery leaves them: every member reported ``epoch`` and a step."""
    return [
        MemberRow(f"workers/{i // 8}/{i % 8}", f"gang-workers-{i // 8}-{i % 8}", epoch, 100 * epoch)
        for i in range(n)
    ]


def measure(kube: Clients, n: int, writes: int) -> dict[str, Any]:
    jobset = jobset_of(n)
    ways: dict[str, Write] = {
        "client": client_write(kube),
        "encoded": Executor(kube.api).write_members,
    }
    ways["client"](jobset, rows_of(n, 0), 0.0)  # created, and each way's first call warmed
    ways["encoded"](jobset, rows_of(n, 0), 0.0)
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    for i in range(writes):
        order = ("client", "encoded") if i % 2 == 0 else ("encoded", "client")
        for way in order:
            rows = rows_of(n, i + 1)  # every row changed, as after a recovery
            c0, w0 = time.thread_time(), time.perf_counter()
            ways[way](jobset, rows, float(i))
            cpu[way].append(time.thread_time() - c0)
            wall[way].append(time.perf_counter() - w0)
    got = kube.custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, NAMESPACE, names.GANGMEMBERS_PLURAL, jobset["metadata"]["name"]
    )
    if len(got["members"]) != n or got["members"][-1]["epoch"] != writes:
        raise SystemExit(f"{n} rows: the object read back is not the last write's")
    out: dict[str, Any] = {"rows": n, "writes": writes}
    for way in ways:
        out[way] = {
            "cpu_s": summary(cpu[way]),
            "wall_s": summary(wall[way]),
            "cpu_values_s": [round(v, 6) for v in cpu[way]],
        }
    out["cpu_ratio"] = ratio_of_medians(cpu["encoded"], cpu["client"]).as_dict()
    out["wall_ratio"] = ratio_of_medians(wall["encoded"], wall["client"]).as_dict()
    return out


def measure_sizes(sizes: list[int], writes: int) -> dict[str, Any]:
    """:func:`measure` for each row count, on a control plane of its own."""
    print("starting the control plane ...", file=sys.stderr, flush=True)
    cp = start_control_plane()
    try:
        cp.kubectl().apply_files([MEMBERS_CRD], server_side=True)
        cp.kubectl().wait_crds_established([f"{names.GANGMEMBERS_PLURAL}.{names.GROUP}"])
        kube = clients(cp.kubeconfig)
        kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
        out: dict[str, Any] = {"sizes": {}}
        for n in sizes:
            print(f"{n} rows: {writes} writes each way ...", file=sys.stderr, flush=True)
            r = out["sizes"][str(n)] = measure(kube, n, writes)
            print(f"  {line(r)}", file=sys.stderr, flush=True)
        return out
    finally:
        cp.stop()


def summary(values: list[float]) -> dict[str, float]:
    low, high = median_interval(values)
    return {"median": statistics.median(values), "low": low, "high": high, "max": max(values)}


def line(r: dict[str, Any]) -> str:
    c, e, ratio = r["client"]["cpu_s"], r["encoded"]["cpu_s"], r["cpu_ratio"]
    wall = r["wall_ratio"]
    return (
        f"{r['rows']} rows: the leader's thread CPU per write {e['median'] * 1000:.1f} ms "
        f"encoded vs {c['median'] * 1000:.1f} ms through the client: {ratio['ratio']:.2f}x "
        f"(95 % {ratio['low']:.2f}-{ratio['high']:.2f}); wall {wall['ratio']:.2f}x "
        f"(95 % {wall['low']:.2f}-{wall['high']:.2f}); n = {r['writes']} writes each"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument(
        "--rows", type=counts(1, "row counts"), default="1000,5000,10000", help="row counts"
    )
    p.add_argument("--writes", type=int, default=20, help="writes per way and row count")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args()
    if args.writes < 2:
        p.error(f"--writes: 2 or more, got {args.writes}")
    run = provenance.begin("bench.members_write", sys.argv[1:], args.allow_dirty or not args.out)
    result: dict[str, Any] = {**run.origin, **measure_sizes(args.rows, args.writes)}
    result["when"] = provenance.when()
    result["kubernetes"] = provenance.CONTROL_PLANE
    result.update(run.steal())
    provenance.write(result, args.out)
    print(f"\ncommit {run.origin['commit']}: a GangMembers write, the leader's side")
    for r in result["sizes"].values():
        print(f"  {line(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
