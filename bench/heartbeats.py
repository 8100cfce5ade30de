"""The simulated agents' heartbeats (hot spares), sent from a process of their own.

Every agent of a gang with hot spares sends an empty report to the leader every
``HEARTBEAT_S`` (:class:`~jobset_inplace.agent.heartbeat.Heartbeat`), each from its own node.
The simulated fleet (bench/fleet.py) runs 1000 agents' decision code in one Python process;
sent from there too, the heartbeats waited behind that process's other threads (the GIL, its
lock, the reports of 1000 agents restarting at once), the leader called live agents silent
and the first 1000-pod runs escalated before any node died. So they are sent from a child
process, with the agents' real client (:class:`~jobset_inplace.agent.channel.ReportChannel`:
one kept-alive TLS connection each, the pinned certificate, the pod-bound token), at a higher
CPU priority than the cluster's processes (``nice -10``): a real agent's heartbeat does not
compete with the control plane for a CPU. What differs from a real agent: its heartbeat and
its reports do not share one connection here (the fleet's reports use their own), and no
lease file is written (the trainers are simulated; the fence's arithmetic is the leader's).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

from jobset_inplace.agent.channel import ChannelError, ReportChannel
from jobset_inplace.names import HEARTBEAT_S
from jobset_inplace.protocol.envelope import HEARTBEAT
from jobset_inplace.protocol.gangstate import Endpoint

TICK_S = 0.02  # a second's heartbeats are sent in 1 / TICK_S groups, spread evenly
THREADS = 64  # enough that the leader's answer time does not hold back the next agents'
PRIORITY = -10  # os.nice: above the cluster's processes (0)


@dataclass(frozen=True)
class Agent:
    """Who a heartbeat is from: what the channel's request names, and its token."""

    namespace: str
    gang: str
    pod: str
    uid: str
    token_file: Path


@dataclass
class Counts:
    sent: int  # answered by the leader
    late: int  # not sent: the agent's previous heartbeat was still unanswered
    errors: int


class HeartbeatSender:
    """The parent's handle: tell it which agents beat, to which endpoint, and when to stop."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: none of our threads
        self._queue: Queue[tuple[str, Agent | str, Endpoint | None] | None] = ctx.Queue()
        self._sent = ctx.Value("q", 0)
        self._late = ctx.Value("q", 0)
        self._errors = ctx.Value("q", 0)
        self._process = ctx.Process(
            target=_serve,
            args=(self._queue, self._sent, self._late, self._errors),
            name="fleet-heartbeats",
            daemon=True,
        )

    def start(self) -> None:
        self._process.start()

    def beat(self, agent: Agent, endpoint: Endpoint) -> None:
        """``agent`` heartbeats to ``endpoint`` from now on (a new endpoint: to that one)."""
        self._queue.put(("beat", agent, endpoint))

    def stop(self, uid: str) -> None:
        """The agent of pod ``uid`` sends no more heartbeats (its node died, its pod went)."""
        self._queue.put(("stop", uid, None))

    def counts(self) -> Counts:
        return Counts(self._sent.value, self._late.value, self._errors.value)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._queue.put(None)
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()


def _serve(
    queue: Queue[tuple[str, Agent | str, Endpoint | None] | None],
    sent: Synchronized[int],
    late: Synchronized[int],
    errors: Synchronized[int],
) -> None:
    """The child: every registered agent's heartbeat every HEARTBEAT_S, spread evenly."""
    with contextlib.suppress(OSError):
        os.nice(PRIORITY)
    lock = threading.Lock()
    channels: dict[str, ReportChannel] = {}
    endpoints: dict[str, Endpoint] = {}
    in_flight: set[str] = set()

    def intake() -> None:
        while (message := queue.get()) is not None:
            kind, who, endpoint = message
            with lock:
                if kind == "stop":
                    assert isinstance(who, str)
                    endpoints.pop(who, None)
                    if (gone := channels.pop(who, None)) is not None:
                        gone.close()
                    continue
                assert isinstance(who, Agent)
                assert endpoint is not None
                if who.uid not in channels:
                    channels[who.uid] = ReportChannel(
                        who.namespace, who.gang, who.pod, who.uid, who.token_file
                    )
                endpoints[who.uid] = endpoint
        os._exit(0)

    def beat(uid: str, channel: ReportChannel, endpoint: Endpoint) -> None:
        try:
            channel.send(endpoint, HEARTBEAT)
            with sent.get_lock():
                sent.value += 1
        except ChannelError:
            with errors.get_lock():
                errors.value += 1
        finally:
            with lock:
                in_flight.discard(uid)

    threading.Thread(target=intake, daemon=True, name="intake").start()
    pool = ThreadPoolExecutor(THREADS, thread_name_prefix="beat")
    ticks = max(1, round(HEARTBEAT_S / TICK_S))
    while True:
        began = time.monotonic()
        with lock:
            uids = sorted(endpoints)
        for tick in range(ticks):
            for uid in uids[tick::ticks]:
                with lock:
                    channel, endpoint = channels.get(uid), endpoints.get(uid)
                    if channel is None or endpoint is None:
                        continue  # stopped meanwhile
                    if uid in in_flight:
                        with late.get_lock():
                            late.value += 1
                        continue
                    in_flight.add(uid)
                pool.submit(beat, uid, channel, endpoint)
            time.sleep(max(0.0, began + (tick + 1) * TICK_S - time.monotonic()))
