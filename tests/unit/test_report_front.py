"""A report front (controller/report_front.py) between real agents' channels and a real leader,
over TLS on loopback: agents' reports reach the leader's cache in batches and each agent gets
the leader's answer; a token of another pod is refused at the front; a leader the front cannot
reach is answered 503 (the agent then reports on its pod)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from bench import channel_attack
from jobset_inplace import names
from jobset_inplace.agent.channel import ChannelError, ReportChannel
from jobset_inplace.controller.report_front import Link, ReportFront
from jobset_inplace.controller.report_server import ReportServer
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
