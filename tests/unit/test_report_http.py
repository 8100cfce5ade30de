"""The report channel's HTTP/1.1 (runtime/report_http.py): the one request agents make is
parsed (pipelined, kept alive or not); anything else is refused with its status and the reason
named, then the connection closed; stalled and idle connections are closed by the sweep. The
connection tests serve over real loopback sockets (plain TCP: TLS is the transport's)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http.client
import itertools
import json
import socket
import ssl
import termios
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import pytest
import uvloop
from hypothesis import event, given, settings
from hypothesis import strategies as st

from jobset_inplace.runtime import report_http
from jobset_inplace.runtime.report_http import (
    MAX_HEAD,
    Answer,
    HttpServer,
    Refused,
    Request,
    RequestReader,
    response,
)
from jobset_inplace.runtime.report_limits import (
    EARLY_DATA,
    FAIR_SHARE,
    OVER_IDENTITY,
    OVER_UNAUTHENTICATED,
    PREAUTH_TIMEOUT,
    RATE_LIMITED,
    Limits,
)
from jobset_inplace.runtime.report_tls import serving_context

PATH = b"/v1/reports"
HOST = "Host: leader\r\n"


def post(body: bytes = b'{"a":1}', *, version: str = "1.1", extra: str = "") -> bytes:
    head = (
        f"POST /v1/reports HTTP/{version}\r\n{HOST}Authorization: Bearer tok\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def next_request(raw: bytes, max_body: int = 100) -> Request | None:
    return RequestReader(PATH, max_body, raw).next()


def test_a_report_request_is_parsed_with_its_token_and_body() -> None:
    assert next_request(post(b'{"epoch":"2"}')) == Request("Bearer tok", b'{"epoch":"2"}', True)


@pytest.mark.parametrize("cut", [10, len(post()) - 1])
def test_an_incomplete_request_waits_for_more(cut: int) -> None:
    assert next_request(post()[:cut]) is None


def test_a_request_trickled_a_byte_at_a_time_is_read_once() -> None:
    reader, raw = RequestReader(PATH, 100), post(b"12345")
    for i in range(len(raw) - 1):
        reader.feed(raw[i : i + 1])
        assert reader.next() is None
    reader.feed(raw[-1:])
    assert reader.next() == Request("Bearer tok", b"12345", True)


def test_pipelined_requests_are_taken_one_after_the_other() -> None:
    reader = RequestReader(PATH, 100, post(b"1") + post(b"22")[:30])
    assert reader.next() == Request("Bearer tok", b"1", True)
    assert reader.next() is None
    assert not reader.idle, "part of the next one is there"
    reader.feed(post(b"22")[30:])
    assert reader.next() == Request("Bearer tok", b"22", True)
    assert reader.idle


@pytest.mark.parametrize(
    ("version", "extra", "keep_alive"),
    [
        ("1.1", "", True),
        ("1.1", "Connection: close\r\n", False),
        ("1.0", "", False),
        # no HTTP/1.0 connection is kept alive; agents speak 1.1
        ("1.0", "Connection: keep-alive\r\n", False),
    ],
)
def test_the_connection_is_kept_as_http_says(version: str, extra: str, keep_alive: bool) -> None:
    parsed = next_request(post(version=version, extra=extra))
    assert parsed is not None
    assert parsed.keep_alive is keep_alive


R = "POST /v1/reports HTTP/1.1\r\n" + HOST


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        ("POST /v1/reports\r\n\r\n", 400, "HTTP/0.9: a request line ends with HTTP/1.1"),
        ("POST /v1/reports HTTP/1.1\nHost: x\n\n", 400, "Expected CRLF"),
        ("GET /v1/reports HTTP/1.1\r\n" + HOST + "\r\n", 405, "POST"),
        ("POST /other HTTP/1.1\r\n" + HOST + "Content-Length: 0\r\n\r\n", 404, "/v1/reports"),
        (R + "bad line\r\n\r\n", 400, "Invalid header token"),
        ("POST /v1/reports HTTP/1.1\r\n folded: x\r\n" + HOST + "\r\n", 400, "Unexpected space"),
        (R + "X: a\r\n b\r\nContent-Length: 0\r\n\r\n", 400, "Unexpected whitespace"),
        (R + "Transfer-Encoding: chunked\r\n\r\n", 501, "Content-Length"),
        (R + "\r\n", 411, "Content-Length is required"),
        (R + "Content-Length: -1\r\n\r\n", 400, "Content-Length"),
        (R + "Content-Length: 101\r\n\r\n", 413, "100 bytes"),
        (R + "Content-Length: 99999999999999999999\r\n\r\n", 400, "Content-Length overflow"),
        (R + "Transfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n1", 400, "Content-Length"),
        (R + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n1", 400, "Content-Length"),
        (R + "Authorization: a\r\nAuthorization: b\r\nContent-Length: 0\r\n\r\n", 400, "twice"),
        ("POST /v1/reports HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400, "Host"),
        # CR, LF or NUL inside a header value: framed differently by different parsers
        (R + "X: a\rb\r\nContent-Length: 0\r\n\r\n", 400, "Missing expected LF"),
        (R + "X: a\x00b\r\nContent-Length: 0\r\n\r\n", 400, "Invalid header value char"),
        (R + "Upgrade: h2c\r\nConnection: upgrade\r\nContent-Length: 0\r\n\r\n", 400, "upgrade"),
        ("CONNECT leader:443 HTTP/1.1\r\n" + HOST + "\r\n", 404, "/v1/reports"),
        ("\r\n\r\n", 400, "no request line"),
        (R + "X: " + "y" * MAX_HEAD, 431, f"{MAX_HEAD} bytes"),
    ],
)
def test_any_other_request_is_refused_with_its_status_and_reason(
    raw: str, status: int, says: str
) -> None:
    with pytest.raises(Refused, match=says) as e:
        next_request(raw.encode())
    assert e.value.status == status


@pytest.mark.parametrize("chunk", [1, 7, 4096, MAX_HEAD + 100])
def test_a_head_too_long_is_431_however_it_is_split(chunk: int) -> None:
    raw = (R + "X: " + "y" * MAX_HEAD + "\r\n\r\n").encode()
    reader = RequestReader(PATH, 100)

    def read() -> None:
        for i in range(0, len(raw), chunk):
            reader.feed(raw[i : i + chunk])
            reader.next()

    with pytest.raises(Refused) as e:
        read()
    assert e.value.status == 431


def head_of(size: int) -> bytes:
    """A report request whose head (request line to its empty line) is ``size`` bytes."""
    base = post(b"").decode()
    return (base[:-2] + "X: " + "y" * (size - len(base) - 5) + "\r\n\r\n").encode()


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 1000, MAX_HEAD + 10])
def test_the_head_limit_is_exact_however_the_head_is_split(chunk: int) -> None:
    def outcome(raw: bytes) -> int:
        reader = RequestReader(PATH, 100)
        try:
            for i in range(0, len(raw), chunk):
                reader.feed(raw[i : i + chunk])
                if reader.next() is not None:
                    return 200
        except Refused as e:
            return e.status
        return 0

    assert len(head_of(MAX_HEAD)) == MAX_HEAD
    assert outcome(head_of(MAX_HEAD)) == 200
    assert outcome(head_of(MAX_HEAD + 1)) == 431


def test_a_refused_connection_stays_refused() -> None:
    reader = RequestReader(PATH, 100, (R + "bad line\r\n\r\n").encode() + post())
    for _ in range(2):
        with pytest.raises(Refused, match="Invalid header token"):
            reader.next()


def outcomes(reader: RequestReader, pieces: list[bytes]) -> list[object]:
    """What a reader makes of ``pieces`` fed in turn: requests, then a refusal's status."""
    seen: list[object] = []
    try:
        for piece in pieces:
            reader.feed(piece)
            while (request := reader.next()) is not None:
                seen.append(request)
    except Refused as e:
        seen.append(e.status)
    return seen


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 400), st.binary(min_size=0, max_size=4), st.integers(0, 3)),
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 500), max_size=6),
)
def test_fuzzed_requests_are_framed_alike_however_split(
    edits: list[tuple[int, bytes, int]], cuts: list[int]
) -> None:
    """Two pipelined requests with bytes replaced, inserted or removed: the reader takes
    requests or refuses with a status (never another exception), and the same whole or cut
    into any pieces."""
    raw = bytearray(post(b'{"a":1}') + post(b"22"))
    for offset, data, removed in edits:
        at = min(offset, len(raw))
        raw[at : at + removed] = data
    whole = outcomes(RequestReader(PATH, 100), [bytes(raw)])
    bounds = sorted({0, len(raw), *(min(c, len(raw)) for c in cuts)})
    pieces = [bytes(raw[a:b]) for a, b in itertools.pairwise(bounds)]
    event("refused" if whole and isinstance(whole[-1], int) else f"{len(whole)} requests")
    assert outcomes(RequestReader(PATH, 100), pieces) == whole


def test_an_answer_is_json_with_its_length() -> None:
    out = response(409, {"error": "unknown pod"}, close=True)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 409 Conflict"
    assert b"Content-Length: %d" % len(body) in head
    assert b"Connection: close" in head
    assert json.loads(body) == {"error": "unknown pod"}
    assert b"Connection" not in response(200, {}, close=False)


# --- served over loopback ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Served(NamedTuple):
    http: HttpServer
    port: int
    seen: list[Request]  # the requests the handler got
    clock: Clock
    refusals: list[int]  # the statuses of the requests the server was told it refused
    dropped: list[str]  # the connections it was told it dropped, why
    release: asyncio.Event  # a request with the body b"hold" is answered once it is set


@contextlib.asynccontextmanager
async def serving(
    tls: ssl.SSLContext | None,
    limits: Limits | None = None,
    member: Callable[[str], bool] | None = None,
) -> AsyncIterator[Served]:
    seen: list[Request] = []
    refusals: list[int] = []
    dropped: list[str] = []
    clock = Clock()

    release = asyncio.Event()

    def answer(request: Request) -> Answer:
        if request.body.endswith(b"deny"):
            return Answer(401, {"error": "no"})
        body = request.body.decode()
        # "as:<who>": accepted as identity <who>
        return Answer(200, {"got": body}, identity=body[3:] if body.startswith("as:") else None)

    async def later(request: Request) -> Answer:
        if request.body == b"boom":
            raise RuntimeError("a bug")
        if request.body == b"hold":
            await release.wait()
        await asyncio.sleep(0.01 if request.body == b"slow" else 0)
        return answer(request)

    def handler(request: Request) -> Answer | Awaitable[Answer]:
        """A body starting with "now" is answered at once (as a report whose token the
        server remembers), any other once its task has run."""
        seen.append(request)
        if not request.body.startswith(b"now"):
            return later(request)
        if request.body == b"now-boom":
            raise RuntimeError("a bug")
        return answer(request)

    http = HttpServer(
        handler,
        PATH,
        100,
        clock,
        tls=tls,
        on_refused=lambda e: refusals.append(e.status),
        limits=limits,
        on_dropped=dropped.append,
        member=member,
    )
    server = await asyncio.get_running_loop().create_server(http.connection, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        yield Served(http, port, seen, clock, refusals, dropped, release)
    finally:
        server.close()
        for c in list(http.connections):
            c.close()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving(None) as s:
        yield s


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any], bool]:
    """(status, JSON body, whether the server said it closes)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers["Content-Length"]))
    return int(lines[0].split()[1]), json.loads(body), headers.get("Connection") == "close"


async def closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 5) == b""
    except ConnectionResetError:  # closed with bytes it had not read, or refused at once
        return True


async def test_pipelined_requests_on_one_connection_are_answered_in_order(
    served: Served,
) -> None:
    http, port, seen = served.http, served.port, served.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"slow") + post(b"two"))  # the first answer takes longer
    assert await read_answer(reader) == (200, {"got": "slow"}, False)
    assert await read_answer(reader) == (200, {"got": "two"}, False)
    writer.write(post(b"three"))  # kept alive
    assert await read_answer(reader) == (200, {"got": "three"}, False)
    assert [r.body for r in seen] == [b"slow", b"two", b"three"]
    assert len(http.connections) == 1
    writer.close()


async def test_answers_at_once_and_by_a_task_keep_the_order_of_the_requests(
    served: Served,
) -> None:
    """Pipelined requests, some answered in the read's callback, some by a task: each is
    answered in turn, none before the one ahead of it, on one kept connection; an answer at
    once that refuses still closes the connection, and nothing after it is served."""
    http, port, seen = served.http, served.port, served.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    bodies = [b"now1", b"slow", b"now2", b"now3", b"x", b"now4"]
    writer.write(b"".join(post(b) for b in bodies))
    for b in bodies:
        assert await read_answer(reader) == (200, {"got": b.decode()}, False)
    assert [r.body for r in seen] == bodies
    assert len(http.connections) == 1
    writer.write(post(b"now-deny") + post(b"now5"))
    assert (await read_answer(reader))[::2] == (401, True)
    assert await closed(reader)
    assert seen[-1].body == b"now-deny", "nothing after a refusal is served"
    writer.close()


async def test_an_idle_connections_reader_serves_the_next_connection(served: Served) -> None:
    """A connection between requests holds no reader: the server keeps the idle one (and its
    parser) and gives it to the next connection that receives a request, which it parses
    from its first byte; a refused request's reader is never kept."""
    http, port = served.http, served.port
    a_reader, a = await asyncio.open_connection("127.0.0.1", port)
    a.write(post(b"now-a"))
    assert await read_answer(a_reader) == (200, {"got": "now-a"}, False)
    await asyncio.sleep(0.05)
    (kept,) = http._readers
    b_reader, b = await asyncio.open_connection("127.0.0.1", port)
    b.write(post(b"now-b" * 3)[:40])  # in two pieces: the kept reader holds the first
    await b.drain()
    for _ in range(500):
        if not http._readers:
            break
        await asyncio.sleep(0.01)
    assert not http._readers, "taken by the connection with a request under way"
    b.write(post(b"now-b" * 3)[40:])
    assert await read_answer(b_reader) == (200, {"got": "now-b" * 3}, False)
    await asyncio.sleep(0.05)
    assert http._readers == [kept], "the same reader, idle again"
    a.write(b"POST /elsewhere HTTP/1.1\r\n" + HOST.encode() + b"Content-Length: 0\r\n\r\n")
    assert (await read_answer(a_reader))[::2] == (404, True)
    await asyncio.sleep(0.05)
    assert http._readers == [], "a refused request's reader is dropped with its connection"
    a.close()
    b.close()


async def test_the_readers_kept_for_reuse_are_bounded(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections with a request under way at once each hold a reader; once idle, the server
    keeps READERS_KEPT of them."""
    monkeypatch.setattr(report_http, "READERS_KEPT", 2)
    http, port = served.http, served.port
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    for _, w in clients:
        w.write(post(b"hold"))
    for _ in range(500):
        if len(served.seen) == 4:
            break
        await asyncio.sleep(0.01)
    served.release.set()
    for r, _ in clients:
        assert (await read_answer(r))[0] == 200
    await asyncio.sleep(0.05)
    assert len(http._readers) == 2
    for _, w in clients:
        w.close()


async def test_a_refused_request_is_answered_and_its_connection_closed(
    served: Served,
) -> None:
    port, seen, refusals = served.port, served.seen, served.refusals
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/reports HTTP/1.1\r\nHost: l\r\n\r\n" + post())
    status, body, closes = await read_answer(reader)
    assert (status, closes) == (405, True)
    assert "POST" in body["error"]
    assert await closed(reader)
    assert seen == [], "nothing after a refused request is served"
    assert refusals == [405], "the server is told (metrics, a warning)"
    writer.close()


@pytest.mark.parametrize("body", [b"boom", b"now-boom"], ids=["in-its-task", "at-once"])
async def test_a_failing_handler_answers_500_and_closes(served: Served, body: bytes) -> None:
    port = served.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(body))
    assert (await read_answer(reader))[::2] == (500, True)
    assert await closed(reader)
    writer.close()


async def test_connection_close_is_honoured(
    served: Served,
) -> None:
    port = served.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"last", extra="Connection: close\r\n"))
    assert await read_answer(reader) == (200, {"got": "last"}, True)
    assert await closed(reader)
    writer.close()


async def connections(http: HttpServer, n: int) -> None:
    for _ in range(500):
        if len(http.connections) == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(http.connections)} connections, not {n}")


async def test_the_sweep_closes_stalled_requests_and_idle_connections_only(
    served: Served,
) -> None:
    """Of connections that had a report accepted: one with a request begun and never finished
    is answered 408 after REQUEST_S, one idle for IDLE_S is closed silently."""
    http, port, clock, refusals = served.http, served.port, served.clock, served.refusals
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for r, w in streams:
        w.write(post(b"hello"))  # authenticated
        assert (await read_answer(r))[0] == 200
    (stalled_r, stalled_w), (idle_r, idle_w), (busy_r, busy_w) = streams
    stalled_w.write(post()[:20])  # a request begun, never finished
    idle_w.write(post(b"once"))
    assert (await read_answer(idle_r))[0] == 200
    await stalled_w.drain()
    for _ in range(100):  # the stalled bytes have arrived
        if any(c.begun is not None for c in http.connections):
            break
        await asyncio.sleep(0.01)
    assert http.sweep() == 0, "nothing is old yet"

    clock.t += report_http.REQUEST_S + 1
    busy_w.write(post(b"recent"))  # active just now
    assert (await read_answer(busy_r))[0] == 200
    assert http.sweep() == 1
    assert (await read_answer(stalled_r))[::2] == (408, True)
    assert refusals == [408]

    clock.t += report_http.IDLE_S
    busy_w.write(post(b"again"))
    assert (await read_answer(busy_r))[0] == 200
    assert http.sweep() == 1
    assert await closed(idle_r), "an idle connection is closed without an answer"
    assert refusals == [408], "and is not a refusal"
    busy_w.write(post(b"still"))
    assert (await read_answer(busy_r))[0] == 200
    for _, w in streams:
        w.close()


async def test_a_connection_without_a_report_accepted_in_time_is_dropped(
    served: Served,
) -> None:
    """Idle, or with a request begun: either way PREAUTH_S after it connected, counted."""
    http, port, clock, dropped = served.http, served.port, served.clock, served.dropped
    idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
    part_r, part_w = await asyncio.open_connection("127.0.0.1", port)
    part_w.write(post()[:20])
    await connections(http, 2)
    for _ in range(200):  # its bytes were read (closing on unread ones would reset it)
        if any(c.begun is not None for c in http.connections):
            break
        await asyncio.sleep(0.01)
    assert http.sweep_unauthenticated() == 0
    assert http.sweep() == 0, "the long sweep leaves them to the short one"
    clock.t += report_http.PREAUTH_S + 0.1
    assert http.sweep_unauthenticated() == 2
    assert (await read_answer(idle_r))[::2] == (408, True)
    assert (await read_answer(part_r))[::2] == (408, True)
    assert dropped == [PREAUTH_TIMEOUT] * 2
    for w in (idle_w, part_w):
        w.close()


async def test_a_refused_report_costs_its_connection() -> None:
    async with serving(None) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(post(b"deny") + post(b"more"))
        assert (await read_answer(reader))[::2] == (401, True)
        assert await closed(reader)
        assert [r.body for r in s.seen] == [b"deny"]
        writer.close()


async def test_connections_over_the_limits_are_refused_before_anything_is_read() -> None:
    limits = Limits(max_unauthenticated_per_source=2, connect_burst=3, connect_rate=1e-9)
    async with serving(None, limits) as s:
        first = [await asyncio.open_connection("127.0.0.1", s.port) for _ in range(2)]
        await connections(s.http, 2)
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        assert await closed(r), "a third unauthenticated connection from one source"
        w.close()
        assert s.dropped == [OVER_UNAUTHENTICATED]
        # one of the two has a report accepted: it counts no more as unauthenticated
        first[0][1].write(post(b"hello"))
        assert (await read_answer(first[0][0]))[0] == 200
        r2, w2 = await asyncio.open_connection("127.0.0.1", s.port)  # the last of the burst
        w2.write(post(b"hello"))
        assert (await read_answer(r2))[0] == 200
        r3, w3 = await asyncio.open_connection("127.0.0.1", s.port)
        assert await closed(r3), "the source's burst of new connections is spent"
        assert s.dropped == [OVER_UNAUTHENTICATED, RATE_LIMITED]
        assert s.http.admission.open == 3
        for _, w in [*first, (r2, w2), (r3, w3)]:
            w.close()


async def test_no_request_is_taken_while_the_peer_does_not_read_its_answers(
    served: Served,
) -> None:
    http, port, seen = served.http, served.port, served.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"one"))
    assert (await read_answer(reader))[0] == 200
    (conn,) = http.connections
    conn.pause_writing()  # what the transport calls when its write buffer is full
    writer.write(post(b"two") + post(b"three"))
    await asyncio.sleep(0.05)
    assert [r.body for r in seen] == [b"one"]
    conn.resume_writing()
    assert await read_answer(reader) == (200, {"got": "two"}, False)
    assert await read_answer(reader) == (200, {"got": "three"}, False)
    writer.close()


@pytest.mark.parametrize("body", [b"x", b"now"], ids=["answered-by-a-task", "answered-at-once"])
async def test_a_peer_pipelining_without_reading_answers_gets_one_read_not_one_per_answer(
    served: Served, body: bytes
) -> None:
    """4 MiB of valid pipelined reports, no answer read: the server answers until the peer's
    side is full, and holds at most one request's worth plus one socket read of the rest (the
    kernel's buffers hold what is left; nothing else is read)."""
    http, port = served.http, served.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"hello"))
    assert (await read_answer(reader))[0] == 200
    (conn,) = http.connections
    one = post(body)
    writer.write(one * (4 * 2**20 // len(one)))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(writer.drain(), 2)  # the kernel's buffers fill, then it waits
    await asyncio.sleep(0.3)
    held = conn._reader.buffered if conn._reader is not None else 0
    assert len(served.seen) > 1, "answered until the peer stopped reading"
    assert held <= http.request_max + report_http.READ_SIZE, f"{held} bytes held"
    writer.transport.abort()


@pytest.mark.parametrize("body", [b"x", b"now"], ids=["answered-by-a-task", "answered-at-once"])
async def test_a_backlog_of_pipelined_requests_must_be_done_within_the_request_deadline(
    served: Served, body: bytes
) -> None:
    """An answer does not restart REQUEST_S while pipelined requests wait: a peer that keeps a
    backlog (reading its answers only now and then) is refused 408 REQUEST_S after it began."""
    http, port, clock = served.http, served.port, served.clock
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting)
    client.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=client)
    writer.write(post(b"hello"))
    assert (await read_answer(reader))[0] == 200
    (conn,) = http.connections
    # the server's answers fill the kernel's buffers soon (no autotuning to megabytes)
    transport = conn._transport
    assert transport is not None
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    one = post(body)
    writer.write(one * 20_000)  # ~2 MB: more than the answers the server can hold unread
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(writer.drain(), 1)
    for _ in range(500):  # the server stopped: the peer does not read
        if conn._blocked:
            break
        await asyncio.sleep(0.01)
    assert conn._blocked
    assert conn.begun is not None
    clock.t += report_http.REQUEST_S / 2
    for _ in range(200):  # read some answers: the server answers more, at this later time
        assert (await read_answer(reader))[0] == 200
    await asyncio.sleep(0.1)
    clock.t += report_http.REQUEST_S / 2 + 1
    assert http.sweep() == 1, "REQUEST_S after the backlog began, whatever was answered since"
    writer.transport.abort()


async def test_requests_sent_while_one_is_handled_keep_its_deadline(served: Served) -> None:
    """Bytes that came while a request was being handled wait in the kernel (the connection
    does not read meanwhile): once it is answered, the next request is not a new one for the
    deadline, however long the first took."""
    http, port, clock, seen = served.http, served.port, served.clock, served.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"hello"))
    assert (await read_answer(reader))[0] == 200  # authenticated
    (conn,) = http.connections
    began = clock.t
    writer.write(post(b"hold"))
    for _ in range(500):
        if seen[-1].body == b"hold":
            break
        await asyncio.sleep(0.01)
    assert conn.begun == began
    clock.t += report_http.REQUEST_S - 5
    writer.write(post(b"next")[:30])  # part of the next request, while the first is handled
    await writer.drain()
    transport = conn._transport
    assert transport is not None
    server_side = transport.get_extra_info("socket").fileno()
    for _ in range(500):  # the bytes are in the kernel, unread
        if fcntl.ioctl(server_side, termios.FIONREAD, b"\0\0\0\0") != b"\0\0\0\0":
            break
        await asyncio.sleep(0.01)
    served.release.set()
    assert (await read_answer(reader))[0] == 200
    await asyncio.sleep(0.1)  # the rest read
    assert conn.begun == began, "the deadline of the request it followed"
    clock.t += 6
    assert http.sweep() == 1
    assert (await read_answer(reader))[::2] == (408, True)
    writer.close()


async def test_one_pods_token_holds_at_most_two_connections_whatever_the_address(
    served: Served,
) -> None:
    """Each connection is bound to the pod its first accepted report was for: a third one of
    that pod closes its oldest (a stolen token holds at most 2; the pod's own agent, connecting
    anew, is never refused for it); other pods' connections are not touched."""
    http, port = served.http, served.port

    async def authenticated(who: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(post(f"as:{who}".encode()))
        assert (await read_answer(r))[0] == 200
        return r, w

    first, second = await authenticated("pod-a"), await authenticated("pod-a")
    other = await authenticated("pod-b")
    third = await authenticated("pod-a")
    assert await closed(first[0]), "pod-a's oldest connection closed"
    assert served.dropped == [OVER_IDENTITY]
    await connections(http, 3)
    for r, w in (second, other, third):  # the rest still served
        w.write(post(b"again"))
        assert (await read_answer(r))[0] == 200
    assert [c.identity for c in http.connections].count("pod-a") == 2
    for _, w in (first, second, other, third):
        w.close()


async def test_forty_addresses_cannot_fill_the_unauthenticated_budget_against_an_agent() -> None:
    """40 loopback addresses hold every unauthenticated slot (plain TCP, never a byte): an
    agent's new connection from another address takes the oldest slot of the heaviest holder
    and its report is accepted; each address keeps a fair share, not less."""
    limits = Limits(max_unauthenticated=64, max_unauthenticated_per_source=8, connect_burst=100)
    async with serving(None, limits) as s:
        attackers = []
        for i in range(40):
            for _ in range(8):
                local = (f"127.0.0.{i + 2}", 0)
                attackers.append(
                    await asyncio.open_connection("127.0.0.1", s.port, local_addr=local)
                )
        await connections(s.http, 64)
        assert s.http.admission.unauthenticated == 64
        for n in range(3):  # agents, each from an address of its own
            r, w = await asyncio.open_connection("127.0.0.1", s.port, local_addr=("127.0.0.200", 0))
            w.write(post(f"agent {n}".encode()))
            assert (await read_answer(r))[0] == 200, "the agent's report accepted"
            w.close()
        assert s.dropped.count(FAIR_SHARE) >= 3
        held: dict[str, int] = {}
        for c in s.http.connections:
            if not c.authenticated:
                held[c.source] = held.get(c.source, 0) + 1
        assert max(held.values()) - min(held.values()) <= 1 or max(held.values()) <= 2, held
        for _, w in attackers:
            w.transport.abort()


# --- over TLS: the connection's own, on a plain transport --------------------------------


@pytest.fixture
async def served_tls() -> AsyncIterator[Served]:
    async with serving(serving_context()[0]) as s:
        yield s


def client_tls() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


async def test_over_tls_requests_are_answered_and_the_connection_kept(
    served_tls: Served,
) -> None:
    http, port, seen = served_tls.http, served_tls.port, served_tls.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls())
    writer.write(post(b"one") + post(b"two"))
    assert await read_answer(reader) == (200, {"got": "one"}, False)
    assert await read_answer(reader) == (200, {"got": "two"}, False)
    writer.write(post(b"x" * 100))  # a body of the most allowed, in TLS records of its own
    assert await read_answer(reader) == (200, {"got": "x" * 100}, False)
    assert [r.body for r in seen] == [b"one", b"two", b"x" * 100]
    (conn,) = http.connections
    assert conn.secure
    writer.close()
    await writer.wait_closed()
    for _ in range(200):  # the peer's close reaches the server
        if not http.connections:
            break
        await asyncio.sleep(0.01)
    assert not http.connections


async def test_over_tls_a_refusal_is_answered_inside_tls_and_closes(
    served_tls: Served,
) -> None:
    port, seen = served_tls.port, served_tls.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls())
    writer.write(b"POST /v1/reports HTTP/1.1\r\nHost: l\r\nContent-Length: 101\r\n\r\n")
    status, body, closes = await read_answer(reader)
    assert (status, closes) == (413, True)
    assert "100 bytes" in body["error"]
    assert await closed(reader)
    assert seen == []


def post_as_an_agent(port: int, body: bytes) -> tuple[int, bytes]:
    """What the agent's client (http.client) gets posting ``body``: it sends all of it before
    it reads the answer."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(), timeout=10)
    try:
        conn.request("POST", "/v1/reports", body=body, headers={"Authorization": "Bearer tok"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("size", [101, 110_000, 400_000, 1_000_000])
async def test_a_body_over_the_limit_is_answered_however_much_of_it_is_still_on_its_way(
    served_tls: Served, size: int
) -> None:
    """The refusal comes at the headers, with the body still arriving: the server reads and
    drops the rest until the client has the answer. (Closed at once, the kernel reset the
    connection under the body still coming in, and the client, still sending, got a broken
    pipe or a reset instead of the 413: the integration test's 110 KB body once did.)"""
    for _ in range(3):
        status, body = await asyncio.to_thread(post_as_an_agent, served_tls.port, b"x" * size)
        assert status == 413
        assert "100 bytes" in json.loads(body)["error"]
    await connections(served_tls.http, 0)
    assert served_tls.seen == []


async def test_after_a_refusal_a_peer_is_read_for_a_bounded_time_and_size(
    served_tls: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a refused peer sends after its answer is dropped for at most LINGER_BYTES and
    LINGER_S: one that keeps sending is cut off, one that neither reads nor closes is closed."""
    http, port = served_tls.http, served_tls.port
    refused = b"POST /v1/reports HTTP/1.1\r\nHost: l\r\nContent-Length: 101\r\n\r\n"
    monkeypatch.setattr(report_http, "LINGER_S", 60.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls())
    writer.write(refused)
    assert (await read_answer(reader))[0] == 413
    with contextlib.suppress(ConnectionError):
        for _ in range(report_http.LINGER_BYTES // 65536 + 8):
            writer.write(b"x" * 65536)
            await writer.drain()
    await connections(http, 0)  # well before LINGER_S
    writer.transport.abort()
    monkeypatch.setattr(report_http, "LINGER_S", 0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls())
    writer.write(refused)
    assert (await read_answer(reader))[0] == 413
    await connections(http, 0)  # it never closed its side
    writer.transport.abort()


async def test_a_peer_that_does_not_speak_tls_is_dropped(
    served_tls: Served,
) -> None:
    port, seen = served_tls.port, served_tls.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post())  # plain HTTP to the TLS port
    assert await closed(reader)
    assert seen == []
    writer.close()


async def test_a_handshake_not_finished_in_time_is_swept_without_an_answer(
    served_tls: Served,
) -> None:
    http, port, clock = served_tls.http, served_tls.port, served_tls.clock
    reader, writer = await asyncio.open_connection("127.0.0.1", port)  # connects, says nothing
    await connections(http, 1)
    assert http.sweep_unauthenticated() == 0
    clock.t += report_http.PREAUTH_S + 0.1
    assert http.sweep_unauthenticated() == 1
    assert await closed(reader)
    assert served_tls.dropped == [PREAUTH_TIMEOUT]
    writer.close()


class ByHand(NamedTuple):
    """A client's TLS over memory BIOs on a plain connection."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tls: ssl.SSLObject
    incoming: ssl.MemoryBIO  # bytes from the server, to OpenSSL
    outgoing: ssl.MemoryBIO  # bytes from OpenSSL, to the server


async def tls_by_hand(port: int) -> ByHand:
    """A client's TLS over memory BIOs (its records written when the test says), the
    handshake done."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_tls().wrap_bio(incoming, outgoing)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            writer.write(outgoing.read())
            incoming.write(await asyncio.wait_for(reader.read(65536), 5))
    writer.write(outgoing.read())  # the client's Finished
    return ByHand(reader, writer, tls, incoming, outgoing)


async def test_a_tls_record_held_short_of_its_last_byte_does_not_keep_a_connection(
    served_tls: Served,
) -> None:
    """The handshake done, then a record begun and never finished: no plaintext ever reaches
    HTTP, and still the connection goes at PREAUTH_S."""
    http, port, clock = served_tls.http, served_tls.port, served_tls.clock
    writer = (await tls_by_hand(port)).writer  # the record below is raw
    await connections(http, 1)
    (conn,) = http.connections
    for _ in range(200):
        if conn.secure:
            break
        await asyncio.sleep(0.01)
    assert conn.secure
    # the header of a 100-byte application-data record, and 10 of its bytes
    writer.write(bytes([23, 3, 3, 0, 100]) + b"x" * 10)
    await writer.drain()
    clock.t += report_http.PREAUTH_S - 1
    assert http.sweep_unauthenticated() == 0
    clock.t += 1.1
    assert http.sweep_unauthenticated() == 1
    await connections(http, 0)
    assert served_tls.dropped == [PREAUTH_TIMEOUT]
    writer.close()


async def test_a_report_sent_with_the_peers_fin_is_answered_then_the_connection_closed(
    served: Served,
) -> None:
    """Request, then the client's half-close in the same breath: served and answered."""
    port, seen = served.port, served.seen
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"one") + post(b"last"))
    writer.write_eof()
    assert await read_answer(reader) == (200, {"got": "one"}, False)
    assert await read_answer(reader) == (200, {"got": "last"}, False)
    assert await closed(reader)
    assert [r.body for r in seen] == [b"one", b"last"]
    await connections(served.http, 0)
    writer.close()


async def test_over_tls_a_report_sent_together_with_close_notify_is_served_and_answered(
    served_tls: Served,
) -> None:
    """The report's record and the client's close_notify arrive in one read: the report is
    served and answered (TLS 1.3 closes each direction on its own), then the server closes."""
    http, port, seen = served_tls.http, served_tls.port, served_tls.seen
    c = await tls_by_hand(port)
    c.tls.write(post(b"bye"))
    with pytest.raises(ssl.SSLWantReadError):
        c.tls.unwrap()  # sends close_notify; waits for the server's
    c.writer.write(c.outgoing.read())  # the report and the close, in one write
    answer = b""
    while not answer.endswith(b"}"):
        data = await asyncio.wait_for(c.reader.read(65536), 5)
        assert data, f"the server closed without an answer (got {answer!r})"
        c.incoming.write(data)
        with contextlib.suppress(ssl.SSLWantReadError):
            answer += c.tls.read(65536)
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer
    assert [r.body for r in seen] == [b"bye"]
    await connections(http, 0)
    c.writer.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_over_the_handshake_rate_a_connection_waits_its_turn(loop: str) -> None:
    """One handshake's budget: a second connection's handshake does not start until the gate
    grants its turn; then it is served like any other. On uvloop too (the controller's loop),
    which reads a new connection once whatever connection_made asked."""
    run = uvloop.run if loop == "uvloop" else asyncio.run
    run(handshake_waits_its_turn())


async def handshake_waits_its_turn() -> None:
    limits = Limits(handshake_rate=1, handshake_burst=1)
    async with serving(serving_context()[0], limits) as s:
        _, writer = await asyncio.open_connection("127.0.0.1", s.port, ssl=client_tls())
        second = asyncio.create_task(asyncio.open_connection("127.0.0.1", s.port, ssl=client_tls()))
        await connections(s.http, 2)
        await asyncio.sleep(0.3)
        assert not second.done(), "its handshake waits"
        assert s.http.gate.waiting == 1
        assert s.http.grant_handshakes() == 0, "no budget yet (the test's clock stands still)"
        s.clock.t += 1
        assert s.http.grant_handshakes() == 1
        reader2, writer2 = await asyncio.wait_for(second, 5)
        writer2.write(post(b"late"))
        assert await read_answer(reader2) == (200, {"got": "late"}, False)
        writer.close()
        writer2.close()


async def test_a_member_pods_handshakes_are_not_held_by_the_gate() -> None:
    """The gate's budget spent by another address: a member pod's connections shake hands at
    once, however many (a new leader's gang reconnecting)."""
    limits = Limits(handshake_rate=1, handshake_burst=1)
    member = "127.0.0.9"
    async with serving(serving_context()[0], limits, member.__eq__) as s:
        _, other = await asyncio.open_connection("127.0.0.1", s.port, ssl=client_tls())
        agents = [
            await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1", s.port, ssl=client_tls(), local_addr=(member, 0)
                ),
                5,
            )
            for _ in range(5)
        ]
        assert s.http.gate.waiting == 0
        for r, w in agents:
            w.write(post(b"member"))
            assert (await read_answer(r))[0] == 200
            w.close()
        other.close()


async def test_a_connection_whose_handshake_waits_still_goes_at_its_preauth_deadline() -> None:
    """Unread, a waiting connection's close is not seen: the PREAUTH_S sweep bounds it (and
    takes it out of the gate's queue)."""
    limits = Limits(handshake_rate=1, handshake_burst=1)
    async with serving(serving_context()[0], limits) as s:
        reader, first = await asyncio.open_connection("127.0.0.1", s.port, ssl=client_tls())
        first.write(post(b"agent"))
        assert (await read_answer(reader))[0] == 200, "authenticated: not swept"
        _, waiting = await asyncio.open_connection("127.0.0.1", s.port)  # plain: never shakes
        await connections(s.http, 2)
        assert s.http.gate.waiting == 1
        waiting.transport.abort()
        s.clock.t += report_http.PREAUTH_S + 0.1
        assert s.http.sweep_unauthenticated() == 1
        await connections(s.http, 1)
        assert s.http.gate.waiting == 0
        assert s.http.admission.open == 1
        assert s.dropped == [PREAUTH_TIMEOUT]
        first.close()


async def test_bytes_read_before_a_connections_turn_are_kept_up_to_one_record() -> None:
    """A read may come before its turn (uvloop reads a new connection once after
    connection_made, whatever it asked): its bytes are kept for the handshake, one TLS record's
    worth at most; more is no TLS client, and is dropped."""
    limits = Limits(handshake_rate=1, handshake_burst=1)
    async with serving(serving_context()[0], limits) as s:
        _, first = await asyncio.open_connection("127.0.0.1", s.port, ssl=client_tls())
        _, second = await asyncio.open_connection("127.0.0.1", s.port)
        _, third = await asyncio.open_connection("127.0.0.1", s.port)
        await connections(s.http, 3)
        ok, flooding = [c for c in s.http.connections if not c.secure]
        assert s.http.gate.waiting == 2
        ok.data_received(b"\x16\x03\x01" * 100)  # as a read before its turn would
        flooding.data_received(b"\x16" * (report_http.MAX_EARLY + 1))
        await connections(s.http, 2)
        assert s.dropped == [EARLY_DATA]
        assert s.http.gate.waiting == 1
        assert s.http.admission.open == 2
        for w in (first, second, third):
            w.close()


def test_an_answer_made_once_is_the_same_bytes_and_a_refusal_is_never_kept() -> None:
    payload = {"accepted": True, "holds": "workers/0/1"}
    first = response(200, payload, close=False)
    assert response(200, dict(payload), close=False) is first  # kept, by its fields
    assert json.loads(first.split(b"\r\n\r\n", 1)[1]) == payload
    other = response(200, {"accepted": True, "holds": None}, close=False)
    assert b'"holds":null' in other
    assert response(200, {"accepted": 1, "holds": None}, close=False).endswith(
        b'"accepted":1,"holds":null}'
    )
    # a payload that cannot be a key is made each time, the same way
    listed = {"accepted": True, "holds": ["a"]}
    assert response(200, listed, close=False) == response(200, listed, close=False)
    before = len(report_http._ANSWERS)
    response(409, {"error": "unknown pod"}, close=True)
    response(200, {"error": "closing"}, close=True)
    assert len(report_http._ANSWERS) == before
