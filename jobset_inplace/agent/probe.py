"""The agent's HTTP probe endpoints: ``GET /barrier`` (the pod scope's startupProbe, which holds
the trainer), ``GET /started`` (the process scope's: the launcher is installed, since the server
starts after that) and ``GET /healthz``."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["BarrierState", "ProbeServer"]


class BarrierState:
    """Whether this agent's barrier is open, and a one-line why; shared with the probe thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._reason = "starting"

    def set(self, is_open: bool, reason: str) -> None:
        with self._lock:
            self._open, self._reason = is_open, reason

    def get(self) -> tuple[bool, str]:
        with self._lock:
            return self._open, self._reason


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    barrier: BarrierState

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack
        super().server_bind()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "jobset-inplace-agent"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/barrier":
            is_open, reason = self.server.barrier.get()
            self._reply(200 if is_open else 503, reason)
        elif path in ("/healthz", "/started"):
            self._reply(200, "ok")
        else:
            self._reply(404, "not found: try /barrier, /started or /healthz")

    def _reply(self, status: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # probes every few seconds would drown the agent's own log


class ProbeServer:
    """Serves the probe endpoints on `port` (all addresses, IPv6 and IPv4) from a daemon
    thread. Raises OSError if the port cannot be bound."""

    def __init__(self, port: int, barrier: BarrierState) -> None:
        server: _Server
        try:
            server = _Server6(("::", port), _Handler)
        except OSError:  # no IPv6 on this host
            server = _Server(("0.0.0.0", port), _Handler)
        server.barrier = barrier
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="probe", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
