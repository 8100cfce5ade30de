"""The apiserver's side of the GangState watch: ``python -m bench.gangstate_fanout``.

Every agent watches its gang's GangState (one watch each, scoped by a ``metadata.name`` field
selector, bookmarks on: jobset_inplace/agent/kubeapi.py), so each status write the leader makes
is an event the apiserver sends to every member. This bench measures that fan-out on a real
etcd and kube-apiserver (the integration control plane, nothing else), for each ``--watchers``
count N: a watcher process holds N watches of one GangState, each on its own TLS connection
(HTTP/1.1, as the agents' client), and this process writes the GangState's status
``--writes`` times as the leader does (a JSON patch of the status subresource), each time
waiting until every watch has the event. The status written is the one the leader writes when
a recovery's barrier opens after as many earlier ones as the history keeps
(:func:`status_after_recoveries`, with the planner's own encoders), its ``message`` changed per
write so that each watcher tells the writes apart.

Per write: the apiserver's CPU (its process's user + system, less its idle rate with the N
watches held, measured before the writes), the time from the write's request to its answer
and to the last watcher's event, and the bytes each watcher got. Per recovery: a write's
figures times the status writes a recovery makes (:data:`WRITES_PER_RECOVERY`: the kwok
leader-cost runs' apiserver requests at 5000 pods, ``PATCH gangstates/status: 2``). The
apiserver's cacher visits only the watchers scoped to the written object's namespace and name
(k8s.io/apiserver v0.37.2, ``pkg/storage/cacher/cacher.go``, ``startDispatching``), so other
gangs' agents do not add to a gang's fan-out, and one gang of N is the case to measure.

Placement: the apiserver alone on one core; etcd, the watcher process and this one on the
other. What it leaves out: the agents' own work on each event (their JSON decode: the watcher
only finds the write's mark), the leader's own watch of the GangStates, and the network (all on
loopback). The CPU figures are this machine's; how they grow with N is the result."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import aiohttp
import uvloop

from bench import provenance
from bench.arguments import counts
from bench.scenarios import pin, status_mib
from bench.stats import median_interval
from jobset_inplace import names
from jobset_inplace.core.gangstate import status_to_dict
from jobset_inplace.core.model import (
    HISTORY_LIMIT,
    Cause,
    GangStatus,
    Ledger,
    Mark,
    Recovery,
    ReportEndpoint,
)
from jobset_inplace.core.planner.barrier import history_entry
from jobset_inplace.core.statemachine import Phase
from testbed.controlplane import ControlPlane, start_control_plane
from testbed.gangsim import CRD, CRD_NAME
from testbed.kube import clients

WRITES_PER_RECOVERY = 2
NAMESPACE = "fanout"
NAME = "train"
IDLE_S = 10.0  # the apiserver's CPU with the watches held and nothing written
SETTLE_S = 0.3  # after a write reached every watch, its window goes on this long
CONNECTING = 100  # watches being opened at once
MARK = re.compile(rb'"message":"fanout write (\d+)"')
WATCHER_CORE, API_CORE = 1, 0


def status_after_recoveries(members: int) -> dict[str, Any]:
    """A gang's status as the leader writes it when a recovery's barrier opens, after
    HISTORY_LIMIT earlier ones (the history full): each time one member's trainer exited and
    every other member restarted in place."""
    t0 = 1_800_000_000.0
    recoveries = [
        Recovery(
            epoch=epoch,
            started=t0 + 600 * epoch,
            deadline=t0 + 600 * epoch + 300,
            causes={f"workers/{epoch}/0": Cause.TRAINER_EXITED},
            in_place=members - 1,
            opened=t0 + 600 * epoch + 3.5,
            resume_step=100 * epoch,
            first_signal=Cause.TRAINER_EXITED,
            first_signal_at=t0 + 600 * epoch,
            progress_lost=7,
        )
        for epoch in range(2, HISTORY_LIMIT + 3)
    ]
    last = recoveries[-1]
    marks = tuple(Mark(t0 + 600 * e, 590.0 * e, 600.0 * e) for e in range(1, 9))
    status = GangStatus(
        phase=Phase.RUNNING,
        epoch=last.epoch,
        barrier_open=True,
        resume_step=last.resume_step,
        recovery=last,
        history=[history_entry(r) for r in recoveries][-HISTORY_LIMIT:],
        inplace_used=len(recoveries),
        expected=members,
        reported=members,
        ready=members,
        report_endpoint=ReportEndpoint("https://10.0.0.1:9444/report", "ab" * 32, "0" * 16),
        goodput=Ledger(since=t0, productive=590.0 * last.epoch, marks=marks),
    )
    return status_to_dict(status)


def cpu_s(pid: int) -> float:
    """Process ``pid``'s CPU seconds to the nanosecond: its threads' run times (schedstat;
    /proc/PID/stat counts in 10 ms ticks, as much as a write's whole cost at 200 watchers).
    A thread that ended between two reads takes its time with it: the apiserver's threads
    (Go's) live as long as it does."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return total / 1e9


def _path(namespace: str) -> str:
    return f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.GANGSTATE_PLURAL}"


# --- the watchers (a process of their own) --------------------------------------------------


async def watch_all(server: str, token: str, n: int, out: IO[str]) -> None:
    """``n`` watches of the GangState, as the agents hold them; prints ``ready`` once each
    has its first event, then, per write, a line once every watch has it."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # (loopback; same TLS work)
    params = {
        "watch": "1",
        "fieldSelector": f"metadata.name={NAME}",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "3600",
    }
    url = server + _path(NAMESPACE)
    got: dict[int, int] = {}
    size: dict[int, int] = {}
    ready, gate = [0], asyncio.Semaphore(CONNECTING)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=60)
    connector = aiohttp.TCPConnector(limit=0, ssl=ctx)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as s:

        async def one() -> None:
            while True:
                async with gate:
                    resp = await s.get(url, params=params)
                    if resp.status == 200:
                        break
                    resp.release()
                if resp.status != 429:  # too many at once (priority and fairness): again
                    raise RuntimeError(f"watch: HTTP {resp.status}")
                await asyncio.sleep(1.0)
            first = True
            async for line in resp.content:
                if first:  # the object as it is: this watch is up
                    first = False
                    ready[0] += 1
                    if ready[0] == n:
                        print("ready", file=out, flush=True)
                    continue
                if (m := MARK.search(line)) is not None:
                    k = int(m[1])
                    got[k] = got.get(k, 0) + 1
                    size[k] = size.get(k, 0) + len(line)
                    if got[k] == n:
                        done = {"write": k, "at": time.time(), "bytes": size.pop(k)}
                        print(json.dumps(done), file=out, flush=True)

        await asyncio.gather(*(one() for _ in range(n)))


def watcher_main(n: int) -> int:
    if WATCHER_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {WATCHER_CORE})
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server, token = sys.stdin.readline().split()
    uvloop.run(watch_all(server, token, n, sys.stdout))
    return 0


# --- the writer (this process) --------------------------------------------------------------


class Watchers:
    """The watcher process holding ``n`` watches."""

    def __init__(self, cp: ControlPlane, n: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.gangstate_fanout", "--watch", str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{cp.server} {cp.token}\n")
        self.proc.stdin.flush()

    def line(self) -> str:
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        if not text:
            raise RuntimeError(f"the watcher process ended (exit {self.proc.wait()})")
        return text.strip()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def measure(cp: ControlPlane, api_pid: int, n: int, writes: int) -> dict[str, Any]:
    """``writes`` status writes with ``n`` watches held (after one not counted)."""
    kube = clients(cp.kubeconfig)
    status = status_after_recoveries(n)
    t0 = time.monotonic()
    watchers = Watchers(cp, n) if n else None
    try:
        if watchers is not None and watchers.line() != "ready":
            raise RuntimeError("the watcher process did not say ready")
        opened_s = time.monotonic() - t0
        idle0, idle_t0 = cpu_s(api_pid), time.monotonic()
        time.sleep(IDLE_S)
        idle_rate = (cpu_s(api_pid) - idle0) / (time.monotonic() - idle_t0)
        out: dict[str, Any] = {
            "watchers": n,
            "opened_s": round(opened_s, 2),
            "apiserver_idle_cores": round(idle_rate, 4),
            "apiserver_rss_mib": round(status_mib(api_pid), 1),
            "writes": [],
        }
        for k in range(writes + 1):
            body = [
                {"op": "add", "path": "/status", "value": status | {"message": f"fanout write {k}"}}
            ]
            cpu0, m0, sent = cpu_s(api_pid), time.monotonic(), time.time()
            kube.custom.patch_namespaced_custom_object_status(
                names.GROUP,
                names.VERSION,
                NAMESPACE,
                names.GANGSTATE_PLURAL,
                NAME,
                body,
                _content_type="application/json-patch+json",
            )
            answered = time.time()
            done: dict[str, Any] = {"at": answered, "bytes": 0}
            if watchers is not None:
                done = json.loads(watchers.line())
                if done["write"] != k:
                    raise RuntimeError(f"write {k}: the watchers answered for {done['write']}")
            time.sleep(SETTLE_S)  # what the apiserver does after the last watcher's read
            window = time.monotonic() - m0
            cpu = cpu_s(api_pid) - cpu0 - idle_rate * window
            if k == 0:
                continue  # the first: connections' and caches' first use
            out["writes"].append(
                {
                    "apiserver_cpu_s": round(cpu, 4),
                    "write_s": round(answered - sent, 4),
                    "fanout_s": round(done["at"] - sent, 4),
                    "bytes_per_watcher": round(done["bytes"] / n) if n else 0,
                }
            )
        return out | summary(out["writes"])
    finally:
        if watchers is not None:
            watchers.stop()


def summary(writes: list[dict[str, Any]]) -> dict[str, Any]:
    """A size's writes: the apiserver's CPU and the fan-out time (medians, 95 % intervals),
    a recovery's CPU (the median times WRITES_PER_RECOVERY)."""
    out: dict[str, Any] = {"n_writes": len(writes)}
    for key in ("apiserver_cpu_s", "fanout_s"):
        values = [w[key] for w in writes]
        low, high = median_interval(values) if len(values) > 1 else (None, None)
        out[key] = {
            "median": statistics.median(values),
            "low": low,
            "high": high,
            "max": max(values),
        }
    out["apiserver_cpu_per_recovery_s"] = round(
        out["apiserver_cpu_s"]["median"] * WRITES_PER_RECOVERY, 3
    )
    out["bytes_per_watcher"] = statistics.median(w["bytes_per_watcher"] for w in writes)
    return out


def ensure_gangstate(cp: ControlPlane) -> None:
    """The GangState CRD, and the one GangState every watch is of."""
    cp.kubectl().apply_files([CRD], server_side=True)
    cp.kubectl().wait_crds_established([CRD_NAME])
    kube = clients(cp.kubeconfig)
    kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
    kube.custom.create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        NAMESPACE,
        names.GANGSTATE_PLURAL,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GANGSTATE_KIND,
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"jobSetName": NAME},
        },
    )


def run(sizes: list[int], writes: int) -> dict[str, Any]:
    print("starting the control plane ...", file=sys.stderr, flush=True)
    cp = start_control_plane()
    cpus = os.sched_getaffinity(0)
    try:
        api_pid = cp.procs[-1].pid  # started last
        if {API_CORE, WATCHER_CORE} <= cpus:
            pin(api_pid, {API_CORE})
            for proc in cp.procs[:-1]:
                pin(proc.pid, {WATCHER_CORE})
            os.sched_setaffinity(0, {WATCHER_CORE})
        ensure_gangstate(cp)
        out: dict[str, Any] = {"sizes": {}}
        for n in sizes:
            print(f"{n} watchers: opening, then {writes} writes ...", file=sys.stderr, flush=True)
            r = out["sizes"][str(n)] = measure(cp, api_pid, n, writes)
            print(f"  {line(r)}", file=sys.stderr, flush=True)
        return out
    finally:
        cp.stop()
        os.sched_setaffinity(0, cpus)


def line(r: dict[str, Any]) -> str:
    cpu, fan = r["apiserver_cpu_s"], r["fanout_s"]
    return (
        f"{r['watchers']} watchers: apiserver CPU per write {cpu['median'] * 1000:.1f} ms "
        f"(max {cpu['max'] * 1000:.1f}), per recovery {r['apiserver_cpu_per_recovery_s']:.3f} "
        f"s; last watcher {fan['median'] * 1000:.1f} ms after the write's request (max "
        f"{fan['max'] * 1000:.1f}); {r['bytes_per_watcher']} bytes per watcher; apiserver RSS "
        f"{r['apiserver_rss_mib']:.0f} MiB, idle {r['apiserver_idle_cores']:.3f} cores "
        f"(n = {r['n_writes']} writes)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument(
        "--watchers",
        type=counts(0, "watch counts"),
        default="0,1000,2000,5000,10000",
        help="watch counts",
    )
    p.add_argument("--writes", type=int, default=20, help="status writes per count")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--watch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args()
    if args.watch is not None:
        return watcher_main(args.watch)
    sizes: list[int] = args.watchers
    if args.writes < 2:
        p.error(f"--writes: 2 or more, got {args.writes}")
    provenance.refuse_dirty(args.allow_dirty or not args.out)
    origin = provenance.provenance("bench.gangstate_fanout", sys.argv[1:])
    result = run(sizes, args.writes)
    result.update(origin)
    result["when"] = provenance.when()
    result["kubernetes"] = provenance.CONTROL_PLANE
    result["status_bytes"] = {
        str(n): len(json.dumps(status_after_recoveries(n), separators=(",", ":"))) for n in sizes
    }
    result["writes_per_recovery"] = WRITES_PER_RECOVERY
    provenance.write(result, args.out)
    print(f"\ncommit {origin['commit']}: a GangState's status writes, N agents watching")
    for r in result["sizes"].values():
        print(f"  {line(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
