"""Where the e2e suite's default members go and what they run (testbed/workloads.py)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed import workloads


def _member(jobset: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]
    return pod


def test_on_kwok_nodes_the_member_is_a_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JSI_E2E_NODE_SELECTOR", raising=False)
    monkeypatch.delenv(workloads.E2E_IMAGE_ENV, raising=False)
    pod = _member(workloads.jobset("js", [("w", 1, 2)]))
    assert pod["nodeSelector"] == {"type": "kwok"}
    assert pod["containers"][0]["image"] == "trainer:local"


def test_on_another_cluster_the_member_runs_the_given_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JSI_E2E_NODE_SELECTOR", "jobset-inplace.dev/real-node=true")
    monkeypatch.setenv(workloads.E2E_IMAGE_ENV, "jobset-inplace/python:local")
    pod = _member(workloads.jobset("js", [("w", 1, 2)]))
    assert pod["nodeSelector"] == {"jobset-inplace.dev/real-node": "true"}
    (container,) = pod["containers"]
    assert container["image"] == "jobset-inplace/python:local"
    assert container["command"] == ["sleep", "infinity"]


def test_a_malformed_node_selector_is_refused_with_its_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JSI_E2E_NODE_SELECTOR", "real-node")
    with pytest.raises(ValueError, match="key=value"):
        workloads.e2e_node_selector()
