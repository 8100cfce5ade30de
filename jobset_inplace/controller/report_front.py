"""A report front (docs/design/report-fronts.md): takes agents' reports off the wire for the
leader, which then takes them in batches over one link instead of one TLS connection each.

A front serves the report channel as the leader does (the same HTTP and TLS layer,
:mod:`~jobset_inplace.runtime.report_http`, with its limits; a certificate of its own, made in
memory), checks each request's form and token and binds its report to the token's pod exactly
as the leader does (:class:`.report_server.ReportServer`'s first checks), and decides nothing:
it holds no gang state. The reports it took while its last batch was on the link go in its
next one (so a burst of reports costs a few batches, and a lone report is sent at once), in
:mod:`jobset_inplace.protocol.front_link`'s codec, to the leader's link (its certificate
pinned, the front's own token in each batch); each agent gets the leader's answer to its
report. A link that fails or does not answer within :data:`LINK_TIMEOUT_S` is answered 503 to
the agents of that batch (they send their report to the leader itself, then on their pod) and
made again for the next batch.

Each batch carries the front's hello (its URL and pin: the leader names the fronts it hears
from in the GangState status, and agents spread over them, :mod:`.core.report_fronts`); a front
with nothing to send says hello alone every HELLO_EVERY_S. A standby replica of the controller
runs one (:func:`standby_front`), sending to the link the leader's election Lease names,
and follows the Lease to each new leader."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import httptools
import uvloop
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.core.report_fronts import HELLO_EVERY_S, Link, https_url, link_of
from jobset_inplace.protocol.envelope import EnvelopeError, Sender
from jobset_inplace.protocol.front_link import (
    BATCH_MAX,
    Entry,
    EntryAnswer,
    decode_answers,
    encode_batch,
)
from jobset_inplace.protocol.gangstate import Front
from jobset_inplace.runtime.manager import Standby
from jobset_inplace.runtime.process import raise_open_files_limit
from jobset_inplace.runtime.report_http import Answer, HttpServer, Listening, Request
from jobset_inplace.runtime.report_limits import Limits
from jobset_inplace.runtime.report_tls import serving_context
from jobset_inplace.runtime.report_tokens import Identity, Rejected, TokenVerifier

from .metrics import METRICS
from .report_server import (
    MAX_BODY,
    advertised_address,
    channel_limits,
    check_sender,
    listen_address,
    parse_report,
)

log = logging.getLogger("jobset_inplace.reports")

# A batch the leader has not answered this fast is answered 503 to its agents: under their
# answer timeout (agent/channel.py TIMEOUT_S, 2 s), so each learns it and reports on its pod.
LINK_TIMEOUT_S = 1.5
LINK_CONNECT_S = 1.0
# The most bytes of the leader's answer to a batch (about 60 bytes per report).
ANSWERS_MAX = 1024 * 1024


class LinkError(Exception):
    """The batch did not reach the leader, or its answer did not come back whole."""


class LinkConnection:
    """One kept-alive TLS connection to the leader's link: a batch out, its answers back."""

    def __init__(self, link: Link, token: Callable[[], str]) -> None:
        self.link, self.token = link, token
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        self._ctx.check_hostname = False
        self._ctx.verify_mode = ssl.CERT_NONE  # the certificate is pinned instead
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, entries: list[Entry], hello: Front | None = None) -> list[EntryAnswer]:
        """The leader's answers to ``entries`` (with the front's ``hello``); raises
        :class:`LinkError`."""
        body = encode_batch(entries, hello)
        try:
            async with asyncio.timeout(LINK_TIMEOUT_S):
                reader, writer = await self._open()
                head = (
                    f"POST {names.REPORT_LINK_PATH} HTTP/1.1\r\nHost: {self.link.host}\r\n"
                    f"Authorization: Bearer {self.token()}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                status, payload = await _response(reader)
        except (OSError, TimeoutError, LinkError, EnvelopeError) as e:
            self.close()
            raise LinkError(f"{type(e).__name__}: {e}") from None
        if status != 200:
            self.close()  # the leader closes after any refusal
            raise LinkError(f"the leader answered {status}: {payload[:200]!r}")
        try:
            return decode_answers(payload, len(entries))
        except EnvelopeError as e:
            self.close()
            raise LinkError(str(e)) from None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._streams is not None and not self._streams[1].is_closing():
            return self._streams
        async with asyncio.timeout(LINK_CONNECT_S):
            reader, writer = await asyncio.open_connection(
                self.link.host, self.link.port, ssl=self._ctx, limit=64 * 1024
            )
        tls = writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        if der is None or hashlib.sha256(der).hexdigest() != self.link.pin:
            writer.close()
            raise LinkError("the link's certificate is not the one pinned")
        self._streams = reader, writer
        return self._streams

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response (llhttp), its body at most ANSWERS_MAX bytes."""
    body = bytearray()
    done = False

    class Callbacks:
        def on_body(self, data: bytes) -> None:
            body.extend(data)
            if len(body) > ANSWERS_MAX:
                raise LinkError(f"an answer beyond {ANSWERS_MAX} bytes")

        def on_message_complete(self) -> None:
            nonlocal done
            done = True

    parser = httptools.HttpResponseParser(Callbacks())
    while not done:
        data = await reader.read(64 * 1024)
        if not data:
            raise LinkError("the leader closed the link")
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise LinkError(f"not an HTTP answer: {e}") from None
    return parser.get_status_code(), bytes(body)


class ReportFront:
    """Serves agents' reports at ``listen`` and hands them to the leader's ``link`` in
    batches (module docstring). ``token``: this pod's own projected token for the channel's
    audience (read when each batch is sent: the kubelet rotates it); ``advertise``: the
    address agents reach it at (None: it says no hello, and no leader names it); ``link``:
    None while no leader is known (every report is answered 503 meanwhile)."""

    def __init__(
        self,
        verifier: TokenVerifier,
        listen: tuple[str, int],
        link: Link | None,
        token: Callable[[], str],
        *,
        advertise: str | None = None,
        limits: Limits | None = None,
        member: Callable[[str], bool] | None = None,
    ) -> None:
        self.verifier, self.listen, self.limits, self.member = verifier, listen, limits, member
        self.advertise, self.token = advertise, token
        self.connection = None if link is None else LinkConnection(link, token)
        self.pending: list[tuple[Entry, asyncio.Future[Answer]]] = []
        self.sending = False
        self.batches = self.forwarded = self.link_failures = self.hellos = 0
        self.http: HttpServer | None = None
        self.port: int | None = None
        self.pin: str | None = None
        self.hello: Front | None = None  # what it tells the leader of itself
        self.sent_at = -HELLO_EVERY_S  # (monotonic) the last batch the leader answered
        self._failing = False  # the last batch failed (logged once until one succeeds)
        self._listening: Listening | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def link(self) -> Link | None:
        return None if self.connection is None else self.connection.link

    async def start(self) -> None:
        ctx, self.pin = serving_context()
        loop = asyncio.get_running_loop()
        # a connection per agent it serves, as the leader's channel
        limits = Limits.for_open_files(raise_open_files_limit("report front"), self.limits)
        self.http = HttpServer(
            self.handle,
            names.REPORT_PATH.encode(),
            MAX_BODY,
            loop.time,
            tls=ctx,
            limits=limits,
            member=self.member,
        )
        self._listening = await self.http.serve(self.listen, backlog=4096)
        self.port = self._listening.port
        if self.advertise is not None:
            self.hello = Front(https_url(self.advertise, self.port, names.REPORT_PATH), self.pin)
            self._tasks.append(loop.create_task(self._say_hello()))
        log.info("report front: serving on %s:%d", self.listen[0], self.port)

    def retarget(self, link: Link | None) -> None:
        """Send to ``link`` from now on (a new leader's; None: no leader known)."""
        if link == self.link:
            return
        if self.connection is not None:
            self.connection.close()
        self.connection = None if link is None else LinkConnection(link, self.token)
        self.sent_at = -HELLO_EVERY_S  # the new leader hears of it at once
        log.info("report front: sending to %s", "no leader" if link is None else link.url)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.connection is not None:
            self.connection.close()
        if self._listening is not None:
            await self._listening.close()
            self._listening = None

    def handle(self, request: Request) -> Answer | Awaitable[Answer]:
        """An agent's report: refused as the leader refuses it where its form or token is
        wrong, else forwarded (its answer: the leader's)."""
        try:
            token, sender, values = parse_report(request)
            who = self.verifier.remembered(token)
            if who is None:
                return self._verify_then_forward(token, sender, values)
            return self._forward(who, sender, values)
        except Rejected as e:
            return _refused(e)

    async def _verify_then_forward(
        self, token: str, sender: Sender, values: dict[str, str]
    ) -> Answer:
        try:
            who = await self.verifier.identify(token)
            return await self._forward(who, sender, values)
        except Rejected as e:
            return _refused(e)

    def _forward(self, who: Identity, sender: Sender, values: dict[str, str]) -> Awaitable[Answer]:
        check_sender(who, sender)
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.pending.append(((sender, values), answer))
        self._start_sending()
        return answer

    def _start_sending(self) -> None:
        if not self.sending:  # (the task's first step: after this turn's other reads)
            self.sending = True
            self._tasks.append(asyncio.get_running_loop().create_task(self._send_all()))
            self._tasks = [t for t in self._tasks if not t.done()]

    async def _send_all(self) -> None:
        """Send what is pending, a batch at a time, until nothing is: what comes while one
        batch is on the link goes in the next."""
        try:
            while self.pending:
                batch, self.pending = self.pending[:BATCH_MAX], self.pending[BATCH_MAX:]
                await self._send(batch)
        finally:
            self.sending = False

    async def _say_hello(self) -> None:
        """A hello alone whenever the leader has heard nothing from this front for
        HELLO_EVERY_S (at once on a new link), never while a batch is on the link."""
        while True:
            await asyncio.sleep(min(1.0, HELLO_EVERY_S))
            due = time.monotonic() - self.sent_at >= HELLO_EVERY_S
            if not due or self.sending or self.connection is None:
                continue
            self.sending = True
            try:
                await self._deliver([])
                self.hellos += 1
            except LinkError:
                pass  # (logged)
            finally:
                self.sending = False
            if self.pending:
                self._start_sending()

    async def _deliver(self, entries: list[Entry]) -> list[EntryAnswer]:
        """The leader's answers to ``entries`` (with this front's hello); raises LinkError,
        logged once until a batch goes through again."""
        try:
            if self.connection is None:
                raise LinkError("no leader is known (its election Lease names no link)")
            answers = await self.connection.send(entries, self.hello)
        except LinkError as e:
            self.link_failures += 1
            METRICS.report_front_link_failures.inc()
            if not self._failing:
                log.warning("report front: the link fails (%s); agents are answered 503", e)
            self._failing = True
            raise
        if self._failing:
            log.info("report front: the link works again")
        self._failing = False
        self.sent_at = time.monotonic()
        return answers

    async def _send(self, batch: list[tuple[Entry, asyncio.Future[Answer]]]) -> None:
        started = time.monotonic()
        try:
            answers = await self._deliver([entry for entry, _ in batch])
        except Exception as e:  # a LinkError, or a bug: each agent must have its answer
            if not isinstance(e, LinkError):
                self.link_failures += 1
                log.exception("report front: %d report(s) not delivered", len(batch))
            METRICS.report_front_requests.labels("503").inc(len(batch))
            for _, future in batch:
                if not future.done():
                    future.set_result(Answer(503, {"error": "the leader is not reachable"}))
            return
        self.batches += 1
        self.forwarded += len(batch)
        for ((sender, _), future), (status, payload) in zip(batch, answers, strict=True):
            METRICS.report_front_requests.labels(str(status)).inc()
            if not future.done():
                identity = sender.uid if status == 200 else None
                future.set_result(Answer(status, payload, identity=identity))
        took = (time.monotonic() - started) * 1000
        log.debug("report front: %d report(s) answered in %.1f ms", len(batch), took)


# How often a standby's front looks at the Lease holder's annotations (the elector reads the
# Lease each retry period): a new leader's link is followed within this long of being read.
FOLLOW_S = 0.5


def standby_front(env: Mapping[str, str]) -> Standby | None:
    """What a standby replica runs while it waits, as configured: a report front on the
    channel's address (``JSI_REPORT_LISTEN``, ``JSI_REPORT_ADVERTISE``, ``JSI_REPORT_LIMITS``)
    with this pod's token for the channel's audience (``JSI_REPORT_TOKEN_FILE``), sending to
    the link the leader's Lease names; None where ``JSI_REPORT_FRONT`` is ``off`` or a setting
    is missing (logged: the replica then only waits, as without fronts). Raises ValueError for
    a malformed setting."""
    if env.get(names.ENV_REPORT_FRONT) == "off":
        log.info("report front: off (%s=off)", names.ENV_REPORT_FRONT)
        return None
    advertise = advertised_address(env)
    token_file = env.get(names.ENV_REPORT_TOKEN_FILE)
    if advertise is None or not token_file:
        if advertise is not None:
            log.info("report front: none (no %s to send batches with)", names.ENV_REPORT_TOKEN_FILE)
        return None
    listen = listen_address(env, names.ENV_REPORT_LISTEN, f"0.0.0.0:{names.DEFAULT_REPORT_PORT}")
    limits = channel_limits(env)
    path = Path(token_file)

    def token() -> str:
        return path.read_text(encoding="utf-8").strip()

    def serve(done: threading.Event, seen: Callable[[], Mapping[str, str]]) -> None:
        front = ReportFront(
            TokenVerifier(client.ApiClient()),
            listen,
            None,
            token,
            advertise=advertise,
            limits=limits,
        )
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(follow_leader(front, done, seen))
        except (OSError, ValueError) as e:
            log.error("report front: cannot serve it (%s); agents send to the leader itself", e)

    return serve


async def follow_leader(
    front: ReportFront, done: threading.Event, seen: Callable[[], Mapping[str, str]]
) -> None:
    """Serve ``front`` until ``done``, sending to the link the Lease holder names (``seen``:
    its annotations as last read)."""
    await front.start()
    try:
        while not done.is_set():
            front.retarget(link_of(seen()))
            await asyncio.sleep(FOLLOW_S)
    finally:
        await front.stop()
        log.info("report front: stopped")


def _refused(e: Rejected) -> Answer:
    """A report refused at the front (its form or its token), counted."""
    METRICS.report_front_requests.labels(str(e.status)).inc()
    return Answer(e.status, {"error": str(e)})
