"""The report channel's server (docs/architecture.md, "Report channel"): the leader takes its
agents' reports (epoch, checkpoint steps, a trainer's exit or hang) over HTTPS instead of each
agent writing them on its pod, so a recovery's API writes do not grow with the gang.

* Only the leader serves it, with a certificate made in memory at its start; the GangState
  status names the URL, the certificate's SHA-256 (agents pin it before sending a token) and a
  per-process id (:class:`~jobset_inplace.core.model.ReportEndpoint`, advertised by the
  planner). A new leader's first status writes tell every agent to send its report again.
* A report carries the agent's projected token for the audience
  :data:`~jobset_inplace.names.REPORT_TOKEN_AUDIENCE`, verified offline
  (:mod:`.report_tokens`); reports are accepted only for that token's own pod: an agent speaks
  for its own pod, as the admission policy holds its pod writes to.
* Reports decode exactly as the pod annotations do
  (:mod:`jobset_inplace.protocol`: one codec, one envelope), land in the cache (the newer of channel
  and annotations wins) and poke the gang's planner.

A report with no keys is a heartbeat (hot spares: docs/design/hot-spares.md, section 5): the
time it was taken is kept for the planner (how long each agent has been silent), nothing else.
A report of ``progress-note`` alone is heard as one, and the note is kept in the cache (how far
the member's trainers are in the running epoch; goodput accounts an epoch whose pods all went
from it), with no planner pass.
Every 200 answer says which slot the pod holds (``holds``: a member's name, or null).

Answers: 200 accepted; 400 a malformed report (the field named); 401 a token the apiserver
does not accept for this audience; 403 a token of another pod; 409 a pod this leader does not
know as a member of that gang (yet); 503 this replica cannot prove it still leads (asked as a
request is taken, and again after its token's verification, before anything is accepted:
no lease of an agent is renewed by a leader its successor may already have replaced); a
request that is not a report is refused by the HTTP layer
(:mod:`.report_http`). Agents write their report on their pod after any failure.

Report fronts (docs/design/report-fronts.md, :mod:`.report_front`) take reports off the wire
for the leader: given a ``link``, the leader takes their batches there (``POST /v1/batches``)
from the pods its ``fronts`` predicate accepts, each report as if it came alone, and names the
fronts it hears from in its endpoint (:func:`.core.report_fronts.live_fronts`): each gang's
status then tells its agents where to send."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from kubernetes import client

from jobset_inplace import names
from jobset_inplace.core.gangstate import progress_write_interval
from jobset_inplace.core.model import ReportEndpoint
from jobset_inplace.core.report_fronts import FRONT_TTL_S, Link, https_url, live_fronts
from jobset_inplace.protocol.envelope import (
    EnvelopeError,
    Heartbeat,
    ProgressNote,
    Sender,
    decode_message,
    parse_request,
)
from jobset_inplace.protocol.front_link import Entry, EntryAnswer, decode_batch, encode_answers
from jobset_inplace.protocol.gangstate import Front
from jobset_inplace.runtime.process import raise_open_files_limit, release_free_memory
from jobset_inplace.runtime.report_http import (
    Answer,
    HttpServer,
    Listening,
    Refused,
    Request,
)
from jobset_inplace.runtime.report_limits import Limits
from jobset_inplace.runtime.report_tls import serving_context
from jobset_inplace.runtime.report_tokens import Identity, Rejected, TokenVerifier

from .cache import ClusterCache, EpochReport, GangKey
from .metrics import METRICS

log = logging.getLogger("jobset_inplace.reports")


class Poke(Protocol):
    """Plan a gang (:meth:`.Reconciler.poke`): ``delay``: within that long; ``urgent``: now,
    the gang waits for nothing."""

    def __call__(
        self, key: GangKey, delay: float | None = None, *, urgent: bool = False
    ) -> None: ...


# A report the barrier waited for, with more still to come, changes only how many it waits
# for, which the status shows no sooner than every progress_write_interval (each count write is
# an event for every agent): its gang is planned within that long, not at the debounce; the
# last one is planned at once. (At 2000 members, a recovery took 3.5-5 planning passes while
# its reports came in, at the debounce: docs/benchmarks.md, "The leader's cost per member"; at
# 10,000, within 1 s, 3 passes whose middle one could write nothing: the same page's fifth
# 10,000-pod run.)


MAX_BODY = 16 * 1024  # a report is ~200 bytes
# A front's batch (docs/design/report-fronts.md): up to front_link.BATCH_MAX reports of ~200
# bytes; a front sends larger ones as several. The link serves the controller's few replicas:
# a handful of connections, each body read before its token is checked (at most
# LINK_LIMITS.max_unauthenticated x LINK_MAX_BODY: 8 MiB).
LINK_MAX_BODY = 1024 * 1024
LINK_LIMITS = Limits(
    max_connections=64,
    max_per_source=4,
    max_unauthenticated=8,
    max_unauthenticated_per_source=2,
    connect_rate=5.0,
    connect_burst=10.0,
    max_per_identity=2,
    handshake_rate=10.0,
    handshake_burst=20.0,
)
LOG_EVERY_S = 10.0  # refusals of one code are logged at most this often
QUIET_S = 2.0  # requests stopped this long: a burst is over (free memory is given back)
STALL_TICK_S = 0.1  # how often the event loop's lateness is measured (ClusterCache.stalled)


async def measure_stalls(cache: ClusterCache, tick: float = STALL_TICK_S) -> None:
    """Add up how late this event loop wakes a timer of ``tick`` seconds (its other work, the
    process descheduled, the GIL held by another thread): the time it could not have read a
    heartbeat (``ClusterCache.stalled``)."""
    clock = time.monotonic
    while True:
        due = clock() + tick
        await asyncio.sleep(tick)
        cache.stalled += max(0.0, clock() - due)


class ReportServer:
    """``POST /v1/reports`` on ``listen`` (host, port), advertised as ``advertise`` (host)."""

    def __init__(
        self,
        cache: ClusterCache,
        poke: Poke,
        verifier: TokenVerifier,
        listen: tuple[str, int],
        advertise: str,
        *,
        limits: Limits | None = None,
        leads: Callable[[], bool] = lambda: True,
        link: tuple[str, int] | None = None,
        fronts: Callable[[Identity], bool] = lambda who: False,
    ) -> None:
        """``leads``: whether this process can prove it leads now; while it cannot, every
        report is refused (503): no answer of a leader whose successor may already act renews
        an agent's lease (hot spares' fence) or takes a report it would not plan on.
        ``link``: where report fronts send their batches (None: no fronts), from the pods whose
        tokens ``fronts`` accepts (docs/design/report-fronts.md; the controller runs no front
        yet)."""
        self.cache, self.poke, self.verifier, self.leads = cache, poke, verifier, leads
        self.listen, self.advertise, self.limits = listen, advertise, limits or Limits()
        self.link_listen, self.fronts = link, fronts
        self.endpoint: ReportEndpoint | None = None  # what the statuses name (once started)
        self.heard: dict[Front, float] = {}  # fronts' hellos: front -> when (monotonic)
        self.link: HttpServer | None = None
        self.link_port: int | None = None  # the one bound
        self.batches = 0  # front batches taken
        self.accepted = 0
        self.handled = 0  # requests, whatever the answer
        self._tasks: list[asyncio.Task[None]] = []
        self._listening: Listening | None = None
        self._link_listening: Listening | None = None
        self.http: HttpServer | None = None
        self._quiet_until: dict[str, float] = {}  # refusal -> no warning logged before
        self._unlogged: dict[str, int] = {}  # refusals not logged since, by kind
        # the counter of accepted reports, looked up once (per report, its label's lookup
        # and lock cost more than the count)
        self._accepted_total = METRICS.report_channel_requests.labels("200")

    async def start(self) -> ReportEndpoint:
        """Listen; the endpoint to advertise (the port actually bound, if 0 was asked)."""
        limits = Limits.for_open_files(raise_open_files_limit("report channel"), self.limits)
        log.info("report channel: limits %s", limits)
        ctx, pin = serving_context()
        loop = asyncio.get_running_loop()
        path = names.REPORT_PATH.encode()
        self.http = HttpServer(
            self.handle,
            path,
            MAX_BODY,
            loop.time,
            tls=ctx,
            on_refused=self._refused,
            limits=limits,
            on_dropped=self._dropped,
            member=self.cache.is_member_address,
        )
        self._listening = await self.http.serve(self.listen, backlog=4096)
        port = self._listening.port
        self._tasks = [
            asyncio.create_task(self._release_after_bursts()),
            asyncio.create_task(measure_stalls(self.cache)),
        ]
        self.endpoint = ReportEndpoint(
            https_url(self.advertise, port, names.REPORT_PATH), pin, secrets.token_hex(8)
        )
        log.info("report channel: serving %s on %s:%d", self.endpoint.url, self.listen[0], port)
        if self.link_listen is not None:
            await self._start_link(ctx)
            self._tasks.append(asyncio.create_task(self._forget_fronts()))
        return self.endpoint

    @property
    def link_address(self) -> Link | None:
        """Where fronts send their batches (None: no link), for the election Lease."""
        if self.link_port is None or self.endpoint is None:
            return None
        return Link(self.advertise, self.link_port, self.endpoint.cert_sha256)

    def _hear(self, front: Front) -> None:
        """A front's hello: named at once if it is new."""
        new = front not in self.heard
        self.heard[front] = time.monotonic()
        if new:
            log.info("report channel: front %s says hello", front.url)
            self._name_fronts()

    async def _forget_fronts(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._name_fronts()

    def _name_fronts(self) -> None:
        """Name the fronts heard from lately (:func:`live_fronts`) in the endpoint; where that
        changes it, every gang is planned (its status names the new endpoint: one write per
        gang)."""
        now = time.monotonic()
        fronts = live_fronts(self.heard, now)
        for front in [f for f, at in self.heard.items() if now - at > FRONT_TTL_S]:
            log.warning("report channel: front %s is silent: no longer named", front.url)
            del self.heard[front]
        if self.endpoint is None or fronts == self.endpoint.fronts:
            return
        self.endpoint = dataclasses.replace(self.endpoint, fronts=fronts)
        self.cache.report_endpoint = self.endpoint
        METRICS.report_fronts.set(len(fronts))
        for key in list(self.cache.gangs):
            self.poke(key)

    async def _start_link(self, ctx: ssl.SSLContext) -> None:
        """Listen for report fronts' batches (same certificate as the channel: a front pins
        the one the GangState names), with limits for a few replicas (LINK_LIMITS)."""
        assert self.link_listen is not None
        loop = asyncio.get_running_loop()
        self.link = HttpServer(
            self.handle_batch,
            names.REPORT_LINK_PATH.encode(),
            LINK_MAX_BODY,
            loop.time,
            tls=ctx,
            on_refused=self._refused,
            limits=LINK_LIMITS,
            on_dropped=self._dropped,
        )
        self._link_listening = await self.link.serve(self.link_listen, backlog=64)
        self.link_port = self._link_listening.port
        log.info("report channel: fronts' batches on %s:%d", self.link_listen[0], self.link_port)

    async def _release_after_bursts(self) -> None:
        """Free memory back to the system once requests stop for QUIET_S after a burst."""
        seen, burst = self.handled, False
        while True:
            await asyncio.sleep(QUIET_S)
            if self.handled != seen:
                seen, burst = self.handled, True
            elif burst:
                burst = False
                await asyncio.to_thread(release_free_memory, "report channel")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for listening in (self._link_listening, self._listening):
            if listening is not None:
                await listening.close()
        self._link_listening = self._listening = None

    def handle(self, request: Request) -> Answer | Awaitable[Answer]:
        """The answer to one report request (accepted: with the pod's uid as its identity):
        at once where its token is remembered (nearly every report: a token is verified once
        per pod, then kept until it expires), else once the token is verified: no task per
        report, and the connection's reading is not paused and resumed around it."""
        self.handled += 1
        try:
            self._must_lead()
            token, sender, values = parse_report(request)
            who = self.verifier.remembered(token)
            if who is None:
                return self._verify_then_accept(token, sender, values)
            return self._accepted(*self._accept(who, sender, values))
        except Rejected as e:
            return self._rejected(e)

    async def _verify_then_accept(
        self, token: str, sender: Sender, values: dict[str, str]
    ) -> Answer:
        try:
            who = await self.verifier.identify(token)
            self._must_lead()  # the verification may have waited
            return self._accepted(*self._accept(who, sender, values))
        except Rejected as e:
            return self._rejected(e)

    def _must_lead(self) -> None:
        if not self.leads():
            raise Rejected(503, "this replica cannot prove it still leads: try the next leader")

    def _accepted(self, uid: str, holds: str | None) -> Answer:
        self.accepted += 1
        self._accepted_total.inc()
        return Answer(200, {"accepted": True, "holds": holds}, identity=uid)

    def _rejected(self, e: Rejected) -> Answer:
        if e.status != 409:
            self._warn(str(e.status), f"refused ({e.status}): {e}")
        METRICS.report_channel_requests.labels(str(e.status)).inc()
        return Answer(e.status, {"error": str(e)})

    def _refused(self, e: Refused) -> None:
        """A request the HTTP layer refused (not a report: its status names why)."""
        self.handled += 1
        self._warn(str(e.status), f"refused ({e.status}): {e}")
        METRICS.report_channel_requests.labels(str(e.status)).inc()

    def _dropped(self, reason: str) -> None:
        """A connection refused before it was served, or dropped unauthenticated."""
        METRICS.report_channel_connections_refused.labels(reason).inc()
        self._warn(reason, f"connection refused: {reason.replace('_', ' ')}")

    def _warn(self, key: str, message: str) -> None:
        """One warning per refusal ``key`` every LOG_EVERY_S (a misconfiguration, or an
        attack, would otherwise log a line per request), with how many were not logged. The
        message may quote what a client sent: control characters are escaped."""
        now = time.monotonic()
        if now < self._quiet_until.get(key, 0.0):
            self._unlogged[key] = self._unlogged.get(key, 0) + 1
            return
        more = self._unlogged.pop(key, 0)
        also = f" (and {more} more of them since the last warning)" if more else ""
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)
        log.warning("report channel: %s%s", text, also)
        self._quiet_until[key] = now + LOG_EVERY_S

    def _accept(
        self, who: Identity, sender: Sender, values: dict[str, str]
    ) -> tuple[str, str | None]:
        """Take one report of the pod ``who`` (its token's): the reporting pod's uid, and the
        slot it holds (hot spares: the agent renews its lease only while it holds the slot
        its trainer runs as); raises `Rejected`."""
        check_sender(who, sender)
        return self._take(sender, values)

    def handle_batch(self, request: Request) -> Answer | Awaitable[Answer]:
        """The answer to a report front's batch (``link``): 200 with an answer per report
        (:meth:`take_batch`), where the request's token is of a pod ``fronts`` accepts; 401
        without a token the cluster signed, 403 with one of another pod, 400 for a body that
        is not a batch (the entry and field named), 503 where this replica cannot prove it
        leads."""
        try:
            self._must_lead()
            token = bearer(request)
            who = self.verifier.remembered(token)
            if who is None:
                return self._verify_then_take_batch(token, request.body)
            return self._batch(who, request.body)
        except Rejected as e:
            return self._rejected(e)

    async def _verify_then_take_batch(self, token: str, body: bytes) -> Answer:
        try:
            who = await self.verifier.identify(token)
            self._must_lead()  # the verification may have waited
            return self._batch(who, body)
        except Rejected as e:
            return self._rejected(e)

    def _batch(self, who: Identity, body: bytes) -> Answer:
        if not self.fronts(who):
            raise Rejected(
                403,
                f"pod {who.namespace}/{who.pod} (service account {who.service_account or '?'}) "
                "is no report front of this controller",
            )
        try:
            batch = decode_batch(body)
        except EnvelopeError as e:
            raise Rejected(400, str(e)) from None
        if batch.front is not None:
            self._hear(batch.front)
        self.batches += 1
        return Answer(200, encode_answers(self.take_batch(batch.entries)), identity=who.uid)

    def take_batch(self, entries: Sequence[Entry]) -> list[EntryAnswer]:
        """A report front's batch (docs/design/report-fronts.md): each entry's report, already
        bound to its sender by the sender's token at the front, taken as :meth:`handle` takes
        one, and its answer (what the front answers that agent); every entry 503 where this
        replica cannot prove it leads. Who may send batches is checked before
        (:meth:`handle_batch`: the front's own token)."""
        answers: list[EntryAnswer] = []
        for sender, values in entries:
            self.handled += 1
            try:
                self._must_lead()
                uid, holds = self._take(sender, values)
                answers.append((200, self._accepted(uid, holds).payload))
            except Rejected as e:
                answers.append((e.status, self._rejected(e).payload))
        return answers

    def _take(self, sender: Sender, values: dict[str, str]) -> tuple[str, str | None]:
        """:meth:`_accept` of a report whose sender its token named."""
        namespace, gang_name, pod, uid = sender.namespace, sender.gang, sender.pod, sender.uid
        try:
            message = decode_message(values)  # now that the token is its pod's
        except EnvelopeError as e:
            raise Rejected(400, str(e)) from None
        key = (namespace, gang_name)
        if isinstance(message, Heartbeat):  # hot spares: alive, nothing to plan on
            refused, holds = self.cache.heartbeat(key, uid, time.monotonic())
            if refused is not None:
                raise Rejected(409, f"pod {namespace}/{pod} {refused}")
            return uid, holds
        if isinstance(message, ProgressNote):  # how far the trainers are: kept, nothing to plan
            note = (message.epoch, message.span)
            refused, holds = self.cache.progress_note(key, uid, note, time.monotonic())
            if refused is not None:
                raise Rejected(409, f"pod {namespace}/{pod} {refused}")
            return uid, holds
        refused, holds, news = self.cache.take_report(key, uid, message, time.monotonic())
        if refused is not None:
            raise Rejected(409, f"pod {namespace}/{pod} {refused}")
        if news is EpochReport.AWAITED and message.only_its_epoch():
            members = len(self.cache.gangs[key].spec.members)  # (take_report found it)
            self.poke(key, progress_write_interval(members))  # only the barrier's count changed
        else:
            self.poke(key, urgent=news is EpochReport.LAST)
        return uid, holds


def bearer(request: Request) -> str:
    """The request's token; raises `Rejected`."""
    scheme, _, token = request.authorization.partition(" ")
    if scheme != "Bearer" or not token:
        raise Rejected(401, "Authorization: Bearer <projected token> is required")
    return token


def parse_report(request: Request) -> tuple[str, Sender, dict[str, str]]:
    """A report request's token and its report's sender and fields, in form only (nothing is
    believed before the token is checked); raises `Rejected`."""
    token = bearer(request)
    try:
        sender, values = parse_request(request.body)
    except EnvelopeError as e:
        raise Rejected(400, str(e)) from None
    return token, sender, values


def check_sender(who: Identity, sender: Sender) -> None:
    """An agent speaks only for its own pod: the token's (``who``); raises `Rejected`."""
    if (who.namespace, who.pod, who.uid) != (sender.namespace, sender.pod, sender.uid):
        raise Rejected(
            403,
            f"the token of pod {who.namespace}/{who.pod} (uid {who.uid}) may not report "
            f"for pod {sender.namespace}/{sender.pod} (uid {sender.uid})",
        )


def listen_address(env: Mapping[str, str], variable: str, default: str) -> tuple[str, int]:
    """``ADDRESS:PORT`` from ``env[variable]`` (or ``default``; port 0: any free one); raises
    ValueError naming the variable and the accepted form."""
    listen = env.get(variable) or default
    host, sep, port = listen.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        raise ValueError(f"{variable} must be ADDRESS:PORT (port 0..65535), got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def advertised_address(env: Mapping[str, str]) -> str | None:
    """Where agents reach this replica's channel (or front): ``JSI_REPORT_ADVERTISE``, else the
    pod's ``POD_IP``; None where neither is set or it is ``off`` (logged)."""
    advertise = env.get(names.ENV_REPORT_ADVERTISE) or env.get("POD_IP") or ""
    if advertise in ("", "off"):
        why = (
            "off"
            if advertise
            else f"no address to advertise (set POD_IP or {names.ENV_REPORT_ADVERTISE})"
        )
        log.info("report channel: %s; agents write their reports on their pods", why)
        return None
    return advertise


def channel_limits(env: Mapping[str, str]) -> Limits:
    try:
        return Limits.parse(env.get(names.ENV_REPORT_LIMITS, ""))
    except ValueError as e:
        raise ValueError(f"{names.ENV_REPORT_LIMITS}: {e}") from None


def own_fronts(env: Mapping[str, str]) -> Callable[[Identity], bool] | None:
    """Who may send batches: pods of this controller's namespace and service account
    (``POD_NAMESPACE``, ``JSI_SERVICE_ACCOUNT``: its Deployment sets both); None where either
    is unknown (logged: the link is then not served)."""
    own = env.get("POD_NAMESPACE") or "", env.get(names.ENV_SERVICE_ACCOUNT) or ""
    if not all(own):
        log.info(
            "report channel: no fronts (POD_NAMESPACE and %s name who they are)",
            names.ENV_SERVICE_ACCOUNT,
        )
        return None

    def fronts(who: Identity) -> bool:
        return (who.namespace, who.service_account) == own

    return fronts


def report_server_from_env(
    cache: ClusterCache,
    poke: Poke,
    env: Mapping[str, str],
    *,
    leads: Callable[[], bool] = lambda: True,
    elected: bool = False,
) -> ReportServer | None:
    """The channel as configured: ``JSI_REPORT_LISTEN`` (ADDRESS:PORT, default 0.0.0.0:9444;
    port 0: any free one), advertised at ``JSI_REPORT_ADVERTISE`` (an address agents reach;
    default the pod's ``POD_IP``; ``off``: no channel, agents write their reports on pods),
    with ``JSI_REPORT_LIMITS`` (``key=value,...``: :class:`.report_limits.Limits`). With an
    election (``elected``: standby replicas may serve as fronts), fronts' batches are taken at
    ``JSI_REPORT_LINK_LISTEN`` (ADDRESS:PORT, default the channel's address, port 9445;
    ``off``: none) from pods of its own namespace and service account (:func:`own_fronts`)."""
    advertise = advertised_address(env)
    if advertise is None:
        return None
    listen_at = listen_address(env, names.ENV_REPORT_LISTEN, f"0.0.0.0:{names.DEFAULT_REPORT_PORT}")
    limits = channel_limits(env)
    link, fronts = None, own_fronts(env) if elected else None
    if env.get(names.ENV_REPORT_LINK_LISTEN) == "off":
        fronts = None
    if fronts is not None:
        default = f"[{listen_at[0]}]:{names.DEFAULT_REPORT_LINK_PORT}"
        link = listen_address(env, names.ENV_REPORT_LINK_LISTEN, default)
    verifier = TokenVerifier(client.ApiClient())
    return ReportServer(
        cache,
        poke,
        verifier,
        listen_at,
        advertise,
        limits=limits,
        leads=leads,
        link=link,
        fronts=fronts or (lambda who: False),
    )
