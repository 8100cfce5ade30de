"""The gRPC side of the report channel's attack suite (bench/channel_attacks_grpc.py), briefly:
its hardened grpc.aio server in a process of its own checks the bearer token with the product's
verifier and the report against the token, the h2 agent's report is answered OK, and an attack
runs through the attacker process and leaves the state that bench.channel_attacks needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import uvloop

from bench.channel_attack import Server, member_pod, report_body
from bench.channel_attacks import KEY_ENV, PRIVATE_ENV, BenchCluster, _state_delta
from bench.channel_attacks_grpc import _h2_tls, grpc_report


@pytest.fixture(scope="module")
def cluster() -> BenchCluster:
    return BenchCluster()


@pytest.fixture(scope="module")
def server(cluster: BenchCluster) -> Iterator[Server]:
    s = Server("bench.channel_attacks_grpc", {KEY_ENV: cluster.keys()})
    try:
        yield s
    finally:
        s.stop()


def _report(server: Server, token: str, body: bytes) -> str:
    return uvloop.run(grpc_report(server.port, _h2_tls(), token, body))[1]


def test_the_agents_report_is_answered_ok_and_others_refused(
    server: Server, cluster: BenchCluster
) -> None:
    assert _report(server, cluster.token(*member_pod(0)), report_body(0)) == "OK"
    garbage = cluster.token(*member_pod(1), pad="x" * 11000, sign=False)
    assert _report(server, garbage, report_body(1)) == "UNAUTHENTICATED"
    # member 1's (valid) token with member 0's report
    assert _report(server, cluster.token(*member_pod(1)), report_body(0)) == "PERMISSION_DENIED"
    state = server.state()
    assert state["accepted"] >= 1
    assert state["refused"]["UNAUTHENTICATED"] >= 1
    assert state["refused"]["PERMISSION_DENIED"] >= 1


def test_an_attack_runs_and_the_state_serves_the_suites_delta(
    server: Server, cluster: BenchCluster
) -> None:
    before = server.state()
    seen = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.channel_attacks_grpc",
            *("--attack", "garbage-tokens", "--port", str(server.port)),
            *("--addresses", "4", "--seconds", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=40,
        env=os.environ | {PRIVATE_ENV: cluster.pem.decode()},
        check=True,
    )
    attacker = json.loads(seen.stdout)
    assert attacker.get("UNAUTHENTICATED", 0) > 0, attacker
    during = after = server.state()
    delta = _state_delta(before, during, after, 2.0)
    assert delta["refused"]["UNAUTHENTICATED"] == attacker["UNAUTHENTICATED"], (delta, attacker)
    assert delta["peaks"]["connections"] >= 0
    assert {"rss_mib", "peak_mib", "cpu_s", "connections", "accepted"} <= set(after)
