"""Every replica's HTTP endpoint for the kubelet and Prometheus (``--health-port``):

* ``/healthz``: the process serves (liveness);
* ``/readyz``: every readiness check passes (e.g. the webhook's certificate is in place, its
  CA injected and its server listening), 503 with the failing checks otherwise;
* ``/metrics``: the Prometheus exposition (docs/metrics.md).

A plain threaded HTTP server of the standard library: it answers while the controller's event
loop is busy with a large recovery."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("jobset_inplace.health")

Check = Callable[[], bool]
Exposition = Callable[[], tuple[bytes, str]]  # body, content type


def port_open(port: int, host: str = "127.0.0.1") -> Check:
    """A check that passes while something accepts TCP connections on ``host:port``."""

    def check() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    return check


class HealthServer:
    def __init__(
        self,
        port: int,
        checks: Mapping[str, Check],
        metrics: Exposition | None = None,
        addr: str = "0.0.0.0",
    ) -> None:
        self.checks, self.metrics = checks, metrics
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, body, ctype = server.answer(self.path.split("?", 1)[0])
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds: no access log

        self.httpd = ThreadingHTTPServer((addr, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]

    def answer(self, path: str) -> tuple[int, bytes, str]:
        text = "text/plain; charset=utf-8"
        if path in ("/healthz", "/livez"):
            return 200, b"ok\n", text
        if path == "/readyz":
            results = {name: _passes(check) for name, check in self.checks.items()}
            lines = "".join(f"{n}: {'ok' if ok else 'failed'}\n" for n, ok in results.items())
            return (200 if all(results.values()) else 503), lines.encode() or b"ok\n", text
        if path == "/metrics" and self.metrics is not None:
            body, ctype = self.metrics()
            return 200, body, ctype
        return 404, b"not found\n", text

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, name="health", daemon=True).start()
        log.info("health: /healthz /readyz /metrics on port %d", self.port)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _passes(check: Check) -> bool:
    try:
        return check()
    except Exception:
        log.exception("readiness check failed")
        return False
