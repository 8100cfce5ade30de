"""Hot spares (docs/design/hot-spares.md, section 5): the agent says it is alive to the leader
every ``HEARTBEAT_S`` (an empty report over the channel) and holds a lease from each answer:
``LEASE_S`` from when it *sent* the heartbeat, by this node's monotonic clock, written for the
launchers (:func:`jobset_inplace.launcher.write_lease`), which freeze the trainers once it has
ended. The leader gives a holder's slot away only ``LEASE_S + FENCE_MARGIN_S`` after it last
heard it: the lease ends first, whatever the clocks' offsets (no clock is compared across
machines), so two pods never train as one member.

Before the agent has read a status there is no lease at all (the launchers wait); where the
status names no channel (the leader serves none), there is nothing to hear the heartbeats: the
lease is unbounded and the fence is the controller's other signals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobset_inplace import launcher
from jobset_inplace.names import HEARTBEAT_S, LEASE_S
from jobset_inplace.protocol.envelope import HEARTBEAT
from jobset_inplace.protocol.gangstate import Endpoint

from .channel import ChannelError, ReportChannel
from .log import Log

__all__ = ["Heartbeat"]


class Heartbeat:
    """A daemon thread: a heartbeat every ``HEARTBEAT_S`` to the endpoint ``endpoint()`` gives
    (the newest status's), over ``channel`` (shared, thread-safe), and the lease written."""

    def __init__(
        self,
        channel: ReportChannel,
        endpoint: Callable[[], tuple[bool, Endpoint | None]],
        running: Callable[[], str | None],
        state_dir: Path,
        log: Log,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``endpoint``: whether a status was read, and the channel it names (None: none);
        ``running``: the slot this pod's trainer runs as (a member's name; None: none runs)."""
        self.channel, self.endpoint, self.running = channel, endpoint, running
        self.state_dir, self.log, self.clock = state_dir, log, clock
        self.until: float | None = None  # the lease's end as last written (None: unbounded)
        self.written = False
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while True:
            began = self.clock()
            self.beat()
            time.sleep(max(0.0, began + HEARTBEAT_S - self.clock()))

    def beat(self) -> None:
        """One heartbeat, and the lease it earns (an unanswered one earns nothing: the lease
        written before runs out)."""
        seen, endpoint = self.endpoint()
        if not seen:
            return  # no lease before the agent knows whether a leader hears heartbeats
        if endpoint is None:
            self._write(None)
            return
        sent = self.clock()
        running = self.running()
        try:
            answer = self.channel.send(endpoint, HEARTBEAT)
        except ChannelError as e:
            self.log.repeat("heartbeat", "WARN", f"heartbeat not answered ({self._left()}): {e}")
            return
        self.log.clear("heartbeat")
        holds = answer.get("holds")
        if running is not None and holds != running:
            # its slot was given away, or is being (the planner decided): the trainer must
            # stop; the agent's next status says so, the lease runs out meanwhile
            self.log.repeat(
                "heartbeat",
                "WARN",
                f"the leader says this pod holds {holds or 'no slot'}, not {running} its "
                f"trainer runs as: lease not renewed ({self._left()})",
            )
            return
        self._write(sent + LEASE_S)

    def _left(self) -> str:
        left = None if self.until is None else self.until - self.clock()
        return "no lease" if left is None or left <= 0 else f"lease ends in {left:.1f} s"

    def _write(self, until: float | None) -> None:
        if self.written and until is None and self.until is None:
            return  # unbounded, and said so already
        try:
            launcher.write_lease(self.state_dir, until)
        except OSError as e:
            self.log.repeat("lease", "WARN", f"cannot write the lease: {e}")
            return
        self.until, self.written = until, True
