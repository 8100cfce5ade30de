"""The trainer monitor: it reports a trainer's non-zero exit (process scope) or hang (hang
detection on) in the running epoch once, and restarts the whole pod when the report keeps
failing (a crash or hang is never left unseen).
The API is a recording stand-in here; tests/integration/test_agent.py runs the monitor against
the real API server."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from jobset_inplace import launcher, names
from jobset_inplace.agent.channel import ChannelError
from jobset_inplace.agent.config import Config
from jobset_inplace.agent.hang import HangRule
from jobset_inplace.agent.kubeapi import ApiError, KubeApi
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.logic import Open, Report
from jobset_inplace.agent.probe import BarrierState
from jobset_inplace.agent.runner import (
    EXIT_REPORT_DEADLINE_S,
    PROGRESS_NOTE_MIN_S,
    PROGRESS_READ_SECONDS,
    Agent,
    TrainerMonitor,
)
from jobset_inplace.core import policy
from jobset_inplace.names import RestartScope
from jobset_inplace.protocol.envelope import Message, message_values
from jobset_inplace.protocol.gangstate import Endpoint
from jobset_inplace.trainer import save_checkpoint
from jobset_inplace.trainer.progress import ProgressReporter, decode_span, read_progress
from jobset_inplace.trainer.stop import StopAt, read_stop


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


NO_HANG_RULE = HangRule()


def monitor(
    tmp_path: Path, scope: str = "process", hang: HangRule = NO_HANG_RULE
) -> tuple[TrainerMonitor, RecordingApi, list[int], list[float]]:
    cfg = Config(
        pod_name="p-0", namespace="ns", gangstate="g", state_dir=tmp_path, local_dir=None,
        persistent_dir=None, restart_exit_code=88, probe_port=1, server="http://x",
        token_file=None, ca_file=None, restart_scope=RestartScope(scope),
        launched=("trainer",) if scope == "process" else (), hang=hang,
    )  # fmt: skip
    api = RecordingApi()
    agent = Agent(
        cfg, KubeApi("http://x", None, None), BarrierState(), Log(io.StringIO()), started=0
    )
    exits: list[int] = []
    now = [0.0]
    m = TrainerMonitor(agent, api, exit_process=exits.append, clock=lambda: now[0])  # type: ignore[arg-type]
    return m, api, exits, now


def launcher_state(tmp_path: Path, state: str, epoch: int, code: int | None) -> None:
    doc = {"state": state, "epoch": epoch, "code": code}
    launcher.state_file(tmp_path, "trainer").write_text(json.dumps(doc))


def test_reports_a_crash_in_the_running_epoch_once(tmp_path: Path) -> None:
    m, api, exits, _ = monitor(tmp_path)
    launcher_state(tmp_path, "exited", 2, 3)
    assert m.attempt()
    assert api.patches == []  # no epoch running (the barrier is not open): nothing to report
    m.agent.running = (2, 0.0)
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
    m.reported.clear()
    assert m.attempt()
    assert len(api.patches) == 1, "exit 0 is no failure"
    assert exits == []


def test_restarts_the_pod_when_the_report_keeps_failing(tmp_path: Path) -> None:
    m, api, exits, now = monitor(tmp_path)
    m.agent.running = (1, 0.0)
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
    m.agent.running = (1, 0.0)
    launcher_state(tmp_path, "exited", 1, 3)
    api.error = ApiError(500, "InternalError", "etcd timeout")
    assert not m.attempt()
    api.error = None
    now[0] = EXIT_REPORT_DEADLINE_S * 2
    assert m.attempt()
    assert m.failing_since is None
    assert exits == []


HUNG = "/api/v1/namespaces/ns/pods/p-0", {"metadata": {"annotations": {names.REPORT_HUNG: "3"}}}


def at(m: TrainerMonitor, now: list[float], t: float) -> bool:
    now[0] = t
    return m.check()


def test_a_planned_stop_is_answered_passed_on_and_its_parking_reported(tmp_path: Path) -> None:
    """core/planned_moves.py: asked (no step yet), the agent says how far its trainers are,
    once; given the step, it writes stop.json for them (report_progress answers True there);
    once every trainer parked at it, it says so, once. Another epoch's stop is not ours."""
    m, api, _, now = monitor(tmp_path, "pod")
    m.agent.running = (3, 0.0)
    m.agent.planned = (2, None)
    report = ProgressReporter(tmp_path, "trainer")
    assert not report(40)
    assert not at(m, now, 1), "an older epoch's planned stop: nothing"
    m.agent.planned = (3, None)
    assert at(m, now, 2)
    [(_, patch)] = api.patches
    epoch, _, span = patch["metadata"]["annotations"][names.REPORT_PROGRESS_NOW].partition(":")
    answer = decode_span(span)
    assert epoch == "3"
    assert answer is not None
    assert (answer.first_step, answer.last_step) == (40, 40)
    assert not at(m, now, 3), "answered once"
    m.agent.planned = (3, 45)
    assert not at(m, now, 4)
    assert read_stop(tmp_path) == StopAt(3, 45)
    assert not report(44)
    assert report(45), "the trainer's report_progress says: stop here"
    forever = "jobset_inplace.trainer.progress.park_forever"  # (cut short for the test)
    with pytest.raises(SystemExit), mock.patch(forever, side_effect=SystemExit):
        report.park(45)
    assert at(m, now, 5)
    assert api.patches[-1][1]["metadata"]["annotations"][names.REPORT_PARKED] == "3"
    assert not at(m, now, 6), "reported once"
    m.agent.kube = api  # type: ignore[assignment]
    m.agent._report(Report(epoch=4, barrier_closed=True))
    m.agent._open(Open(epoch=4, resume_step=45))
    assert read_stop(tmp_path) is None, "a planned stop is one epoch's"


def test_reports_a_trainer_that_stopped_advancing_once(tmp_path: Path) -> None:
    m, api, _, now = monitor(tmp_path, "pod", HangRule(hang_timeout=30))
    m.agent.running = (3, 0.0)
    progress = ProgressReporter(tmp_path, "trainer")
    assert not at(m, now, 100), "no first step yet, and no startup-timeout: no hang"
    progress(5)
    assert not at(m, now, 101)  # first seen at 101
    progress(6)
    assert not at(m, now, 120)  # advanced: seen at 120
    assert not at(m, now, 149)
    assert at(m, now, 150)
    assert api.patches == [HUNG]
    assert not at(m, now, 200), "reported once per epoch"
    assert api.patches == [HUNG]


def test_reports_a_trainer_that_never_made_a_first_step(tmp_path: Path) -> None:
    m, api, _, now = monitor(tmp_path, "pod", HangRule(startup_timeout=60))
    m.agent.running = (3, 10.0)  # the barrier opened at 10
    assert not at(m, now, 69)
    assert at(m, now, 70)
    assert api.patches == [HUNG]


def test_a_new_epoch_starts_the_watch_over(tmp_path: Path) -> None:
    m, api, _, now = monitor(tmp_path, "pod", HangRule(hang_timeout=30, startup_timeout=60))
    m.agent.running = (2, 0.0)
    ProgressReporter(tmp_path, "trainer")(7)
    assert not at(m, now, 1)
    m.agent.running = (3, 20.0)  # the record of epoch 2 is removed when 3's barrier opens
    (tmp_path / "progress-trainer.json").unlink()
    assert not at(m, now, 40), "the epoch-2 record's age does not count in epoch 3"
    assert at(m, now, 80), "epoch 3: no first step 60 s after its barrier opened"
    assert api.patches == [HUNG]


def test_no_hang_while_no_trainer_runs(tmp_path: Path) -> None:
    m, api, _, now = monitor(tmp_path, "process", HangRule(hang_timeout=30))
    m.agent.running = (3, 0.0)
    ProgressReporter(tmp_path, "trainer")(1)
    launcher_state(tmp_path, "running", 3, None)
    assert not at(m, now, 1)
    launcher_state(tmp_path, "stopped", 3, None)  # being stopped for a new epoch
    assert not at(m, now, 100)
    launcher_state(tmp_path, "running", 3, None)
    assert at(m, now, 101)
    assert api.patches == [HUNG]


def test_a_crash_is_reported_before_a_hang(tmp_path: Path) -> None:
    m, api, _, now = monitor(tmp_path, "process", HangRule(startup_timeout=10))
    m.agent.running = (3, 0.0)
    launcher_state(tmp_path, "exited", 3, 3)
    assert at(m, now, 50)
    assert [p[1]["metadata"]["annotations"] for p in api.patches] == [{names.REPORT_EXITED: "3"}]


def test_reads_the_progress_records_at_most_once_a_read_period(tmp_path: Path) -> None:
    m, _, _, now = monitor(tmp_path, "pod", HangRule(startup_timeout=60))
    m.agent.running = (3, 0.0)
    before = 60 - PROGRESS_READ_SECONDS / 2
    assert not at(m, now, before)
    assert not at(m, now, 60), f"next read at {before + PROGRESS_READ_SECONDS}"
    assert at(m, now, before + PROGRESS_READ_SECONDS)


def test_a_short_hang_timeout_is_found_within_a_read_period(tmp_path: Path) -> None:
    """The shortest hang-timeout the policy accepts is found no later than one read period
    after it ran out, and not before."""
    shortest = policy.HANG_TIMEOUT_RANGE_S[0]
    m, _, _, now = monitor(tmp_path, "pod", HangRule(hang_timeout=shortest))
    m.agent.running = (3, 0.0)
    ProgressReporter(tmp_path, "trainer")(7)
    assert not at(m, now, 1.0)  # the record is first seen here
    t = 1.0
    while t + PROGRESS_READ_SECONDS < 1.0 + shortest:
        t += PROGRESS_READ_SECONDS
        assert not at(m, now, t), f"hung at {t} s, before the hang-timeout ran out"
    assert at(m, now, t + PROGRESS_READ_SECONDS), "found at the first read past the timeout"


def test_publishes_the_busy_windows_and_retries_without_restarting(tmp_path: Path) -> None:
    m, api, exits, now = monitor(tmp_path, "pod")
    local = tmp_path / "local"
    for step in (10, 20):  # the newest complete checkpoint goes with the windows
        save_checkpoint(step, lambda d: None, env={"JSI_CHECKPOINT_LOCAL_DIR": str(local)})
    m.agent.cfg = dataclasses.replace(
        m.agent.cfg, busy_window=60.0, busy_windows=2, local_dir=local
    )
    m = TrainerMonitor(m.agent, api, exit_process=exits.append, clock=lambda: now[0])  # type: ignore[arg-type]
    m.agent.running = (3, 0.0)
    report = ProgressReporter(tmp_path, "trainer")
    report(1, busy_s=0.1)
    assert not at(m, now, 1)  # the first window starts
    for step in range(2, 12):
        report(step, busy_s=0.25)
    api.error = ApiError(500, "InternalError", "etcd timeout")
    assert not at(m, now, 61)
    assert api.patches == []
    api.error = None
    assert not at(m, now, 62), "retried at the next read"
    busy = {
        names.REPORT_BUSY: "250",
        names.REPORT_NEWEST_STEP: "20",
        names.REPORT_BUSY_EPOCH: "3",
    }
    assert api.patches == [("/api/v1/namespaces/ns/pods/p-0", {"metadata": {"annotations": busy}})]
    assert exits == [], "an advisory signal never restarts the pod"


def test_a_new_epochs_report_says_how_far_the_trainers_got_before_it(tmp_path: Path) -> None:
    """The progress step (core/goodput.py): the newest step this pod's trainers reported
    progress for, from the records the last epoch left; none, no key; the records are cleared
    when the new epoch's barrier opens, so the next report cannot repeat them."""
    m, _, _, _ = monitor(tmp_path)
    api = RecordingApi()
    agent = m.agent
    agent.kube = api  # type: ignore[assignment]
    agent._report(Report(epoch=2, barrier_closed=True))
    [(_, first)] = api.patches
    assert first["metadata"]["annotations"][names.REPORT_PROGRESS_STEP] is None, "no records"
    assert first["metadata"]["annotations"][names.REPORT_PROGRESS_SPAN] is None
    trainer, worker = ProgressReporter(tmp_path, "trainer"), ProgressReporter(tmp_path, "worker-1")
    trainer(40)
    worker(39)
    trainer(41)
    worker(43)
    agent._report(Report(epoch=3, barrier_closed=True))
    annotations = api.patches[-1][1]["metadata"]["annotations"]
    assert (annotations[names.REPORT_EPOCH], annotations[names.REPORT_PROGRESS_STEP]) == ("3", "43")
    # the span: from the earliest first step of the pod's trainers to the newest step
    span = decode_span(annotations[names.REPORT_PROGRESS_SPAN])
    records = read_progress(tmp_path)
    assert span is not None
    earliest = min(records.values(), key=lambda r: (r.first_at or 0, r.first_step or 0))
    assert (span.first_step, span.first_at) == (earliest.first_step, earliest.first_at)
    assert (span.last_step, span.last_at) == (43, records["worker-1"].at)
    agent._open(Open(epoch=3, resume_step=None))
    assert read_progress(tmp_path) == {}, "epoch 3's trainers start with no records"


class RecordingChannel:
    """Records what is sent over the report channel; fails with ``error`` while it is set."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []
        self.error: ChannelError | None = None

    def send(self, endpoint: Endpoint, message: Message) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        self.sent.append(message_values(message))  # as it goes on the wire
        return {}


def test_notes_how_far_the_trainers_are_over_the_channel_only(tmp_path: Path) -> None:
    """Goodput of an epoch whose pods all die: the agent tells the leader how far its trainers
    are, first once their pace is known (two steps), then each time the note's reach has about
    doubled, at most every PROGRESS_NOTE_S, and anew in a new epoch; a note not taken is not
    retried before the next one and never fails the monitor; without a channel nothing is
    sent and nothing is written on the pod."""
    m, api, exits, now = monitor(tmp_path, "pod")
    channel = RecordingChannel()
    m.channel = channel  # type: ignore[assignment]
    m.agent.reporter.endpoint = Endpoint("https://leader:9444/v1/reports", "0" * 64, "l")
    m.agent.running = (3, 0.0)
    wall = 1_790_000_000.0  # the trainers' clock, as their progress records date steps
    progress = ProgressReporter(tmp_path, "trainer")

    def trained(step: int, at: float) -> None:
        with mock.patch("jobset_inplace.trainer.progress.time.time", return_value=wall + at):
            progress(step)

    def newest() -> tuple[str, int, float]:
        epoch, _, raw = channel.sent[-1][names.REPORT_PROGRESS_NOTE].partition(":")
        span = decode_span(raw)
        assert span is not None
        return epoch, span.last_step, round(span.last_at - span.first_at, 3)

    assert not at(m, now, 1)
    trained(5, 0.0)
    assert not at(m, now, 2)
    assert channel.sent == [], "one step: no pace yet"
    trained(6, 0.2)
    assert not at(m, now, 2.5)
    assert channel.sent == [], f"notes looked for once a {PROGRESS_NOTE_MIN_S} s"
    at(m, now, 3)
    assert newest() == ("3", 6, 0.2)
    trained(20, 3.0)
    at(m, now, 4)  # a reach of 0.2 s: the next note a read later
    assert newest() == ("3", 20, 3.0)
    trained(200, 40.0)
    at(m, now, 6.9)
    assert len(channel.sent) == 2, "a reach of 3 s: the next note 3 s later"
    at(m, now, 7)
    assert newest() == ("3", 200, 40.0)
    trained(300, 70.0)
    at(m, now, 7 + names.PROGRESS_NOTE_S - 0.1)
    assert len(channel.sent) == 3, f"a reach of 40 s: the next note {names.PROGRESS_NOTE_S} s later"
    channel.error = ChannelError("HTTP 503")
    now[0] = 7 + names.PROGRESS_NOTE_S
    assert m.attempt(), "a note not taken does not fail the monitor"
    channel.error = None
    at(m, now, 7 + names.PROGRESS_NOTE_S + 1)
    assert len(channel.sent) == 3, "not retried before the next one"
    at(m, now, 7 + 2 * names.PROGRESS_NOTE_S)
    assert newest()[:2] == ("3", 300)
    m.agent.running = (4, 100.0)
    at(m, now, 100)
    assert newest()[0] == "4", "a new epoch: at once"
    m.agent.reporter.endpoint = None
    trained(301, 71.0)
    at(m, now, 100 + 3 * names.PROGRESS_NOTE_S)
    assert len(channel.sent) == 5, "no channel named: no note"
    assert api.patches == []
    assert exits == []
