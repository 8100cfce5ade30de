"""``kubectl jobset-inplace``: status, history, manual restart, offline enable and cluster
checks for jobset-inplace. Rendering lives in :mod:`.render` and :mod:`.doctor` (pure, on plain
dicts); :mod:`.cluster` is the thin API access."""

from __future__ import annotations

from .cli import main
from .exitcodes import ExitCode

__all__ = ["ExitCode", "main"]
