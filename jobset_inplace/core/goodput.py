"""What a recovery cost the training, in steps (goodput accounting; docs/metrics.md):

* checkpoint steps given up (:func:`checkpoint_steps_lost`): the newest checkpoint any member
  can still read minus the resume step, i.e. checkpoints discarded so that every member resumes
  from the same one;
* progress steps lost (:func:`progress_steps_lost`): how far training had got (the newest step
  any member's trainers reported progress for, in the epoch the recovery ended) minus the resume
  step, i.e. the training the gang does again. Known only for trainers that report progress
  (``jobset_inplace.trainer.report_progress``, the same records hang detection reads);
* goodput by time (:class:`Ledger`, below): productive seconds and badput seconds by bucket,
  since the gang first started (:func:`live`) and over the last hour (:func:`recent`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from jobset_inplace.core.model import Bucket, Ledger, Mark, NotedProgress, PodView, Recovery
from jobset_inplace.trainer.progress import ProgressSpan

__all__ = [
    "Bucket",
    "Goodput",
    "Ledger",
    "Recent",
    "barrier_opened",
    "checkpoint_steps_lost",
    "epoch_spans",
    "live",
    "progress_steps_lost",
    "recent",
    "training_ended",
    "with_notes",
]


def checkpoint_steps_lost(joined: Sequence[PodView], resume_step: int | None) -> int:
    """Checkpoint steps given up by resuming at ``resume_step`` (None: from scratch): the
    newest step any member reported minus it (0 when nobody reported one)."""
    newest = max((step for pod in joined for step in pod.reported_steps or ()), default=0)
    return max(0, newest - (resume_step or 0))


def progress_steps_lost(joined: Sequence[PodView], resume_step: int | None) -> int | None:
    """Training steps redone by resuming at ``resume_step`` (None: from scratch): the newest
    progress step the members reported with their new epoch minus it; None when none did."""
    reached = [pod.progress_step for pod in joined if pod.progress_step is not None]
    return None if not reached else max(0, max(reached) - (resume_step or 0))


# --- Goodput by time (docs/metrics.md "Goodput") ---
#
# The gang's time since it first started is split, epoch by epoch, into productive time (steps
# that are kept) and badput by bucket. A recovery's record gives the times of its failure's first
# signal, the start of the recovery and the barrier's opening; the trainers' progress span of
# the epoch that ended (reported by every agent with its next epoch) gives when training began
# in it, its pace, and how far it got. Pure: the planner folds each opened barrier in; readers
# (status, metrics, plugin) add the running epoch with their own clock (:func:`live`).

# A span whose first step is dated this long before the barrier it follows opened belongs to an
# older epoch (a pod whose records survived); node clocks and the controller's agree far better.
SPAN_CLOCK_SLACK_S = 1.0
# Kubernetes writes a condition's transition time in whole seconds (a pod's Ready turning False
# at 12.9 s reads 12 s): a failure the failed member's own steps place up to this long after
# such a signal (a whole second) is that signal's (a trainer that ran on past its signal, such
# as one whose device was tainted, is placed further). The controller's own times are not
# whole seconds but one time in a million.
SIGNAL_TIME_RESOLUTION_S = 1.0


@dataclass(frozen=True)
class Goodput:
    """The account as a reader sees it at ``now``: the running epoch's time since its barrier
    opened counted productive (its restore and any steps it loses are accounted when it ends)."""

    ratio: float | None  # productive / (productive + badput); None: nothing measured yet
    productive: float
    badput: Mapping[Bucket, float]
    running: float  # seconds of the running epoch included in ``productive``


def live(ledger: Ledger, now: float, recovery: Recovery | None = None) -> Goodput:
    """The account at ``now``. ``recovery``: the gang's newest (its GangState's); one in
    progress ends the running epoch at its first signal, and its time so far counts as
    detection and recovery (until its barrier opens and the epoch is accounted exactly)."""
    badput = dict(ledger.badput)
    end = now
    if (
        recovery is not None
        and recovery.opened is None
        and ledger.training_since is not None
        and recovery.began >= ledger.training_since
    ):
        end = recovery.began
        started = min(max(recovery.started, end), now)
        badput = _add(badput, detection=started - end, recovery=now - started)
    running = 0.0 if ledger.training_since is None else max(0.0, end - ledger.training_since)
    productive = ledger.productive + running
    measured = productive + sum(badput.values())
    ratio = productive / measured if measured > 0 else None
    return Goodput(ratio, productive, badput, running)


# The recent window (the plugin's, the recent-goodput gauge's), and how many marks a ledger
# keeps at most: a window then starts no earlier than the oldest (a gang failing more often than
# every minute for an hour gets a shorter window, which Recent.seconds says).
RECENT_WINDOW_S = 3600.0
MARKS_MAX = 64


@dataclass(frozen=True)
class Recent:
    """Goodput over the window that ends at ``now``: ``seconds`` long (the window asked for,
    or less while the gang is younger)."""

    ratio: float | None  # None: nothing measured in it (a suspended gang)
    seconds: float


def recent(
    ledger: Ledger,
    now: float,
    window_s: float = RECENT_WINDOW_S,
    recovery: Recovery | None = None,
) -> Recent | None:
    """Goodput over the last ``window_s``: the live account at ``now`` minus the account at the
    window's start, read between the marks around it (linear within an epoch: an epoch the
    window cuts counts its own average ratio for the part inside). None: no marks yet."""
    if not ledger.marks:
        return None
    now = max(now, ledger.marks[-1].at)
    account = live(ledger, now, recovery)
    points = [
        *ledger.marks,
        Mark(now, account.productive, account.productive + sum(account.badput.values())),
    ]
    start = max(now - window_s, points[0].at)
    productive, measured = _account_at(points, start)
    spent = points[-1].measured - measured
    ratio = (points[-1].productive - productive) / spent if spent > 0 else None
    return Recent(ratio, now - start)


def _account_at(points: Sequence[Mark], t: float) -> tuple[float, float]:
    """Productive and measured seconds at ``t`` (``points`` oldest first, the first at or
    before ``t``), linear between the two points around it."""
    i = max(i for i, m in enumerate(points) if m.at <= t)
    before = points[i]
    if i + 1 == len(points):
        return before.productive, before.measured
    after = points[i + 1]
    f = (t - before.at) / (after.at - before.at)
    return (
        before.productive + f * (after.productive - before.productive),
        before.measured + f * (after.measured - before.measured),
    )


def _marked(ledger: Ledger, at: float) -> Ledger:
    """``ledger`` with its account marked at ``at``; marks no window needs any more go (every
    one before the newest that is a window old), and beyond MARKS_MAX the oldest."""
    marks = [*ledger.marks, Mark(at, ledger.productive, ledger.productive + ledger.badput_total)]
    old = [i for i, m in enumerate(marks) if m.at <= at - RECENT_WINDOW_S]
    if old:
        marks = marks[old[-1] :]
    return replace(ledger, marks=tuple(marks[-MARKS_MAX:]))


def _add(badput: Mapping[Bucket, float], **seconds: float) -> dict[Bucket, float]:
    out = dict(badput)
    for name, value in seconds.items():
        bucket = Bucket[name.upper()]
        out[bucket] = out.get(bucket, 0.0) + max(0.0, value)
    return out


def epoch_spans(
    joined: Sequence[PodView], noted: Mapping[str, tuple[int, ProgressSpan]], ledger: Ledger
) -> list[ProgressSpan]:
    """The members' progress spans of the epoch that ended (the ledger's training epoch): each
    joined pod's own, reported with its next epoch; for a member whose pod reported none (a
    new pod: the records went with the old one), the span its agent last noted while the epoch
    ran (``noted``: slot -> (epoch, span); shorter than the whole epoch by up to
    ``names.PROGRESS_NOTE_S``, which the account does not need: the steps kept are the resume
    step's). With neither (a new leader: the notes went with the old one), none: the account
    reads the notes' sum the status kept (:func:`with_notes`)."""
    spans = {pod.member: pod.progress_span for pod in joined if pod.progress_span is not None}
    epoch = ledger.training_epoch
    if epoch is not None:
        for member, (noted_epoch, span) in noted.items():
            if noted_epoch == epoch:
                spans.setdefault(member, span)
    return list(spans.values())


def with_notes(ledger: Ledger, noted: Mapping[str, tuple[int, ProgressSpan]]) -> Ledger:
    """``ledger`` with its training epoch's notes summed in (:class:`NotedProgress`) when they
    span at least twice the seconds of the sum it holds: a status write at 2x, 4x, ... the
    first note's reach, O(log) per epoch, none between."""
    epoch = ledger.training_epoch
    ours = [
        span
        for e, span in noted.values()
        if e == epoch and span.last_step > span.first_step and span.last_at >= span.first_at
    ]
    if epoch is None or not ours:
        return ledger
    first = min(ours, key=lambda s: (s.first_at, s.first_step))
    summed = NotedProgress(
        first.first_step,
        first.first_at,
        sum(s.last_step - s.first_step for s in ours),
        sum(s.last_at - s.first_at for s in ours),
        max(s.last_at for s in ours),
    )
    held = ledger.training_noted
    if held is not None and summed.seconds < 2 * held.seconds:
        return ledger
    return replace(ledger, training_noted=summed)


def barrier_opened(
    ledger: Ledger,
    rec: Recovery,
    spans: Sequence[ProgressSpan],
    complete: Sequence[ProgressSpan] = (),
    failed: Sequence[ProgressSpan] = (),
) -> Ledger:
    """``ledger`` once ``rec``'s barrier opened (``rec.opened`` and ``rec.resume_step`` set):
    the epoch that ended at its failure accounted from the members' ``spans`` of it (of which
    ``complete``: those their own pods reported, up to their trainers' newest step; of those,
    ``failed``: the failing members'), the recovery's own time in its buckets, and its epoch's
    training running."""
    assert rec.opened is not None
    if ledger.training_since is None:  # a start (or a restart after a suspension)
        led = replace(
            _marked(ledger, rec.began),  # (the time it was suspended is not measured)
            since=rec.began if ledger.since is None else ledger.since,
            badput=_add(ledger.badput, scheduling=rec.opened - rec.began),
        )
        restarted = False
    else:
        led, ended = _close_epoch(
            ledger,
            rec.began,
            spans,
            rec.resume_step,
            complete=complete,
            failed=failed,
            window=rec.signal_window,
            latest=rec.started,
        )
        led = replace(
            led,
            badput=_add(
                led.badput,
                detection=rec.started - ended,
                recovery=rec.opened - rec.started,
            ),
        )
        restarted = True
    return replace(
        _marked(led, rec.opened),
        training_epoch=rec.epoch,
        training_since=rec.opened,
        training_resume=rec.resume_step,
        restarted=restarted,
        training_noted=None,
    )


def training_ended(ledger: Ledger, now: float, *, kept: bool) -> Ledger:
    """The running epoch ended without a next one: the JobSet finished (``kept``: every step
    is kept; its startup or restore time cannot be told apart and counts as productive), or
    the gang stood down or failed (unmeasured: no report of how far it got comes)."""
    if ledger.training_since is None:
        return ledger
    spent = max(0.0, now - ledger.training_since)
    led = _not_training(ledger)
    if kept:
        return _marked(replace(led, productive=led.productive + spent), now)
    return _marked(replace(led, unmeasured=led.unmeasured + spent), now)


def _not_training(ledger: Ledger) -> Ledger:
    return replace(
        ledger,
        training_epoch=None,
        training_since=None,
        training_resume=None,
        training_noted=None,
    )


def _close_epoch(
    ledger: Ledger,
    end: float,
    spans: Sequence[ProgressSpan],
    next_resume: int | None,
    *,
    complete: Sequence[ProgressSpan] = (),
    failed: Sequence[ProgressSpan] = (),
    window: float = 0.0,
    latest: float | None = None,
) -> tuple[Ledger, float]:
    """Account the running epoch, from its barrier's opening to ``end`` (the next failure's
    first signal): startup or restore until training began, then the steps the next epoch
    keeps (up to ``next_resume``) as productive and the rest as wasted progress, until the
    gang stopped training; from then to ``end`` detection. Returns the ledger and where the
    epoch ended: ``end``, or later (up to ``latest``, the recovery's start) where ``end`` is a
    whole second and the failed members' steps place the failure within
    ``SIGNAL_TIME_RESOLUTION_S`` after it.

    The gang stopped with the failure: the newest step of the ``failed`` members' spans (their
    own, to their last step) and the one under way (counted whole). The other members' steps
    after it are not training (they are thrown away, or wait in an all-reduce: data-parallel
    members wait for each other), so without a failed member's span, with the newest step of
    the ``complete`` spans. Without a complete span (every pod went: notes end up to
    ``PROGRESS_NOTE_S`` early), at ``end`` less half the signal's ``window`` (the failure came
    somewhere in it: a silent node's, a renew interval after its last Lease renewal; its
    middle, off by at most half the window), and not before what the gang is known to have
    reached: the newest step the notes saw and the resume step (its checkpoint was saved in
    this epoch)."""
    opened = ledger.training_since
    assert opened is not None
    resume = ledger.training_resume or 0
    spent = max(0.0, end - opened)
    led = _not_training(ledger)
    ours = [s for s in spans if s.first_at >= opened - SPAN_CLOCK_SLACK_S]
    # the newest step the members' spans saw; with none (a new leader: the notes went with the
    # old one), the notes' sum the status kept, whose span is the gang's pace, not its reach
    summed = ledger.training_noted if not ours else None
    if summed is not None and summed.first_at >= opened - SPAN_CLOCK_SLACK_S:
        ours, noted_until = [summed.span()], summed.last_at or None
    else:
        noted_until = max((s.last_at for s in ours), default=None)
    if not ours:
        return replace(led, unmeasured=led.unmeasured + spent), end
    first = min(ours, key=lambda s: (s.first_at, s.first_step))
    # The pace from each member's own span, never one member's start against another's end:
    # members that resumed apart (one pod back 0.9 s before the other, measured in
    # e2e/test_goodput.py) or on nodes whose clocks differ would count that gap as steps.
    paced = [s for s in ours if s.last_step > s.first_step and s.last_at >= s.first_at]
    pace: float | None = ledger.step_seconds
    if paced:
        seconds = sum(s.last_at - s.first_at for s in paced)
        pace = seconds / sum(s.last_step - s.first_step for s in paced)
    if pace is None:  # one step seen and no pace known: when training began is unknown
        return replace(led, unmeasured=led.unmeasured + spent), end
    began = first.first_at - max(0, first.first_step - resume) * pace
    began = min(max(began, opened), end)
    # The steps kept are the resume step's: the trainers reached it (its checkpoint was saved
    # in this epoch) even where the newest span seen ends before it (a note from before it).
    kept = max(0, (next_resume or 0) - resume)
    # (the members' times are their nodes' clocks, ``end`` the controller's: a node's clock
    # behind moves that much from wasted progress to detection, the total is unchanged)
    failures = [s.last_at + pace for s in failed if s.first_at >= opened - SPAN_CLOCK_SLACK_S]
    newest = [s.last_at for s in complete if s.first_at >= opened - SPAN_CLOCK_SLACK_S]
    if failures:
        failure = max(began, min(failures))  # (members that failed apart: the first)
        if end.is_integer() and end < failure <= end + SIGNAL_TIME_RESOLUTION_S:
            end = failure if latest is None else min(failure, max(end, latest))
        stopped = min(end, failure)
    elif newest:
        stopped = min(end, max(began, max(newest) + pace))
    else:
        # Known to have trained until the newest step noted and the resume step reached (not
        # the middle of the window's part after those: they come just before the failure,
        # and that middle is late on average).
        noted = began if noted_until is None else noted_until + pace
        trained = max(began, noted, began + kept * pace)
        stopped = min(end, max(trained, end - window / 2))
    training = stopped - began
    productive = min(kept * pace, training)
    warmup = "restore" if ledger.restarted else "startup"
    return replace(
        led,
        productive=led.productive + productive,
        badput=_add(
            led.badput,
            **{
                warmup: began - opened,
                "wasted_progress": training - productive,
                "detection": end - stopped,
            },
        ),
        step_seconds=pace,
    ), end
