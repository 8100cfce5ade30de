"""The simulated kubelet's projected report token: requested when a pod's agent first starts
and again at 80 % of its life, as the kubelet does (a 10,000-pod gang takes most of an hour to
start here, and tokens of its first pods expired during the measured failures without it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from bench import fleet as fleet_module
from bench.fleet import ROTATE_RETRY_S, TOKEN_ROTATE_AT, Fleet, SimAgent
from jobset_inplace import names


@pytest.fixture
def fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Fleet, list[tuple[float, Callable[[], None]]], list[str]]:
    issued: list[str] = []

    def pod_token(core: object, namespace: str, **kw: object) -> str:
        if kw["pod"] == "broken":
            raise client.exceptions.ApiException(status=500, reason="apiserver overloaded")
        assert kw["audience"] == names.REPORT_TOKEN_AUDIENCE
        issued.append(f"token-{len(issued) + 1}")
        return issued[-1]

    monkeypatch.setattr(fleet_module, "pod_token", pod_token)
    f = Fleet(
        client.ApiClient(),
        server="https://127.0.0.1:1",
        token_file=tmp_path / "token",
        ca_file=tmp_path / "ca",
        namespace="bench",
        gang="g",
        restart_delay=1.0,
    )
    later: list[tuple[float, Callable[[], None]]] = []
    monkeypatch.setattr(f, "_later", lambda delay, fn: later.append((delay, fn)))
    return f, later, issued


def test_a_pods_token_is_mounted_then_rotated_at_80_percent_of_its_life(
    fleet: tuple[Fleet, list[tuple[float, Callable[[], None]]], list[str]],
) -> None:
    f, later, issued = fleet
    agent = SimAgent("p", "uid-p", ["trainer"])
    f.agents["p"] = agent
    f._start_reporter(agent)
    assert agent.token_file is not None
    assert agent.token_file.read_text() == "token-1"
    ((delay, rotate),) = later
    assert delay == TOKEN_ROTATE_AT * names.REPORT_TOKEN_SECONDS
    rotate()
    assert agent.token_file.read_text() == "token-2"  # the file the agent reads per report
    assert len(later) == 2
    assert later[1][0] == delay  # and again at 80 % of the new one's life
    del f.agents["p"]  # the pod is gone: no more tokens for it
    later[1][1]()
    assert issued == ["token-1", "token-2"]
    assert len(later) == 2


def test_a_failed_rotation_is_tried_again_and_said(
    fleet: tuple[Fleet, list[tuple[float, Callable[[], None]]], list[str]],
) -> None:
    f, later, _ = fleet
    agent = SimAgent("broken", "uid-b", ["trainer"])
    f.agents["broken"] = agent
    f._rotate(agent)
    assert [d for d, _ in later] == [ROTATE_RETRY_S]
    assert any("token rotation" in e and "apiserver overloaded" in e for e in f.errors)
