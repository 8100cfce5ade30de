"""The report channel's attack suite against ours and a hardened gRPC server, like for like, in
one run: ``python -m bench.channel_attacks_grpc``.

The five attacks of ``bench.channel_attacks`` (garbage-tokens, plain-tcp, stolen-idle,
stolen-pipelined, handshakes), from the same ``--addresses`` loopback addresses with the same
workers per address, the same quiet measurement before each and the same figures and goals
(every report answered OK, latency at most 2x the transport's own quiet, RSS at most +100 MiB),
first against our server (``bench.channel_attacks.run``, unchanged: the real
:class:`~jobset_inplace.controller.report_server.ReportServer` with its default limits), then
against ``grpcio``'s asyncio server (``grpc.aio``, its C core doing TLS 1.3 and HTTP/2), in a
process of its own pinned as ours is, one unary method ``/jsi.Reports/Report`` taking the
report's bytes. Its handler checks what ours checks: the ``authorization`` metadata's bearer
token by the product's verifier (:class:`~bench.channel_attacks.BenchKeysVerifier`, the same
keys: a refused token is UNAUTHENTICATED), the token's pod is one of the gang's two members
(else PERMISSION_DENIED) and the report's ``pod``/``uid`` are the token's (else
PERMISSION_DENIED), then answers ``{"accepted":true}``. Ours also consults its cluster cache
(the gang, its epoch, the member's address); the gRPC handler knows the two members by name.

**gRPC's hardening** (:func:`hardened_options`; every key below was checked to be a core
argument of the installed grpcio, its name present in ``cygrpc``'s library), set to our
server's own figures where it has one:

* at most 1 concurrent stream per connection (``grpc.max_concurrent_streams``), messages of at
  most 16 KiB each way (``grpc.max_receive_message_length``/``max_send_message_length``: our
  body limit), metadata of at most 16 KiB (``grpc.max_metadata_size`` and
  ``grpc.absolute_max_metadata_size``: our head limit; the garbage tokens, ~15 KiB, fit in both);
* a handshake deadline of 10 s (``grpc.server_handshake_timeout_ms``, TLS and HTTP/2's
  settings: our pre-authentication deadline);
* keepalive enforcement: no pings without calls (``grpc.keepalive_permit_without_calls`` 0,
  ``grpc.http2.max_pings_without_data`` 0), pings without data at most every 5 min
  (``grpc.http2.min_ping_interval_without_data_ms``), a connection closed after 2 offences
  (``grpc.http2.max_ping_strikes``);
* connections idle at most 1 h (``grpc.max_connection_idle_ms``: our authenticated connections'
  idle limit, so an agent keeps its connection as with ours; gRPC cannot tell an authenticated
  connection from another, so a TLS connection that never calls is kept as long), at most 1 h
  old (``grpc.max_connection_age_ms``) with 30 s to finish its calls
  (``grpc.max_connection_age_grace_ms``: our in-request limit);
* at most as many connections as ours takes (``grpc.max_allowed_incoming_connections``:
  ``Limits.for_open_files`` of the open-files limit, raised to its hard limit as ours raises
  it: 19 488 on a hard limit of 20 000);
* flow control: no BDP probing (``grpc.http2.bdp_probe`` 0), a stream's window of 32 KiB
  (``grpc.http2.lookahead_bytes``: two messages), reads of at most 16 KiB
  (``grpc.experimental.tcp_max_read_chunk_size``: our reader's);
* at most 2048 calls in flight (``maximum_concurrent_rpcs``: our unauthenticated budget; more are
  refused RESOURCE_EXHAUSTED by grpc's Python layer).

What grpcio's Python API does not offer: a resource quota (``grpc.resource_quota``, the core's
memory and thread cap, is a pointer argument to an object only the C API makes:
``grpc_resource_quota_create`` is not exported by ``cygrpc``, whose only symbol is
``PyInit_cygrpc``, and ``grpc`` has no Python wrapper); any limit per source address (connections,
connection rate, a fair share of a budget), a rate of TLS handshakes, a deadline by which a
connection must have made an authenticated call, a limit of connections per identity: a handler
sees a call, not its connection (no way to bind a connection to its token, or to close one), and
the connection limit is for every source together.

**The gRPC agent** (:func:`grpc_agent`) reports as ours does (member 0's token and report, on a
new TLS connection each time from the agent's address, every 0.1 s), speaking raw HTTP/2 with
``h2`` (grpcio's client cannot choose its source address; :class:`H2`): the connection preface
and settings, the call's HEADERS (HPACK literals, no Huffman coding: hpack's is Python) and its
length-prefixed message, read until ``grpc-status``. Its latency is h2's in Python against
grpc's C core, the HTTP/1.1 agent's against llhttp: the two transports' quiet latencies are not
comparable, each one's ratio to its own quiet is. The attacks (:class:`GrpcAttack`) are ours
with HTTP/2 calls where ours send HTTP/1.1 requests (plain-tcp and handshakes, offering ALPN
``h2``, are the same). One differs by force: stolen-pipelined's connections write the calls
that the connection's flow-control window takes (334 of the 400, 0.32 MiB where HTTP/1.1's 400
are 0.41 MiB), never reading; past the window grpc closes the connection at once (a protocol
error, no back-pressure left to measure).

The gRPC server's state (:func:`_serve_grpc`) is ours' protocol: its RSS, peak, CPU (every thread
of the process: the C core's with the loop's, all on the server's CPU), the asyncio loop's lag
(the handler's side: the C core's work is on threads of its own), the calls accepted and refused
by code, and its connections: its open files less those open when it began to listen, an
approximation (sampled every 100 ms for the peaks, not 10 ms as ours: listing 3 000 of them
takes ~2 ms of the server's CPU). It has no notion of an unauthenticated connection (null)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import ssl
import sys
import time
from typing import Any

import grpc  # type: ignore[import-untyped]
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
import uvloop

from bench import provenance
from bench.channel_attack import AGENT, Server, _tls, member_pod, report_body, server_state
from bench.channel_attack import NAMESPACE as NS
from bench.channel_attacks import (
    AGENT_ENV,
    KEY_ENV,
    Attack,
    BenchCluster,
    BenchKeysVerifier,
    Sample,
    Transport,
    arguments,
    attack_main,
    attacks_named,
    pin,
    run,
    sample,
)
from bench.channel_grpc import METHOD, SERVER_OPTIONS, _material
from jobset_inplace import names
from jobset_inplace.controller.report_server import MAX_BODY
from jobset_inplace.runtime.report_http import IDLE_S, MAX_HEAD, PREAUTH_S, REQUEST_S
from jobset_inplace.runtime.report_limits import Limits
from jobset_inplace.runtime.report_tokens import Rejected

MAX_RPCS = Limits().max_unauthenticated  # grpc.aio's maximum_concurrent_rpcs
CALL_TIMEOUT_S = 10.0  # connecting, then the call's answer (as bench.channel_attack's agent)
CODES: dict[int, str] = {c.value[0]: c.name for c in grpc.StatusCode}  # grpc-status: name
OK = "OK"


def hardened_options(open_files: int) -> list[tuple[str, int]]:
    """The gRPC server's core arguments (the module's docstring says why each), with
    ``open_files`` its open-files limit."""
    options = dict(SERVER_OPTIONS) | {
        "grpc.max_receive_message_length": MAX_BODY,
        "grpc.max_send_message_length": MAX_BODY,
        "grpc.max_metadata_size": MAX_HEAD,
        "grpc.absolute_max_metadata_size": MAX_HEAD,
        "grpc.server_handshake_timeout_ms": int(PREAUTH_S * 1000),
        "grpc.http2.min_ping_interval_without_data_ms": 300_000,
        "grpc.http2.max_ping_strikes": 2,
        "grpc.max_connection_idle_ms": int(IDLE_S * 1000),
        "grpc.max_connection_age_ms": int(IDLE_S * 1000),
        "grpc.max_connection_age_grace_ms": int(REQUEST_S * 1000),
        "grpc.max_allowed_incoming_connections": Limits.for_open_files(open_files).max_connections,
        "grpc.http2.bdp_probe": 0,
        "grpc.http2.lookahead_bytes": 2 * MAX_BODY,
        "grpc.experimental.tcp_max_read_chunk_size": 16 * 1024,
    }
    return list(options.items())


def _h2_tls() -> ssl.SSLContext:
    """bench.channel_attack's client context (TLS 1.3, no verification), offering h2."""
    ctx = _tls()
    ctx.set_alpn_protocols(["h2"])
    return ctx


# --- HTTP/2 calls (the agent's and the attacker's) ----------------------------------------


class _Literal(hpack.Encoder):
    """HPACK without Huffman coding: hpack's coder is Python, ~23 ms for a garbage token (15
    KiB) where the HTTP/1.1 attacker sends its bytes as they are: the attacker would be the
    bottleneck (and the agent's reports ~1 ms slower)."""

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        return super().encode(headers, huffman=False)


class H2:
    """A gRPC client's side of one HTTP/2 connection, on an open TLS stream (h2)."""

    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w = r, w
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        self.conn.encoder = _Literal()
        self.conn.initiate_connection()  # the preface and settings, sent with the first call

    def send(self, token: str, body: bytes, calls: int = 1) -> int:
        """Write ``calls`` unary calls at once, one stream each: HEADERS (the token in
        ``authorization``, never indexed by HPACK: sent whole every time), then DATA (the
        length-prefixed message) ending the stream. Those the connection's flow-control window
        has room for: how many."""
        message = b"\0" + len(body).to_bytes(4, "big") + body
        headers = [
            (":method", "POST"),
            (":scheme", "https"),
            (":path", METHOD),
            (":authority", "leader"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("authorization", f"Bearer {token}"),
        ]
        sent = 0
        while sent < calls and self.conn.outbound_flow_control_window >= len(message):
            stream = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream, headers)
            self.conn.send_data(stream, message, end_stream=True)
            sent += 1
        self.w.write(self.conn.data_to_send())
        return sent

    async def status(self) -> str:
        """The first answer's status: its ``grpc-status`` by name ("OK"), else how the stream
        or connection ended. Raises TimeoutError after CALL_TIMEOUT_S, OSError, ssl.SSLError."""

        async def read() -> str:
            while data := await self.r.read(65536):
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                        fields = {bytes(k): bytes(v) for k, v in event.headers}
                        if b"grpc-status" in fields:
                            code = int(fields[b"grpc-status"])
                            return CODES.get(code, str(code))
                    elif isinstance(event, h2.events.StreamEnded):
                        return "no grpc-status"
                    elif isinstance(event, h2.events.StreamReset):
                        return f"reset {getattr(event.error_code, 'name', event.error_code)}"
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return f"goaway {getattr(event.error_code, 'name', event.error_code)}"
                self.w.write(self.conn.data_to_send())  # settings' acknowledgements
            return "closed"

        return await asyncio.wait_for(read(), CALL_TIMEOUT_S)

    async def call(self, token: str, body: bytes) -> str:
        """One call's status (see :meth:`status`)."""
        self.send(token, body)
        return await self.status()


async def grpc_report(port: int, ctx: ssl.SSLContext, token: str, body: bytes) -> tuple[float, str]:
    """One report on a new TLS connection from the agent's address: (seconds, its status, or
    "failed: <exception>")."""
    started = time.monotonic()
    try:
        r, w = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, local_addr=(AGENT, 0)),
            CALL_TIMEOUT_S,
        )
        status = await H2(r, w).call(token, body)
        w.close()
    except (OSError, TimeoutError, ssl.SSLError, h2.exceptions.ProtocolError) as e:
        status = f"failed: {type(e).__name__}"
    return time.monotonic() - started, status


async def grpc_agent(port: int, token: str, body: bytes, seconds: float) -> Sample:
    """As ``bench.channel_attacks.agent_for``, over gRPC."""
    ctx = _h2_tls()
    return await sample(lambda: grpc_report(port, ctx, token, body), seconds)


# --- the gRPC server (a process of its own) --------------------------------------------------


class _Refusal(Exception):
    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code


def _bearer(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value.removeprefix("Bearer ")
    raise _Refusal(grpc.StatusCode.UNAUTHENTICATED, "no bearer token")


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _serve_grpc() -> None:
    """The server process: answers each line on stdin with its state (as
    ``bench.channel_attack._serve``)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as ReportServer raises its own
    verifier = BenchKeysVerifier(os.environ[KEY_ENV])
    members = {member_pod(0), member_pod(1)}
    accepted, refused = 0, {}  # type: ignore[var-annotated]

    async def check(body: bytes, context: Any) -> None:
        try:
            identity = await verifier.identify(_bearer(context.invocation_metadata()))
        except Rejected as e:
            code = (
                grpc.StatusCode.UNAUTHENTICATED if e.status == 401 else grpc.StatusCode.UNAVAILABLE
            )
            raise _Refusal(code, str(e)) from None
        if identity.namespace != NS or (identity.pod, identity.uid) not in members:
            raise _Refusal(grpc.StatusCode.PERMISSION_DENIED, "not a member pod of the gang")
        try:
            doc = json.loads(body)
        except ValueError:
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, "not JSON") from None
        if not isinstance(doc, dict) or (doc.get("pod"), doc.get("uid")) != (
            identity.pod,
            identity.uid,
        ):
            raise _Refusal(grpc.StatusCode.PERMISSION_DENIED, "a report for another pod")

    async def report(body: bytes, context: Any) -> bytes:
        nonlocal accepted
        try:
            await check(body, context)
        except _Refusal as e:
            refused[e.code.name] = refused.get(e.code.name, 0) + 1
            await context.abort(e.code, str(e))
        accepted += 1
        return b'{"accepted":true}'

    handler = grpc.method_handlers_generic_handler(
        METHOD.split("/")[1],
        {METHOD.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(report)},
    )
    options = hardened_options(hard)
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=MAX_RPCS)
    server.add_generic_rpc_handlers((handler,))
    crt, key = _material()
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, crt)]))
    await server.start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    baseline = _open_files()  # the listener, the pipes, grpc's own: not connections

    def connections() -> int:
        return max(0, _open_files() - baseline)

    pid = os.getpid()
    lags: list[float] = []  # how late a 10 ms timer fired (as _serve measures it)
    peaks = {"connections": 0}

    async def lag() -> None:
        ticks = 0
        while True:
            began = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - began - 0.01)
            ticks += 1
            if ticks % 10 == 0:  # every 100 ms: listing the open files costs ~1 us each
                peaks["connections"] = max(peaks["connections"], connections())

    lagging = asyncio.create_task(lag())
    limits = ", ".join(f"{k.removeprefix('grpc.')}={v}" for k, v in options)
    limits += f", maximum_concurrent_rpcs={MAX_RPCS}"
    print(json.dumps({"url": f"https://127.0.0.1:{port}{METHOD}", "limits": limits}), flush=True)
    while await reader.readline():  # one line per question: the state now
        now = connections()
        peaks["connections"] = max(peaks["connections"], now)
        state = server_state(pid, lags, peaks) | {
            "connections": now,
            "unauthenticated": None,  # (no such notion)
            "accepted": accepted,
            "refused": dict(refused),
        }
        print(json.dumps(state), flush=True)
    lagging.cancel()
    await server.stop(0)


# --- the attacker (a process of its own) ---------------------------------------------------


class GrpcAttack(Attack):
    """``bench.channel_attacks.Attack`` over gRPC calls: TLS connections offer h2; plain-tcp
    and handshakes are Attack's own."""

    def __init__(self, port: int, addresses: list[str], cluster: BenchCluster) -> None:
        super().__init__(port, addresses, cluster)
        self.ctx = _h2_tls()

    async def exchange(self, conn: Attack.Conn, token: str) -> str:
        """Member 1's report with ``token`` as a call: its status, or "no answer"."""
        try:
            return await H2(*conn).call(token, report_body(1))
        except (OSError, TimeoutError, ssl.SSLError, h2.exceptions.ProtocolError):
            return "no answer"

    def pipeline(self, conn: Attack.Conn) -> None:
        """400 calls in one write, as many as the connection's flow-control window takes (it
        never reads the server's WINDOW_UPDATEs): 334, 0.32 MiB (HTTP/1.1's 400: 0.41 MiB);
        the answers never read. (Past the window, grpc closes the connection at once.)"""
        self.count("opened")
        try:
            calls = H2(*conn).send(self.stolen_token, report_body(1), 400)
            self.seen["calls"] = self.seen.get("calls", 0) + calls
        except (OSError, RuntimeError):  # (uvloop: a transport the server closed already)
            self.count("not_sent")


# --- the run -----------------------------------------------------------------------------


def grpc_transport(cluster: BenchCluster) -> Transport:
    """The gRPC server's: member 0's agent (raw HTTP/2; no new pod's: gRPC has no address
    priority to measure it against)."""
    token, body = cluster.token(*member_pod(0)), report_body(0)

    def agents(port: int, seconds: float) -> tuple[Sample, Sample | None]:
        return uvloop.run(grpc_agent(port, token, body, seconds)), None

    return Transport(agents, module="bench.channel_attacks_grpc", ok=OK, label=" (gRPC)")


def comparison(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Per attack, per transport: the figures the goals are about."""
    out: dict[str, Any] = {}
    for name in ours["attacks"]:
        out[name] = {}
        for transport, result in (("ours", ours), ("grpc", theirs)):
            r = result["attacks"][name]
            out[name][transport] = {
                "every_report_answered": r["goals"]["every_report_answered"],
                "answers": r["answers"],
                "quiet_median_ms": round(r["quiet_median_s"] * 1000, 2),
                "latency": r["latency"],
                "rss_growth_mib": r["server"]["rss_growth_mib"],
                "peak_growth_mib": r["server"]["peak_growth_mib"],
                "cpu_share": r["server"]["cpu_share"],
                "goals": r["goals"],
            }
    return out


def _compare_line(transport: str, c: dict[str, Any]) -> str:
    lat, missed = c["latency"], [k for k, ok in c["goals"].items() if not ok]
    return (
        f"{transport:>4}: answers {c['answers']}; latency {lat['ratio']:.2f}x its quiet "
        f"{c['quiet_median_ms']:.1f} ms ({lat['low']:.2f}-{lat['high']:.2f}); RSS "
        f"{c['rss_growth_mib']:+.1f} MiB (peak {c['peak_growth_mib']:+.1f}); CPU "
        f"{c['cpu_share']:.0%} of a core; goals "
        + ("met" if not missed else "NOT met: " + ", ".join(missed))
    )


def main() -> int:
    p = arguments(__doc__)
    args = p.parse_args()
    if args.serve:
        pin("server")
        uvloop.run(_serve_grpc())
        return 0
    if args.attack:
        return attack_main(args.attack, args.port, args.addresses, args.seconds, GrpcAttack)
    provenance.refuse_dirty(args.allow_dirty or not args.out)  # (no file: nothing recorded)
    origin = provenance.provenance("bench.channel_attacks_grpc", sys.argv[1:])
    attacks = attacks_named(p, args.only)
    cluster = BenchCluster()
    pin(
        "agent"
    )  # (its children are pinned within the CPUs it had before: bench.channel_attacks.pin)
    ours = Server(
        "bench.channel_attacks",
        {KEY_ENV: cluster.keys(), AGENT_ENV: AGENT, names.ENV_REPORT_LIMITS: ""},
    )
    try:
        result: dict[str, Any] = {"ours": run(ours, cluster, args.addresses, args.seconds, attacks)}
    finally:
        ours.stop()
    theirs = Server("bench.channel_attacks_grpc", {KEY_ENV: cluster.keys()})
    try:
        result["grpc"] = run(
            theirs,
            cluster,
            args.addresses,
            args.seconds,
            attacks,
            transport=grpc_transport(cluster),
        )
    finally:
        theirs.stop()
    result["grpc"]["client"] = "raw HTTP/2 (h2), not grpcio's: its quiet latency is not ours'"
    result["comparison"] = comparison(result["ours"], result["grpc"])
    result.update(origin)
    result["when"] = provenance.when()
    result["seconds"] = args.seconds
    result["addresses"] = args.addresses
    result["kubernetes"] = "none (loopback, no cluster)"
    provenance.write(result, args.out)
    print(
        f"\ncommit {origin['commit']}: the report channel against gRPC, {args.addresses} "
        f"attacker addresses, {args.seconds:g} s each"
    )
    met = {"ours": 0, "grpc": 0}
    for name, c in result["comparison"].items():
        print(f"  {name}")
        for transport in ("ours", "grpc"):
            print(f"    {_compare_line(transport, c[transport])}")
            met[transport] += all(c[transport]["goals"].values())
    print(f"  every goal met: ours in {met['ours']} of {len(attacks)}, gRPC in {met['grpc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
