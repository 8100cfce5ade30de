"""The report channel against 40 addresses and a stolen member token, end to end on loopback
(bench/channel_attacks.py): the real ReportServer and TokenVerifier in a process of their own,
an agent of the gang reporting on new TLS connections throughout each attack. What must hold
whatever the machine's speed (the latencies and CPU shares are the benchmark's): every report
of the agent answered 200; the server's memory within 100 MiB of idle; and each attack held
by the limit made for it, counted by reason."""

from __future__ import annotations

from typing import Any

import pytest

from bench.channel_attack import AGENT, FRONT_POD, Server
from bench.channel_attacks import AGENT_ENV, ATTACKS, FRONT_ENV, KEY_ENV, BenchCluster, run
from jobset_inplace.runtime.report_limits import Limits

SECONDS = 11.0  # past the 10 s pre-authentication deadline


def attacked(*, front: bool) -> dict[str, Any]:
    """Every attack on a fresh server process: the leader's channel, or (``front``) a report
    front (its own limits, no knowledge of the members' addresses) handing the leader its
    reports over the link (``--front``)."""
    cluster = BenchCluster()
    env = {KEY_ENV: cluster.keys(), AGENT_ENV: AGENT}
    if front:
        env[FRONT_ENV] = cluster.token(FRONT_POD, "uid-front")
    server = Server("bench.channel_attacks", env)
    try:
        return run(server, cluster, 40, SECONDS)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def suite() -> dict[str, Any]:
    return attacked(front=False)


@pytest.fixture(scope="module")
def front_suite() -> dict[str, Any]:
    return attacked(front=True)


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("target", ["suite", "front_suite"])
def test_every_report_of_the_agent_is_answered_and_memory_stays_bounded(
    request: pytest.FixtureRequest, target: str, attack: str
) -> None:
    attacks: dict[str, Any] = request.getfixturevalue(target)
    r = attacks["attacks"][attack]
    assert set(r["answers"]) == {"HTTP/1.1 200 OK"}, r["answers"]
    # and a new pod's agent, whose address the server does not know (no member's priority)
    assert set(r["new_pod"]["answers"]) == {"HTTP/1.1 200 OK"}, r["new_pod"]
    assert r["goals"]["rss_within_100_mib"], r["server"]
    assert attacks["end"]["peak_mib"] - attacks["idle"]["rss_mib"] < 100, attacks["end"]


def test_garbage_tokens_are_refused_and_cost_a_handshake_each_within_the_gate(
    suite: dict[str, Any],
) -> None:
    r = suite["attacks"]["garbage-tokens"]
    assert set(r["attacker"]) <= {"401", "not_connected", "no answer"}, r["attacker"]
    lim = Limits()
    assert r["attacker"].get("401", 0) <= lim.handshake_burst + lim.handshake_rate * (SECONDS + 2)


def test_forty_addresses_hold_no_more_than_the_unauthenticated_budget(
    suite: dict[str, Any],
) -> None:
    r = suite["attacks"]["plain-tcp"]
    assert r["attacker"]["opened"] > 0, r["attacker"]
    assert 0 < r["server"]["peaks"]["unauthenticated"] <= Limits().max_unauthenticated, r["server"]


def test_a_stolen_token_holds_at_most_two_connections(suite: dict[str, Any]) -> None:
    """However many it opens from 40 addresses (each authenticated by a valid report)."""
    for attack, authenticated in (("stolen-idle", "200"), ("stolen-pipelined", "opened")):
        r = suite["attacks"][attack]
        assert r["attacker"][authenticated] > 2 * 40, (attack, r["attacker"])
        assert r["server"]["peaks"]["per_identity"] == Limits().max_per_identity, (attack, r)
        assert r["server"]["refused"]["identity_limit"] > 0, (attack, r["server"])


def test_handshakes_of_non_member_addresses_are_held_to_the_gates_rate(
    suite: dict[str, Any],
) -> None:
    r, lim = suite["attacks"]["handshakes"], Limits()
    assert r["attacker"]["handshakes"] <= lim.handshake_burst + lim.handshake_rate * (SECONDS + 2)
