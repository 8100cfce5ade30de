"""The report channel's limits before authentication (runtime/report_limits.py), pure: the
TLS handshake gate's rate and its turns across sources, and the limits' parser. Served over
loopback: tests/unit/test_report_http.py."""

from __future__ import annotations

import pytest

from jobset_inplace.runtime.report_limits import (
    OVER_UNAUTHENTICATED,
    SUSPECT_HOLDING,
    SUSPECT_RESERVE,
    SUSPECT_S,
    Admission,
    HandshakeGate,
    Limits,
)


def test_handshakes_start_at_once_within_the_burst_then_at_the_rate() -> None:
    gate = HandshakeGate(rate=10, burst=3)
    assert [gate.ask("a", n, 0.0) for n in range(5)] == [True, True, True, False, False]
    assert gate.waiting == 2
    assert gate.next_grant_s() == pytest.approx(0.1)
    assert gate.grant(0.05) == [], "half a handshake's worth of budget"
    assert gate.grant(0.1) == [3]
    assert gate.grant(0.2) == [4]
    assert gate.waiting == 0
    assert gate.grant(10.0) == []
    assert gate.ask("a", 5, 10.0), "the budget refilled (up to the burst)"


def test_a_source_with_one_connection_waits_behind_each_other_sources_one_only() -> None:
    """Forty connections of one source wait; an agent's one, come later, gets the second turn."""
    gate = HandshakeGate(rate=1, burst=1)
    assert gate.ask("attacker", "x0", 0.0)
    for n in range(1, 40):
        assert not gate.ask("attacker", f"x{n}", 0.0)
    assert not gate.ask("agent", "agent", 0.5)
    assert gate.grant(1.0) == ["x1"]
    assert gate.grant(2.0) == ["agent"]
    assert [gate.grant(t) for t in (3.0, 4.0)] == [["x2"], ["x3"]]


def test_every_source_has_its_turn_in_order() -> None:
    gate = HandshakeGate(rate=1, burst=1)
    gate.ask("a", "a0", 0.0)
    for who in ("a1", "a2", "b1", "c1", "b2"):
        gate.ask(who[0], who, 0.0)
    assert [gate.grant(t) for t in (1.0, 2.0, 3.0, 4.0, 5.0)] == [
        ["a1"],
        ["b1"],
        ["c1"],
        ["a2"],
        ["b2"],
    ]


def test_the_budget_refills_to_the_burst_and_grants_that_many_at_once() -> None:
    gate = HandshakeGate(rate=1, burst=3)
    for n in range(8):
        gate.ask("a", n, 0.0)
    assert gate.grant(100.0) == [3, 4, 5]


def test_a_connection_that_closes_while_it_waits_leaves_the_queue() -> None:
    gate = HandshakeGate(rate=1, burst=1)
    gate.ask("a", "a0", 0.0)
    gate.ask("a", "a1", 0.0)
    gate.ask("b", "b1", 0.0)
    gate.cancel("a1")
    gate.cancel("b1")
    gate.cancel("a0")  # (it did not wait: nothing to do)
    assert gate.waiting == 0
    assert gate.grant(9.0) == []


def test_limits_are_parsed_from_key_value_pairs_with_defaults_for_the_rest() -> None:
    limits = Limits.parse("handshake_rate=200, max_per_identity=3")
    assert (limits.handshake_rate, limits.max_per_identity) == (200.0, 3)
    assert limits.max_connections == Limits().max_connections
    assert Limits.parse("") == Limits()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("handshake_rat=1", "expected KEY=VALUE with KEY one of max_connections"),
        ("max_connections", "expected KEY=VALUE"),
        ("max_connections=1.5", "max_connections: '1.5' is not a whole number"),
        ("handshake_rate=fast", "handshake_rate: 'fast' is not a number"),
        ("handshake_burst=0", "handshake_burst: must be above 0"),
    ],
)
def test_bad_limits_name_the_key_and_the_accepted_form(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Limits.parse(text)


def test_the_connection_limits_stay_below_the_open_files_limit() -> None:
    limits = Limits.for_open_files(1536)
    assert limits.max_connections == 1024
    assert limits.max_unauthenticated == 1024
    assert limits.handshake_rate == Limits().handshake_rate


def test_a_time_before_the_last_one_adds_nothing_to_the_budget() -> None:
    """A connection's time may be older than the gate's last grant (its object was made an
    iteration earlier): the budget neither shrinks nor is refilled for it."""
    gate = HandshakeGate(rate=1, burst=10)
    for n in range(10):
        assert gate.ask("a", n, 5.0)
    assert gate.grant(5.5) == []
    assert not gate.ask("a", 10, 4.0), "no budget came back"
    assert not gate.ask("a", 11, 5.2)
    assert gate.grant(6.0) == [10]
    assert gate.grant(6.9) == []
    assert gate.grant(7.0) == [11]


def test_a_member_pods_address_gets_an_unauthenticated_slot_whoever_holds_them() -> None:
    """Every slot held by an address with one connection each: another such address is
    refused (the share is fair already), a member pod's address takes the oldest."""
    admission = Admission(Limits(max_unauthenticated=4))
    for n in range(4):
        assert admission.admit(f"10.0.0.{n}", 0.0, f"c{n}") == (None, None)
    assert admission.admit("10.0.1.1", 0.0, "stranger") == (OVER_UNAUTHENTICATED, None)
    refused, victim = admission.admit("10.0.2.1", 0.0, "agent", member=True)
    assert refused is None
    assert victim in {"c0", "c1", "c2", "c3"}, "one of theirs closed for it"
    assert admission.unauthenticated == 4
    assert admission.open == 4


def test_a_suspect_sources_connections_wait_behind_every_other_sources() -> None:
    """Forty addresses that have been wasting handshakes wait with connections each; an agent
    from an address the leader cannot tell yet (a new pod), come last, is served first."""
    gate = HandshakeGate(rate=1, burst=1)
    assert gate.ask("x0", "x0-0", 0.0, suspect=True)
    for n in range(40):
        for k in range(2):
            assert not gate.ask(f"x{n}", f"x{n}-{k + 1}", 0.0, suspect=True)
    assert not gate.ask("agent", "agent", 0.5)
    assert gate.grant(1.0) == ["agent"]
    assert gate.grant(2.0) == ["x0-1"], "then the suspect ones, in their turns"
    assert gate.grant(3.0) == ["x1-1"]
    gate.cancel("x2-1")  # (x2's next one keeps its turn)
    assert gate.grant(4.0) == ["x2-2"]
    assert gate.waiting == 40 * 2 - 4


def test_an_address_whose_connection_ended_unauthenticated_is_suspect_for_a_while() -> None:
    admission = Admission(Limits())
    for source, conn in (("10.0.0.0", "garbage"), ("10.0.0.1", "agent")):
        assert admission.admit(source, 0.0, conn) == (None, None)
    admission.authenticated("10.0.0.1", "agent")
    admission.closed("10.0.0.1", "agent", authenticated=True, now=1.0)
    admission.closed("10.0.0.0", "garbage", authenticated=False, now=1.0)
    assert not admission.suspect("10.0.0.1", 2.0), "its report was accepted"
    assert admission.suspect("10.0.0.0", 2.0)
    assert admission.suspect("10.0.0.0", 1.0 + SUSPECT_S - 0.1)
    assert not admission.suspect("10.0.0.0", 1.0 + SUSPECT_S)
    assert not admission.suspect("10.9.9.9", 2.0), "never seen"
    # a fair-share victim (closed for another's connection) counts as ended unauthenticated
    full = Admission(Limits(max_unauthenticated=1))
    assert full.admit("10.0.0.5", 0.0, "held") == (None, None)
    assert full.admit("10.0.0.6", 3.0, "agent", member=True) == (None, "held")
    assert full.suspect("10.0.0.5", 4.0)


def test_an_address_holding_many_connections_before_authentication_is_suspect() -> None:
    """Plain TCP held from one address: suspect from its SUSPECT_HOLDING-th connection on,
    before any has ended; an agent's one or two are not."""
    admission = Admission(Limits())
    for n in range(SUSPECT_HOLDING - 1):
        assert admission.admit("10.0.0.7", 0.0, n) == (None, None)
    assert not admission.suspect("10.0.0.7", 0.0)
    admission.admit("10.0.0.7", 0.0, "one more")
    assert admission.suspect("10.0.0.7", 0.0)
    admission.mark_suspect("10.0.0.8", 0.0)  # (never seen: nothing to remember)
    assert not admission.suspect("10.0.0.8", 0.0)


def test_the_suspect_never_take_the_budgets_last_handshakes() -> None:
    """The suspect start their handshakes while more than SUSPECT_RESERVE are left: another
    source's connection, come while they wait, starts at once."""
    gate = HandshakeGate(rate=10, burst=5)
    started = [gate.ask("x", n, 0.0, suspect=True) for n in range(5)]
    assert started == [True] * (5 - SUSPECT_RESERVE) + [False] * SUSPECT_RESERVE
    assert gate.next_grant_s() == pytest.approx(0.1), "the reserve and one more"
    assert gate.grant(0.05) == []
    assert gate.ask("agent", "agent", 0.05), "from the reserve, at once"
    assert gate.ask("agent", "agent-2", 0.05), "and its second"
    assert not gate.ask("agent", "agent-3", 0.05), "the budget spent: it waits, first in line"
    assert gate.grant(0.1) == ["agent-3"]
    assert gate.grant(0.39) == []
    assert gate.grant(0.4) == [3], "the suspect: once the reserve is back, and one more"
