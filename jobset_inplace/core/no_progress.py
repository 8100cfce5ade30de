"""The stop rule: a gang that fails the same way again and again without getting any further
escalates at once instead of spending its in-place budget on restarts that end where they
began (a step that always crashes: a bad batch, an allocation that never fits).

Judged when a failure's recovery opens its barrier, the first time the members' reports say
how far the epoch that failed got:

* the failure's **signature** is the first signal of the members that started it (the
  planner's ``Recovery.first_signal``: ``TrainerExited``, ``TrainerHung``, ...), counted only
  when every failing member failed for a reason of its trainer's or its containers'
  (:data:`TRAINER_CAUSES`): a node, a device, a drain or a silent agent is not the job's own
  failure and ends the run;
* **how far** the failed epoch got: the newest step its trainers reported progress for (with
  the new epoch's reports), else the checkpoint the gang resumes from; unknown (neither: no
  progress records, no checkpoint) ends the run, so a gang this rule cannot judge is never
  stopped by it;
* a run is the failures in a row with one signature none of which got further than the
  furthest step the gang had reached at the first of them: ``limit`` of them (the policy's
  ``no-progress-limit``) escalate. A failure that got further starts a new run from there,
  so a gang that keeps passing its furthest step, however often it fails, is never stopped.

Pure: snapshot values in, the new memory out."""

from __future__ import annotations

from collections.abc import Sequence

from jobset_inplace.core.model import Cause, PodView, Recovery, Repeats

# What makes a failure the job's own: the trainer exited or hung, its containers restarted,
# its pod failed; a member failing in place again and again (recreated for it) too.
TRAINER_CAUSES = frozenset(
    {
        Cause.TRAINER_EXITED,
        Cause.TRAINER_HUNG,
        Cause.RESTARTING,
        Cause.POD_FAILED,
        Cause.REPEATED_FAILURE,
    }
)


def signature(rec: Recovery) -> str | None:
    """The failure's signature, or None when it does not count (no member failure, a
    failing member's reason is not its trainer's, or no first signal recorded)."""
    if not rec.causes or rec.first_signal is None:
        return None
    if any(cause not in TRAINER_CAUSES for cause in rec.causes.values()):
        return None
    return rec.first_signal.value


def furthest_step(joined: Sequence[PodView], resume_step: int | None) -> int | None:
    """How far the epoch that failed got: the newest step any member's trainers reported
    progress for, else ``resume_step`` (None: neither is known)."""
    reached = [pod.progress_step for pod in joined if pod.progress_step is not None]
    if reached:
        return max(reached)
    return resume_step


def observe(memory: Repeats | None, sig: str | None, furthest: int | None) -> Repeats | None:
    """The memory after a failure's barrier: its run one longer when the failure has the
    run's signature and got no further than the run's furthest step; else a new run of one
    (None when the failure does not count)."""
    if sig is None or furthest is None:
        return None
    if memory is not None and memory.signature == sig and furthest <= memory.furthest:
        return Repeats(sig, memory.count + 1, memory.furthest)
    return Repeats(sig, 1, furthest)


def stop(memory: Repeats | None, limit: int) -> bool:
    """Whether the run is long enough to escalate (``limit`` 0: never)."""
    return limit > 0 and memory is not None and memory.count >= limit
