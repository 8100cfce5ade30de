"""A report front (controller/report_front.py) between real agents' channels and a real leader,
over TLS on loopback: agents' reports reach the leader's cache in batches and each agent gets
the leader's answer; a token of another pod is refused at the front; a leader the front cannot
reach is answered 503 (the agent then reports on its pod)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from bench import channel_attack
from jobset_inplace import names
from jobset_inplace.agent import channel as agent_channel
from jobset_inplace.agent.channel import ChannelError, ReportChannel
from jobset_inplace.controller.cache import GangKey
from jobset_inplace.controller.report_front import ReportFront, follow_leader
from jobset_inplace.controller.report_server import ReportServer
from jobset_inplace.core.model import ReportEndpoint
from jobset_inplace.core.report_fronts import FRONT_TTL_S, Link, link_annotations
from jobset_inplace.protocol.gangstate import Endpoint
from jobset_inplace.protocol.report import AgentReport
from jobset_inplace.runtime.report_limits import Limits
from jobset_inplace.runtime.report_tokens import TokenVerifier

from .test_front_link import linked_leader
from .test_report_server import MemberTokens

MEMBERS = 6
REPORT = AgentReport(reported_epoch=2, reported_steps=(200, 100))


@dataclass
class Setup:
    leader: ReportServer
    front: ReportFront
    endpoint: Endpoint  # the front's, as an agent would be told


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    leader = linked_leader(MEMBERS)
    endpoint = await leader.start()
    assert leader.link_port is not None
    front = ReportFront(
        cast(TokenVerifier, MemberTokens()),
        ("127.0.0.1", 0),
        Link("127.0.0.1", leader.link_port, endpoint.cert_sha256),
        lambda: "front",
        limits=Limits(handshake_rate=1000.0, handshake_burst=1000.0),
    )
    await front.start()
    url = f"https://127.0.0.1:{front.port}{names.REPORT_PATH}"
    assert front.pin is not None
    try:
        yield Setup(leader, front, Endpoint(url, front.pin, "front-1"))
    finally:
        await front.stop()
        await leader.stop()


def agent(tmp_path: Path, index: int, token: str | None = None) -> ReportChannel:
    pod, uid = channel_attack.member_pod(index)
    path = tmp_path / f"token-{index}"
    path.write_text(token or f"m{index}")
    return ReportChannel(channel_attack.NAMESPACE, channel_attack.GANG, pod, uid, path)


async def test_agents_reports_reach_the_leader_through_the_front(
    setup: Setup, tmp_path: Path
) -> None:
    agents = [agent(tmp_path, i) for i in range(MEMBERS)]
    answers = await asyncio.gather(
        *(asyncio.to_thread(a.send, setup.endpoint, REPORT) for a in agents)
    )
    assert [a["accepted"] for a in answers] == [True] * MEMBERS
    key = (channel_attack.NAMESPACE, channel_attack.GANG)
    views = setup.leader.cache.gangs[key].pods.values()
    assert [v.reported_steps for v in views] == [(200, 100)] * MEMBERS
    assert setup.front.forwarded == MEMBERS
    assert 1 <= setup.front.batches == setup.leader.batches <= MEMBERS
    assert setup.leader.accepted == MEMBERS
    for a in agents:
        a.close()


async def test_a_token_of_another_pod_is_refused_at_the_front(setup: Setup, tmp_path: Path) -> None:
    impostor = agent(tmp_path, 1, token="m2")  # member 2's token, member 1's report
    with pytest.raises(ChannelError, match="HTTP 403"):
        await asyncio.to_thread(impostor.send, setup.endpoint, REPORT)
    assert (setup.front.forwarded, setup.leader.accepted) == (0, 0)


async def test_a_leader_out_of_reach_is_answered_503(setup: Setup, tmp_path: Path) -> None:
    await setup.leader.stop()
    member = agent(tmp_path, 1)
    with pytest.raises(ChannelError, match="HTTP 503"):
        await asyncio.to_thread(member.send, setup.endpoint, REPORT)
    assert setup.front.link_failures == 1


async def test_a_link_whose_certificate_is_not_the_pinned_one_sends_nothing(
    setup: Setup, tmp_path: Path
) -> None:
    assert setup.leader.link_port is not None
    front = ReportFront(
        cast(TokenVerifier, MemberTokens()),
        ("127.0.0.1", 0),
        Link("127.0.0.1", setup.leader.link_port, "0" * 64),
        lambda: "front",
    )
    await front.start()
    try:
        assert front.pin is not None
        url = f"https://127.0.0.1:{front.port}{names.REPORT_PATH}"
        member = agent(tmp_path, 1)
        with pytest.raises(ChannelError, match="HTTP 503"):
            await asyncio.to_thread(member.send, Endpoint(url, front.pin, "front-2"), REPORT)
        assert (front.link_failures, setup.leader.batches) == (1, 0)
    finally:
        await front.stop()


# --- the leader names its fronts; agents spread over them, the leader itself their fallback -----


async def eventually(what: str, holds: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not holds():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def named() -> AsyncIterator[tuple[ReportServer, ReportFront]]:
    """A leader and a front that says hello (it has an address to advertise), following the
    leader's Lease: the leader names the front in its endpoint."""
    pokes: list[GangKey] = []
    leader = linked_leader(MEMBERS)
    leader.poke = lambda key, delay=None, *, urgent=False: pokes.append(key)
    await leader.start()
    front = ReportFront(
        cast(TokenVerifier, MemberTokens()),
        ("127.0.0.1", 0),
        None,
        lambda: "front",
        advertise="127.0.0.1",
        limits=Limits(handshake_rate=1000.0, handshake_burst=1000.0),
    )
    done = threading.Event()
    assert leader.link_address is not None
    lease = link_annotations(leader.link_address)  # what the leader's Lease says
    following = asyncio.create_task(follow_leader(front, done, lambda: lease))
    try:
        await eventually(
            "the front named", lambda: leader.endpoint is not None and leader.endpoint.fronts != ()
        )
        assert pokes == [(channel_attack.NAMESPACE, channel_attack.GANG)], "its gang planned"
        yield leader, front
    finally:
        done.set()
        await following
        await leader.stop()


async def test_a_front_says_hello_and_agents_send_through_it(
    named: tuple[ReportServer, ReportFront], tmp_path: Path
) -> None:
    leader, front = named
    assert leader.endpoint is not None
    assert front.hello is not None
    assert leader.endpoint.fronts == (front.hello,)
    assert leader.cache.report_endpoint == leader.endpoint, "what each gang's status names"
    told = to_agents(leader.endpoint)
    agents = [agent(tmp_path, i) for i in range(MEMBERS)]
    for a in agents:
        await asyncio.to_thread(a.send, told, REPORT)
    assert (front.forwarded, leader.accepted) == (MEMBERS, MEMBERS), "every report by the front"
    for a in agents:
        a.close()


async def test_agents_send_to_the_leader_itself_while_their_front_cannot_reach_it(
    named: tuple[ReportServer, ReportFront], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, front = named
    assert leader.endpoint is not None
    front.retarget(None)  # the Lease names no leader now
    told = to_agents(leader.endpoint)
    why: list[str] = []
    pod, uid = channel_attack.member_pod(1)
    path = tmp_path / "token"
    path.write_text("m1")
    member = ReportChannel(
        channel_attack.NAMESPACE, channel_attack.GANG, pod, uid, path, on_front_failed=why.append
    )
    await asyncio.to_thread(member.send, told, REPORT)
    assert (front.forwarded, leader.accepted) == (0, 1), "accepted by the leader itself"
    assert len(why) == 1
    assert "HTTP 503" in why[0]
    await asyncio.to_thread(member.send, told, REPORT)
    assert (len(why), leader.accepted) == (1, 2), "the failed front passed over meanwhile"
    front.retarget(leader.link_address)
    later = time.monotonic() + agent_channel.FRONT_RETRY_S + 1
    monkeypatch.setattr(agent_channel, "_now", lambda: later)
    await asyncio.to_thread(member.send, told, REPORT)
    assert (front.forwarded, leader.accepted) == (1, 3), "the front again, once its pause is over"
    member.close()


async def test_a_refusal_of_the_leader_through_the_front_is_not_sent_again(
    named: tuple[ReportServer, ReportFront], tmp_path: Path
) -> None:
    leader, _ = named
    assert leader.endpoint is not None
    impostor = agent(tmp_path, 1, token="m2")
    with pytest.raises(ChannelError, match="HTTP 403") as refused:
        await asyncio.to_thread(impostor.send, to_agents(leader.endpoint), REPORT)
    assert refused.value.status == 403
    assert leader.handled == 0, "not sent to the leader itself"


async def test_a_silent_front_is_no_longer_named(
    named: tuple[ReportServer, ReportFront],
) -> None:
    leader, front = named
    assert front.hello is not None
    leader.heard[front.hello] -= FRONT_TTL_S + 1  # its last hello that long ago
    leader._name_fronts()
    assert leader.endpoint is not None
    assert leader.endpoint.fronts == ()
    assert leader.cache.report_endpoint == leader.endpoint
    assert leader.heard == {}


def to_agents(endpoint: ReportEndpoint) -> Endpoint:
    """What an agent reads of ``endpoint`` in its gang's status."""
    return Endpoint(endpoint.url, endpoint.cert_sha256, endpoint.leader, endpoint.fronts)
