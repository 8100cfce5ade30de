"""The agent's `Reporter`: a report goes over the channel the status names, or on the pod when
there is none or it fails (and the failed channel is left alone for a while, so a channel that
does not answer costs one timeout, not one per report); a record sent to a leader that is
gone is sent again to the new one. Stand-ins for the channel and the API here;
tests/integration/test_report_channel.py runs both for real."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from jobset_inplace.agent.channel import ChannelError
from jobset_inplace.agent.config import Config
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.runner import CHANNEL_RETRY, Reporter
from jobset_inplace.protocol.envelope import message_values
from jobset_inplace.protocol.gangstate import Endpoint, Front
from jobset_inplace.protocol.report import AgentReport, decode_report

POD = "/api/v1/namespaces/ns/pods/p-0"
LEADER_1 = Endpoint("https://10.0.0.9:9444/v1/reports", "a" * 64, "one")
LEADER_2 = Endpoint("https://10.0.0.8:9444/v1/reports", "b" * 64, "two")
EPOCH_3 = {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "200,100"}


class Channel:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, str]]] = []
        self.down = False
        self.attempts = 0

    def send(self, endpoint: Endpoint, report: AgentReport) -> None:
        self.attempts += 1
        if self.down:
            raise ChannelError(f"{endpoint.url}: TimeoutError: timed out")
        self.sent.append((endpoint.leader, message_values(report)))  # as it goes on the wire


class Api:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def merge_patch(self, path: str, body: Any) -> Any:
        assert path == POD
        self.patches.append(body["metadata"]["annotations"])
        return {}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def reporter(tmp_path: Path) -> tuple[Reporter, Channel, Api, io.StringIO]:
    cfg = Config(
        pod_name="p-0", namespace="ns", gangstate="g", state_dir=tmp_path, local_dir=None,
        persistent_dir=None, restart_exit_code=88, probe_port=1, server="http://x",
        token_file=None, ca_file=None,
    )  # fmt: skip
    out = io.StringIO()
    return Reporter(cfg, Log(out)), Channel(), Api(), out


def report(
    r: Reporter, ch: Channel, api: Api, values: dict[str, str], *, fresh: bool = True
) -> str:
    update, error = decode_report(values)
    assert update is not None, error
    return r.report(update, fresh=fresh, channel=ch, kube=api)  # type: ignore[arg-type]


def resend(r: Reporter, ch: Channel, api: Api, epoch: int) -> str | None:
    return r.resend(epoch, ch, api)  # type: ignore[arg-type]


def test_reports_go_over_the_channel_the_status_names(tmp_path: Path, clock: list[float]) -> None:
    r, ch, api, _ = reporter(tmp_path)
    r.endpoint = LEADER_1
    assert report(r, ch, api, EPOCH_3) == "channel"
    assert report(r, ch, api, {names.REPORT_EXITED: "3"}, fresh=False) == "channel"
    assert ch.sent == [("one", EPOCH_3), ("one", {**EPOCH_3, names.REPORT_EXITED: "3"})]
    assert api.patches == []


def test_without_a_channel_a_new_epochs_report_replaces_the_pods_keys(
    tmp_path: Path, clock: list[float]
) -> None:
    r, ch, api, _ = reporter(tmp_path)
    assert report(r, ch, api, EPOCH_3) == "pod"
    assert api.patches[0][names.REPORT_EPOCH] == "3"
    # the older epoch's exit, hang and straggler windows are removed with it
    assert api.patches[0][names.REPORT_EXITED] is None
    assert api.patches[0][names.REPORT_BUSY] is None
    assert report(r, ch, api, {names.REPORT_HUNG: "3"}, fresh=False) == "pod"
    # an addition writes the record again (nothing removed, the straggler windows left alone)
    assert api.patches[1] == {**EPOCH_3, names.REPORT_HUNG: "3"}


def test_an_exit_after_the_channel_failed_goes_on_the_pod_with_its_epochs_report(
    tmp_path: Path, clock: list[float]
) -> None:
    """Epoch 3's report went over the channel, then the channel failed: the exit written on
    the pod carries the whole record, so it ranks above the channel's (core/decode.py)."""
    r, ch, api, _ = reporter(tmp_path)
    r.endpoint = LEADER_1
    assert report(r, ch, api, EPOCH_3) == "channel"
    ch.down = True
    assert report(r, ch, api, {names.REPORT_EXITED: "3"}, fresh=False) == "pod"
    assert api.patches[-1] == {**EPOCH_3, names.REPORT_EXITED: "3"}


def test_a_failed_channel_is_left_alone_for_a_while(tmp_path: Path, clock: list[float]) -> None:
    r, ch, api, out = reporter(tmp_path)
    r.endpoint = LEADER_1
    ch.down = True
    assert report(r, ch, api, EPOCH_3) == "pod"
    assert "writing reports on the pod" in out.getvalue()
    ch.down = False
    assert report(r, ch, api, {names.REPORT_EXITED: "3"}, fresh=False) == "pod", "not retried yet"
    clock[0] += CHANNEL_RETRY.delay(1) + 0.01
    assert report(r, ch, api, EPOCH_3) == "channel"
    ch.down = True
    assert report(r, ch, api, EPOCH_3) == "pod"
    r.endpoint = LEADER_2  # a new leader: its channel is tried at once
    ch.down = False
    assert report(r, ch, api, EPOCH_3) == "channel"


def tried_after(r: Reporter, ch: Channel, api: Api, clock: list[float]) -> float:
    """Seconds until the failed channel is tried again (to 0.05 s), each report on the pod
    until then."""
    attempts, waited = ch.attempts, 0.0
    while True:
        where = report(r, ch, api, EPOCH_3)
        if ch.attempts > attempts:
            return waited
        assert where == "pod"
        clock[0] += 0.05
        waited += 0.05


def test_a_channel_refused_once_is_tried_again_within_a_second_then_less_often(
    tmp_path: Path, clock: list[float]
) -> None:
    """A transient refusal (a new leader's burst) costs about a second of reports on the pod,
    not a minute; a channel that stays down is tried less often, at most once a minute."""
    r, ch, api, _ = reporter(tmp_path)
    r.endpoint = LEADER_1
    ch.down = True
    assert report(r, ch, api, EPOCH_3) == "pod"
    waits = [tried_after(r, ch, api, clock) for _ in range(8)]
    for n, wait in enumerate(waits, start=1):  # jittered: half the rule's delay to all of it
        assert CHANNEL_RETRY.delay(n) / 2 - 0.05 <= wait <= CHANNEL_RETRY.delay(n) + 0.05, waits
    assert waits[0] <= 1.05
    assert max(waits) <= 60.05
    ch.down = False
    assert tried_after(r, ch, api, clock) <= 60.05
    ch.down = True
    assert report(r, ch, api, EPOCH_3) == "pod"
    ch.down = False
    assert tried_after(r, ch, api, clock) <= 1.05, "a success starts the backoff afresh"


def test_a_new_leader_gets_the_record_again(tmp_path: Path, clock: list[float]) -> None:
    r, ch, api, _ = reporter(tmp_path)
    r.endpoint = LEADER_1
    report(r, ch, api, EPOCH_3)
    report(r, ch, api, {names.REPORT_EXITED: "3"}, fresh=False)
    assert resend(r, ch, api, 3) is None  # same leader
    r.endpoint = dataclasses.replace(LEADER_1, fronts=(Front(LEADER_2.url, "c" * 64),))
    assert resend(r, ch, api, 3) is None, "the same leader naming a front: it has the record"
    r.endpoint = LEADER_2
    assert resend(r, ch, api, 4) is None, "the status moved on: a new report follows"
    assert resend(r, ch, api, 3) == "channel"
    assert ch.sent[-1] == ("two", {**EPOCH_3, names.REPORT_EXITED: "3"})
    assert resend(r, ch, api, 3) is None, "once"


def test_a_record_written_on_the_pod_is_not_sent_again(tmp_path: Path, clock: list[float]) -> None:
    r, ch, api, _ = reporter(tmp_path)
    report(r, ch, api, EPOCH_3)  # no channel: on the pod, where any leader reads it
    r.endpoint = LEADER_2
    assert resend(r, ch, api, 3) is None
    assert ch.sent == []


def test_the_first_report_over_the_channel_removes_the_one_left_on_the_pod(
    tmp_path: Path, clock: list[float]
) -> None:
    r, ch, api, _ = reporter(tmp_path)
    r.endpoint = LEADER_1
    ch.down = True  # the leader is down: the exit goes on the pod
    assert report(r, ch, api, {names.REPORT_EXITED: "3"}, fresh=False) == "pod"
    ch.down = False
    r.endpoint = LEADER_2  # a new leader: the next epoch's report over its channel
    assert report(r, ch, api, {names.REPORT_EPOCH: "4", names.REPORT_STEPS: "200"}) == "channel"
    assert api.patches[-1] == dict.fromkeys(names.CHANNEL_REPORT_KEYS), "the pod's trace removed"
    assert report(r, ch, api, {names.REPORT_HUNG: "4"}, fresh=False) == "channel"
    assert len(api.patches) == 2, "removed once"
