"""A minimal Kubernetes API client over the standard library: the three calls the agent makes
(get its GangState, watch it, merge-patch its own pod). The official client costs 0.4-1 s to
import, which would sit on the critical path of every in-place restart."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from jobset_inplace import __version__

__all__ = ["ApiError", "KubeApi", "TransportErrors"]

USER_AGENT = f"jobset-inplace-agent/{__version__}"

# Errors of the connection itself (refused, reset, TLS, timeouts, truncated responses).
TransportErrors = (OSError, http.client.HTTPException)


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def _api_error(status: int, body: bytes) -> ApiError:
    reason, message = http.client.responses.get(status, ""), body.decode("utf-8", "replace")
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or reason)
            message = str(doc.get("message") or message)
    except ValueError:
        pass
    return ApiError(status, reason, message.strip()[:300])


def _keepalive(sock: socket.socket) -> None:
    """Notice a silently dead watch connection within ~30 s instead of at the read timeout."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class KubeApi:
    """Requests to one API server with a bearer token re-read from its file on every request
    (projected service-account tokens are rotated by the kubelet)."""

    def __init__(
        self,
        server: str,
        token_file: Path | None,
        ca_file: Path | None,
        timeout: float = 10.0,
    ) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"not an API server URL: {server!r}")
        self.server = server
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._token_file = token_file
        self._timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            self._ssl = ssl.create_default_context(
                cafile=str(ca_file) if ca_file is not None else None
            )
        self._conn: http.client.HTTPConnection | None = None

    # --- plumbing ------------------------------------------------------------------------

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return conn

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self._token_file is not None:
            token = self._token_file.read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request on the kept-alive connection; the decoded JSON answer. Raises ApiError
        for an error status, a `TransportErrors` member for a broken connection (after one
        retry on a fresh connection when a kept-alive one turned out closed)."""
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers(content_type if data is not None else None)
        for attempt in (1, 2):
            fresh = self._conn is None
            conn = self._conn if self._conn is not None else self._connect(self._timeout)
            self._conn = conn
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except TransportErrors:
                self.close()
                if fresh or attempt == 2:
                    raise
                continue  # the server closed an idle kept-alive connection: retry once
            if resp.will_close:
                self.close()
            if resp.status >= 400:
                raise _api_error(resp.status, payload)
            return json.loads(payload)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- the agent's calls ------------------------------------------------------------------

    @staticmethod
    def gangstates_path(group: str, version: str, namespace: str, plural: str) -> str:
        return f"/apis/{group}/{version}/namespaces/{quote(namespace)}/{plural}"

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def watch(
        self,
        collection: str,
        name: str,
        resource_version: str | None,
        timeout_seconds: int,
    ) -> Iterator[dict[str, Any]]:
        """Watch events for the object `name` of `collection` after `resource_version`
        (None: synthetic ADDED of the current object first). Ends when the server closes the
        watch (`timeout_seconds`); raises ApiError / `TransportErrors` on failures."""
        query = {
            "watch": "1",
            "fieldSelector": f"metadata.name={name}",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if resource_version is not None:
            query["resourceVersion"] = resource_version
        conn = self._connect(timeout_seconds + 30.0)
        try:
            conn.request(
                "GET", f"{self._prefix}{collection}?{urlencode(query)}", headers=self._headers()
            )
            if conn.sock is not None:
                _keepalive(conn.sock)
            resp = conn.getresponse()
            if resp.status >= 400:
                raise _api_error(resp.status, resp.read())
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event
        finally:
            conn.close()
