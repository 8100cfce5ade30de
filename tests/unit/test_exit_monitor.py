"""The process scope's exit monitor: it reports a trainer's non-zero exit in the running epoch
once, and restarts the whole pod when the report keeps failing (a crash is never left unseen).
The API is a recording stand-in here; tests/integration/test_agent.py runs the monitor against
the real API server."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from jobset_inplace import launcher, names
from jobset_inplace.agent.config import Config
from jobset_inplace.agent.kubeapi import ApiError, KubeApi
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.probe import BarrierState
from jobset_inplace.agent.runner import EXIT_REPORT_DEADLINE_S, Agent, ExitMonitor


class RecordingApi:
    """Records merge patches; fails with ``error`` while it is set."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []
        self.error: ApiError | None = None

    def merge_patch(self, path: str, body: Any) -> Any:
        if self.error is not None:
            raise self.error
        self.patches.append((path, body))
        return {}


def monitor(tmp_path: Path) -> tuple[ExitMonitor, RecordingApi, list[int], list[float]]:
    cfg = Config(
        pod_name="p-0", namespace="ns", gangstate="g", state_dir=tmp_path, local_dir=None,
        persistent_dir=None, restart_exit_code=88, probe_port=1, server="http://x",
        token_file=None, ca_file=None, restart_scope="process", launched=("trainer",),
    )  # fmt: skip
    api = RecordingApi()
    agent = Agent(
        cfg, KubeApi("http://x", None, None), BarrierState(), Log(io.StringIO()), started=0
    )
    exits: list[int] = []
    now = [0.0]
    m = ExitMonitor(agent, api, exit_process=exits.append, clock=lambda: now[0])  # type: ignore[arg-type]
    return m, api, exits, now


def launcher_state(tmp_path: Path, state: str, epoch: int, code: int | None) -> None:
    doc = {"state": state, "epoch": epoch, "code": code}
    launcher.state_file(tmp_path, "trainer").write_text(json.dumps(doc))


def test_reports_a_crash_in_the_running_epoch_once(tmp_path: Path) -> None:
    m, api, exits, _ = monitor(tmp_path)
    launcher_state(tmp_path, "exited", 2, 3)
    assert m.attempt()
    assert api.patches == []  # no epoch running (the barrier is not open): nothing to report
    m.agent.running_epoch = 2
    assert m.attempt()
    assert api.patches == [
        (
            "/api/v1/namespaces/ns/pods/p-0",
            {"metadata": {"annotations": {names.REPORT_EXITED: "2"}}},
        )
    ]
    assert m.attempt()
    assert len(api.patches) == 1, "reported once per epoch"
    launcher_state(tmp_path, "exited", 2, 0)
    m.reported = None
    assert m.attempt()
    assert len(api.patches) == 1, "exit 0 is no failure"
    assert exits == []


def test_restarts_the_pod_when_the_report_keeps_failing(tmp_path: Path) -> None:
    m, api, exits, now = monitor(tmp_path)
    m.agent.running_epoch = 1
    launcher_state(tmp_path, "exited", 1, 3)
    api.error = ApiError(403, "Forbidden", "pods is forbidden")
    assert not m.attempt()
    now[0] = EXIT_REPORT_DEADLINE_S - 0.1
    assert not m.attempt()
    assert exits == []
    now[0] = EXIT_REPORT_DEADLINE_S
    m.attempt()
    assert exits == [88]


def test_a_report_that_succeeds_in_time_resets_the_deadline(tmp_path: Path) -> None:
    m, api, exits, now = monitor(tmp_path)
    m.agent.running_epoch = 1
    launcher_state(tmp_path, "exited", 1, 3)
    api.error = ApiError(500, "InternalError", "etcd timeout")
    assert not m.attempt()
    api.error = None
    now[0] = EXIT_REPORT_DEADLINE_S * 2
    assert m.attempt()
    assert m.failing_since is None
    assert exits == []
