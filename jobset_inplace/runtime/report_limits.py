"""What the report channel lets in before anyone has authenticated: its port is reachable from
every pod of the cluster, so a hostile pod must not be able to exhaust the leader's memory,
file descriptors or event loop with connections that never send a valid report
(docs/guarantees.md, fault model: a hostile pod at the channel's port).

:class:`Admission` decides, with no I/O and the clock passed in, whether a new connection from a
source address is taken, and counts what is open. Limits, all per leader process:

* ``max_connections``: every connection, below the open-files limit with a reserve for the
  API sockets the controller needs (status writes, pod actions, Lease renewals);
* ``max_unauthenticated``: connections that have not had a report accepted yet, and
  ``max_unauthenticated_per_source`` of them from one address (a pod, or a node for
  host-network pods); shared fairly: when all are taken, a new connection from an address
  holding fewer than the heaviest holder less one, or from a gang member pod's address, closes
  that holder's oldest (``fair_share``), so dozens of addresses cannot fill them against an
  agent's one;
* ``max_per_source``: every connection from one address;
* a token bucket per source for new connections (``connect_rate`` per second, ``connect_burst``
  at once): a TLS handshake costs ~0.5 ms of the loop's CPU;
* ``max_per_identity``: connections that had a report accepted for one pod (its token's), from
  any address: an agent needs one (two while it replaces it); beyond, the oldest is closed, so
  a stolen token holds at most that many and the pod's own agent is never refused for it.

:class:`HandshakeGate` then spaces the TLS handshakes of every source together
(``handshake_rate`` per second, ``handshake_burst`` at once): a connection over the rate waits
(its bytes unread, at no cost but its socket) and the waiting are served one per source in
turn; connections from the address of a gang's member pod are not held by it (their number is
the gangs' own, and a new leader's gang reconnects at once). So dozens of addresses at their
own rate cannot take a core of the loop, nor make an agent's connection wait behind theirs.
An address one of whose connections ended without a report accepted in the last
``SUSPECT_S`` (a refused token, a handshake and nothing, a pre-authentication timeout) or was
closed for its pod's identity limit, or that holds ``SUSPECT_HOLDING`` connections before
authentication, waits behind every other: an agent the leader cannot tell by its address
yet (a new pod whose address its cache has not seen) is served before the addresses that have
been wasting the loop's work, at once where the budget allows one.

A connection that authenticates (a report accepted) stops counting as unauthenticated; it is
then the only kind kept open while idle (report_http.py)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

# Reasons a connection is dropped before it is served: the ``reason`` label of
# jobset_inplace_report_channel_connections_refused_total.
OVER_TOTAL = "connection_limit"
OVER_SOURCE = "source_limit"
OVER_UNAUTHENTICATED = "unauthenticated_limit"
RATE_LIMITED = "rate_limited"
PREAUTH_TIMEOUT = "preauth_timeout"  # handshake and first report not done within PREAUTH_S
OVER_IDENTITY = "identity_limit"  # closed: its pod's token authenticated newer connections
FAIR_SHARE = "fair_share"  # closed unauthenticated: room for a source that held fewer
EARLY_DATA = "early_data"  # sent more than a TLS record while its handshake waited its turn
REFUSALS = (
    OVER_TOTAL,
    OVER_SOURCE,
    OVER_UNAUTHENTICATED,
    RATE_LIMITED,
    PREAUTH_TIMEOUT,
    OVER_IDENTITY,
    FAIR_SHARE,
    EARLY_DATA,
)

# Open-files reserve kept for everything but the channel's connections.
FD_RESERVE = 512
MAX_SOURCES = 65536  # source addresses whose bucket is remembered (least recently seen go first)
# An address whose connection ended without a report accepted, or was closed for its pod's
# identity limit, is served after the others this long (HandshakeGate); an agent's own
# connections end so only when its report is refused or its process was replaced.
SUSPECT_S = 60.0
# ... and one holding this many connections before authentication (an agent holds one or two)
SUSPECT_HOLDING = 8
# Handshakes the suspect never take from the gate's budget: another's starts at once.
SUSPECT_RESERVE = 2


@dataclass(frozen=True)
class Limits:
    max_connections: int = 20000
    max_per_source: int = 512
    max_unauthenticated: int = 2048
    max_unauthenticated_per_source: int = 64
    connect_rate: float = 50.0  # new connections per second from one source
    connect_burst: float = 400.0  # every agent of a host-network node reconnecting to a new leader
    max_per_identity: int = 2
    # TLS handshakes of the addresses that are no member pod's, together: each costs the loop
    # 0.8-1.2 ms with its connection and request (OpenSSL's part 0.43 ms; docs/architecture.md),
    # so 100/s is about a tenth of a core (member pods' connections are not held by it)
    handshake_rate: float = 100.0
    handshake_burst: float = 200.0

    @staticmethod
    def parse(text: str) -> Limits:
        """Limits from ``key=value,...`` (keys: the field names; unnamed ones keep their
        default), as ``JSI_REPORT_LIMITS`` gives them. Raises ValueError naming what is
        wrong and the accepted form."""
        values: dict[str, float | int] = {}
        known = {f.name: f.type for f in dataclasses.fields(Limits)}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(known)}")
            number: float | int
            try:
                number = float(raw) if known[key] == "float" else int(raw)
            except ValueError:
                kind = "a number" if known[key] == "float" else "a whole number"
                raise ValueError(f"{key}: {raw!r} is not {kind}") from None
            if not number > 0:
                raise ValueError(f"{key}: must be above 0, got {raw!r}")
            values[key] = number
        return Limits(**values)  # type: ignore[arg-type]

    @staticmethod
    def for_open_files(limit: int, base: Limits | None = None) -> Limits:
        """``base`` with ``max_connections`` below an open-files ``limit`` (less the reserve)."""
        base = base or Limits()
        cap = max(1, min(base.max_connections, limit - FD_RESERVE))
        return dataclasses.replace(
            base,
            max_connections=cap,
            max_per_source=min(base.max_per_source, cap),
            max_unauthenticated=min(base.max_unauthenticated, cap),
        )


@dataclass
class _Source:
    open: int = 0
    tokens: float = 0.0
    refilled: float = 0.0
    # its connections not authenticated yet, oldest first
    unauthenticated: OrderedDict[Hashable, None] = field(default_factory=OrderedDict)
    suspect_until: float = float("-inf")  # one of its connections ended unauthenticated


@dataclass
class Admission:
    limits: Limits = field(default_factory=Limits)
    open: int = 0
    unauthenticated: int = 0
    _sources: OrderedDict[str, _Source] = field(default_factory=OrderedDict)
    # sources by how many unauthenticated connections they hold (> 0), to find the heaviest
    # in O(1): a count changes by one at a time
    _by_unauthenticated: dict[int, set[str]] = field(default_factory=dict)
    _heaviest: int = 0
    # identity -> its authenticated connections, oldest first (each is open: bounded by them)
    _identities: dict[str, OrderedDict[Hashable, None]] = field(default_factory=dict)

    def bind(self, identity: str, connection: Hashable) -> Hashable | None:
        """``connection`` had a report accepted for ``identity``: the connection to close now
        (the identity's oldest, once it has more than ``max_per_identity``), or None."""
        mine = self._identities.setdefault(identity, OrderedDict())
        mine[connection] = None
        if len(mine) > self.limits.max_per_identity:
            return mine.popitem(last=False)[0]
        return None

    def most_per_identity(self) -> int:
        """The most connections bound to one identity now (O(identities): for benchmarks)."""
        return max(map(len, self._identities.values()), default=0)

    def unbind(self, identity: str, connection: Hashable) -> None:
        """A connection bound to ``identity`` closed."""
        mine = self._identities.get(identity)
        if mine is not None:
            mine.pop(connection, None)
            if not mine:
                del self._identities[identity]

    def admit(
        self, source: str, now: float, connection: Hashable, *, member: bool = False
    ) -> tuple[str | None, Hashable | None]:
        """Take ``connection``, new and unauthenticated, from ``source`` (``member``: a gang
        member pod's address): (None, or why it is refused: one of REFUSALS, then nothing is
        counted; an unauthenticated connection to close for it, already counted as closed, or
        None).

        The unauthenticated budget is shared fairly: when it is full, a source that holds
        fewer unauthenticated connections than the heaviest holder less one takes the
        heaviest's oldest (so dozens of addresses cannot fill it against an agent's one), and
        a member pod's address takes it whatever the others hold (so 2048 addresses holding
        one each cannot either)."""
        lim = self.limits
        s = self._source(source, now)
        if self.open >= lim.max_connections:
            return OVER_TOTAL, None
        if s.open >= lim.max_per_source:
            return OVER_SOURCE, None
        if len(s.unauthenticated) >= lim.max_unauthenticated_per_source:
            return OVER_UNAUTHENTICATED, None
        full = self.unauthenticated >= lim.max_unauthenticated
        if full and not member and self._heaviest <= len(s.unauthenticated) + 1:
            return OVER_UNAUTHENTICATED, None
        if s.tokens < 1:
            return RATE_LIMITED, None
        victim = None
        if full:  # the heaviest holder's oldest makes room
            heaviest = next(iter(self._by_unauthenticated[self._heaviest]))
            victim = next(iter(self._sources[heaviest].unauthenticated))
            self.closed(heaviest, victim, authenticated=False, now=now)
        s.tokens -= 1
        s.open += 1
        self.open += 1
        self._count(source, s, connection, +1)
        return None, victim

    def authenticated(self, source: str, connection: Hashable) -> None:
        """``connection`` of ``source`` had a report accepted (once per connection)."""
        s = self._sources.get(source)
        if s is not None and connection in s.unauthenticated:
            self._count(source, s, connection, -1)

    def closed(self, source: str, connection: Hashable, *, authenticated: bool, now: float) -> None:
        """``connection`` of ``source`` closed (``authenticated``: it had a report accepted);
        one that had none makes its source suspect until ``now`` + SUSPECT_S."""
        s = self._sources.get(source)
        if s is None or s.open == 0:
            return
        s.open -= 1
        self.open -= 1
        if not authenticated and connection in s.unauthenticated:
            self._count(source, s, connection, -1)
            self.mark_suspect(source, now)

    def mark_suspect(self, source: str, now: float) -> None:
        """``source`` wasted the channel's work (a connection that ended unauthenticated, or
        one closed for its pod's identity limit): suspect until ``now`` + SUSPECT_S."""
        s = self._sources.get(source)
        if s is not None:
            s.suspect_until = max(s.suspect_until, now + SUSPECT_S)

    def suspect(self, source: str, now: float) -> bool:
        """Whether ``source`` wasted the channel's work in the last SUSPECT_S or holds
        SUSPECT_HOLDING connections before authentication now (its handshakes wait behind
        the others')."""
        s = self._sources.get(source)
        return s is not None and (
            now < s.suspect_until or len(s.unauthenticated) >= SUSPECT_HOLDING
        )

    def _count(self, source: str, s: _Source, connection: Hashable, delta: int) -> None:
        """``connection`` of ``source`` counted as unauthenticated (+1) or no longer (-1)."""
        was = len(s.unauthenticated)
        if delta > 0:
            s.unauthenticated[connection] = None
        else:
            del s.unauthenticated[connection]
        self.unauthenticated += delta
        now = was + delta
        if was:
            bucket = self._by_unauthenticated[was]
            bucket.discard(source)
            if not bucket:
                del self._by_unauthenticated[was]
        if now:
            self._by_unauthenticated.setdefault(now, set()).add(source)
        if now > self._heaviest:
            self._heaviest = now
        elif was == self._heaviest and was not in self._by_unauthenticated:
            self._heaviest = now  # it was the only one that heavy: one less is the heaviest

    def _source(self, source: str, now: float) -> _Source:
        lim = self.limits
        s = self._sources.get(source)
        if s is None:
            s = self._sources[source] = _Source(tokens=lim.connect_burst, refilled=now)
            self._forget_idle_sources()
        else:
            self._sources.move_to_end(source)
            if now > s.refilled:  # (a time before the last one credits nothing, twice)
                s.tokens = min(lim.connect_burst, s.tokens + (now - s.refilled) * lim.connect_rate)
                s.refilled = now
        return s

    def _forget_idle_sources(self) -> None:
        """Bound the memory of buckets: the least recently seen sources with nothing open go
        (their next connection starts with a full bucket)."""
        if len(self._sources) <= MAX_SOURCES:
            return
        for source, s in list(self._sources.items()):
            if len(self._sources) <= MAX_SOURCES // 2:
                break
            if s.open == 0:
                del self._sources[source]


@dataclass
class HandshakeGate:
    """TLS handshakes of the sources that are no member pod's, together, at most ``rate`` a
    second after a ``burst``: :meth:`ask` says whether a connection's handshake may start
    now, else it waits; :meth:`grant` gives the waiting their turn as the budget refills, one
    per source in turn (round robin), so a source with one connection waits behind each other
    source's one, not behind all of theirs. No I/O; the clock is passed in.

    Memory: a waiting connection is one deque entry; how many can wait is bounded by the
    unauthenticated limits (:class:`Admission`)."""

    rate: float
    burst: float
    tokens: float | None = None  # (None: full, from the first call on)
    refilled: float = 0.0
    # per lane (0: sources in good standing, 1: suspect ones, served when lane 0 is empty):
    # source -> its waiting connections, oldest first; sources in the order they are served
    _lanes: tuple[OrderedDict[str, deque[Hashable]], ...] = field(
        default_factory=lambda: (OrderedDict(), OrderedDict())
    )
    # a waiting connection's source and lane
    _source_of: dict[Hashable, tuple[str, int]] = field(default_factory=dict)

    @property
    def waiting(self) -> int:
        return len(self._source_of)

    @property
    def _reserve(self) -> float:
        """What the suspect leave of the budget (less where the burst is smaller)."""
        return min(SUSPECT_RESERVE, max(0.0, self.burst - 1))

    def ask(self, source: str, connection: Hashable, now: float, *, suspect: bool = False) -> bool:
        """Whether ``connection``'s handshake may start now; if not, it waits its turn
        (``suspect``: behind every connection of a source that is not, and never taking the
        budget's last SUSPECT_RESERVE: another's connection starts at once)."""
        lane = int(suspect)
        ahead = self._source_of if suspect else self._lanes[0]  # who it would wait behind
        if not ahead and self._refill(now) >= 1 + lane * self._reserve:
            self.tokens = self._refill(now) - 1
            return True
        queue = self._lanes[lane].get(source)
        if queue is None:
            queue = self._lanes[lane][source] = deque()
        queue.append(connection)
        self._source_of[connection] = source, lane
        return False

    def cancel(self, connection: Hashable) -> None:
        """``connection`` closed while it waited (or did not wait)."""
        where = self._source_of.pop(connection, None)
        if where is None:
            return
        source, lane = where
        queue = self._lanes[lane][source]
        queue.remove(connection)  # (at most a source's unauthenticated limit long)
        if not queue:
            del self._lanes[lane][source]

    def grant(self, now: float) -> list[Hashable]:
        """The waiting connections whose handshake may start now, one per source in turn,
        the suspect sources' only when no other source's waits."""
        tokens = self._refill(now)
        granted: list[Hashable] = []
        for lane, queues in enumerate(self._lanes):
            while queues and tokens >= 1 + lane * self._reserve:
                source, queue = next(iter(queues.items()))
                connection = queue.popleft()
                del self._source_of[connection]
                if queue:
                    queues.move_to_end(source)  # its next one after every other source's
                else:
                    del queues[source]
                tokens -= 1
                granted.append(connection)
        self.tokens = tokens
        return granted

    def next_grant_s(self) -> float:
        """Seconds until the budget has room for the next one waiting (0: now)."""
        need = 1 + (self._reserve if not self._lanes[0] else 0)
        return max(0.0, (need - (self.burst if self.tokens is None else self.tokens)) / self.rate)

    def _refill(self, now: float) -> float:
        """The budget at ``now`` (a time before the last one's adds nothing)."""
        if self.tokens is None:
            self.tokens, self.refilled = self.burst, now
        elif now > self.refilled:
            self.tokens = min(self.burst, self.tokens + (now - self.refilled) * self.rate)
            self.refilled = now
        return self.tokens
