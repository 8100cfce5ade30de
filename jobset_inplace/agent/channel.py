"""The agent's side of the report channel (docs/architecture.md): its report sent to the
leader named in the GangState status, over one kept-alive HTTPS connection whose certificate
must match the status's pin before the token is sent. Any failure raises `ChannelError`: the
caller then writes the report on its pod instead (the channel never holds a barrier)."""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from jobset_inplace.protocol.envelope import Message, Sender, encode_request
from jobset_inplace.protocol.gangstate import Endpoint

from .kubeapi import USER_AGENT, TransportErrors

__all__ = ["ChannelError", "ReportChannel"]

TIMEOUT_S = 2.0  # a leader that does not answer this fast is not worth waiting for
# A leader that does not take the TCP connection this fast is not there (a black-holed address:
# a pod network's connect takes milliseconds); the report goes on the pod at once instead.
CONNECT_S = 1.0
# A new connection the leader drops before TLS (its connection limits: many agents at once, a
# new leader) is tried again once after a random pause in this range, not given up at once.
REFUSED_RETRY_S = (0.1, 1.0)
_pause = time.sleep  # the tests' lever on that pause
_now = time.monotonic  # ... and on the clock


@functools.cache
def _client_context() -> ssl.SSLContext:
    """TLS without CA verification: the server's certificate is pinned instead (checked after
    the handshake, before anything is sent). No CA store is loaded; one per process."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # what the leader accepts
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# A report front that failed (docs/design/report-fronts.md) is passed over for this long: each
# report goes to the leader itself meanwhile, not through a front that costs it a timeout.
FRONT_RETRY_S = 30.0


class ChannelError(Exception):
    """The report did not reach the leader, or the leader refused it (``status``: its HTTP
    status; None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ReportChannel:
    """Reports of pod ``pod`` (namespace, name, uid) of gang ``gang`` to the leader. One per
    thread (it holds a connection)."""

    def __init__(
        self,
        namespace: str,
        gang: str,
        pod: str,
        uid: str,
        token_file: Path,
        *,
        on_front_failed: Callable[[str], None] = lambda why: None,
    ) -> None:
        """``on_front_failed``: told why, each time this pod's front failed and the report went
        to the leader itself."""
        self.sender = Sender(namespace, gang, pod, uid)
        self.on_front_failed = on_front_failed
        self._front_failed: tuple[Endpoint, float] | None = None  # (front, passed over until)
        self._token_file = token_file
        self._ssl = _client_context()
        self._conn: http.client.HTTPSConnection | None = None
        self._endpoint: Endpoint | None = None
        # one request at a time: the trainer monitor and the heartbeat share one connection
        # (the leader keeps at most two per pod)
        self._lock = threading.RLock()

    def send(self, endpoint: Endpoint, message: Message) -> dict[str, object]:
        """Deliver ``message`` (a report, a progress note or a heartbeat) to ``endpoint``:
        the leader's answer (a JSON object); raises `ChannelError`. A kept-alive connection
        the leader closed is retried once. Where the endpoint names report fronts, the report
        goes to this pod's (:meth:`Endpoint.front_for`), and to the leader itself where the
        front does not answer or cannot reach the leader (503), a front that failed being
        passed over for FRONT_RETRY_S."""
        body = encode_request(self.sender, message)
        front = endpoint.front_for(self.sender.uid)
        failed = self._front_failed
        if front is not None and (failed is None or failed[0] != front or _now() > failed[1]):
            try:
                return self.post(front, body)
            except ChannelError as e:
                if e.status not in (None, 503):
                    raise  # the leader's own answer, through the front
                self._front_failed = (front, _now() + FRONT_RETRY_S)
                self.on_front_failed(f"report front {e}; sending to the leader itself")
        return self.post(endpoint, body)

    def post(self, endpoint: Endpoint, body: bytes) -> dict[str, object]:
        """Deliver a request ``body`` as it is (what :meth:`send` encodes; the tests send
        what an agent would not with it), as :meth:`send` does."""
        with self._lock:
            return self._post(endpoint, body)

    def _post(self, endpoint: Endpoint, body: bytes) -> dict[str, object]:
        for attempt in (1, 2):
            fresh = self._conn is None or self._endpoint != endpoint
            try:
                conn = self._connection(endpoint)
                token = self._token_file.read_text(encoding="utf-8").strip()
                path = urlsplit(endpoint.url).path or "/"
                headers = {
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json",
                    "User-Agent": USER_AGENT,
                }
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except ChannelError:
                self.close()
                raise
            except TransportErrors as e:
                self.close()
                if attempt == 2 or (fresh and not _dropped(e)):
                    raise ChannelError(f"{endpoint.url}: {type(e).__name__}: {e}") from e
                if fresh:
                    _pause(random.uniform(*REFUSED_RETRY_S))
                continue
            if resp.will_close:
                self.close()
            if resp.status != 200:
                raise ChannelError(
                    f"{endpoint.url}: HTTP {resp.status}: {_error(payload)}", resp.status
                )
            return _answer(payload)
        raise AssertionError("unreachable")

    def _connection(self, endpoint: Endpoint) -> http.client.HTTPSConnection:
        if self._conn is not None and self._endpoint == endpoint:
            return self._conn
        self.close()
        parts = urlsplit(endpoint.url)
        if parts.scheme != "https" or not parts.hostname:
            raise ChannelError(f"not an https URL: {endpoint.url!r}")
        conn = http.client.HTTPSConnection(
            parts.hostname, parts.port or 443, timeout=TIMEOUT_S, context=self._ssl
        )
        conn._create_connection = _connect  # type: ignore[attr-defined]  # (http.client's hook)
        conn.connect()
        assert conn.sock is not None
        der = conn.sock.getpeercert(binary_form=True) or b""
        if hashlib.sha256(der).hexdigest() != endpoint.cert_sha256:
            conn.close()
            raise ChannelError(
                f"{endpoint.url}: its certificate does not match the GangState's pin; no token sent"
            )
        self._conn, self._endpoint = conn, endpoint
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn, self._endpoint = None, None


def _connect(
    address: tuple[str, int], timeout: float, source: tuple[str, int] | None = None
) -> socket.socket:
    """The TCP connection within CONNECT_S; then ``timeout`` for TLS and the answer."""
    sock = socket.create_connection(address, CONNECT_S, source)
    sock.settimeout(timeout)
    return sock


def _dropped(e: BaseException) -> bool:
    """A connection closed by the leader before any answer (a limit of its channel), rather
    than a leader that is not there (refused) or does not answer (timeout)."""
    return isinstance(e, (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError))


def _answer(payload: bytes) -> dict[str, object]:
    """A 200 answer's JSON object ({} when it is not one: only a heartbeat reads it)."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _error(payload: bytes) -> str:
    try:
        doc = json.loads(payload)
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, str):
            return error[:300]
    except ValueError:
        pass
    return payload.decode("utf-8", "replace").strip()[:300]
