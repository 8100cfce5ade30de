"""The report channel under attack, end to end on loopback (bench/channel_attack.py): the real
ReportServer in its own process with its default limits; an attacker address holding 20 000
idle or partial-TLS connections, then 3 connections trickling a TLS record a byte at a time.
What must hold, whatever the machine's speed (timings are the benchmark's, not this test's):
every report of the agent (another address) is answered 200 throughout; the attacker holds no
more than its per-address share of unauthenticated connections; everything else is refused
before any TLS and counted by reason; the trickling connections are dropped at the
pre-authentication deadline; the server's memory stays bounded."""

from __future__ import annotations

import uvloop

from bench.channel_attack import Server, run
from jobset_inplace.runtime.report_limits import Limits

ATTACK = 20_000


def test_a_flood_and_a_trickle_from_one_address_leave_an_agent_answered() -> None:
    server = Server()
    try:
        out = uvloop.run(run(server, ATTACK, 2000, 5))
    finally:
        server.stop()
    held = Limits().max_unauthenticated_per_source
    for phase in ("quiet_answers", "flood_answers", "trickle_answers"):
        assert set(out[phase]) == {"HTTP/1.1 200 OK"}, (phase, out[phase])
    attacker, end = out["attacker"], out["end"]
    assert attacker["not_connected"] == 0, attacker  # TCP accepted, then refused or held
    assert out["peak_during_flood"]["unauthenticated"] <= held, out["peak_during_flood"]
    # every attacker connection the server dropped is counted: refused before any TLS
    # (limits) or at the pre-authentication deadline; the server never held more than the
    # address's share (connections the kernel never handed it: ``never_accepted``)
    assert attacker["held"] + attacker["dropped"] == ATTACK, attacker
    refused = out["settled"]["refused"]
    kinds = ("unauthenticated_limit", "source_limit", "rate_limited", "preauth_timeout")
    assert sum(refused[k] for k in kinds) == attacker["dropped"], (refused, attacker)
    assert refused["connection_limit"] == 0, refused
    assert attacker["held"] <= held + out["never_accepted"], (attacker, out["never_accepted"])
    # the 3 trickling connections were dropped at the deadline (and came back)
    trickled = end["refused"]["preauth_timeout"] - refused["preauth_timeout"]
    assert trickled >= 3, end["refused"]
    assert out["trickle_connections"] >= 6, out["trickle_connections"]
    # bounded memory: ~50 KiB per held connection at most, far below the 512 MiB limit
    assert end["peak_mib"] - out["idle"]["rss_mib"] < 64, (out["idle"], end)
    assert end["connections"] == 0, end
