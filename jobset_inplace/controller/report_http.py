"""HTTP/1.1 for the report channel (:mod:`.report_server`): one route, small bodies, connections
kept alive between recoveries.

Every agent keeps its connection open, so the leader holds one per member: at 5000 members a
general-purpose server's per-connection objects and per-request work were a large share of
the leader's memory and CPU (docs/benchmarks.md). This serves the one request agents make,
strictly: ``POST <path>`` with a ``Content-Length`` body of at most ``max_body`` bytes; any
other request is answered with its status (404, 405, 411, 413, 431, 501 or 400, the reason
named) and the connection closed. Requests on a connection are answered in order (pipelining
allowed); a connection is closed when it stays idle for IDLE_S, or when its TLS handshake or
a request begun is not complete within REQUEST_S (a request is answered 408).

:func:`next_request` (bytes in, a request or a refusal out, no I/O) carries the parsing;
:class:`Connection` only decrypts, buffers, hands requests to the handler and writes answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

log = logging.getLogger("jobset_inplace.reports")

MAX_HEAD = 16 * 1024  # request line and headers; a projected token is ~1-2 KiB
IDLE_S = 3600.0  # an idle connection is kept this long: an agent's next report needs no handshake
REQUEST_S = 30.0  # a request begun must be complete within this
SWEEP_S = 30.0  # how often idle and stalled connections are looked for
TLS_READ = 64 * 1024  # plaintext taken from OpenSSL per read

_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (\S{1,2048}) HTTP/1\.([01])")
_HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True, slots=True)
class Request:
    authorization: str  # the Authorization header's value, "" when absent
    body: bytes
    keep_alive: bool  # False: answer, then close


class Refused(Exception):
    """A request that is not served: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


Handler = Callable[[Request], Coroutine[Any, Any, tuple[int, dict[str, Any]]]]


def next_request(
    buffer: bytes | bytearray, path: bytes, max_body: int
) -> tuple[Request, int] | None:
    """The first request in ``buffer`` and how many bytes it took; None while incomplete.
    Raises :class:`Refused` for a request that is not served."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        if len(buffer) > MAX_HEAD:
            raise Refused(431, f"the request line and headers exceed {MAX_HEAD} bytes")
        return None
    minor, headers = _head(bytes(buffer[:end]), path)
    size = _body_size(headers, max_body)
    start = end + 4
    if len(buffer) < start + size:
        return None
    connection = headers.get(b"connection", b"").lower()
    keep_alive = connection != b"close" and (minor == b"1" or connection == b"keep-alive")
    auth = headers.get(b"authorization", b"").decode("latin-1")
    return Request(auth, bytes(buffer[start : start + size]), keep_alive), start + size


def _head(head: bytes, path: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """The HTTP minor version and the headers (lower-case names) of a POST to ``path``."""
    line, *fields = head.split(b"\r\n")
    m = _REQUEST_LINE.fullmatch(line)
    if m is None:
        raise Refused(400, "the request line must be: METHOD PATH HTTP/1.1")
    method, target, minor = m.groups()
    headers: dict[bytes, bytes] = {}
    for field in fields:
        name, sep, value = field.partition(b":")
        if not sep or _HEADER_NAME.fullmatch(name) is None:
            raise Refused(400, f"malformed header line {field[:60]!r}")
        name = name.lower()
        if name in headers and name in (b"content-length", b"authorization"):
            raise Refused(400, f"header {name.decode()} given twice")
        headers[name] = value.strip(b" \t")
    if target != path:
        raise Refused(404, f"no such path; reports go to POST {path.decode()}")
    if method != b"POST":
        raise Refused(405, f"method {method.decode()}: reports are sent with POST")
    return minor, headers


def _body_size(headers: dict[bytes, bytes], max_body: int) -> int:
    if b"transfer-encoding" in headers:
        raise Refused(501, "Transfer-Encoding is not accepted; send Content-Length")
    length = headers.get(b"content-length")
    if length is None:
        raise Refused(411, "Content-Length is required")
    if not length.isdigit() or len(length) > 9:
        raise Refused(400, f"Content-Length must be a byte count, got {length[:20]!r}")
    if int(length) > max_body:
        raise Refused(413, f"the body exceeds {max_body} bytes")
    return int(length)


def response(status: int, payload: dict[str, Any], *, close: bool) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    closing = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{closing}\r\n"
    )
    return head.encode() + body


class Connection(asyncio.Protocol):
    """One agent's connection: TLS when the server has a context, then requests in order, one
    at a time.

    TLS runs here, on a plain transport: OpenSSL through two memory BIOs (:class:`ssl.SSLObject`),
    as asyncio's and uvloop's TLS transports do, without the read buffer they keep per
    connection (uvloop's is 256 KiB, and where it lands on reused heap all of it is resident)."""

    __slots__ = (
        "_blocked",
        "_buffer",
        "_busy",
        "_closed",
        "_server",
        "_tls",
        "_tls_in",
        "_tls_out",
        "_transport",
        "begun",
        "last_active",
        "secure",
    )

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None  # bytes from the peer, to OpenSSL
        self._tls_out: ssl.MemoryBIO | None = None  # bytes from OpenSSL, to the peer
        self.secure = False  # the TLS handshake is done (or there is no TLS)
        self._buffer = bytearray()
        self._busy = False  # a request is being handled
        self._blocked = False  # the peer does not read its answers: take no more requests
        self._closed = False
        self.last_active = server.now()
        self.begun: float | None = None  # when the incomplete request (or handshake) began

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        if self._server.tls is None:
            self.secure = True
            return
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = self._server.tls.wrap_bio(self._tls_in, self._tls_out, server_side=True)
        self.begun = self.last_active  # the handshake must end within REQUEST_S too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        self._buffer = bytearray()
        self._tls = self._tls_in = self._tls_out = None

    def data_received(self, data: bytes) -> None:
        self.last_active = self._server.now()
        if self._tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        self._buffer += data
        if self.begun is None:
            self.begun = self.last_active
        if not self._busy:
            self._next()
        if len(self._buffer) > 2 * (MAX_HEAD + self._server.max_body):
            assert self._transport is not None
            self._transport.pause_reading()  # pipelined well past one request: wait

    def _decrypt(self, data: bytes) -> bytes:
        """The plaintext in ``data`` (b"" while the handshake is on). A TLS error or the peer's
        close ends the connection."""
        tls, incoming = self._tls, self._tls_in
        assert tls is not None
        assert incoming is not None
        incoming.write(data)
        plain = b""
        try:
            if not self.secure:
                tls.do_handshake()
                self.secure = True
                self.begun = None
            while chunk := tls.read(TLS_READ):
                plain += chunk
            self._flush()
            self.close()  # b"": the peer closed
            return b""
        except ssl.SSLWantReadError:
            self._flush()  # handshake messages, session tickets
            return plain
        except ssl.SSLError as e:  # SSLZeroReturnError: the peer's close_notify
            if not isinstance(e, ssl.SSLZeroReturnError):
                log.debug("report channel: TLS: %s", e)
            self._flush()
            self.close()
            return b""

    def _flush(self) -> None:
        out = self._tls_out.read() if self._tls_out is not None else b""
        if out and self._transport is not None:
            self._transport.write(out)

    def _send(self, data: bytes) -> None:
        assert self._transport is not None
        if self._tls is None:
            self._transport.write(data)
            return
        try:
            self._tls.write(data)
        except ssl.SSLError as e:  # the peer closed its side of TLS meanwhile
            log.debug("report channel: TLS: %s", e)
            self.close()
            return
        self._flush()

    def pause_writing(self) -> None:
        self._blocked = True

    def resume_writing(self) -> None:
        self._blocked = False
        if not self._busy:
            self._next()

    def _next(self) -> None:
        if self._blocked or self._closed:
            return
        try:
            parsed = next_request(self._buffer, self._server.path, self._server.max_body)
        except Refused as e:
            self.refuse(e)
            return
        if parsed is None:
            if not self._buffer:
                self.begun = None
            return
        request, used = parsed
        del self._buffer[:used]
        self.begun = self.last_active if self._buffer else None
        self._busy = True
        task = asyncio.get_running_loop().create_task(self._server.handler(request))
        task.add_done_callback(lambda t: self._answered(t, request.keep_alive))

    def _answered(self, task: asyncio.Task[tuple[int, dict[str, Any]]], keep_alive: bool) -> None:
        self._busy = False
        if self._closed:
            return
        try:
            status, payload = task.result()
        except Exception:
            log.exception("report channel: a request failed")
            self.close_with(500, {"error": "internal error; report on the pod"})
            return
        if not keep_alive:
            self.close_with(status, payload)
            return
        self._send(response(status, payload, close=False))
        self.last_active = self._server.now()
        assert self._transport is not None
        self._transport.resume_reading()
        self._next()

    def refuse(self, e: Refused) -> None:
        """Tell the server (``on_refused``), answer ``e`` and close."""
        if self._server.on_refused is not None:
            self._server.on_refused(e)
        self.close_with(e.status, {"error": str(e)})

    def close_with(self, status: int, payload: dict[str, Any]) -> None:
        """Answer, then close (a refused or stalled request; before the TLS handshake ends
        there is no one to answer)."""
        if self.secure and not self._closed:
            self._send(response(status, payload, close=True))
        self.close()

    def close(self) -> None:
        if self._transport is None or self._closed:
            self._closed = True
            return
        self._closed = True
        if self._tls is not None and self.secure:
            with contextlib.suppress(ssl.SSLError):  # it would wait for the peer's: not needed
                self._tls.unwrap()  # our close_notify
            self._flush()
        self._transport.close()


@dataclass
class HttpServer:
    """Serves ``handler`` at ``path``; :meth:`sweep` closes idle and stalled connections."""

    handler: Handler
    path: bytes
    max_body: int
    now: Callable[[], float]
    tls: ssl.SSLContext | None = None  # None: plain HTTP
    on_refused: Callable[[Refused], None] | None = None  # a request that was not a report

    def __post_init__(self) -> None:
        self.connections: set[Connection] = set()

    def connection(self) -> Connection:
        return Connection(self)

    def sweep(self) -> int:
        """Close connections idle for IDLE_S or with a request begun REQUEST_S ago; how many."""
        now, closed = self.now(), 0
        for c in list(self.connections):
            if c.begun is not None and now - c.begun > REQUEST_S:
                c.refuse(Refused(408, f"the request was not complete within {REQUEST_S:.0f} s"))
                closed += 1
            elif c.begun is None and now - c.last_active > IDLE_S:
                c.close()  # silently: the agent's next report reconnects
                closed += 1
        return closed
