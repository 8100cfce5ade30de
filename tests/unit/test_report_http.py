"""The report channel's HTTP/1.1 (controller/report_http.py): the one request agents make is
parsed (pipelined, kept alive or not); anything else is refused with its status and the reason
named, then the connection closed; stalled and idle connections are closed by the sweep. The
connection tests serve over real loopback sockets (plain TCP: TLS is the transport's)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest

from jobset_inplace.controller import report_http, report_server
from jobset_inplace.controller.report_http import (
    MAX_HEAD,
    HttpServer,
    Refused,
    Request,
    next_request,
    response,
)

PATH = b"/v1/reports"


def post(body: bytes = b'{"a":1}', *, version: str = "1.1", extra: str = "") -> bytes:
    head = (
        f"POST /v1/reports HTTP/{version}\r\nHost: leader\r\nAuthorization: Bearer tok\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def test_a_report_request_is_parsed_with_its_token_and_body() -> None:
    raw = post(b'{"epoch":"2"}')
    assert next_request(raw, PATH, 100) == (Request("Bearer tok", b'{"epoch":"2"}', True), len(raw))


@pytest.mark.parametrize("cut", [10, len(post()) - 1])
def test_an_incomplete_request_waits_for_more(cut: int) -> None:
    assert next_request(post()[:cut], PATH, 100) is None


def test_pipelined_requests_are_taken_one_at_a_time() -> None:
    first, second = post(b"1"), post(b"22")
    parsed = next_request(first + second, PATH, 100)
    assert parsed is not None
    assert parsed == (Request("Bearer tok", b"1", True), len(first))
    assert next_request((first + second)[parsed[1] :], PATH, 100) == (
        Request("Bearer tok", b"22", True),
        len(second),
    )


@pytest.mark.parametrize(
    ("version", "extra", "keep_alive"),
    [
        ("1.1", "", True),
        ("1.1", "Connection: close\r\n", False),
        ("1.0", "", False),
        ("1.0", "Connection: keep-alive\r\n", True),
    ],
)
def test_the_connection_is_kept_as_http_says(version: str, extra: str, keep_alive: bool) -> None:
    parsed = next_request(post(version=version, extra=extra), PATH, 100)
    assert parsed is not None
    assert parsed[0].keep_alive is keep_alive


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"POST /v1/reports\r\n\r\n", 400, "request line"),
        (b"GET /v1/reports HTTP/1.1\r\n\r\n", 405, "POST"),
        (b"POST /other HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 404, "POST /v1/reports"),
        (b"POST /v1/reports HTTP/1.1\r\nbad line\r\n\r\n", 400, "malformed header"),
        (b"POST /v1/reports HTTP/1.1\r\n folded: x\r\n\r\n", 400, "malformed header"),
        (
            b"POST /v1/reports HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            501,
            "Content-Length",
        ),
        (b"POST /v1/reports HTTP/1.1\r\n\r\n", 411, "Content-Length is required"),
        (b"POST /v1/reports HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "byte count"),
        (b"POST /v1/reports HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413, "100 bytes"),
        (
            b"POST /v1/reports HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n1",
            400,
            "twice",
        ),
        (b"POST /v1/reports HTTP/1.1\r\nX: " + b"y" * MAX_HEAD, 431, f"{MAX_HEAD} bytes"),
    ],
)
def test_any_other_request_is_refused_with_its_status_and_reason(
    raw: bytes, status: int, says: str
) -> None:
    with pytest.raises(Refused, match=says) as e:
        next_request(raw, PATH, 100)
    assert e.value.status == status


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


@contextlib.asynccontextmanager
async def serving(tls: ssl.SSLContext | None) -> AsyncIterator[Served]:
    seen: list[Request] = []
    refusals: list[int] = []
    clock = Clock()

    async def handler(request: Request) -> tuple[int, dict[str, Any]]:
        seen.append(request)
        if request.body == b"boom":
            raise RuntimeError("a bug")
        await asyncio.sleep(0.01 if request.body == b"slow" else 0)
        return 200, {"got": request.body.decode()}

    http = HttpServer(
        handler, PATH, 100, clock, tls=tls, on_refused=lambda e: refusals.append(e.status)
    )
    server = await asyncio.get_running_loop().create_server(http.connection, "127.0.0.1", 0)
    try:
        yield Served(http, server.sockets[0].getsockname()[1], seen, clock, refusals)
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
    return await asyncio.wait_for(reader.read(1), 5) == b""


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


async def test_a_refused_request_is_answered_and_its_connection_closed(
    served: Served,
) -> None:
    port, seen, refusals = served.port, served.seen, served.refusals
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/reports HTTP/1.1\r\n\r\n" + post())
    status, body, closes = await read_answer(reader)
    assert (status, closes) == (405, True)
    assert "POST" in body["error"]
    assert await closed(reader)
    assert seen == [], "nothing after a refused request is served"
    assert refusals == [405], "the server is told (metrics, a warning)"
    writer.close()


async def test_a_failing_handler_answers_500_and_closes(
    served: Served,
) -> None:
    port = served.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"boom"))
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


async def test_the_sweep_closes_stalled_requests_and_idle_connections_only(
    served: Served,
) -> None:
    http, port, clock, refusals = served.http, served.port, served.clock, served.refusals
    stalled_r, stalled_w = await asyncio.open_connection("127.0.0.1", port)
    idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
    busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
    stalled_w.write(post()[:20])  # a request begun, never finished
    idle_w.write(post(b"once"))
    assert (await read_answer(idle_r))[0] == 200
    for _ in range(100):
        if len(http.connections) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the stalled bytes have arrived
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
    for w in (stalled_w, idle_w, busy_w):
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


# --- over TLS: the connection's own, on a plain transport --------------------------------


@pytest.fixture
async def served_tls() -> AsyncIterator[Served]:
    async with serving(report_server.serving_context()[0]) as s:
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
    writer.write(b"POST /v1/reports HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
    status, body, closes = await read_answer(reader)
    assert (status, closes) == (413, True)
    assert "100 bytes" in body["error"]
    assert await closed(reader)
    assert seen == []


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
    for _ in range(200):
        if http.connections:
            break
        await asyncio.sleep(0.01)
    assert http.sweep() == 0
    clock.t += report_http.REQUEST_S + 1
    assert http.sweep() == 1
    assert await closed(reader)
    writer.close()
