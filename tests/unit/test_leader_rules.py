"""The leader-election decisions (pure): who may write the Lease, what is written, when a
leader must stop, and which timings are refused."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace

import pytest

from jobset_inplace import names
from jobset_inplace.controller import operator
from jobset_inplace.core.leader_rules import (
    ElectionTiming,
    LeaseRecord,
    Step,
    claim,
    lease_body,
    must_stop,
    next_step,
    record_of,
    released,
)
from jobset_inplace.runtime import manager
from jobset_inplace.runtime.leader_election import Election
from jobset_inplace.runtime.manager import Settings

OTHER = LeaseRecord("b", 15, acquired=100.0, renewed=200.0, transitions=2)


@pytest.mark.parametrize(
    ("record", "now", "observed_since", "step"),
    [
        (None, 0.0, 0.0, Step.CREATE),
        (LeaseRecord("a", 15, 1.0, 2.0), 0.0, 0.0, Step.RENEW),
        (LeaseRecord("", 1), 0.0, 0.0, Step.TAKE),  # released
        (OTHER, 14.9, 0.0, Step.WAIT),  # held, not silent long enough
        (OTHER, 15.0, 0.0, Step.TAKE),  # silent for the lease duration, by our clock
        (OTHER, 1000.0, 990.0, Step.WAIT),  # just changed: our clock counts from the change
    ],
)
def test_next_step(
    record: LeaseRecord | None, now: float, observed_since: float, step: Step
) -> None:
    assert next_step(record, "a", now=now, observed_since=observed_since) is step


def test_expiry_ignores_the_holders_renew_time() -> None:
    """renewTime is the holder's clock: an old one does not make the Lease free."""
    stale_clock = LeaseRecord("b", 15, acquired=0.0, renewed=0.0)
    assert next_step(stale_clock, "a", now=5.0, observed_since=0.0) is Step.WAIT


def test_claim_counts_transitions_only_when_the_holder_changes() -> None:
    assert claim(None, "a", wall=50.0, duration_s=15) == LeaseRecord("a", 15, 50.0, 50.0, 0)
    taken = claim(OTHER, "a", wall=300.0, duration_s=15)
    assert taken == LeaseRecord("a", 15, acquired=300.0, renewed=300.0, transitions=3)
    renewed = claim(taken, "a", wall=302.0, duration_s=15)
    assert renewed == LeaseRecord("a", 15, acquired=300.0, renewed=302.0, transitions=3)


def test_release_hands_over_at_once() -> None:
    mine = LeaseRecord("a", 15, acquired=300.0, renewed=310.0, transitions=3)
    out = released(mine, wall=320.0)
    assert out == LeaseRecord("", 1, acquired=320.0, renewed=320.0, transitions=3)
    assert next_step(out, "b", now=0.0, observed_since=0.0) is Step.TAKE


def test_a_leader_stops_at_the_renew_deadline() -> None:
    t = ElectionTiming()
    assert not must_stop(100.0, 109.9, t)
    assert must_stop(100.0, 110.0, t)


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        (ElectionTiming(15.5, 10, 2), "whole seconds"),
        (ElectionTiming(0, 0, 0), "whole seconds"),
        (ElectionTiming(15, 15, 2), "renew-deadline 15s must be shorter than"),
        (ElectionTiming(15, 10, 9), r"longer than 1.2 x --leader-elect-retry-period 9s"),
        (ElectionTiming(15, 10, 0), "retry-period 0s"),
    ],
)
def test_timings_that_could_let_two_leaders_act_are_refused(
    timing: ElectionTiming, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        timing.check()


def test_with_the_report_channel_a_successor_acts_only_after_every_agent_lease_ended() -> None:
    """The predecessor answers for up to renew-deadline after its last renewal; each answer
    is a lease of names.LEASE_S, its trainer stopped names.FENCE_MARGIN_S later."""
    fence = names.LEASE_S + names.FENCE_MARGIN_S
    ElectionTiming(15, 10, 2).check_fence()
    ElectionTiming(10 + fence, 10, 2).check_fence()  # the least that fences
    ElectionTiming(3 + fence, 3, 1).check_fence()
    with pytest.raises(ValueError, match=r"lease-duration 13s must be at least .* \(14s\)"):
        ElectionTiming(10 + fence - 1, 10, 2).check_fence()
    with pytest.raises(ValueError, match="must end before a successor acts"):
        ElectionTiming(3, 2, 0.5).check_fence()


def test_defaults_are_client_go_s() -> None:
    t = ElectionTiming()
    t.check()
    t.check_fence()
    assert (t.lease_duration_s, t.renew_deadline_s, t.retry_period_s) == (15, 10, 2)


def test_lease_round_trip() -> None:
    rec = LeaseRecord("a", 15, acquired=1_800_000_000.25, renewed=1_800_000_001.5, transitions=4)
    body = lease_body("l", "ns", rec, "42")
    assert body["metadata"] == {"name": "l", "namespace": "ns", "resourceVersion": "42"}
    assert body["spec"]["renewTime"] == "2027-01-15T08:00:01.500000Z"
    assert record_of(body) == rec
    assert "resourceVersion" not in lease_body("l", "ns", rec, None)["metadata"]
    assert record_of(lease_body("l", "ns", LeaseRecord(), None)) == LeaseRecord()


def test_an_election_that_cannot_fence_leaves_the_channel_off_not_the_controller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A controller upgraded with flags accepted before (lease 5s, renew 4s) keeps running,
    without the report channel (agents report on their pods), and says why; without an
    election, or with the defaults, the channel is served."""

    def settings(timing: ElectionTiming | None) -> Settings:
        election = None if timing is None else Election("ns", "me", timing, "lease")
        return Settings(election=election, health_port=None, certificate_namespace=None)

    assert operator.channel_refused(settings(None)) is None
    assert operator.channel_refused(settings(ElectionTiming())) is None
    why = operator.channel_refused(settings(ElectionTiming(5, 4, 1)))
    assert why is not None
    assert "--leader-elect-lease-duration 5s must be at least" in why
    untouched = object()  # not a reconciler: a refused channel never looks at it
    asyncio.run(operator.start_report_channel(untouched, lambda: True, why))  # type: ignore[arg-type]
    assert f"report channel: not served ({why}); agents write their reports on pods" in (
        caplog.text
    )


def test_a_lease_body_carries_the_holders_annotations() -> None:
    rec = LeaseRecord("a", 15, acquired=1_800_000_000.0, renewed=1_800_000_001.0)
    said = {"jobset-inplace.dev/report-link": "https://10.0.0.5:9445/v1/batches"}
    assert lease_body("l", "ns", rec, "42", said)["metadata"]["annotations"] == said
    assert "annotations" not in lease_body("l", "ns", rec, "42", {})["metadata"]


def test_a_standbys_part_runs_while_it_waits_and_is_stopped_before_it_leads() -> None:
    """What a standby runs (its report front) sees the Lease holder's annotations as last
    read, and is stopped, its thread joined, before the replica leads (the front's port is
    then free for the leader's channel)."""
    elector = SimpleNamespace(seen_annotations={"k": "one"})
    seen: list[Mapping[str, str]] = []
    ended = threading.Event()

    def standby(done: threading.Event, annotations: Callable[[], Mapping[str, str]]) -> None:
        while not done.wait(0.01):
            seen.append(annotations())
        ended.set()

    waiting = manager._start_standby(standby, elector)  # type: ignore[arg-type]
    assert waiting is not None
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    elector.seen_annotations = {"k": "two"}
    while seen[-1] != {"k": "two"} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen[0] == {"k": "one"}
    assert seen[-1] == {"k": "two"}, "the newest read"
    waiting.stop()
    assert ended.is_set()
    assert not waiting.thread.is_alive()
    assert manager._start_standby(None, elector) is None  # type: ignore[arg-type]
