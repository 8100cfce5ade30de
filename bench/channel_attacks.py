"""The report channel against many addresses and a stolen member token, without a cluster:
``python -m bench.channel_attacks``.

The leader's real :class:`~jobset_inplace.controller.report_server.ReportServer` runs in a
process of its own (its default limits, TLS, llhttp, the sweeps) with the real
:class:`~jobset_inplace.runtime.report_tokens.TokenVerifier`: tokens are RS256 JWTs signed by a
key this bench makes for the run and checked offline as a cluster's would be (only where the
keys are read from differs: this bench's JWKS instead of the apiserver's). The gang has two
members. The agent of member 0 reports from one loopback address, each report on a new TLS
connection (a new leader's case: no kept-alive connection, a handshake each time), and so does
member 2's from an address the server does not know (a new pod whose address its cache has not
seen: no member's priority), while an attacker process, from ``--addresses`` other loopback
addresses (40 by default), runs one attack after another:

* ``garbage-tokens``: distinct ~15 KiB JWTs with the cluster's key id and a zero signature,
  each on a new TLS connection, as fast as the limits let them in (refused tokens remembered);
* ``plain-tcp``: every address holds as many plain TCP connections as it may, reconnecting as
  they are dropped (the unauthenticated budget);
* ``stolen-idle``: member 1's token (stolen): each connection sends one valid report, then
  stays idle; more are opened all along (authenticated connections held);
* ``stolen-pipelined``: member 1's token: 100 connections write hundreds of valid reports each,
  pipelined, and never read an answer (back-pressure);
* ``handshakes``: TLS handshakes as fast as each address's rate allows, each connection closed
  after it (the loop's CPU).

Before each attack the agent measures quiet, then during it (``--seconds``, past the 10 s
pre-authentication deadline). Per attack: every answer the agent got, the ratio of its median
latency to quiet's with a 95 % bootstrap interval, the server's RSS growth and peak, its CPU
share (of one core) over the attack, its loop's lag, and what it refused, by reason. The whole
suite runs ``--repeats`` times, each on a fresh server process (a repeat's memory growth is not
the heap an earlier one left); the summary pools the agents' latencies and gives each of the
server's figures as the median over the repeats with its 95 % bootstrap interval
(:func:`summarize`). The goals: every report answered 200 in every repeat, the latency ratio's
interval within 2x quiet, RSS at most +100 MiB in the worst repeat. The attacker and the agent share
this machine's 2 cores with the server: the CPU figures are this machine's, the ratios are what
matters."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import uvloop
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from bench import provenance
from bench.channel_attack import (
    AGENT,
    FRONT_POD,
    NEW_POD,
    Server,
    _serve,
    _tls,
    agent_report,
    member_pod,
    report_body,
    request,
)
from bench.channel_attack import NAMESPACE as NS
from bench.stats import median_interval, ratio_of_medians
from jobset_inplace import names
from jobset_inplace.runtime.report_limits import Limits
from jobset_inplace.runtime.report_tokens import TokenVerifier

ATTACKS = {  # name -> what it does (each one's method of Attack, the dashes underscores)
    "garbage-tokens": "distinct ~15 KiB JWTs with the cluster's key id and a zero signature, "
    "each on a new TLS connection",
    "plain-tcp": "as many plain TCP connections as each address may hold, reconnecting",
    "stolen-idle": "a member's stolen token: one valid report per connection, then idle; "
    "10 new connections a second per address",
    "stolen-pipelined": "a member's stolen token: 100 connections, 400 pipelined reports "
    "each, answers never read",
    "handshakes": "TLS handshakes as fast as each address may, each connection closed after",
}
ISSUER = "https://bench.cluster.local"
KID = "bench-key"
KEY_ENV = "JSI_BENCH_JWKS"  # the server's keys, from this bench: {"config": ..., "jwks": ...}
PRIVATE_ENV = "JSI_BENCH_KEY"  # the attacker process's key (PEM): it mints the stolen token
AGENT_ENV = "JSI_BENCH_AGENT"  # the agent's address: member 0's pod's, in the server's cache
FRONT_ENV = "JSI_BENCH_FRONT"  # --front: the front's token (the server process serves one)
GOAL_LATENCY_X = 2.0
GOAL_RSS_MIB = 100.0
QUIET_S = 4.0
NEW_MEMBER = 2  # the new pod's member: its address is none the server knows
REPORT_EVERY_S = 0.1  # the agent's pause between two reports


def attacker_addresses(n: int) -> list[str]:
    """``n`` loopback addresses beside the agent's (fresh ones each run: connections the
    server closed leave their ports in TIME_WAIT)."""
    net = AGENT.rsplit(".", 1)[0]
    return [f"{net}.{10 + i}" for i in range(n)]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class BenchCluster:
    """A service-account issuer of this run: its signing key, JWKS, and pod-bound tokens."""

    def __init__(self, pem: bytes | None = None) -> None:
        if pem is None:
            self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            key = serialization.load_pem_private_key(pem, None)
            assert isinstance(key, rsa.RSAPrivateKey)
            self.key = key
        self.pem = self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def keys(self) -> str:
        """What the server reads instead of the apiserver's discovery documents."""
        n = self.key.public_key().public_numbers()
        jwk = {"kty": "RSA", "kid": KID, "n": _b64(n.n.to_bytes(256, "big")), "e": _b64(b"\1\0\1")}
        return json.dumps({"config": {"issuer": ISSUER}, "jwks": {"keys": [jwk]}})

    def token(self, pod: str, uid: str, *, pad: str = "", sign: bool = True) -> str:
        """A projected token of ``pod`` for the channel's audience (``sign``: by the cluster's
        key; else a zero signature; ``pad``: an extra claim, to make it long and distinct)."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": [names.REPORT_TOKEN_AUDIENCE],
            "exp": now + 3600,
            "nbf": now - 10,
            "iat": now - 10,
            "sub": f"system:serviceaccount:{NS}:default",
            "kubernetes.io": {"namespace": NS, "pod": {"name": pod, "uid": uid}},
        }
        if pad:
            claims["pad"] = pad
        header = _b64(json.dumps({"alg": "RS256", "kid": KID}).encode())
        signed = f"{header}.{_b64(json.dumps(claims).encode())}"
        if sign:
            sig = self.key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        else:
            sig = bytes(256)
        return f"{signed}.{_b64(sig)}"


class BenchKeysVerifier(TokenVerifier):
    """The product's verifier, its keys read from this bench instead of an apiserver."""

    def __init__(self, keys: str) -> None:
        super().__init__(None)  # no apiserver: _fetch is ours
        doc = json.loads(keys)
        self._bench_keys = doc["config"], doc["jwks"]

    def _fetch(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._bench_keys


# --- the agent ---------------------------------------------------------------------------


Sample = tuple[list[float], dict[str, int]]  # an agent's latencies, and its answers by status


async def sample(report: Callable[[], Awaitable[tuple[float, str]]], seconds: float) -> Sample:
    """An agent's ``report`` (each one's seconds and answer) every REPORT_EVERY_S for
    ``seconds``: the latencies, and the answers by status."""
    times: list[float] = []
    answers: dict[str, int] = {}
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        took, status = await report()
        times.append(took)
        answers[status] = answers.get(status, 0) + 1
        await asyncio.sleep(REPORT_EVERY_S)
    return times, answers


async def agent_for(port: int, raw: bytes, seconds: float, address: str = AGENT) -> Sample:
    """An agent's reports from ``address`` for ``seconds``, each on a new TLS connection."""
    ctx = _tls()
    return await sample(lambda: agent_report(port, ctx, raw, address), seconds)


async def agents_for(port: int, raws: tuple[bytes, bytes], seconds: float) -> tuple[Sample, Sample]:
    """Member 0's agent (its address known) and the new pod's, at once."""
    known, new = await asyncio.gather(
        agent_for(port, raws[0], seconds), agent_for(port, raws[1], seconds, NEW_POD)
    )
    return known, new


# --- the attacker (a process of its own) ---------------------------------------------------


class Attack:
    """One attack from ``addresses`` on ``port`` until ``stop``; what it did, in ``seen``."""

    def __init__(self, port: int, addresses: list[str], cluster: BenchCluster) -> None:
        self.port, self.addresses, self.cluster = port, addresses, cluster
        self.seen: dict[str, int] = {}
        self.stop = asyncio.Event()
        self.ctx = _tls()
        self.stolen_token = cluster.token(*member_pod(1))

    def count(self, what: str) -> None:
        self.seen[what] = self.seen.get(what, 0) + 1

    async def connect(
        self, address: str, tls: bool = True
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1", self.port, ssl=self.ctx if tls else None, local_addr=(address, 0)
                ),
                10,
            )
        except (OSError, TimeoutError, ssl.SSLError):
            self.count("not_connected")
            await asyncio.sleep(0.01)
            return None

    async def answer(self, r: asyncio.StreamReader) -> str:
        try:
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
            return head.split(b" ", 2)[1].decode()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError):
            return "no answer"

    async def until_closed(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """Hold a connection until the server drops it or the attack stops."""
        read = asyncio.ensure_future(r.read())
        stop = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
        if read.done():
            read.exception()  # (EOF or a reset: dropped either way)
            self.count("dropped")
        for task in (read, stop):
            task.cancel()
        w.transport.abort()

    Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]

    async def exchange(self, conn: Conn, token: str) -> str:
        """Member 1's report with ``token`` on ``conn``: the answer's status."""
        r, w = conn
        w.write(request(token, report_body(1)))
        return await self.answer(r)

    def pipeline(self, conn: Conn) -> None:
        """Member 1's valid reports written at once on ``conn``, the answers never read."""
        conn[1].write(request(self.stolen_token, report_body(1)) * 400)  # 0.41 MiB
        self.count("opened")

    async def garbage_tokens(self, address: str, worker: int) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            conn = await self.connect(address)
            if conn is None:
                continue
            pad = f"{address}/{worker}/{i}/" + "x" * 11000
            garbage = self.cluster.token(*member_pod(1), pad=pad, sign=False)
            self.count(await self.exchange(conn, garbage))
            conn[1].transport.abort()

    async def plain_tcp(self, address: str, worker: int) -> None:
        while not self.stop.is_set():
            conn = await self.connect(address, tls=False)
            if conn is not None:
                self.count("opened")
                await self.until_closed(*conn)
            await asyncio.sleep(0.05)

    async def stolen_idle(self, address: str, worker: int) -> None:
        held: list[asyncio.Task[None]] = []
        while not self.stop.is_set():
            conn = await self.connect(address)
            if conn is not None:
                self.count(await self.exchange(conn, self.stolen_token))
                held.append(asyncio.ensure_future(self.until_closed(*conn)))
            await asyncio.sleep(0.1)  # 10 new connections a second from each address
        await asyncio.gather(*held)

    async def stolen_pipelined(self, address: str, worker: int) -> None:
        if worker >= 3 or (worker == 2 and self.addresses.index(address) >= 20):
            return  # 100 connections: 3 from each of the first 20 addresses, 2 from the rest
        conn = await self.connect(address)
        if conn is None:
            return
        self.pipeline(conn)
        await self.until_closed(*conn)

    async def handshakes(self, address: str, worker: int) -> None:
        while not self.stop.is_set():
            conn = await self.connect(address)
            if conn is not None:
                self.count("handshakes")
                conn[1].transport.abort()

    async def run(self, name: str, seconds: float, workers: int) -> dict[str, int]:
        attack = getattr(self, name.replace("-", "_"))
        tasks = [
            asyncio.ensure_future(attack(a, n)) for a in self.addresses for n in range(workers)
        ]
        await asyncio.sleep(seconds)
        self.stop.set()
        await asyncio.wait(tasks, timeout=15)
        return self.seen


WORKERS = {  # each address's concurrent connections or loops, per attack
    "garbage-tokens": 2,
    "plain-tcp": 64,  # its unauthenticated limit
    "stolen-idle": 1,
    "stolen-pipelined": 3,
    "handshakes": 2,
}


CPUS_ENV = "JSI_BENCH_CPUS"  # the CPUs the run began with, for the processes it starts


def pin(role: str) -> None:
    """Where each process runs, on a machine of 2 CPUs or more: the server alone on the first
    (what is measured is its loop), the agent and the attacker on the second with the attacker
    at the lowest priority (the attacker's machine is not the leader's, and the agent's own
    TLS work must not wait behind it). On one CPU: nothing (the figures then mix the three).
    The CPUs are the run's first process's, passed on in the environment: a child inherits
    its parent's pinning, and would otherwise see the one CPU the agent was pinned to."""
    named = os.environ.get(CPUS_ENV)
    cpus = sorted(map(int, named.split(","))) if named else sorted(os.sched_getaffinity(0))
    os.environ[CPUS_ENV] = ",".join(map(str, cpus))
    if len(cpus) < 2:
        return
    os.sched_setaffinity(0, {cpus[0]} if role == "server" else {cpus[1]})
    if role == "attacker":
        os.nice(19)


def attack_main(
    name: str, port: int, addresses: int, seconds: float, kind: type[Attack] = Attack
) -> int:
    """The attacker process: attack ``name`` (a ``kind`` of Attack) on ``port``; prints what
    it got."""
    pin("attacker")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cluster = BenchCluster(os.environ[PRIVATE_ENV].encode())
    attack = kind(port, attacker_addresses(addresses), cluster)
    seen = uvloop.run(attack.run(name, seconds, WORKERS[name]))
    print(json.dumps(seen), flush=True)
    return 0


# --- the run -----------------------------------------------------------------------------


def _state_delta(
    before: dict[str, Any], during: dict[str, Any], after: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """The server over an attack: its memory, CPU share and loop lag while the agent measured
    (``during``: the state at its end, ``seconds`` after ``before``), and what it refused
    until the attacker was done (``after``)."""
    refused = {
        k: v - before["refused"].get(k, 0)
        for k, v in after["refused"].items()
        if v - before["refused"].get(k, 0)
    }
    return {
        "rss_growth_mib": round(during["rss_mib"] - before["rss_mib"], 1),
        "peak_growth_mib": round(during["peak_mib"] - before["peak_mib"], 1),
        "cpu_share": round((during["cpu_s"] - before["cpu_s"]) / seconds, 3),
        "loop_lag_ms": during["loop_lag_ms"],
        "peaks": {k: max(during["peaks"][k], after["peaks"][k]) for k in during["peaks"]},
        "refused": refused,
    }


@dataclass(frozen=True)
class Transport:
    """What the run measures a server with: its agents (each a sample for so many seconds:
    member 0's, and a new pod's where measured), the module whose ``--attack`` attacks it,
    the answer to an accepted report, and its name in the progress lines."""

    agents: Callable[[int, float], tuple[Sample, Sample | None]]
    module: str = "bench.channel_attacks"
    ok: str = "HTTP/1.1 200 OK"
    label: str = ""


def ours(cluster: BenchCluster) -> Transport:
    """Our server's: member 0's agent and a new pod's (member 2), each report over TLS."""
    raws = tuple(request(cluster.token(*member_pod(i)), report_body(i)) for i in (0, NEW_MEMBER))
    assert len(raws) == 2

    def agents(port: int, seconds: float) -> tuple[Sample, Sample | None]:
        return uvloop.run(agents_for(port, (raws[0], raws[1]), seconds))

    return Transport(agents)


def run(
    server: Server,
    cluster: BenchCluster,
    addresses: int,
    seconds: float,
    attacks: Sequence[str] = tuple(ATTACKS),
    *,
    transport: Transport | None = None,
) -> dict[str, Any]:
    """Every attack in turn on ``server``, its agents measured quiet and then during it."""
    t = transport or ours(cluster)
    out: dict[str, Any] = {"limits": server.limits, "addresses": addresses, "attacks": {}}
    out["idle"] = server.state()
    t.agents(server.port, 1.0)  # the agents' tokens verified once
    for name in attacks:
        (quiet, quiet_answers), new_quiet = t.agents(server.port, QUIET_S)
        before = server.state()
        print(f"{name}{t.label}: {addresses} addresses for {seconds:.0f} s ...", file=sys.stderr)
        attacker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                t.module,
                "--attack",
                name,
                "--port",
                str(server.port),
                "--addresses",
                str(addresses),
                "--seconds",
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {PRIVATE_ENV: cluster.pem.decode()},
        )
        began = time.monotonic()
        (times, answers), new_pod = t.agents(server.port, seconds)
        during = time.monotonic() - began
        mid = server.state()
        seen_text, _ = attacker.communicate(timeout=120)
        after = server.state()
        ratio = ratio_of_medians(times, quiet)
        result = {
            "quiet_answers": quiet_answers,
            "answers": answers,
            "quiet_median_s": statistics.median(quiet),
            "median_s": statistics.median(times),
            "latency": ratio.as_dict(),
            "samples_s": _samples(quiet, times),
            "attacker": json.loads(seen_text or "{}"),
            "server": _state_delta(before, mid, after, during),
            "server_after": {k: after[k] for k in ("connections", "unauthenticated", "rss_mib")},
        }
        answered, worst = set(answers) == {t.ok}, ratio.ratio
        if new_pod is not None and new_quiet is not None:
            new_ratio = ratio_of_medians(new_pod[0], new_quiet[0])
            result["new_pod"] = {
                "answers": new_pod[1],
                "median_s": statistics.median(new_pod[0]),
                "quiet_median_s": statistics.median(new_quiet[0]),
                "latency": new_ratio.as_dict(),
                "samples_s": _samples(new_quiet[0], new_pod[0]),
            }
            answered = answered and set(new_pod[1]) == {t.ok}
            worst = max(worst, new_ratio.ratio)
        result["goals"] = {
            "every_report_answered": answered,
            "latency_within_2x": worst <= GOAL_LATENCY_X,
            "rss_within_100_mib": result["server"]["peak_growth_mib"] <= GOAL_RSS_MIB
            and result["server"]["rss_growth_mib"] <= GOAL_RSS_MIB,
        }
        out["attacks"][name] = result
        print(f"  {_line(name, result)}", file=sys.stderr)
    out["end"] = server.state()
    return out


def _samples(quiet: list[float], during: list[float]) -> dict[str, list[float]]:
    """An agent's latencies, quiet and during an attack, as stored (to 10 us: a repeat's
    samples pooled with the others' by :func:`summarize`)."""
    return {"quiet": [round(t, 5) for t in quiet], "during": [round(t, 5) for t in during]}


# The server's figures per attack that each repeat gives once (the latencies are samples of
# their own): the name in a summary, and how it is read from a repeat's ``server``.
SERVER_FIGURES: dict[str, Callable[[dict[str, Any]], float]] = {
    "rss_growth_mib": lambda s: s["rss_growth_mib"],
    "peak_growth_mib": lambda s: s["peak_growth_mib"],
    "cpu_share": lambda s: s["cpu_share"],
    "loop_lag_p99_ms": lambda s: s["loop_lag_ms"]["p99"],
}


def _added(counts: Sequence[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    """A figure over the repeats: its median, its 95 % bootstrap interval (none from one
    repeat), the worst (largest) and every value."""
    low, high = median_interval(values) if len(values) > 1 else (None, None)
    return {
        "median": statistics.median(values),
        "low": low,
        "high": high,
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def _pooled(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An agent over the repeats: its answers summed, its latency during the attack against
    quiet from every repeat's samples pooled."""
    quiet = [t for r in results for t in r["samples_s"]["quiet"]]
    during = [t for r in results for t in r["samples_s"]["during"]]
    return {
        "answers": _added([r["answers"] for r in results]),
        "median_s": statistics.median(during),
        "quiet_median_s": statistics.median(quiet),
        "latency": ratio_of_medians(during, quiet).as_dict(),
    }


def summarize(runs: Sequence[dict[str, Any]], ok: str = "HTTP/1.1 200 OK") -> dict[str, Any]:
    """Every attack over ``runs`` (each a fresh server's whole suite, :func:`run`): the
    agents' answers summed and their latencies pooled, the server's figures as medians over
    the repeats with their intervals, what the attacker got and the server refused summed,
    and the goals: every report answered in every repeat, the latency ratio's interval
    within 2x (a verdict only where the interval supports it), the worst repeat's memory
    within 100 MiB."""
    out: dict[str, Any] = {}
    for name in runs[0]["attacks"]:
        each = [r["attacks"][name] for r in runs]
        agent = _pooled(each)
        summary: dict[str, Any] = {
            "repeats": len(each),
            **agent,
            "server": {
                k: _spread([f(r["server"]) for r in each]) for k, f in SERVER_FIGURES.items()
            },
            "attacker": _added([r["attacker"] for r in each]),
            "refused": _added([r["server"]["refused"] for r in each]),
        }
        agents = [agent]
        if all("new_pod" in r for r in each):
            summary["new_pod"] = _pooled([r["new_pod"] for r in each])
            agents.append(summary["new_pod"])
        memory = summary["server"]
        summary["goals"] = {
            "every_report_answered": all(set(a["answers"]) == {ok} for a in agents),
            "latency_within_2x": all(a["latency"]["high"] <= GOAL_LATENCY_X for a in agents),
            "rss_within_100_mib": max(
                memory["peak_growth_mib"]["max"], memory["rss_growth_mib"]["max"]
            )
            <= GOAL_RSS_MIB,
        }
        out[name] = summary
    return out


def _summary_line(name: str, r: dict[str, Any]) -> str:
    s, lat = r["server"], r["latency"]

    def fig(k: str, unit: str) -> str:
        f = s[k]
        spread = f" ({f['low']:g}-{f['high']:g})" if f["low"] is not None else ""
        return f"{f['median']:g}{unit}{spread}"

    new = r.get("new_pod")
    return (
        f"{name}: answers {r['answers']}; latency / quiet {lat['ratio']:.2f}x "
        f"({lat['low']:.2f}-{lat['high']:.2f}, n = {lat['n_a']}, {lat['n_b']})"
        + (f", a new pod's {new['latency']['ratio']:.2f}x" if new else "")
        + f"; server RSS {fig('rss_growth_mib', ' MiB')}, peak {fig('peak_growth_mib', ' MiB')}, "
        f"CPU {fig('cpu_share', '')} of a core, loop lag p99 {fig('loop_lag_p99_ms', ' ms')} "
        f"(medians of {r['repeats']} repeats)"
    )


def _line(name: str, r: dict[str, Any]) -> str:
    s, lat = r["server"], r["latency"]
    return (
        f"{name}: answers {r['answers']}; latency {r['median_s'] * 1000:.1f} ms, quiet "
        f"{r['quiet_median_s'] * 1000:.1f} ms: {lat['ratio']:.2f}x "
        f"({lat['low']:.2f}-{lat['high']:.2f}, n = {lat['n_a']}, {lat['n_b']}); server RSS "
        f"{s['rss_growth_mib']:+.1f} MiB (peak {s['peak_growth_mib']:+.1f}), CPU "
        f"{s['cpu_share']:.0%} of a core, loop lag {s['loop_lag_ms']} ms; refused "
        f"{s['refused']}; attacker {r['attacker']}{_new_pod_text(r)}"
    )


def _new_pod_text(r: dict[str, Any]) -> str:
    """The new pod's agent in a run's line (runs before it was measured: nothing)."""
    new = r.get("new_pod")
    if new is None:
        return ""
    lat = new["latency"]
    return (
        f"; a new pod's agent: answers {new['answers']}, latency {new['median_s'] * 1000:.1f} "
        f"ms, quiet {new['quiet_median_s'] * 1000:.1f} ms: {lat['ratio']:.2f}x "
        f"({lat['low']:.2f}-{lat['high']:.2f})"
    )


def arguments(doc: str) -> argparse.ArgumentParser:
    """The options of an attack-suite bench (and its processes' own, hidden)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    p.add_argument("--addresses", type=int, default=40, help="the attacker's source addresses")
    p.add_argument("--seconds", type=float, default=12.0, help="each attack's length")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="the whole suite this many times, each on a fresh server process (the server's "
        "figures: medians over the repeats with 95 %% intervals; default %(default)s)",
    )
    p.add_argument(
        "--only", default=",".join(ATTACKS), help=f"attacks to run (default: {','.join(ATTACKS)})"
    )
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--attack", choices=ATTACKS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    return p


def attacks_named(p: argparse.ArgumentParser, only: str) -> list[str]:
    """``--only``'s attacks (an unknown one is an error naming the known)."""
    attacks = [a.strip() for a in only.split(",") if a.strip()]
    if unknown := set(attacks) - set(ATTACKS):
        p.error(f"--only: {', '.join(sorted(unknown))}: not one of {', '.join(ATTACKS)}")
    return attacks


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--limits", default="", help="the server's limits, as JSI_REPORT_LIMITS")
    p.add_argument(
        "--front",
        action="store_true",
        help="attack a report front instead of the leader: the agent and the attacker meet a "
        "ReportFront (the same limits, no knowledge of the members' addresses) that hands the "
        "leader its reports over the link",
    )
    args = p.parse_args()
    if args.serve:
        pin("server")
        verifier = BenchKeysVerifier(os.environ[KEY_ENV])
        limits = Limits.parse(os.environ.get(names.ENV_REPORT_LIMITS, ""))
        front = os.environ.get(FRONT_ENV) or None
        uvloop.run(_serve(verifier, 3, {0: os.environ[AGENT_ENV]}, limits, front))
        return 0
    if args.attack:
        return attack_main(args.attack, args.port, args.addresses, args.seconds)
    provenance.refuse_dirty(args.allow_dirty or not args.out)  # (no file: nothing recorded)
    origin = provenance.provenance("bench.channel_attacks", sys.argv[1:])
    cluster = BenchCluster()
    pin("agent")
    attacks = attacks_named(p, args.only)
    try:
        Limits.parse(args.limits)
    except ValueError as e:
        p.error(f"--limits: {e}")
    if args.repeats < 1:
        p.error(f"--repeats: must be 1 or more, got {args.repeats}")
    env = {KEY_ENV: cluster.keys(), AGENT_ENV: AGENT, names.ENV_REPORT_LIMITS: args.limits}
    if args.front:
        env[FRONT_ENV] = cluster.token(FRONT_POD, "uid-front")
    runs = []
    for rep in range(args.repeats):
        # a fresh server each time: a repeat's memory growth is not the heap an earlier left
        print(f"repeat {rep + 1} of {args.repeats}: a fresh server process", file=sys.stderr)
        server = Server("bench.channel_attacks", env)
        try:
            runs.append(run(server, cluster, args.addresses, args.seconds, attacks))
        finally:
            server.stop()
    result = {
        **origin,
        "when": provenance.when(),
        "seconds": args.seconds,
        "addresses": args.addresses,
        "limits": runs[0]["limits"],
        "kubernetes": "none (loopback, no cluster)",
        "target": "a report front" if args.front else "the leader",
        "attacks": summarize(runs),
        "runs": runs,
    }
    provenance.write(result, args.out)
    print(
        f"\ncommit {origin['commit']}: the report channel, {args.addresses} attacker addresses, "
        f"{args.repeats} repeats"
    )
    for name, r in result["attacks"].items():
        met = [k for k, ok in r["goals"].items() if not ok]
        verdict = "met" if not met else "NOT met: " + ", ".join(met)
        print(f"  {_summary_line(name, r)}\n    goals {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
