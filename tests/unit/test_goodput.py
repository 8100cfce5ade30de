"""Goodput by time (core.goodput): a gang's time split into productive seconds and badput by
bucket, epoch by epoch, from the recoveries' times and the trainers' progress spans."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace.core.goodput import (
    MARKS_MAX,
    RECENT_WINDOW_S,
    Bucket,
    Ledger,
    barrier_opened,
    epoch_spans,
    live,
    recent,
    training_ended,
    with_notes,
)
from jobset_inplace.core.model import Cause, NotedProgress, Recovery
from jobset_inplace.core.planner import plan
from jobset_inplace.trainer.progress import ProgressSpan

from .gangs import NOW, pods, snapshot, with_pod
from .test_telemetry import OPENED, crashed, rejoined, step, trained

T0 = 1_790_000_000.0


def start(opened: float, began: float = 0.0) -> Recovery:
    """The gang's first epoch: seen at ``began``, every member joined at ``opened``."""
    return Recovery(1, T0 + began, T0 + 300, opened=T0 + opened)


def failure(
    epoch: int, signal: float, started: float, opened: float, resume: int | None
) -> Recovery:
    return Recovery(
        epoch,
        T0 + started,
        T0 + 300,
        causes={"w/0/0": Cause.TRAINER_EXITED},
        opened=T0 + opened,
        resume_step=resume,
        first_signal=Cause.TRAINER_EXITED,
        first_signal_at=T0 + signal,
    )


def span(first: int, first_at: float, last: int, last_at: float) -> ProgressSpan:
    return ProgressSpan(first, T0 + first_at, last, T0 + last_at)


def test_a_worked_timeline_splits_every_second() -> None:
    # Epoch 1: seen at 0, barrier at 10; the trainer starts, 0.5 s per step, step 1 done at 13
    # (training began at 12.5: 2.5 s of startup), step 60 at 42.5; it crashes at 43 (first
    # signal), the recovery starts at 43.2 and opens at 45 resuming from step 50 (steps 51..60
    # and the half step in flight are thrown away). Epoch 2 resumes: step 51 done at 48 (training
    # began at 47.5: 2.5 s of restore).
    led = barrier_opened(Ledger(), start(opened=10), [])
    assert led.since == T0
    assert led.badput == {Bucket.SCHEDULING: 10}
    assert (led.training_epoch, led.training_since, led.restarted) == (1, T0 + 10, False)
    members = [span(1, 13, 60, 42.5), span(1, 13.01, 59, 42.01)]
    led = barrier_opened(led, failure(2, signal=43, started=43.2, opened=45, resume=50), members)
    assert led.step_seconds == pytest.approx(0.5)
    assert led.productive == pytest.approx(25.0)  # steps 1..50 at 0.5 s
    assert led.badput == pytest.approx(
        {
            Bucket.SCHEDULING: 10,
            Bucket.STARTUP: 2.5,
            Bucket.WASTED_PROGRESS: 5.5,  # steps 51..60 and the 0.5 s of step 61
            Bucket.DETECTION: 0.2,
            Bucket.RECOVERY: 1.8,
        }
    )
    assert (led.training_epoch, led.training_resume, led.restarted) == (2, 50, True)
    # every second from the start to the barrier is in one place
    assert led.productive + led.badput_total == pytest.approx(45.0)
    now = live(led, T0 + 55)
    assert now.running == pytest.approx(10)
    assert now.ratio == pytest.approx(35 / 55)
    # epoch 2 ends with a second failure; its span starts after a 2.5 s restore
    led = barrier_opened(
        led, failure(3, signal=70, started=70.5, opened=72, resume=90), [span(51, 48, 94, 69.5)]
    )
    assert led.badput[Bucket.RESTORE] == pytest.approx(2.5)
    assert led.productive == pytest.approx(25.0 + 20.0)  # steps 51..90
    assert led.badput[Bucket.WASTED_PROGRESS] == pytest.approx(5.5 + 2.5)  # 91..94, in flight
    assert led.productive + led.badput_total + led.unmeasured == pytest.approx(72.0)


def test_members_that_resumed_apart_keep_their_own_pace() -> None:
    # Both trainers step every 0.2 s, one resumed 0.9 s after the other (seen in e2e: a pod
    # back from RestartAllContainers later than its peer): the pace is 0.2 s, not the first
    # member's start against the second's end ((21.9 - 11) / 50 = 0.218 s).
    led = barrier_opened(Ledger(), start(opened=10), [])
    members = [span(1, 11.0, 46, 20.0), span(1, 11.9, 51, 21.9)]
    led = barrier_opened(led, failure(2, signal=22, started=22, opened=23, resume=40), members)
    assert led.step_seconds == pytest.approx(0.2)
    assert led.productive == pytest.approx(40 * 0.2)


def test_an_epoch_without_spans_is_unmeasured_and_left_out_of_the_ratio() -> None:
    led = barrier_opened(Ledger(), start(opened=10), [])
    led = barrier_opened(led, failure(2, 40, 41, 42, resume=None), [])
    assert led.unmeasured == pytest.approx(30)
    assert led.productive == 0
    assert led.badput == pytest.approx(
        {Bucket.SCHEDULING: 10, Bucket.DETECTION: 1, Bucket.RECOVERY: 1}
    )
    assert live(led, T0 + 42).ratio == 0.0
    assert live(Ledger(), T0).ratio is None, "nothing measured: no ratio"


def test_a_span_of_an_older_epoch_is_not_taken_for_the_ended_one() -> None:
    # a member whose records are from before this epoch's barrier (10 s) does not count
    led = barrier_opened(Ledger(), start(opened=10), [])
    stale = span(1, 2, 400, 8)
    led = barrier_opened(led, failure(2, 40, 41, 42, resume=None), [stale])
    assert led.unmeasured == pytest.approx(30)


def test_from_scratch_every_step_is_wasted() -> None:
    led = barrier_opened(Ledger(), start(opened=10), [])
    led = barrier_opened(led, failure(2, 40, 41, 42, resume=None), [span(1, 11, 50, 35.5)])
    assert led.productive == 0
    assert led.badput[Bucket.STARTUP] == pytest.approx(0.5)
    assert led.badput[Bucket.WASTED_PROGRESS] == pytest.approx(29.5)


def test_a_single_step_uses_the_pace_measured_before() -> None:
    led = Ledger(step_seconds=2.0, training_epoch=3, training_since=T0)
    led = replace(led, training_resume=10, restarted=True)
    led = barrier_opened(led, failure(4, 7, 7, 8, resume=11), [span(11, 5, 11, 5)])
    assert led.badput[Bucket.RESTORE] == pytest.approx(3.0)  # step 11 took 2 s, done at 5
    assert led.productive == pytest.approx(2.0)
    # no pace at all: unmeasured rather than a guess
    fresh = Ledger(training_epoch=3, training_since=T0, training_resume=10)
    fresh = barrier_opened(fresh, failure(4, 7, 7, 8, resume=11), [span(11, 5, 11, 5)])
    assert fresh.unmeasured == pytest.approx(7)
    assert fresh.productive == 0


def test_the_end_of_training() -> None:
    led = barrier_opened(Ledger(), start(opened=10), [])
    done = training_ended(led, T0 + 70, kept=True)
    assert done.productive == pytest.approx(60)
    assert done.training_since is None
    assert training_ended(done, T0 + 80, kept=True) == done, "once"
    gone = training_ended(led, T0 + 70, kept=False)
    assert gone.unmeasured == pytest.approx(60)
    assert gone.productive == 0
    # after a suspension the gang starts again: scheduling, not a recovery
    again = barrier_opened(gone, Recovery(2, T0 + 100, T0 + 400, opened=T0 + 104), [])
    assert again.badput[Bucket.SCHEDULING] == pytest.approx(14)
    assert again.since == T0
    assert not again.restarted


def test_the_recent_window_is_read_between_the_marks_around_its_start() -> None:
    # the worked timeline's first two epochs: marks at the start (0: nothing), at 10 (the
    # scheduling), at 45 (productive 25 of 45); epoch 2 runs from 45
    led = barrier_opened(Ledger(), start(opened=10), [])
    members = [span(1, 13, 60, 42.5), span(1, 13.01, 59, 42.01)]
    led = barrier_opened(led, failure(2, signal=43, started=43.2, opened=45, resume=50), members)
    marks = [x for m in led.marks for x in (m.at - T0, m.productive, m.measured)]
    assert marks == pytest.approx([0, 0, 0, 10, 0, 10, 45, 25, 45])
    assert recent(Ledger(), T0) is None, "no marks: no window"
    # younger than the window: the window is the whole history, the same ratio as live()
    young = recent(led, T0 + 55)
    assert young is not None
    assert young.seconds == pytest.approx(55)
    assert young.ratio == pytest.approx(live(led, T0 + 55).ratio)
    # a 20 s window at 55 starts at 35, inside epoch 1 (10..45: 25 productive of 35):
    # 10 s of it at that average (25/35), then the 10 s of epoch 2 running (productive)
    window = recent(led, T0 + 55, window_s=20)
    assert window is not None
    assert window.seconds == pytest.approx(20)
    assert window.ratio == pytest.approx((10 * 25 / 35 + 10) / 20)
    # a window within the running epoch is all productive
    assert recent(led, T0 + 55, window_s=5).ratio == pytest.approx(1.0)  # type: ignore[union-attr]


def test_a_recovery_in_progress_ends_the_running_epoch_at_its_first_signal() -> None:
    """Read during a recovery, the running epoch is productive only up to the failure's first
    signal; the time since is detection and recovery (a stalled recovery once read as 15 min
    of training)."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    stalled = Recovery(2, T0 + 40, T0 + 300, first_signal_at=T0 + 38)  # opened: not yet
    acc = live(led, T0 + 100, stalled)
    assert acc.productive == pytest.approx(28), "10 .. 38 s"
    assert acc.badput == pytest.approx(
        {Bucket.SCHEDULING: 10, Bucket.DETECTION: 2, Bucket.RECOVERY: 60}
    )
    assert acc.ratio == pytest.approx(28 / 100)
    assert live(led, T0 + 100).ratio == pytest.approx(90 / 100), "without it: all productive"
    done = Recovery(1, T0, T0 + 300, opened=T0 + 10)  # the epoch's own (opened) recovery
    assert live(led, T0 + 100, done).ratio == pytest.approx(90 / 100)
    # the last 50 s: read between the barrier's mark (10 s: 0 of 10) and now (28 of 100)
    window = recent(led, T0 + 100, window_s=50, recovery=stalled)
    assert window is not None
    assert window.ratio == pytest.approx((28 - 28 * 40 / 90) / (100 - 50))


def test_a_suspension_is_not_measured_in_the_window() -> None:
    led = barrier_opened(Ledger(), start(opened=10), [])
    led = training_ended(led, T0 + 100, kept=False)  # stood down: 90 s unmeasured
    # back 1000 s later: 5 s to schedule, then 45 s running
    led = barrier_opened(led, Recovery(2, T0 + 1100, T0 + 1400, opened=T0 + 1105), [])
    window = recent(led, T0 + 1150, window_s=500)
    assert window is not None
    assert window.ratio == pytest.approx(45 / 50), "the idle 1000 s count neither way"


def test_old_marks_go_and_the_count_stays_bounded() -> None:
    led = barrier_opened(Ledger(), start(opened=10), [])
    t, epoch = 10.0, 1
    for _ in range(200):  # a failure every 30 s for 100 min
        epoch += 1
        led = barrier_opened(led, failure(epoch, t + 29, t + 29.5, t + 30, None), [])
        t += 30
        assert len(led.marks) <= MARKS_MAX
    # every mark kept is younger than a window, but one; the window at t is clipped to them
    assert sum(m.at <= T0 + t - RECENT_WINDOW_S for m in led.marks) <= 1
    window = recent(led, T0 + t)
    assert window is not None
    assert window.seconds == pytest.approx(T0 + t - led.marks[0].at)
    assert window.seconds <= RECENT_WINDOW_S


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.1, 30),  # training time before the failure
            st.floats(0, 5),  # detection
            st.floats(0, 30),  # recovery
            st.floats(0, 5),  # restore/startup before the first step
            st.floats(0.05, 2),  # step seconds
            st.integers(0, 3),  # how many checkpoints back the gang resumes (0: newest)
            st.booleans(),  # spans reported
            st.booleans(),  # ... by the failed member's own pod (its steps date the failure)
            st.booleans(),  # the signal read in whole seconds (a condition's time)
        ),
        min_size=1,
        max_size=8,
    )
)
def test_every_second_is_accounted_exactly_once(epochs: list[tuple]) -> None:  # type: ignore[type-arg]
    """Whatever the timeline, productive + badput + unmeasured is the time from the start to
    the newest barrier, each part is >= 0, and productive never exceeds the steps kept."""
    led = barrier_opened(Ledger(), start(opened=5), [])
    t, resume, epoch = 5.0, 0, 1
    for training, detect, recover, warm, pace, back, spans, own, whole in epochs:
        first_at = t + min(warm, training)
        steps = max(0, int((t + training - first_at) / pace))
        reported = (
            [span(resume + 1, first_at + pace, resume + 1 + steps, first_at + pace * (steps + 1))]
            if spans and t + training >= first_at + pace * (steps + 1)
            else []
        )
        newest = resume + 1 + steps if reported else resume
        next_resume = max(resume, newest - 10 * back) if reported else resume
        signal = t + training
        epoch += 1
        rec = failure(
            epoch,
            max(t, math.floor(signal)) if whole else signal,
            signal + detect,
            signal + detect + recover,
            next_resume or None,
        )
        before, resume_before = led.productive, resume
        failed = reported if own else []
        led = barrier_opened(led, rec, reported, failed, failed)
        t, resume = signal + detect + recover, next_resume
        assert led.productive - before <= (next_resume - resume_before) * pace + 1e-6
        assert all(v >= 0 for v in led.badput.values())
    total = led.productive + led.badput_total + led.unmeasured
    assert total == pytest.approx(t - 0.0, abs=1e-6)


def test_the_planner_keeps_the_account_at_each_barrier() -> None:
    """Through plan(): epoch 1 opens at OPENED (the first pass: no scheduling time seen), a
    trainer crashes (first signal NOW - 2.5, recovery from NOW), every member rejoins with the
    span of epoch 1 (resumed at 200) and the barrier opens at NOW + 10 resuming at 300; the
    account is in the status the pass writes, and a suspension ends the running epoch
    unmeasured."""
    status = trained()
    assert status.goodput.since == OPENED
    assert (status.goodput.training_since, status.goodput.training_resume) == (OPENED, 200)
    back = rejoined(steps_of_2=(300, 200, 100))
    for i in range(4):  # step 201 done at OPENED + 4.5, step 1390 at NOW - 5
        spans = ProgressSpan(201, OPENED + 4.5, 1390, NOW - 5.0)
        back = with_pod(back, i, progress_span=spans)
    _, p = step(crashed(), back, now=NOW + 10)
    led = p.status.goodput
    assert (led.training_epoch, led.training_resume, led.restarted) == (2, 300, True)
    pace = (600 - 9.5) / 1189
    assert led.step_seconds == pytest.approx(pace)
    assert led.productive == pytest.approx(100 * pace)
    assert led.badput[Bucket.STARTUP] == pytest.approx(4.5 - pace)
    # the first signal came 2.5 s before the recovery; every member's newest step 2.5 s before
    # that, and nothing after the one under way: the gang stood still, unseen, meanwhile
    assert led.badput[Bucket.DETECTION] == pytest.approx(2.5 + 2.5 - pace)
    assert led.badput[Bucket.RECOVERY] == pytest.approx(10)
    assert led.productive + led.badput_total == pytest.approx(610)
    _, p = step(p.status, back, now=NOW + 70, suspended=True)
    assert p.status.goodput.unmeasured == pytest.approx(60)
    assert p.status.goodput.training_since is None


def test_an_epoch_whose_pods_all_went_is_accounted_from_the_agents_notes() -> None:
    """Every member's pod went with its node: the new pods report no span of epoch 1, and the
    spans their agents last noted over the channel while it ran account it. The notes end
    (step 250) before the checkpoint the gang resumes from (300; a note comes every
    PROGRESS_NOTE_S): the steps kept are still the resume step's, as with the whole spans."""
    pace = (600 - 9.5) / 1189
    note = ProgressSpan(201, OPENED + 4.5, 250, OPENED + 4.5 + 49 * pace)
    back = rejoined(steps_of_2=(300, 200, 100))
    s = snapshot(status=crashed(), pod_list=back, now=NOW + 10)
    noted = {f"workers/{i}/0": (1, note) for i in range(4)}
    led = plan(replace(s, progress_noted=noted)).status.goodput
    assert led.unmeasured == 0
    assert led.step_seconds == pytest.approx(pace)
    assert led.productive == pytest.approx(100 * pace)
    assert led.badput[Bucket.STARTUP] == pytest.approx(4.5 - pace)
    assert led.productive + led.badput_total == pytest.approx(610)
    # without the notes (another leader's, or none) the epoch is unmeasured
    led = plan(s).status.goodput
    assert led.unmeasured == pytest.approx(600 - 2.5)


def test_a_members_own_span_wins_over_its_note_and_other_epochs_notes_are_not_taken() -> None:
    own = span(1, 11, 60, 40.5)
    joined = pods(2, epoch=1)
    joined[0] = replace(joined[0], progress_span=own)
    noted = {
        "workers/0/0": (1, span(1, 11, 20, 20.5)),  # the same member: its own span wins
        "workers/1/0": (1, span(1, 11.2, 50, 35.7)),  # a new pod: its note
        "workers/2/0": (2, span(1, 11.2, 50, 35.7)),  # the running epoch's: not the ended one
    }
    training = Ledger(training_epoch=1)
    assert epoch_spans(joined, noted, training) == [own, span(1, 11.2, 50, 35.7)]
    assert epoch_spans(joined, noted, Ledger()) == [own], "no epoch training: only own spans"


def test_the_notes_sum_is_kept_at_doubling_reach_and_accounts_for_a_new_leader() -> None:
    """The running epoch's notes, summed (the earliest first step, the members' steps and
    seconds added up), go into the ledger the status keeps when they reach twice the seconds
    of the sum it holds (a write at 2x, 4x, ... none between); a new leader, whose memory holds
    no note, accounts the ended epoch from that sum as from the notes themselves."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    assert with_notes(led, {}) is led
    early = {"w/0": (1, span(1, 13, 3, 14)), "w/1": (1, span(1, 13.2, 3, 14.2))}
    led = with_notes(led, early)
    assert led.training_noted == NotedProgress(1, T0 + 13, 4, 2.0, T0 + 14.2)
    later = {"w/0": (1, span(1, 13, 4, 14.5)), "w/1": (1, span(1, 13.2, 4, 14.7))}
    assert with_notes(led, later) is led, "3 s summed: less than twice 2 s, not written"
    other = {"w/0": (2, span(1, 13, 400, 300)), "w/1": (1, span(1, 13.2, 3, 14.2))}
    assert with_notes(led, other) is led, "another epoch's note is not summed"
    notes = {"w/0": (1, span(1, 13, 41, 33)), "w/1": (1, span(1, 13.2, 41, 33.2))}
    led = with_notes(led, notes)
    assert led.training_noted == NotedProgress(1, T0 + 13, 80, 40.0, T0 + 33.2)
    rec = failure(2, signal=43, started=43.2, opened=45, resume=50)
    from_memory = barrier_opened(led, rec, epoch_spans([], notes, led))
    from_status = barrier_opened(led, rec, epoch_spans([], {}, led))
    assert from_status.unmeasured == from_memory.unmeasured == 0
    assert from_status.productive == pytest.approx(from_memory.productive)
    assert from_status.productive == pytest.approx(25.0)  # steps 1..50 at 0.5 s
    assert from_status.badput == pytest.approx(from_memory.badput)
    assert from_status.training_noted is None, "the new epoch starts without a sum"
    # A silence that took every pod ends from the newest step noted, not from the sum's span
    # (its end is the members' seconds added up: 40 s past the first step, not 20): the same
    # account from the status as from the notes.
    silence = replace(
        failure(2, signal=53, started=68.2, opened=75, resume=50),
        first_signal=Cause.NODE_UNHEALTHY,
        signal_window=10.0,
    )
    from_memory = barrier_opened(led, silence, epoch_spans([], notes, led))
    from_status = barrier_opened(led, silence, epoch_spans([], {}, led))
    assert from_status.badput == pytest.approx(from_memory.badput)
    assert from_status.badput[Bucket.DETECTION] == pytest.approx(5 + 15.2)  # from 48, mid-window


def test_a_running_pass_keeps_the_notes_sum_in_the_status_and_only_when_it_doubles() -> None:
    status = trained()
    notes = {
        f"workers/{i}/0": (1, ProgressSpan(201, OPENED + 4.5, 260, OPENED + 34)) for i in range(4)
    }
    s = replace(snapshot(status=status, pod_list=pods(4, epoch=1), now=NOW), progress_noted=notes)
    kept = plan(s).status
    assert kept.goodput.training_noted == NotedProgress(
        201, OPENED + 4.5, 4 * 59, 4 * 29.5, OPENED + 34
    )
    again = plan(replace(s, status=kept)).status
    assert again == kept, "the same notes: nothing new to write"


def test_a_gang_standing_still_until_its_failure_is_seen_counts_that_as_detection() -> None:
    """Members that wait for each other (data-parallel: each step ends in an all-reduce) stop
    training when one hangs: the others' own spans end then too. From their newest step and
    the one under way to the hang's first signal (its timeout later) the gang stood still:
    detection, not progress thrown away. Without a complete span (every pod went), the same
    time stays wasted progress, as before: a note may end 30 s early."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    members = [span(1, 13, 60, 42.5), span(1, 13.01, 60, 42.51)]
    hang = failure(2, signal=53, started=53.2, opened=55, resume=50)  # 10 s hang timeout
    seen = barrier_opened(led, hang, members, members)
    assert seen.productive == pytest.approx(25.0)
    assert seen.badput[Bucket.WASTED_PROGRESS] == pytest.approx(5.51)  # 51..60, one in flight
    assert seen.badput[Bucket.DETECTION] == pytest.approx(10.0 - 0.01 + 0.2)  # 43.01 -> 53.2
    noted = barrier_opened(led, hang, members)  # no pod's own span: notes only
    assert noted.badput[Bucket.WASTED_PROGRESS] == pytest.approx(15.5)
    assert noted.badput[Bucket.DETECTION] == pytest.approx(0.2)
    for account in (seen, noted):
        assert account.productive + account.badput_total == pytest.approx(55.0)


def test_a_silent_node_took_every_pod_half_its_window_counts_as_detection() -> None:
    """Every pod of the gang went with a silent node: no member's own span dates the stop, and
    the first signal (a missed Lease renewal) comes up to a renew interval after the node died.
    Half that window counts as detection, not the whole as wasted progress (unbiased, off by
    at most 5 s); never before the newest step the notes saw."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    notes = [span(1, 13, 40, 32.5), span(1, 13.01, 40, 32.51)]  # noted up to 10 s early
    silence = replace(
        failure(2, signal=53, started=68.2, opened=75, resume=50),
        first_signal=Cause.NODE_UNHEALTHY,
        signal_window=10.0,
    )
    account = barrier_opened(led, silence, notes)
    assert account.badput[Bucket.WASTED_PROGRESS] == pytest.approx(48 - 12.5 - 25)
    assert account.badput[Bucket.DETECTION] == pytest.approx(5 + 15.2)
    late = [span(1, 13, 80, 52.5)]  # a note past the window's middle: the gang trained on
    account = barrier_opened(led, silence, late)
    assert account.badput[Bucket.DETECTION] == pytest.approx(53 - 53 + 15.2)
    for spans in (notes, late):
        whole = barrier_opened(led, silence, spans)
        assert whole.productive + whole.badput_total == pytest.approx(75.0)


def test_a_silence_that_took_every_pod_ends_no_earlier_than_the_resume_step() -> None:
    """The next epoch resumes from a checkpoint this one saved, so the gang trained at least
    to that step, also where the window's middle comes before it: before, such kept steps
    counted as detection (CI: 10.55 points under both trainers' own accounts). Not the middle
    of the window's rest: the gang reached that step just before it failed, on average."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    notes = [span(1, 13, 40, 32.5), span(1, 13.01, 40, 32.51)]  # noted up to 10 s early
    silence = replace(
        failure(2, signal=53, started=68.2, opened=75, resume=80),  # step 80 at 52.5
        first_signal=Cause.NODE_UNHEALTHY,
        signal_window=10.0,
    )
    account = barrier_opened(led, silence, notes)
    assert account.productive == pytest.approx(40.0), "every step up to the resume step"
    assert account.badput[Bucket.WASTED_PROGRESS] == pytest.approx(0.0)
    assert account.badput[Bucket.DETECTION] == pytest.approx(0.5 + 15.2)  # 52.5 -> 53 -> 68.2
    assert account.productive + account.badput_total == pytest.approx(75.0)


def test_members_that_train_on_after_a_failure_leave_detection_from_its_first_signal() -> None:
    """A member that does not wait for the others (or is stopped only after the first
    signal) has steps past the signal: nothing moves to detection."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    members = [span(1, 13, 50, 37.5), span(1, 13, 62, 43.5)]  # one crashed at 37.5
    crash = failure(2, signal=38, started=38.1, opened=40, resume=50)
    led = barrier_opened(led, crash, members, members)
    assert led.badput[Bucket.DETECTION] == pytest.approx(0.1)
    assert led.badput[Bucket.WASTED_PROGRESS] == pytest.approx(0.5)  # 38 - 37.5: in flight


def test_the_failed_members_own_steps_date_the_failure() -> None:
    """A member that crashed at 38 (its last step, 50, at 37.5 and the one under way), seen at
    40 (a pod's Ready condition: the kubelet's notice); the other member trained on to step 60
    meanwhile, steps thrown away with the resume at 50. The epoch stopped at the failure, not
    at the newest step of any member: 38 -> 40 is detection (the trainers' own account)."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    crashed, other = span(1, 13, 50, 37.5), span(1, 13, 60, 42.5)
    crash = failure(2, signal=40, started=40.1, opened=42, resume=50)
    led = barrier_opened(led, crash, [crashed, other], [crashed, other], [crashed])
    assert led.productive == pytest.approx(25.0)
    assert led.badput[Bucket.WASTED_PROGRESS] == pytest.approx(0.5)  # step 51, under way
    assert led.badput[Bucket.DETECTION] == pytest.approx(2.1)  # 38 -> 40.1
    assert led.productive + led.badput_total == pytest.approx(42.0)


def test_a_signal_read_in_whole_seconds_does_not_cut_the_steps_before_it() -> None:
    """A pod's Ready condition says when it turned False in whole seconds: 37 for a crash at
    38 (its last step, 50, at 37.5). Ended at 37, the epoch lost half a step of the kept ones
    (CI: 1.16 points under the trainers' own account); it ends at the failure, and the
    recovery's detection counts from there (never past the recovery's start)."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    crashed = [span(1, 13, 50, 37.5)]
    crash = failure(2, signal=37, started=38.5, opened=40, resume=50)
    account = barrier_opened(led, crash, crashed, crashed, crashed)
    assert account.productive == pytest.approx(25.0), "every step up to the resume step"
    assert account.badput[Bucket.WASTED_PROGRESS] == pytest.approx(0.5)
    assert account.badput[Bucket.DETECTION] == pytest.approx(0.5)  # 38 -> 38.5
    assert account.productive + account.badput_total == pytest.approx(40.0)
    quick = failure(2, signal=37, started=37.6, opened=40, resume=50)  # started before 38
    account = barrier_opened(led, quick, crashed, crashed, crashed)
    assert account.badput[Bucket.DETECTION] == pytest.approx(0.0)
    assert account.productive + account.badput_total == pytest.approx(40.0)


def test_a_failed_member_that_trained_on_past_its_signal_ends_the_epoch_at_the_signal() -> None:
    """A member whose device was tainted at 38 trains on until the recovery stops it (step 62
    at 43.5): more than a second after its signal, so its steps do not date the failure."""
    led = barrier_opened(Ledger(), start(opened=10), [])
    tainted = [span(1, 13, 62, 43.5)]
    taint = failure(2, signal=38, started=38.1, opened=45, resume=50)
    led = barrier_opened(led, taint, tainted, tainted, tainted)
    assert led.badput[Bucket.WASTED_PROGRESS] == pytest.approx(0.5)  # 37.5 -> 38
    assert led.badput[Bucket.DETECTION] == pytest.approx(0.1)
    assert led.productive + led.badput_total == pytest.approx(45.0)
