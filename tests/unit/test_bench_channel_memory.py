"""bench/channel_memory.py works end to end on a few connections: every connection is made
and kept, and each round's reports are all answered 200 (the tool raises otherwise)."""

from __future__ import annotations

from bench.channel_memory import measure


def test_every_connection_is_made_kept_and_answered() -> None:
    idle, first, second = measure(20, 8)
    assert idle["connections"] == 0
    assert first["connections"] == second["connections"] == 20
