"""Hang detection's rule, free of I/O: given the trainers' progress records the agent read and
its own clock, is a trainer of the running epoch hung?

Why the progress record and not the process: a trainer stuck in a collective (a peer's GPU or
NIC failed, NCCL waits forever) keeps every process alive, often spinning at 100 % CPU, so
neither liveness nor CPU time tells it from a working one. Only the training loop knows that it
advances; it says so by rewriting its record once per step (`jobset_inplace.trainer.progress`).

The rule, per epoch (from the moment this agent opened the barrier):

* **startup hang**: no record at all ``startup_timeout`` after the barrier opened (an
  initialisation that never finishes: a rendezvous or first collective that never forms);
* **hang**: a record whose content has not changed for ``hang_timeout`` (it advanced before,
  then stopped), unless it says the trainer parked at a planned stop's step (it waits there by
  design until the gang moves on, however long the others take).

Times are the agent's monotonic clock when it *saw* a record change, never the trainer's
timestamp: the two clocks need not agree and a record copied from elsewhere cannot fake
progress.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobset_inplace.trainer.progress import Progress

__all__ = ["HangRule", "HangWatch", "Hung"]


@dataclass(frozen=True)
class HangRule:
    hang_timeout: float | None = None  # seconds; None: off
    startup_timeout: float | None = None

    @property
    def enabled(self) -> bool:
        return self.hang_timeout is not None or self.startup_timeout is not None


@dataclass(frozen=True)
class Hung:
    epoch: int
    reason: str  # for the log: what was seen, for how long


class HangWatch:
    """One agent's view of its trainers' progress in the running epoch."""

    def __init__(self, rule: HangRule) -> None:
        self.rule = rule
        self.epoch: int | None = None
        self.opened_at = 0.0
        self.seen: dict[str, tuple[Progress, float]] = {}  # name -> (record, when it changed)

    def opened(self, epoch: int, now: float) -> None:
        """The barrier of ``epoch`` opened at ``now``: the trainers start over."""
        self.epoch, self.opened_at, self.seen = epoch, now, {}

    def observe(self, now: float, records: Mapping[str, Progress]) -> Hung | None:
        """Fold in the records just read; the hang they show, if any."""
        if self.epoch is None:
            return None
        for name, record in records.items():
            have = self.seen.get(name)
            if have is None or have[0] != record:
                self.seen[name] = (record, now)
        rule = self.rule
        if not self.seen:
            waited = now - self.opened_at
            if rule.startup_timeout is not None and waited >= rule.startup_timeout:
                return Hung(
                    self.epoch,
                    f"no progress reported {waited:.1f} s after the barrier of epoch "
                    f"{self.epoch} opened (startup-timeout {rule.startup_timeout:g} s)",
                )
            return None
        if rule.hang_timeout is None:
            return None
        for name, (record, since) in sorted(self.seen.items()):
            if record.parked:
                continue  # stopped at a planned stop's step on purpose: it waits to be stopped
            if now - since >= rule.hang_timeout:
                return Hung(
                    self.epoch,
                    f"trainer {name} has been at step {record.step} for {now - since:.1f} s "
                    f"(hang-timeout {rule.hang_timeout:g} s)",
                )
        return None
