"""The simulated kubelet's projected report token: requested when a pod's agent first starts
and again at 80 % of its life, as the kubelet does (a 10,000-pod gang takes most of an hour to
start here, and tokens of its first pods expired during the measured failures without it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from kubernetes import client

from bench import fleet as fleet_module
from bench.fleet import ROTATE_RETRY_S, TOKEN_ROTATE_AT, Fleet, SimAgent
from jobset_inplace import names


class Rig(NamedTuple):
    fleet: Fleet
    later: list[tuple[float, Callable[[], None]]]  # (delay, what) the fleet's timer was given
    issued: list[str]  # the tokens the apiserver issued

    def agent(self, pod: str) -> SimAgent:
        """A member pod's agent, known to the fleet."""
        agent = self.fleet.agents[pod] = SimAgent(pod, f"uid-{pod}", ["trainer"])
        return agent


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
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
    return Rig(f, later, issued)


def test_a_pods_token_is_mounted_then_rotated_at_80_percent_of_its_life(rig: Rig) -> None:
    f, later, issued = rig
    agent = rig.agent("p")
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


def test_a_failed_rotation_is_tried_again_and_said(rig: Rig) -> None:
    f, later, _ = rig
    f._rotate(rig.agent("broken"))
    assert [d for d, _ in later] == [ROTATE_RETRY_S]
    assert any("token rotation" in e and "apiserver overloaded" in e for e in f.errors)
