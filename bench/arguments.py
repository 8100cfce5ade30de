"""Command-line forms the benchmarks share: one parser per form, one error per form."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def counts(minimum: int, what: str) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated integers, each ``minimum`` or more (``what`` they
    count names them in the error, with an example)."""

    def parse(raw: str) -> list[int]:
        try:
            values = [int(s) for s in raw.split(",") if s]
        except ValueError:
            values = []
        if not values or any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what} >= {minimum} (e.g. 1000,5000), got {raw!r}"
            )
        return values

    return parse
