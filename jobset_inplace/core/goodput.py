"""What a recovery cost the training, in steps (goodput accounting; docs/metrics.md):

* checkpoint steps given up (:func:`checkpoint_steps_lost`): the newest checkpoint any member
  can still read minus the resume step, i.e. checkpoints discarded so that every member resumes
  from the same one;
* progress steps lost (:func:`progress_steps_lost`): how far training had got (the newest step
  any member's trainers reported progress for, in the epoch the recovery ended) minus the resume
  step, i.e. the training the gang does again. Known only for trainers that report progress
  (``jobset_inplace.trainer.report_progress``, the same records hang detection reads);
* goodput by time (:class:`Ledger`, below): productive seconds and badput seconds by bucket."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from jobset_inplace.core.model import Bucket, Ledger, PodView, Recovery
from jobset_inplace.trainer.progress import ProgressSpan

__all__ = [
    "Bucket",
    "Goodput",
    "Ledger",
    "barrier_opened",
    "checkpoint_steps_lost",
    "live",
    "progress_steps_lost",
    "training_ended",
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


@dataclass(frozen=True)
class Goodput:
    """The account as a reader sees it at ``now``: the running epoch's time since its barrier
    opened counted productive (its restore and any steps it loses are accounted when it ends)."""

    ratio: float | None  # productive / (productive + badput); None: nothing measured yet
    productive: float
    badput: Mapping[Bucket, float]
    running: float  # seconds of the running epoch included in ``productive``


def live(ledger: Ledger, now: float) -> Goodput:
    running = 0.0 if ledger.training_since is None else max(0.0, now - ledger.training_since)
    productive = ledger.productive + running
    measured = productive + ledger.badput_total
    ratio = productive / measured if measured > 0 else None
    return Goodput(ratio, productive, dict(ledger.badput), running)


def _add(badput: Mapping[Bucket, float], **seconds: float) -> dict[Bucket, float]:
    out = dict(badput)
    for name, value in seconds.items():
        bucket = Bucket[name.upper()]
        out[bucket] = out.get(bucket, 0.0) + max(0.0, value)
    return out


def barrier_opened(ledger: Ledger, rec: Recovery, spans: Sequence[ProgressSpan]) -> Ledger:
    """``ledger`` once ``rec``'s barrier opened (``rec.opened`` and ``rec.resume_step`` set):
    the epoch that ended at its first signal accounted from the members' ``spans`` of it, the
    recovery's own time in its buckets, and its epoch's training running."""
    assert rec.opened is not None
    if ledger.training_since is None:  # a start (or a restart after a suspension)
        led = replace(
            ledger,
            since=rec.began if ledger.since is None else ledger.since,
            badput=_add(ledger.badput, scheduling=rec.opened - rec.began),
        )
        restarted = False
    else:
        led = _close_epoch(ledger, rec.began, spans, rec.resume_step)
        led = replace(
            led,
            badput=_add(
                led.badput,
                detection=rec.started - rec.began,
                recovery=rec.opened - rec.started,
            ),
        )
        restarted = True
    return replace(
        led,
        training_epoch=rec.epoch,
        training_since=rec.opened,
        training_resume=rec.resume_step,
        restarted=restarted,
    )


def training_ended(ledger: Ledger, now: float, *, kept: bool) -> Ledger:
    """The running epoch ended without a next one: the JobSet finished (``kept``: every step
    is kept; its startup or restore time cannot be told apart and counts as productive), or
    the gang stood down or failed (unmeasured: no report of how far it got comes)."""
    if ledger.training_since is None:
        return ledger
    spent = max(0.0, now - ledger.training_since)
    led = replace(ledger, training_epoch=None, training_since=None, training_resume=None)
    if kept:
        return replace(led, productive=led.productive + spent)
    return replace(led, unmeasured=led.unmeasured + spent)


def _close_epoch(
    ledger: Ledger, end: float, spans: Sequence[ProgressSpan], next_resume: int | None
) -> Ledger:
    """Account the running epoch, from its barrier's opening to ``end`` (the next failure's
    first signal): startup or restore until training began, then the steps the next epoch
    keeps (up to ``next_resume``) as productive and the rest as wasted progress."""
    opened = ledger.training_since
    assert opened is not None
    resume = ledger.training_resume or 0
    spent = max(0.0, end - opened)
    led = replace(ledger, training_epoch=None, training_since=None, training_resume=None)
    ours = [s for s in spans if s.first_at >= opened - SPAN_CLOCK_SLACK_S]
    if not ours:
        return replace(led, unmeasured=led.unmeasured + spent)
    first = min(ours, key=lambda s: (s.first_at, s.first_step))
    last = max(ours, key=lambda s: (s.last_step, s.last_at))
    pace: float | None = None
    if last.last_step > first.first_step and last.last_at >= first.first_at:
        pace = (last.last_at - first.first_at) / (last.last_step - first.first_step)
    pace = pace if pace is not None else ledger.step_seconds
    if pace is None:  # one step seen and no pace known: when training began is unknown
        return replace(led, unmeasured=led.unmeasured + spent)
    began = first.first_at - max(0, first.first_step - resume) * pace
    began = min(max(began, opened), end)
    kept = max(0, min(last.last_step, next_resume or 0) - resume)
    training = end - began
    productive = min(kept * pace, training)
    warmup = "restore" if ledger.restarted else "startup"
    return replace(
        led,
        productive=led.productive + productive,
        badput=_add(
            led.badput, **{warmup: began - opened, "wasted_progress": training - productive}
        ),
        step_seconds=pace,
    )
