"""HTTP/1.1 for the report channel (:mod:`.report_server`): one route, small bodies, connections
kept alive between recoveries, and a port every pod of the cluster can reach.

Framing is llhttp's (:class:`RequestReader`: strict about what it accepts, CR, LF or NUL in a
header value, conflicting lengths; a head over MAX_HEAD however it arrives). On top of it, this
serves the one request agents make: ``POST <path>`` with a ``Content-Length`` body of at most
``max_body`` bytes. Any other request, and any answer but 200, is answered with its status
(the reason named) and the connection closed.

Against a hostile client (docs/guarantees.md, fault model, "a hostile pod at the report
channel's port"):

* a new connection is taken only within :class:`.report_limits.Admission`'s limits (total, per
  source, unauthenticated, a rate per source); refused ones are closed before any TLS; TLS
  handshakes of every source that is no member pod's address are spaced by
  :class:`.report_limits.HandshakeGate` (a connection waits its turn unread, sources served in
  turn);
* a connection must finish its TLS handshake and have a report accepted within PREAUTH_S of
  connecting, whatever it sent meanwhile (a TLS record held short of its last byte included);
* only a connection that has had a report accepted is kept while idle (IDLE_S), and a request
  begun on it must be complete within REQUEST_S; requests pipelined behind it must be too
  (an answer does not restart the clock while more is waiting);
* back-pressure: a connection reads only while no request of it is being handled, its peer
  reads its answers, and it holds less than one request's worth of bytes not yet taken
  (MAX_HEAD + the body limit), READ_SIZE at a time: a peer that pipelines without reading its
  answers costs one request and one read (16 KiB), not a read per answer;
* llhttp parses each byte once, so a peer trickling bytes costs the loop little per read.
* a refused request's answer is followed by our close, and the connection is then read (and
  what comes dropped, not decrypted) until the peer closes, for at most LINGER_S and
  LINGER_BYTES: a client still sending an oversized body reads the 413 instead of a reset;

TLS runs in the connection, on a plain transport: OpenSSL through two memory BIOs
(:class:`ssl.SSLObject`), as asyncio's and uvloop's TLS transports do, without the read buffer
they keep per connection (uvloop's is 256 KiB, and where it lands on reused heap all of it is
resident). The parser exists only while a request is in flight: an idle connection holds its
TLS state and nothing else (the server keeps up to READERS_KEPT idle parsers for reuse).
Where the handler can answer at once (a report whose token is remembered), the request is
answered in the read's own callback; else its task runs while the connection reads nothing."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import socket
import ssl
import sys
import termios
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any, NoReturn, cast

import httptools

from .report_limits import (
    EARLY_DATA,
    FAIR_SHARE,
    OVER_IDENTITY,
    PREAUTH_TIMEOUT,
    Admission,
    HandshakeGate,
    Limits,
)

log = logging.getLogger("jobset_inplace.reports")

MAX_HEAD = 16 * 1024  # request line and headers; a projected token is ~1-2 KiB
IDLE_S = 3600.0  # an authenticated idle connection is kept this long: no handshake next time
REQUEST_S = 30.0  # a request begun on an authenticated connection must be complete within this
PREAUTH_S = 10.0  # a new connection: TLS handshake and a report accepted within this
SWEEP_S = 30.0  # how often idle and stalled authenticated connections are looked for
PREAUTH_SWEEP_S = 1.0  # how often connections past PREAUTH_S are looked for
TLS_READ = 64 * 1024  # plaintext taken from OpenSSL per read
MAX_EARLY = 16 * 1024 + 5  # bytes kept of a connection whose handshake waits: one TLS record
READ_SIZE = 16 * 1024 + 5  # bytes taken from a socket per read: one TLS record
# After an answer that ends the connection (a refusal), what the peer still sends is read and
# dropped, unparsed and undecrypted, for at most this long and this many bytes, before the
# socket closes: closed with its body still arriving, the kernel would reset the connection
# and the peer (still sending) would never read why (as nginx's lingering close).
LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024
READERS_KEPT = 64  # idle request readers kept for reuse (HttpServer.reader)


@dataclass(frozen=True, slots=True)
class Request:
    authorization: str  # the Authorization header's value, "" when absent
    body: bytes
    keep_alive: bool  # False: answer, then close


@dataclass(frozen=True, slots=True)
class Answer:
    """A handler's answer: its status and JSON body, and (a report accepted) who the request
    was authenticated as: the connection is bound to that identity (report_limits.py,
    ``max_per_identity``)."""

    status: int
    payload: dict[str, Any]
    identity: str | None = None


class Refused(Exception):
    """A request that is not served: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


# A handler answers at once (an Answer) or later (an awaitable of one, run as a task while
# the connection reads nothing more).
Handler = Callable[[Request], Answer | Awaitable[Answer]]


class RequestReader:
    """Requests out of one connection's bytes (no I/O): :meth:`feed` bytes, take requests with
    :meth:`next`. Raises :class:`Refused` for a request that is not served (and again on every
    later call: the connection is done).

    Framing is llhttp's (Node.js's HTTP parser, through ``httptools``, uvloop's sibling): strict
    by default (CR, LF or NUL in a header value, obs-fold, conflicting or malformed lengths,
    bare LF line ends are errors), incremental (bytes are parsed once, however they are
    split), one parser across the requests that come while the reader is kept. Measured on 2
    cores with a real agent's request (a ~1.1 KiB token): 14 us per request with this reader's
    checks quiet, 23 us busy (llhttp itself 4-6 us), against ~150 us busy for h11's reader,
    which this replaced (at 5000 reports per recovery, 0.4-0.75 CPU-s of the loop that plans).

    What llhttp does not bound, this does: the head (request line and headers) is at most
    MAX_HEAD bytes from the request's first byte to the end of its empty line, counted exactly
    whatever the split (this finds that line itself: llhttp would hold a head of any size), and
    the parser is given one request at a time (a pipelined one waits until the one before it
    is taken)."""

    __slots__ = (
        "_body",
        "_buf",
        "_complete",
        "_head_len",
        "_headers",
        "_keep_alive",
        "_max_body",
        "_need",
        "_parser",
        "_path",
        "_refused",
        "_tail",
        "_url",
    )

    def __init__(self, path: bytes, max_body: int, data: bytes = b"") -> None:
        self._path, self._max_body = path, max_body
        self._parser = httptools.HttpRequestParser(self)
        self._buf = bytearray()  # received, not given to the parser yet
        self._refused: Refused | None = None
        self._begin()
        self.feed(data)

    def _begin(self) -> None:
        """State of the next request."""
        self._head_len = 0  # bytes of its head given to the parser
        self._tail = b""  # the last (up to 3) of them: the empty line may straddle reads
        self._url = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._need: int | None = None  # body bytes still to come, once the head is read
        self._body = bytearray()
        self._complete = False
        self._keep_alive = False

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def idle(self) -> bool:
        """No byte of a request received and not taken."""
        return not self._buf and self._head_len == 0 and self._need is None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet given to the parser."""
        return len(self._buf)

    def next(self) -> Request | None:
        """The next complete request; None while it is incomplete."""
        if self._refused is not None:
            raise self._refused
        try:
            return self._next()
        except Refused as e:
            self._refused = e
            self._buf.clear()
            raise

    def _next(self) -> Request | None:
        if self._need is None and not self._read_head():
            return None
        assert self._need is not None
        take = min(self._need, len(self._buf))
        if take:
            self._parse(self._buf[:take])
            del self._buf[:take]
            self._need -= take
        if self._need or not self._complete:
            return None
        auth = self._headers.get(b"authorization", b"").decode("latin-1")
        request = Request(auth, bytes(self._body), self._keep_alive)
        self._begin()
        return request

    def _read_head(self) -> bool:
        """Give the parser the head's bytes received so far; whether it is complete."""
        buf, tail = self._buf, self._tail
        window = tail + bytes(buf[: MAX_HEAD + 4])  # (more than that is refused either way)
        end = window.find(b"\r\n\r\n")
        taken = len(buf) if end < 0 else end + 4 - len(tail)
        if self._head_len + taken > MAX_HEAD:
            raise Refused(431, f"the request line and headers exceed {MAX_HEAD} bytes")
        if taken:
            self._parse(buf[:taken])
            del buf[:taken]
            self._head_len += taken
            self._tail = (tail + window[len(tail) : len(tail) + taken])[-3:]
        if end < 0:
            return False
        if self._need is None:  # the parser did not see the head end where it ends
            raise Refused(400, "malformed request: no request line before the empty line")
        return True

    def _parse(self, data: bytes | bytearray) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self._refused is not None:
                raise self._refused from None
            raise
        except httptools.HttpParserError as e:
            raise Refused(400, f"malformed request: {e!s:.200}") from None
        except httptools.HttpParserUpgrade:  # Upgrade or CONNECT: the parser stops there
            raise Refused(400, "a protocol upgrade is not accepted") from None

    # --- the parser's callbacks -----------------------------------------------------------
    def on_url(self, url: bytes) -> None:
        self._url += url  # (in pieces, as the bytes came)

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key in self._headers and key in (b"authorization", b"host"):
            self._refuse(400, f"header {key.decode()} given twice")
        self._headers[key] = value

    def on_headers_complete(self) -> None:
        parser, headers = self._parser, self._headers
        version = parser.get_http_version()
        if version not in ("1.0", "1.1"):
            self._refuse(400, f"HTTP/{version}: a request line ends with HTTP/1.1")
        if version == "1.1" and b"host" not in headers:
            self._refuse(400, "Host header is required")
        if self._url != self._path:
            self._refuse(404, f"no such path; reports go to POST {self._path.decode()}")
        method = parser.get_method()
        if method != b"POST":
            self._refuse(405, f"method {method.decode()}: reports are sent with POST")
        if b"transfer-encoding" in headers:
            self._refuse(501, "Transfer-Encoding is not accepted; send Content-Length")
        length = headers.get(b"content-length")
        if length is None:
            self._refuse(411, "Content-Length is required")
        need = int(length)  # llhttp accepts digits only, at most one Content-Length
        if need > self._max_body:
            self._refuse(413, f"the body exceeds {self._max_body} bytes")
        self._need = need
        # HTTP/1.0 connections are not kept: agents speak 1.1
        self._keep_alive = version == "1.1" and parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._body += body  # within Content-Length: the parser is given no more

    def on_message_complete(self) -> None:
        self._complete = True

    def _refuse(self, status: int, reason: str) -> NoReturn:
        self._refused = Refused(status, reason)
        raise self._refused


def response(status: int, payload: dict[str, Any], *, close: bool) -> bytes:
    """An answer's bytes: ``payload`` as JSON. The answers a recovery sends to nearly every
    member (200, the same few fields: ``{"accepted": true, "holds": null}``) are made once and
    kept, at most ANSWERS_KEPT of them (a refusal's payload, which may quote a client, never)."""
    key = None
    if status == 200 and not close:
        try:  # (with each value's type: 1 and True are equal keys, not equal JSON)
            key = tuple((k, type(v), v) for k, v in payload.items())
            kept = _ANSWERS.get(key)
        except TypeError:  # a value that is no key (a list, a dict): made each time
            key = kept = None
        if kept is not None:
            return kept
    body = json.dumps(payload, separators=(",", ":")).encode()
    closing = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{closing}\r\n"
    )
    out = head.encode() + body
    if key is not None and len(_ANSWERS) < ANSWERS_KEPT:
        _ANSWERS[key] = out
    return out


# 200 answers kept by their payload (response): with hot spares each member's names its slot.
ANSWERS_KEPT = 20_000
_ANSWERS: dict[tuple[tuple[str, type, Any], ...], bytes] = {}


class Connection(asyncio.BufferedProtocol):
    """One agent's connection: TLS when the server has a context, then requests in order, one
    at a time. Reads land in the server's one read buffer (READ_SIZE: the loop reads one
    connection at a time) and are copied out at once: a read costs a connection at most that
    much, not the 256 KiB asyncio's and uvloop's own reads take."""

    __slots__ = (
        "_blocked",
        "_busy",
        "_closed",
        "_gated",
        "_linger_timer",
        "_lingering",
        "_paused",
        "_peer_done",
        "_reader",
        "_server",
        "_tls",
        "_tls_in",
        "_tls_out",
        "_transport",
        "authenticated",
        "begun",
        "identity",
        "last_active",
        "secure",
        "source",
    )

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None  # bytes from the peer, to OpenSSL
        self._tls_out: ssl.MemoryBIO | None = None  # bytes from OpenSSL, to the peer
        self._reader: RequestReader | None = None  # while a request is in flight
        self.secure = False  # the TLS handshake is done (or there is no TLS)
        self.authenticated = False  # a report was accepted on it
        self.identity: str | None = None  # whom (the first report accepted on it)
        self.source = ""  # the peer's address
        self._busy = False  # a request is being handled
        self._blocked = False  # the peer does not read its answers: take no more requests
        self._paused = False  # its reading was paused since it last settled (_settled)
        self._closed = False
        self._peer_done = False  # the peer sent its last byte (close_notify, or FIN)
        self._gated = False  # its TLS handshake waits its turn (report_limits.HandshakeGate)
        self._lingering: int | None = None  # answered and closing: bytes it may still send
        self._linger_timer: asyncio.TimerHandle | None = None
        self.last_active = server.now()
        self.begun: float | None = None  # when the incomplete request (or handshake) began

    @property
    def closing(self) -> bool:
        """Answered and closed on our side; the peer's side may still be lingering."""
        return self._closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        server = self._server
        member = server.member is not None and server.member(self.source)
        refused, victim = server.admission.admit(self.source, self.last_active, self, member=member)
        if refused is not None:
            self._closed = True
            server.dropped(refused)
            self._transport.abort()  # before any TLS: a refusal costs no handshake
            return
        if isinstance(victim, Connection):  # unauthenticated, of the heaviest source
            victim.drop(FAIR_SHARE)
        server.connections.add(self)
        server.unauthenticated[self] = self.last_active + PREAUTH_S
        if server.tls is None:
            self.secure = True
            return
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = server.tls.wrap_bio(self._tls_in, self._tls_out, server_side=True)
        now = server.now()
        suspect = server.admission.suspect(self.source, now)
        if not member and not server.gate.ask(self.source, self, now, suspect=suspect):
            self._gated = True  # nothing of it is read until its turn
            self._transport.pause_reading()
            # (uvloop starts reading after connection_made returns, whatever it was told)
            asyncio.get_running_loop().call_soon(self._read_on)
            server.handshakes_wait()

    def handshake_granted(self) -> None:
        """Its turn for the TLS handshake: its bytes are read from now on (and those read
        before it, handled now)."""
        self._gated = False
        incoming = self._tls_in
        if incoming is not None and incoming.pending and not self._closed:
            self.data_received(b"")
        self._read_on()

    def _early(self, data: bytes) -> None:
        """Bytes read while the handshake waits its turn: kept for it, up to one TLS
        record's worth (a ClientHello is ~0.5 KiB); a peer that sends more before any answer
        is no TLS client and is dropped."""
        incoming = self._tls_in
        assert incoming is not None
        if incoming.pending + len(data) > MAX_EARLY:
            self._server.admission.closed(
                self.source, self, authenticated=False, now=self._server.now()
            )
            self.drop(EARLY_DATA)
            return
        incoming.write(data)
        self._read_on()

    def drop(self, reason: str) -> None:
        """Close this unauthenticated connection now, without an answer, for ``reason``
        (the admission already counted it closed)."""
        server = self._server
        server.connections.discard(self)
        server.unauthenticated.pop(self, None)
        server.gate.cancel(self)
        self._closed = True
        server.dropped(reason)
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed and self not in self._server.connections:
            return  # refused at once, or dropped
        self._closed = True
        server = self._server
        server.connections.discard(self)
        server.unauthenticated.pop(self, None)
        server.gate.cancel(self)
        server.admission.closed(
            self.source, self, authenticated=self.authenticated, now=server.now()
        )
        if self.identity is not None:
            server.admission.unbind(self.identity, self)
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self._reader = None
        self._tls = self._tls_in = self._tls_out = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._lingering is not None:
            self._drop_lingering(nbytes)
            return
        self.data_received(bytes(self._server.read_buffer[:nbytes]))

    def _drop_lingering(self, nbytes: int) -> None:
        assert self._lingering is not None
        self._lingering -= nbytes
        if self._lingering < 0 and self._transport is not None:
            self._transport.abort()  # more than LINGER_BYTES after its answer

    def data_received(self, data: bytes) -> None:
        if self._closed or self._peer_done:
            return
        self.last_active = self._server.now()
        if self.begun is None:
            self.begun = self.last_active  # any byte starts the clock, even a partial record
        if self._gated:  # read before its turn (see connection_made): kept, not processed
            self._early(data)
            return
        if self._tls is not None:
            plain = self._decrypt(data)
            if plain is None:  # a TLS error: closed
                return
            data = plain
        self._take(data)

    def _take(self, data: bytes) -> None:
        """Plaintext received: requests out of it, in turn."""
        if data:
            if self._reader is None:
                self._reader = self._server.reader()
            self._reader.feed(data)
        if self._peer_done:
            self._peer_ended()
            return
        if not (self._busy or self._blocked):
            self._next()
        self._read_on()

    def eof_received(self) -> bool:
        """The peer's FIN (plain TCP): what it sent before is still served and answered (its
        half of the connection is closed, not necessarily ours), then the connection closes."""
        if self._lingering is not None:
            return False  # it has the answer and is done: the transport closes
        self._peer_ended()
        return True  # the transport stays open for the answers; close() ends it

    def _peer_ended(self) -> None:
        self._peer_done = True
        if self._closed:
            return
        if self._blocked:  # it sent its last request and does not read the answers
            self.close()
        elif not self._busy:
            self._next()  # closes once nothing complete is left

    def _decrypt(self, data: bytes) -> bytes | None:
        """The plaintext in ``data`` (b"" while the handshake is on). The peer's close_notify
        ends its side: the plaintext before it is still served (a report sent with the close
        is answered, then the connection closed). A TLS error closes the connection: None."""
        tls, incoming = self._tls, self._tls_in
        assert tls is not None
        assert incoming is not None
        incoming.write(data)
        plain = b""
        try:
            if not self.secure:
                tls.do_handshake()
                self.secure = True
            while chunk := tls.read(TLS_READ):
                plain += chunk
        except ssl.SSLWantReadError:
            self._flush()  # handshake messages
            return plain
        except ssl.SSLZeroReturnError:  # the peer's close_notify
            pass
        except ssl.SSLError as e:
            log.debug("report channel: TLS: %s", e)
            self._flush()
            self.close()
            return None
        self._flush()
        self._peer_done = True  # (read() gives b"" only once the peer has closed)
        return plain

    def _read_on(self) -> None:
        """Read only while no request is being handled, the peer reads its answers and less
        than one request's worth waits (a pipelining peer gets one read, not one per answer)."""
        if self._transport is None or self._closed:
            return
        reader = self._reader
        full = reader is not None and reader.buffered >= self._server.request_max
        if self._busy or self._blocked or full or self._gated:
            self._paused = True
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

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
        self._read_on()

    def _settled(self) -> bool:
        """Nothing of a request received and not answered, not even part of a TLS record, nor
        bytes the kernel holds unread (a pipelined backlog the peer sent while reading was
        paused: its deadline goes on). Unpaused, the loop reads what comes as it comes (what
        arrives after this is a new request, its clock started when read): the kernel is
        asked (an ioctl) only where reading was paused since the connection last settled."""
        reader, incoming = self._reader, self._tls_in
        settled = (
            (reader is None or reader.idle)
            and (incoming is None or not incoming.pending)
            and not (self._paused and self._unread_in_kernel())
        )
        if settled:
            self._paused = False
        return settled

    def _unread_in_kernel(self) -> bool:
        sock = self._transport.get_extra_info("socket") if self._transport is not None else None
        if sock is None:
            return False
        try:
            count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):  # closed meanwhile
            return False
        return int.from_bytes(count, sys.byteorder) > 0

    def _next(self) -> None:
        """Serve the requests received, in turn: each answered at once where the handler can,
        until one must wait for its task (or none is complete, or the peer stops reading)."""
        while not (self._blocked or self._closed):
            reader = self._reader
            try:
                request = reader.next() if reader is not None else None
            except Refused as e:
                self.refuse(e)
                return
            if request is None:
                if self._peer_done:  # nothing more will come: what is incomplete never will be
                    self.close()
                elif self._settled():
                    self.begun, self._reader = None, None
                    self._server.release_reader(reader)
                return
            try:
                answer = self._server.handler(request)
            except Exception:
                log.exception("report channel: a request failed")
                self.close_with(500, {"error": "internal error; report on the pod"})
                return
            if not isinstance(answer, Answer):
                self._busy = True
                task = asyncio.ensure_future(answer)
                task.add_done_callback(partial(self._answered, keep_alive=request.keep_alive))
                return
            if not self._answer(answer, request.keep_alive):
                return

    def _answered(self, task: asyncio.Future[Answer], *, keep_alive: bool) -> None:
        """A handler's task ended: its answer, then the requests that came meanwhile."""
        self._busy = False
        if self._closed:
            return
        try:
            answer = task.result()
        except Exception:
            log.exception("report channel: a request failed")
            self.close_with(500, {"error": "internal error; report on the pod"})
            return
        if self._answer(answer, keep_alive):
            self._next()  # a request waiting keeps the clock of the first one (``begun``)
            self._read_on()

    def _answer(self, answer: Answer, keep_alive: bool) -> bool:
        """Send ``answer``; whether the connection goes on (a refused request, or one that
        asked to close, ends it)."""
        status, payload = answer.status, answer.payload
        if status != 200 or not keep_alive:
            self.close_with(status, payload)  # a refused request costs its connection
            return False
        server = self._server
        if not self.authenticated:
            self.authenticated = True
            server.unauthenticated.pop(self, None)
            server.admission.authenticated(self.source, self)
        if answer.identity is not None and self.identity is None:
            self.identity = answer.identity
            oldest = server.admission.bind(answer.identity, self)
            if isinstance(oldest, Connection):  # the identity's oldest, over its limit
                server.dropped(OVER_IDENTITY)
                server.admission.mark_suspect(oldest.source, server.now())
                oldest.close()
        self._send(response(status, payload, close=False))
        self.last_active = server.now()
        return not self._closed

    def refuse(self, e: Refused) -> None:
        """Tell the server (``on_refused``), answer ``e`` and close."""
        if self._server.on_refused is not None:
            self._server.on_refused(e)
        self.close_with(e.status, {"error": str(e)})

    def close_with(self, status: int, payload: dict[str, Any]) -> None:
        """Answer, then close (a refused or stalled request; before the TLS handshake ends
        there is no one to answer): our side ends at once, the peer's after it has read the
        answer and closed, or LINGER_S / LINGER_BYTES later."""
        if not self.secure or self._closed:
            self.close()
            return
        self._send(response(status, payload, close=True))
        transport = self._transport
        if self._closed or transport is None or not transport.can_write_eof():
            self.close()
            return
        self._end_tls()
        self._closed = True
        self._server.unauthenticated.pop(self, None)  # no deadline but the linger's
        self._lingering = LINGER_BYTES
        transport.write_eof()  # after the answer
        transport.resume_reading()
        loop = asyncio.get_running_loop()
        self._linger_timer = loop.call_later(LINGER_S, transport.abort)

    def close(self) -> None:
        if self._transport is None or self._closed:
            self._closed = True
            return
        self._closed = True
        self._end_tls()
        self._transport.close()

    def _end_tls(self) -> None:
        if self._tls is not None and self.secure:
            with contextlib.suppress(ssl.SSLError):  # it would wait for the peer's: not needed
                self._tls.unwrap()  # our close_notify
            self._flush()


@dataclass
class HttpServer:
    """Serves ``handler`` at ``path``; :meth:`sweep` and :meth:`sweep_unauthenticated` close
    idle, stalled and unauthenticated connections past their time."""

    handler: Handler
    path: bytes
    max_body: int
    now: Callable[[], float]
    tls: ssl.SSLContext | None = None  # None: plain HTTP
    on_refused: Callable[[Refused], None] | None = None  # a request that was not a report
    limits: Limits | None = None  # None: the defaults
    on_dropped: Callable[[str], None] | None = None  # a connection refused or dropped: why
    # whether a source address is a member pod's (its handshakes are not held by the gate)
    member: Callable[[str], bool] | None = None

    def __post_init__(self) -> None:
        self.request_max = MAX_HEAD + self.max_body  # one request's worth of bytes
        self.read_buffer = memoryview(bytearray(READ_SIZE))  # every connection's reads
        self.connections: set[Connection] = set()
        # connection -> its PREAUTH_S deadline, in the order they came (= deadline order)
        self.unauthenticated: OrderedDict[Connection, float] = OrderedDict()
        limits = self.limits or Limits()
        self.admission = Admission(limits)
        self.gate = HandshakeGate(limits.handshake_rate, limits.handshake_burst)
        self._grant_timer: asyncio.TimerHandle | None = None
        self._readers: list[RequestReader] = []  # idle ones, for reuse (reader())

    def connection(self) -> Connection:
        return Connection(self)

    def reader(self) -> RequestReader:
        """A reader for a connection's next requests: one it left idle, or a new one."""
        if self._readers:
            return self._readers.pop()
        return RequestReader(self.path, self.max_body)

    def release_reader(self, reader: RequestReader | None) -> None:
        """Keep ``reader`` (idle: between two requests, none refused) for the next
        connection that receives a request, up to READERS_KEPT: making a reader (its llhttp
        parser) per request showed in the leader's profile; reusing one costs nothing."""
        if reader is not None and len(self._readers) < READERS_KEPT:
            self._readers.append(reader)

    def dropped(self, reason: str) -> None:
        if self.on_dropped is not None:
            self.on_dropped(reason)

    def handshakes_wait(self) -> None:
        """Handshakes wait for the gate: grant them as its budget refills."""
        if self._grant_timer is None and self.gate.waiting:
            loop = asyncio.get_running_loop()
            self._grant_timer = loop.call_later(self.gate.next_grant_s(), self.grant_handshakes)

    def grant_handshakes(self) -> int:
        """Start the handshakes whose turn it is; how many."""
        self._grant_timer = None
        granted = self.gate.grant(self.now())
        for c in granted:
            cast(Connection, c).handshake_granted()
        self.handshakes_wait()
        return len(granted)

    def sweep_unauthenticated(self) -> int:
        """Close connections that had no report accepted within PREAUTH_S; how many. Costs
        only the connections it closes (they are kept in deadline order)."""
        now, closed = self.now(), 0
        while self.unauthenticated:
            c = next(iter(self.unauthenticated))
            if self.unauthenticated[c] > now:
                break
            self.unauthenticated.popitem(last=False)
            self.dropped(PREAUTH_TIMEOUT)
            c.close_with(408, {"error": f"no report accepted within {PREAUTH_S:.0f} s"})
            closed += 1
        return closed

    def sweep(self) -> int:
        """Close authenticated connections idle for IDLE_S or with a request begun REQUEST_S
        ago; how many."""
        now, closed = self.now(), 0
        for c in list(self.connections):
            if not c.authenticated or c.closing:
                continue
            if c.begun is not None and now - c.begun > REQUEST_S:
                c.refuse(Refused(408, f"the request was not complete within {REQUEST_S:.0f} s"))
                closed += 1
            elif c.begun is None and now - c.last_active > IDLE_S:
                c.close()  # silently: the agent's next report reconnects
                closed += 1
        return closed

    async def serve(self, listen: tuple[str, int], backlog: int) -> Listening:
        """Listen at ``listen`` (port 0: any free one) and sweep on time."""
        sock = socket.create_server(listen, backlog=backlog)
        # plain TCP: the connection does its own TLS (Connection)
        server = await asyncio.get_running_loop().create_server(self.connection, sock=sock)
        sweeps = [
            asyncio.create_task(_every(SWEEP_S, self.sweep)),
            asyncio.create_task(_every(PREAUTH_SWEEP_S, self.sweep_unauthenticated)),
        ]
        return Listening(self, server, sock.getsockname()[1], sweeps)


@dataclass
class Listening:
    """A listening :class:`HttpServer` (:meth:`HttpServer.serve`)."""

    http: HttpServer
    server: asyncio.Server
    port: int  # the one bound
    sweeps: list[asyncio.Task[None]]

    async def close(self) -> None:
        """Stop listening and close every connection."""
        for task in self.sweeps:
            task.cancel()
        self.server.close()
        for c in list(self.http.connections):
            c.close()
        await self.server.wait_closed()


async def _every(seconds: float, sweep: Callable[[], int]) -> None:
    while True:
        await asyncio.sleep(seconds)
        sweep()
