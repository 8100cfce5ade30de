"""The one retry rule of the project: wait ``first`` seconds after a failure, doubling with each
failure in a row, never more than ``cap``. Every retry loop (the agent's actions, the
controller's failed passes, its watches, the signing-key reads, the webhook's certificate)
uses it; standard library only (the agent's image carries nothing else)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first: float
    cap: float

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row (0 after none)."""
        if failures <= 0:
            return 0.0
        return float(min(self.cap, self.first * 2 ** min(failures - 1, 64)))


class Retries:
    """A loop's failures in a row under ``backoff``; with ``jitter``, each wait is drawn from
    [half, all] of the rule's delay (many clients failing together do not retry together)."""

    def __init__(self, backoff: Backoff, *, jitter: bool = False) -> None:
        self.backoff, self.jitter = backoff, jitter
        self.failures = 0

    def failed(self) -> float:
        """Count a failure; the seconds to wait before the next try."""
        self.failures += 1
        delay = self.backoff.delay(self.failures)
        return delay * random.uniform(0.5, 1.0) if self.jitter else delay

    def succeeded(self) -> None:
        self.failures = 0
