"""The report channel's transport against gRPC's, without a cluster: ``python -m
bench.channel_grpc --connections 2000``.

The same measurement as ``bench.channel_memory``, made for both in one run, alternated: a
server process takes N kept-alive TLS 1.3 connections (one agent each, the certificate made as
the leader makes its own), one report on each (round 1: handshakes and reports), then one more
on each (round 2: reports on kept-alive connections, what a recovery costs). The handler does
what ``bench.channel_memory``'s does (decode the report's JSON; no token check, no cache).

* **ours**: the report channel's HTTP/1.1 and TLS layer (``HttpServer`` on uvloop);
* **grpc**: ``grpcio``'s asyncio server (``grpc.aio``), one unary method taking the report's
  bytes (the token in the call's metadata, as a gRPC agent would send it), its C core doing
  HTTP/2 and TLS; configured as the issue asks a hardened one to be: at most one stream per
  connection, messages of at most 16 KiB, no keepalive pings without calls, connections idle an
  hour at most. Its clients are ``grpc.aio`` channels, one TCP connection each (a local
  subchannel pool).

Printed per transport: the server's RSS growth per connection (after ``malloc_trim``) and its
CPU per report in each round, with the ratio gRPC/ours and its interval over the repetitions.
The attack suite (``bench.channel_attacks``) is not run against gRPC here."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import grpc  # type: ignore[import-untyped]
import uvloop

from bench import channel_memory, provenance
from bench.scenarios import cpu_seconds, status_mib
from bench.stats import ratio_of_medians
from jobset_inplace.runtime.certificates import issue

METHOD = "/jsi.Reports/Report"
# What the issue names for a hardened gRPC server, as grpc core options.
SERVER_OPTIONS = [
    ("grpc.max_concurrent_streams", 1),
    ("grpc.max_receive_message_length", 16 * 1024),
    ("grpc.max_send_message_length", 16 * 1024),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_connection_idle_ms", 3_600_000),
]


def _material() -> tuple[bytes, bytes]:
    """A certificate and key made as the leader makes its own (PEM)."""
    m = issue(["jobset-inplace-reports"], datetime.datetime.now(datetime.UTC))
    return m.tls_crt, m.tls_key


async def _serve_grpc(port_file: str, cert_file: str) -> None:
    async def report(body: bytes, context: Any) -> bytes:
        json.loads(body)
        return b'{"accepted":true}'

    handler = grpc.method_handlers_generic_handler(
        "jsi.Reports", {"Report": grpc.unary_unary_rpc_method_handler(report)}
    )
    server = grpc.aio.server(options=SERVER_OPTIONS, maximum_concurrent_rpcs=None)
    server.add_generic_rpc_handlers((handler,))
    crt, key = _material()
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, crt)]))
    await server.start()
    with open(cert_file, "wb") as c:
        c.write(crt)
    with open(port_file, "w", encoding="utf-8") as f:
        f.write(str(port))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pid = os.getpid()
    print(json.dumps({"rss_mib": status_mib(pid), "cpu_s": cpu_seconds(pid)}), flush=True)
    while await reader.readline():
        ctypes.CDLL(None).malloc_trim(0)
        print(json.dumps({"rss_mib": status_mib(pid), "cpu_s": cpu_seconds(pid)}), flush=True)
    await server.stop(0)


async def _drive_grpc(
    port: int, n: int, concurrency: int, ask: Any, server_crt: bytes
) -> list[dict[str, float]]:
    gate = asyncio.Semaphore(concurrency)
    channels: list[Any] = []
    calls: list[Any] = []
    # The server's certificate is self-signed for a name, as the leader's: the clients trust
    # it as their root and name it (gRPC verifies a chain; agents pin the certificate instead).
    creds = grpc.ssl_channel_credentials(root_certificates=server_crt)
    metadata = (("authorization", f"Bearer {channel_memory.TOKEN}"),)

    async def first(i: int) -> None:
        async with gate:
            ch = grpc.aio.secure_channel(
                f"127.0.0.1:{port}",
                creds,
                options=[
                    ("grpc.use_local_subchannel_pool", 1),
                    ("grpc.ssl_target_name_override", "jobset-inplace-reports"),
                    ("grpc.channel_id", i),
                ],
            )
            call = ch.unary_unary(METHOD)
            await call(channel_memory.REPORT, metadata=metadata)
            channels.append(ch)
            calls.append(call)

    async def again(call: Any) -> None:
        async with gate:
            await call(channel_memory.REPORT, metadata=metadata)

    states = [ask()]
    started = time.monotonic()
    await asyncio.gather(*(first(i) for i in range(n)))
    print(f"grpc round 1: {n} connections and reports in {time.monotonic() - started:.2f} s")
    states.append(ask())
    started = time.monotonic()
    await asyncio.gather(*(again(c) for c in calls))
    print(f"grpc round 2: {n} reports in {time.monotonic() - started:.2f} s")
    states.append(ask())
    for ch in channels:
        await ch.close()
    return states


def measure_grpc(n: int, concurrency: int) -> list[dict[str, float]]:
    """As ``channel_memory.measure``, for the gRPC server."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file, cert_file = os.path.join(tmp, "port"), os.path.join(tmp, "crt")
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.channel_grpc", "--serve", port_file, cert_file],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ask = channel_memory.asker(server)
        try:
            with open(port_file, encoding="utf-8") as f:
                port = int(f.read())
            with open(cert_file, "rb") as c:
                crt = c.read()
            return asyncio.run(_drive_grpc(port, n, concurrency, ask, crt))
        finally:
            server.terminate()
            server.wait()


def _figures(states: list[dict[str, float]], n: int) -> dict[str, float]:
    idle, one, two = states
    return {
        "kib_per_connection": (one["rss_mib"] - idle["rss_mib"]) * 1024 / n,
        "ms_per_report_with_handshake": (one["cpu_s"] - idle["cpu_s"]) / n * 1000,
        "ms_per_report_kept_alive": (two["cpu_s"] - one["cpu_s"]) / n * 1000,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64, help="handshakes / reports in flight")
    p.add_argument("--reps", type=int, default=5, help="runs of each transport, alternated")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args()
    if args.serve:
        uvloop.run(_serve_grpc(*args.serve))
        return 0
    provenance.refuse_dirty(args.allow_dirty or not args.out)
    origin = provenance.provenance("bench.channel_grpc", sys.argv[1:])
    n, runs = args.connections, {"ours": [], "grpc": []}  # type: ignore[var-annotated]
    for rep in range(args.reps):
        for name, measure in (("ours", channel_memory.measure), ("grpc", measure_grpc)):
            runs[name].append(_figures(measure(n, args.concurrency), n))
            print(f"rep {rep + 1} {name}: {runs[name][-1]}", flush=True)
    result: dict[str, Any] = {"connections": n, "runs": runs, "ratios": {}}
    for figure in runs["ours"][0]:
        r = ratio_of_medians([x[figure] for x in runs["grpc"]], [x[figure] for x in runs["ours"]])
        result["ratios"][figure] = r.as_dict()
        ours = statistics.median(x[figure] for x in runs["ours"])
        theirs = statistics.median(x[figure] for x in runs["grpc"])
        print(f"{figure}: ours {ours:.3f}, grpc {theirs:.3f}: grpc {r.text()}")
    provenance.write(result | origin, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
