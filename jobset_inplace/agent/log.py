"""One-line log records on stderr: ``<UTC time> <LEVEL> <message>``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Log"]


# Not jobset_inplace.times: the agent imports only the standard library, names and trainer.
def _timestamp(t: float) -> str:
    millis = int((t % 1) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{millis:03d}Z"


class Log:
    """Writes records; `repeat` suppresses a repeated message of the same topic (a retry
    loop) but lets it through once every `every` seconds, with a count."""

    def __init__(
        self,
        stream: TextIO | None = None,
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._every = every
        self._clock = clock
        self._last: dict[str, tuple[str, float, int]] = {}  # topic -> (message, when, muted)

    def _write(self, level: str, message: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        stream.write(f"{_timestamp(time.time())} {level} {message}\n")
        stream.flush()

    def info(self, message: str) -> None:
        self._write("INFO", message)

    def warning(self, message: str) -> None:
        self._write("WARN", message)

    def error(self, message: str) -> None:
        self._write("ERROR", message)

    def repeat(self, topic: str, level: str, message: str) -> None:
        """Log `message` unless it is the same as the last one of `topic` less than `every`
        seconds ago."""
        now = self._clock()
        last = self._last.get(topic)
        if last is not None and last[0] == message and now - last[1] < self._every:
            self._last[topic] = (last[0], last[1], last[2] + 1)
            return
        muted = last[2] if last is not None and last[0] == message else 0
        suffix = f" (repeated {muted} more times)" if muted else ""
        self._write(level, message + suffix)
        self._last[topic] = (message, now, 0)

    def clear(self, topic: str) -> None:
        """The condition of `topic` is over: its next message is logged at once."""
        self._last.pop(topic, None)
