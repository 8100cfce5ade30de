"""What one kept-alive agent connection and one report cost the leader's report channel, without
a cluster: ``python -m bench.channel_memory --connections 2000``.

A server process runs the channel's HTTP and TLS layer (:class:`~jobset_inplace.controller.
report_http.HttpServer` on uvloop, with a certificate made as the leader makes its own) and a
handler that decodes each report's JSON (no token check, no cache: those are the
controller's, measured by ``make bench``). This process opens N TLS connections, sends one report
on each (round 1: handshakes and reports), then one more on each (round 2: reports on kept-alive
connections, what a recovery costs). Printed: the server's RSS growth per connection (after
``malloc_trim``) and its CPU per report in each round."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import uvloop

from bench.scenarios import cpu_seconds, status_mib
from jobset_inplace import names
from jobset_inplace.runtime.report_http import Answer, HttpServer, Request
from jobset_inplace.runtime.report_limits import Limits
from jobset_inplace.runtime.report_tls import serving_context
from testbed.controller import FLEET_LIMITS

REPORT = json.dumps(
    {"namespace": "bench", "gang": "g", "pod": "p" * 40, "uid": "u" * 36, "report": {"epoch": "2"}}
).encode()
TOKEN = "x" * 1100  # a projected token's size


def _server_state() -> dict[str, float]:
    return {"rss_mib": status_mib(os.getpid()), "cpu_s": cpu_seconds(os.getpid())}


async def _serve(sock: socket.socket) -> None:
    async def handle(request: Request) -> Answer:
        json.loads(request.body)
        return Answer(200, {"accepted": True})

    loop = asyncio.get_running_loop()
    ctx, _ = serving_context()
    # every connection comes from this host's one address: no per-source limit (the
    # controller run as a host process does the same: testbed/controller.py)
    limits = Limits.parse(FLEET_LIMITS)
    http = HttpServer(
        handle, names.REPORT_PATH.encode(), 16 * 1024, loop.time, tls=ctx, limits=limits
    )
    await loop.create_server(http.connection, sock=sock)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps(_server_state()), flush=True)  # idle
    while await reader.readline():  # one line per question: the state now, after a trim
        ctypes.CDLL(None).malloc_trim(0)
        print(json.dumps({**_server_state(), "connections": len(http.connections)}), flush=True)


def serve_main(fd: int) -> None:
    uvloop.run(_serve(socket.socket(fileno=fd)))


async def _drive(port: int, n: int, concurrency: int, ask: Any) -> list[dict[str, float]]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    request = (
        f"POST {names.REPORT_PATH} HTTP/1.1\r\nHost: leader\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(REPORT)}\r\n\r\n"
    ).encode() + REPORT
    gate = asyncio.Semaphore(concurrency)
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def report(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(request)
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {head[:80]!r}")
        length = next(
            int(h.split(b":")[1])
            for h in head.split(b"\r\n")
            if h.lower().startswith(b"content-length")
        )
        await r.readexactly(length)

    async def first() -> None:
        async with gate:
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
            await report(r, w)
            conns.append((r, w))

    async def again(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        async with gate:
            await report(r, w)

    states = [ask()]
    started = time.monotonic()
    await asyncio.gather(*(first() for _ in range(n)))
    print(f"round 1: {n} connections and reports in {time.monotonic() - started:.2f} s", flush=True)
    states.append(ask())
    started = time.monotonic()
    await asyncio.gather(*(again(r, w) for r, w in conns))
    print(f"round 2: {n} reports in {time.monotonic() - started:.2f} s", flush=True)
    states.append(ask())
    for _, w in conns:
        w.close()
    return states


def asker(server: subprocess.Popen[str]) -> Callable[[], dict[str, float]]:
    """Once ``server`` (a bench server process) said it started: a function that asks it for
    its state (a line out, a JSON line back)."""
    assert server.stdin is not None
    assert server.stdout is not None
    stdin, stdout = server.stdin, server.stdout
    stdout.readline()  # started

    def ask() -> dict[str, float]:
        stdin.write("?\n")
        stdin.flush()
        state: dict[str, float] = json.loads(stdout.readline())
        return state

    return ask


def measure(n: int, concurrency: int) -> list[dict[str, float]]:
    """The server's state (RSS MiB, CPU s, open connections) idle, after round 1, after round
    2."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=4096)
    port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.channel_memory", "--serve-fd", str(sock.fileno())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(sock.fileno(),),
    )
    sock.close()  # the server's now
    ask = asker(server)
    try:
        return asyncio.run(_drive(port, n, concurrency, ask))
    finally:
        server.terminate()
        server.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64, help="handshakes / reports in flight")
    p.add_argument("--serve-fd", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fd is not None:
        serve_main(args.serve_fd)
        return 0
    n = args.connections
    idle, one, two = measure(n, args.concurrency)
    print(
        f"server: idle RSS {idle['rss_mib']:.1f} MiB; with {n} connections "
        f"{one['rss_mib']:.1f} MiB: {(one['rss_mib'] - idle['rss_mib']) * 1024 / n:.1f} KiB per "
        f"connection (after malloc_trim)\n"
        f"server CPU per report: round 1 (with its handshake) "
        f"{(one['cpu_s'] - idle['cpu_s']) / n * 1000:.3f} ms, round 2 (kept alive) "
        f"{(two['cpu_s'] - one['cpu_s']) / n * 1000:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
