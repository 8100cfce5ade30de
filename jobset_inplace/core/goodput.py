"""What a recovery cost the training, in steps (goodput accounting; docs/metrics.md):

* checkpoint steps given up (:func:`checkpoint_steps_lost`): the newest checkpoint any member
  can still read minus the resume step, i.e. checkpoints discarded so that every member resumes
  from the same one;
* progress steps lost (:func:`progress_steps_lost`): how far training had got (the newest step
  any member's trainers reported progress for, in the epoch the recovery ended) minus the resume
  step, i.e. the training the gang does again. Known only for trainers that report progress
  (``jobset_inplace.trainer.report_progress``, the same records hang detection reads)."""

from __future__ import annotations

from collections.abc import Sequence

from jobset_inplace.core.model import PodView


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
