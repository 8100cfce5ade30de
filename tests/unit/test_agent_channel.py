"""The agent's side of the report channel (agent/channel.py) against the leader's real HTTP and
TLS layer on loopback: a report is delivered over a pinned TLS connection, and a new connection
the leader drops before TLS (its connection limits) is tried once more before the agent gives
up on the channel."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobset_inplace.agent import channel
from jobset_inplace.agent.channel import ChannelError, ReportChannel
from jobset_inplace.protocol.gangstate import Endpoint
from jobset_inplace.protocol.report import AgentReport
from jobset_inplace.runtime.report_http import Answer, HttpServer, Request
from jobset_inplace.runtime.report_limits import OVER_UNAUTHENTICATED, Limits
from jobset_inplace.runtime.report_tls import serving_context

REPORT = AgentReport(reported_epoch=2)


@dataclass
class Leader:
    endpoint: Endpoint
    port: int
    loop: asyncio.AbstractEventLoop
    http: HttpServer
    seen: list[Request]
    dropped: list[str]


@pytest.fixture
def leader() -> Iterator[Leader]:
    """The channel's HTTP and TLS layer on a loop of its own (the agent's calls block), at most
    one unauthenticated connection from a source."""
    loop = asyncio.new_event_loop()
    seen: list[Request] = []
    dropped: list[str] = []

    async def handle(request: Request) -> Answer:
        seen.append(request)
        return Answer(200, {"accepted": True})

    ctx, pin = serving_context()
    limits = Limits(max_unauthenticated_per_source=1)
    http = HttpServer(
        handle, b"/v1/reports", 1024, loop.time, tls=ctx, limits=limits, on_dropped=dropped.append
    )
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = loop.run_until_complete(loop.create_server(http.connection, sock=sock))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    endpoint = Endpoint(f"https://127.0.0.1:{port}/v1/reports", pin, "leader-1")
    try:
        yield Leader(endpoint, port, loop, http, seen, dropped)
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.fixture
def agent(tmp_path: Path) -> ReportChannel:
    token = tmp_path / "token"
    token.write_text("a-token\n")
    return ReportChannel("ns", "gang", "gang-w-0-0", "uid-0", token)


def hold_the_one_unauthenticated_connection(leader: Leader) -> socket.socket:
    holder = socket.create_connection(("127.0.0.1", leader.port))
    deadline = time.monotonic() + 5
    while not leader.http.connections:  # taken by the leader before the agent connects
        assert time.monotonic() < deadline, "the leader never took the connection"
        time.sleep(0.01)
    return holder


def test_a_report_is_delivered_and_the_connection_kept(
    leader: Leader, agent: ReportChannel
) -> None:
    agent.send(leader.endpoint, REPORT)
    agent.send(leader.endpoint, REPORT)
    assert [r.authorization for r in leader.seen] == ["Bearer a-token"] * 2
    assert len(leader.http.connections) == 1
    agent.close()


def test_a_connection_dropped_by_the_leaders_limits_is_tried_once_more(
    leader: Leader, agent: ReportChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = hold_the_one_unauthenticated_connection(leader)
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # the random pause: the limit frees up meanwhile
        pauses.append(seconds)
        holder.close()

    monkeypatch.setattr(channel, "_pause", pause)
    agent.send(leader.endpoint, REPORT)
    assert leader.dropped == [OVER_UNAUTHENTICATED]
    assert len(pauses) == 1
    assert channel.REFUSED_RETRY_S[0] <= pauses[0] <= channel.REFUSED_RETRY_S[1]
    assert len(leader.seen) == 1
    agent.close()


def test_a_connection_dropped_twice_gives_up_on_the_channel(
    leader: Leader, agent: ReportChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = hold_the_one_unauthenticated_connection(leader)
    monkeypatch.setattr(channel, "_pause", lambda seconds: None)
    with pytest.raises(ChannelError):
        agent.send(leader.endpoint, REPORT)
    assert leader.dropped == [OVER_UNAUTHENTICATED] * 2
    assert leader.seen == []
    holder.close()


def test_a_leader_that_does_not_take_the_connection_is_given_up_after_the_connect_timeout(
    agent: ReportChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A black-holed address: a listener whose accept queue is full drops every SYN (the
    kernel neither accepts nor refuses). The agent gives up after CONNECT_S, not TIMEOUT_S,
    and does not retry: its report goes on the pod at once."""
    monkeypatch.setattr(channel, "CONNECT_S", 0.3)
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    queued = []
    for _ in range(4):  # fill the accept queue (backlog 0 holds one): later SYNs are dropped
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(hole.getsockname())
        queued.append(s)
    time.sleep(0.1)
    port = hole.getsockname()[1]
    endpoint = Endpoint(f"https://127.0.0.1:{port}/v1/reports", "0" * 64, "gone")
    began = time.monotonic()
    with pytest.raises(ChannelError, match="timed out"):
        agent.send(endpoint, REPORT)
    took = time.monotonic() - began
    assert took < channel.TIMEOUT_S - 0.5, f"{took:.2f} s: the connect timeout did not apply"
    for s in (*queued, hole):
        s.close()
