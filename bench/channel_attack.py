"""The report channel under attack, without a cluster: ``python -m bench.channel_attack``.

A server process runs the leader's real :class:`~jobset_inplace.controller.report_server.
ReportServer` (its limits at their defaults, the open-files limit of this machine, TLS, llhttp,
the sweeps) on 127.0.0.1 with one gang of one member in its cache. Its token check is the one
part replaced: a bench verifier takes the token as the pod's identity (the JWT checks cost
~0.1 ms a report and have tests of their own: tests/unit/test_report_tokens.py). This process:

1. **quiet**: an agent on one loopback address sends reports, each on a new TLS connection:
   the latency without an attacker (median of ``--samples``);
2. **flood**: an attacker on another opens ``--connections`` connections (20 000 by
   default) and holds each one until the server drops it (at the pre-authentication deadline
   at the latest): half idle, half with a TLS record sent short of its last byte. The agent's
   reports start with the flood and go on while it comes in. Printed: the server's peak RSS,
   its connections, what it refused by reason, the agent's latency and answers;
3. **trickle**: 3 connections from a third address send a byte every 50 ms (a TLS record that
   would take 25 s to complete), each reconnecting when dropped, while the agent reports:
   latency against quiet.

Each figure comes from this run; the ratios are what matter (a noisy 2-core machine)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import ssl
import statistics
import subprocess
import sys
import time
from typing import Any

import uvloop

from bench import provenance
from bench.scenarios import cpu_seconds, status_mib
from jobset_inplace import names
from jobset_inplace.controller.cache import ClusterCache, JobEntry, pod_entry
from jobset_inplace.controller.metrics import METRICS
from jobset_inplace.controller.report_front import ReportFront
from jobset_inplace.controller.report_server import ReportServer
from jobset_inplace.core.model import GangStatus
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.report_fronts import Link
from jobset_inplace.runtime.report_limits import REFUSALS, Limits
from jobset_inplace.runtime.report_tokens import Identity, TokenVerifier

NAMESPACE, GANG, POD, UID = "bench", "train", "train-workers-0-0-abcde", "uid-member-0"
FRONT_POD = "front-0"  # the report front's pod (--front), whose token the leader's link takes
REPORT = json.dumps(
    {
        "namespace": NAMESPACE,
        "gang": GANG,
        "pod": POD,
        "uid": UID,
        "report": {names.REPORT_EPOCH: "2", names.REPORT_STEPS: "200,100"},
    }
).encode()
# Loopback addresses of this run's agent, attacker and trickler: fresh ones each run (127.x.y.z
# all reach the host), since 20 000 connections closed by the server leave their ports in
# TIME_WAIT for a minute and a second run from the same address would run out of them.
_NET = random.randrange(1, 255), random.randrange(0, 255)
AGENT, ATTACKER, TRICKLER, NEW_POD = (f"127.{_NET[0]}.{_NET[1]}.{h}" for h in (2, 1, 3, 4))
FLOOD_TIMEOUT_S = 300.0
TRICKLE_S = 0.05  # between two bytes of a trickling connection
# The first bytes of a TLS record (handshake, TLS 1.0 framing) announcing 512 bytes, of which
# fewer arrive: the server's TLS layer waits for the rest.
PARTIAL_RECORD = b"\x16\x03\x01\x02\x00" + b"\x01" * 200


class TrustingVerifier:
    """The bench's token check: the token names the pod it speaks for (no JWT)."""

    def remembered(self, token: str) -> Identity | None:
        return Identity(NAMESPACE, POD, UID, until=time.time() + 3600)  # as if verified before

    async def identify(self, token: str) -> Identity:
        return Identity(NAMESPACE, POD, UID, until=time.time() + 3600)


def member_pod(index: int) -> tuple[str, str]:
    """(name, uid) of the gang's member ``index``'s pod (0: the bench's agent)."""
    return (POD, UID) if index == 0 else (f"train-workers-{index}-0-abcde", f"uid-member-{index}")


def report_body(index: int) -> bytes:
    """Member ``index``'s report of epoch 2 (the gang's epoch), as its agent sends it."""
    pod, uid = member_pod(index)
    doc = json.loads(REPORT)
    return json.dumps(doc | {"pod": pod, "uid": uid}).encode()


def _cache(members: int = 1, addresses: dict[int, str] | None = None) -> ClusterCache:
    """A gang of ``members``, epoch 2; ``addresses``: member index -> its pod's address."""
    cache = ClusterCache()
    jobset = {
        "metadata": {"name": GANG, "namespace": NAMESPACE, "uid": "js"},
        "spec": {
            "replicatedJobs": [{"name": "workers", "replicas": members, "template": {"spec": {}}}]
        },
    }
    cache.upsert_jobset(jobset, Policy(), "")
    for index in range(members):
        cache.upsert_job(JobEntry(f"job-{index}", "js"))
        labels = {
            names.JOBSET_NAME_LABEL: GANG,
            names.REPLICATED_JOB_LABEL: "workers",
            names.JOB_INDEX_LABEL: str(index),
            names.COMPLETION_INDEX_LABEL: "0",
        }
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": f"job-{index}"}
        name, uid = member_pod(index)
        meta = {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid,
            "labels": labels,
            "ownerReferences": [owner | {"controller": True}],
        }
        status = {"phase": "Running", "podIP": (addresses or {}).get(index, "")}
        pod = {"metadata": meta, "spec": {}, "status": status}
        cache.upsert_pod(pod_entry(pod))
    cache.gangs[NAMESPACE, GANG].status = GangStatus(epoch=2)  # the epoch the agent reports
    return cache


def _refused() -> dict[str, float]:
    counter = METRICS.report_channel_connections_refused
    return {reason: counter.labels(reason)._value.get() for reason in REFUSALS}


async def _serve(
    verifier: TokenVerifier | None = None,
    members: int = 1,
    addresses: dict[int, str] | None = None,
    limits: Limits | None = None,
    front_token: str | None = None,
) -> None:
    """The server process: answers each line on stdin with its state (``verifier``: the token
    check, the bench's trusting one by default; ``members`` and their ``addresses``: the
    gang's). ``front_token``: the clients meet a report front
    (:class:`~jobset_inplace.controller.report_front.ReportFront`, the pod ``front-0`` of
    that token, with the same limits and no knowledge of the members' addresses) that hands
    the leader their reports over its link; the state is the front's."""
    server = ReportServer(
        _cache(members, addresses),
        lambda key, urgent=False: None,
        verifier or TrustingVerifier(),  # type: ignore[arg-type]
        ("127.0.0.1", 0),
        "127.0.0.1",
        limits=limits or Limits(),
        link=("127.0.0.1", 0) if front_token else None,
        fronts=lambda who: who.pod == FRONT_POD,
    )
    endpoint = await server.start()
    assert server.http is not None
    http = server.http
    if front_token:
        assert server.link_port is not None
        front = ReportFront(
            verifier or TrustingVerifier(),  # type: ignore[arg-type]
            ("127.0.0.1", 0),
            Link("127.0.0.1", server.link_port, endpoint.cert_sha256),
            lambda: front_token,
            limits=limits or Limits(),
        )
        await front.start()
        assert front.http is not None
        http = front.http
        # (a front has no metrics of its own yet: its refusals counted as the leader's are)
        http.on_dropped = server._dropped
        endpoint = dataclasses.replace(
            endpoint, url=f"https://127.0.0.1:{front.port}{names.REPORT_PATH}"
        )
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pid = os.getpid()
    lags: list[float] = []  # how late a 10 ms timer fired: what any callback waits for the loop
    peaks = {"unauthenticated": 0, "per_identity": 0}  # sampled every 10 ms

    async def lag() -> None:
        while True:
            began = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - began - 0.01)
            admission = http.admission
            peaks["unauthenticated"] = max(peaks["unauthenticated"], admission.unauthenticated)
            peaks["per_identity"] = max(peaks["per_identity"], admission.most_per_identity())

    lagging = asyncio.create_task(lag())
    print(json.dumps({"url": endpoint.url, "limits": str(http.admission.limits)}), flush=True)
    while await reader.readline():  # one line per question: the state now
        state = server_state(pid, lags, peaks) | {
            "connections": len(http.connections),
            "unauthenticated": len(http.unauthenticated),
            "handshakes_waiting": http.gate.waiting,
            "accepted": server.accepted,
            "refused": _refused(),
        }
        print(json.dumps(state), flush=True)
    lagging.cancel()


def server_state(pid: int, lags: list[float], peaks: dict[str, int]) -> dict[str, Any]:
    """What every bench server answers a question with: its ``peaks`` since the last one and
    the loop's ``lags`` (both then started afresh), its memory and CPU."""
    seen, lags[:] = sorted(lags), []
    state = {
        "peaks": dict(peaks),
        "loop_lag_ms": {
            "median": round(statistics.median(seen) * 1000, 2) if seen else None,
            "p99": round(seen[int(len(seen) * 0.99)] * 1000, 2) if seen else None,
        },
        "rss_mib": status_mib(pid),
        "peak_mib": status_mib(pid, "VmHWM"),
        "cpu_s": cpu_seconds(pid),
    }
    peaks.update(dict.fromkeys(peaks, 0))
    return state


class Server:
    """The server process (``module``'s ``--serve``), asked for its state line by line."""

    def __init__(self, module: str = "bench.channel_attack", env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=None if env is None else os.environ | env,
        )
        assert self.proc.stdout is not None
        first = json.loads(self.proc.stdout.readline())
        self.port = int(first["url"].rsplit(":", 1)[1].split("/")[0])
        self.limits = first["limits"]

    def state(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def _tls() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def request(token: str, body: bytes) -> bytes:
    """A report request as an agent sends it."""
    return (
        f"POST {names.REPORT_PATH} HTTP/1.1\r\nHost: leader\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def agent_report(
    port: int, ctx: ssl.SSLContext, raw: bytes | None = None, address: str = AGENT
) -> tuple[float, str]:
    """One report (``raw``: this request, else member 0's with the bench's token) on a new
    TLS connection from ``address`` (the agent's): (seconds, status line)."""
    started = time.monotonic()
    try:
        r, w = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, local_addr=(address, 0)), 10
        )
        w.write(raw or request("agent", REPORT))
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
        w.close()
        status = head.split(b"\r\n", 1)[0].decode()
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError) as e:
        status = f"failed: {type(e).__name__}"
    return time.monotonic() - started, status


async def agent_samples(port: int, n: int, at_least_s: float = 0.0) -> tuple[float, dict[str, int]]:
    """The median latency of ``n`` reports or more, one after the other, for ``at_least_s``
    seconds at least, and their answers."""
    ctx, times, answers = _tls(), [], {}  # type: ignore[var-annotated]
    until = time.monotonic() + at_least_s
    while len(times) < n or time.monotonic() < until:
        took, status = await agent_report(port, ctx)
        times.append(took)
        answers[status] = answers.get(status, 0) + 1
        await asyncio.sleep(0.05)
    return statistics.median(times), answers


async def flood(
    port: int, n: int, concurrency: int, hold: asyncio.Event, seen: dict[str, int]
) -> dict[str, int]:
    """``n`` connections from the attacker's address, each held until the server drops it or
    ``hold`` is set; half idle, half with a partial TLS record. Counted in ``seen``."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
            except OSError:
                seen["not_connected"] += 1
                return
            seen["opened"] += 1
            if i % 2 and not w.is_closing():  # (dropped already: uvloop's write would raise)
                w.write(PARTIAL_RECORD)
            # the server's drop shows as EOF; until then the connection counts as held
            read = asyncio.ensure_future(r.read(1))
            waiting = asyncio.ensure_future(hold.wait())
            done, _ = await asyncio.wait({read, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if read in done:
                read.exception()  # EOF or a reset: dropped either way
                seen["dropped"] += 1
                waiting.cancel()
            else:
                seen["held"] += 1
                read.cancel()
            w.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return seen


async def trickle(port: int, stop: asyncio.Event) -> int:
    """3 connections sending a byte every 50 ms (the 512-byte record would complete after the
    pre-authentication deadline), reconnecting when dropped: how many ran."""
    runs = 0

    async def one() -> None:
        nonlocal runs
        while not stop.is_set():
            runs += 1
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(TRICKLER, 0))
                for byte in PARTIAL_RECORD * 100:
                    # (a transport the server reset is closed before the reader sees EOF, and
                    # uvloop's write on it raises RuntimeError, not OSError)
                    if stop.is_set() or r.at_eof() or w.is_closing():
                        break
                    w.write(bytes([byte]))
                    await w.drain()
                    await asyncio.sleep(TRICKLE_S)
                w.close()
            except (OSError, asyncio.IncompleteReadError):  # dropped by the server
                await asyncio.sleep(0.1)

    await asyncio.gather(*(one() for _ in range(3)))
    return runs


async def run(server: Server, connections: int, concurrency: int, samples: int) -> dict[str, Any]:
    port, out = server.port, {"limits": server.limits}
    out["idle"] = server.state()
    out["quiet_s"], out["quiet_answers"] = await agent_samples(port, samples)
    # the flood, the agent reporting while it comes in and while the attacker holds its share
    hold = asyncio.Event()
    started = time.monotonic()
    seen = {"opened": 0, "dropped": 0, "held": 0, "not_connected": 0}
    attack = asyncio.ensure_future(flood(port, connections, concurrency, hold, seen))
    out["flood_s"], out["flood_answers"] = await agent_samples(port, samples)
    peak: dict[str, Any] = {}
    # Until every attacker connection was tried and the server's count of them (refused or
    # held) stays put for a second. Some may never reach the server: when the burst overflows
    # the listening socket's queue, the kernel answers with SYN cookies and drops the
    # handshake's last packet, and an idle client then believes in a connection the server
    # never had (the kernel's doing, not the channel's; counted as ``never_accepted``).
    last, steady = -1.0, 0
    while True:
        state = await asyncio.to_thread(server.state)
        if state["connections"] >= peak.get("connections", -1):
            peak = state
        counted = sum(state["refused"].values()) + state["unauthenticated"]
        steady = steady + 1 if counted == last else 0
        last = counted
        if seen["opened"] + seen["not_connected"] == connections and steady >= 5:
            break
        if time.monotonic() - started > FLOOD_TIMEOUT_S:
            raise RuntimeError(f"the flood did not settle: attacker {seen}, server {state}")
        await asyncio.sleep(0.2)
    out["never_accepted"] = seen["opened"] - int(last)
    out["flood_burst_s"] = time.monotonic() - started
    out["under_flood"] = state
    # Every connection the server holds is dropped at its pre-authentication deadline: wait for
    # that, then for the attacker to have seen every drop the server counted (on a busy machine
    # an EOF reaches it late; deciding before would count a dropped connection as held). What
    # it still holds then, the server never had.
    while True:
        state = await asyncio.to_thread(server.state)
        if state["unauthenticated"] == 0 and seen["dropped"] == sum(state["refused"].values()):
            break
        if time.monotonic() - started > FLOOD_TIMEOUT_S:
            raise RuntimeError(
                f"the attacker's drops and the server's refusals differ: attacker {seen}, "
                f"server {state}"
            )
        await asyncio.sleep(0.2)
    # The server's count here, not after the attacker lets go: closing a connection the kernel
    # answered with a SYN cookie sends a packet that completes it late, and the server then
    # accepts (and refuses) it; seen once under load, 34 late rate-limit refusals.
    out["settled"] = state
    hold.set()
    out["attacker"] = await attack
    out["peak_during_flood"] = peak
    # the trickle
    stop = asyncio.Event()
    trickling = asyncio.ensure_future(trickle(port, stop))
    await asyncio.sleep(1.0)
    # past the pre-authentication deadline (10 s): the trickling connections are dropped and
    # come back meanwhile
    out["trickle_s"], out["trickle_answers"] = await agent_samples(port, samples, 15.0)
    stop.set()
    out["trickle_connections"] = await trickling
    out["end"] = await asyncio.to_thread(server.state)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=2000, help="attacker's connections at once")
    p.add_argument("--samples", type=int, default=20, help="agent reports per phase")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args()
    if args.serve:
        uvloop.run(_serve())
        return 0
    provenance.refuse_dirty(args.allow_dirty or not args.out)  # (no file: nothing recorded)
    origin = provenance.provenance("bench.channel_attack", sys.argv[1:])
    server = Server()
    try:
        result = uvloop.run(run(server, args.connections, args.concurrency, args.samples))
    finally:
        server.stop()
    result.update(origin)
    commit = origin["commit"]
    provenance.write(result, args.out)
    q, f, t = result["quiet_s"], result["flood_s"], result["trickle_s"]
    end, held = result["end"], result["peak_during_flood"].get("connections")
    print(
        f"\ncommit {commit}: {args.connections} attacker connections from one address\n"
        f"  server RSS: idle {result['idle']['rss_mib']:.1f} MiB, peak {end['peak_mib']:.1f} "
        f"MiB; connections held at the flood's peak {held}; never accepted (SYN cookies) "
        f"{result['never_accepted']}; the flood took "
        f"{result['flood_burst_s']:.1f} s"
        f"\n  refused: {end['refused']}\n"
        f"  agent report (new TLS connection): quiet {q * 1000:.1f} ms, under the flood "
        f"{f * 1000:.1f} ms ({f / q:.2f}x; answers {result['flood_answers']}), with 3 trickling "
        f"connections {t * 1000:.1f} ms ({t / q:.2f}x; answers {result['trickle_answers']}; "
        f"{result['trickle_connections']} trickling connections in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
