"""What every controller replica runs besides the recovery loop, started and stopped in one
place: the health endpoint, the admission webhook (its certificate first, when self-managed)
and the leader election. :meth:`Manager.run` holds ``lead`` (the recovery loop, which the
caller supplies) until this replica may act, runs it, and stops the rest after it.

Threads and loops (docs/architecture.md, "Threads and event loops"): the health server's
threads; ``webhook`` (its own asyncio loop: kopf's admission server) and ``certificates``
(renewals); ``leader-renew`` and ``leader-watchdog``; ``lead`` runs on the calling (main)
thread."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubernetes import client

from jobset_inplace.backoff import Backoff

from .health import Check, Exposition, HealthServer, port_open
from .leader_election import Election, LeaderElector
from .webhook_certificates import CertificateError, CertificateManager
from .webhook_server import (
    cert_dir_from_env,
    serve,
    server_from_env,
    settings_from_env,
    webhook_port_from_env,
)

log = logging.getLogger("jobset_inplace.controller")

# Exit status of a replica that lost the leader Lease (its pod restarts as a candidate).
LOST_LEADERSHIP_EXIT = 3
# A replica that cannot set up its webhook certificate (missing Secret or RBAC) tries again
# this often, unready, instead of crash-looping.
CERTIFICATE_RETRY = Backoff(10.0, 10.0)


@dataclass(frozen=True)
class Settings:
    """What ``jobset-inplace run`` asks of the runtime (its flags)."""

    election: Election | None = None  # None: the only replica, always acting
    health_port: int | None = None  # None: no /healthz, /readyz, /metrics
    certificate_namespace: str | None = None  # None: the webhook's certificate is mounted


class Manager:
    """Starts the replica's parts, runs ``lead`` once it may act, stops the parts after."""

    def __init__(
        self,
        settings: Settings,
        *,
        exposition: Exposition | None = None,
        on_leading: Callable[[bool], None] = lambda leading: None,
        release_after_s: float = 0.0,
    ) -> None:
        """``release_after_s``: how long a leader that stops keeps the Lease, unrenewed, before
        it releases it (:meth:`LeaderElector.release`)."""
        self.settings, self.exposition, self.on_leading = settings, exposition, on_leading
        self.release_after_s = release_after_s
        self.checks: dict[str, Check] = {}
        self.stop = threading.Event()  # the side parts' stop flag
        self._elector: LeaderElector | None = None

    def leads(self) -> bool:
        """Whether this replica may act now: always without an election; with one, while its
        last renewal of the Lease is fresh (:meth:`LeaderElector.fresh`)."""
        return self._elector is None or self._elector.fresh()

    def advertise(self, annotations: Mapping[str, str]) -> None:
        """Tell the other candidates ``annotations`` on the Lease, from its next renewal on (no
        election: nobody to tell)."""
        if self._elector is not None:
            self._elector.annotations = dict(annotations)

    def run(self, lead: Callable[[], None], standby: Standby | None = None) -> None:
        """Run until ``lead`` returns (or raises); every part is stopped after it. With an
        election, ``lead`` starts only once this replica holds the Lease, and a replica that
        loses it exits at once (its pod restarts as a candidate); ``standby`` runs on a thread
        of its own while this replica waits, and is stopped (its thread joined) before
        ``lead`` starts."""
        _exit_on_sigterm()
        health = self._start_health()
        self._start_webhook()
        elector = None
        # Whatever ends this replica (SIGTERM while a standby, too), the side parts must stop:
        # the webhook's executor thread waits for ``stop``, and the interpreter joins it.
        try:
            election = self.settings.election
            if election is None:
                self.on_leading(True)
            else:
                api = client.CoordinationV1Api(client.ApiClient())
                elector = self._elector = LeaderElector(api, election, self.on_leading)
                log.info("leader: candidate %s for %s", election.identity, elector.where)
                waiting = _start_standby(standby, elector)
                elector.acquire()
                if waiting is not None:
                    waiting.stop()
                elector.keep(on_lost=_leadership_lost)
            lead()
        finally:
            self.stop.set()
            if elector is not None:
                if self.release_after_s and threading.current_thread() is threading.main_thread():
                    # a second SIGTERM must not cut the wait short: the Lease would then
                    # only expire (safe, but the successor waits the lease duration)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                elector.release(after_s=self.release_after_s)
            if health is not None:
                health.stop()

    def _start_health(self) -> HealthServer | None:
        port = self.settings.health_port
        if port is None:
            return None
        health = HealthServer(port, self.checks, metrics=self.exposition)
        health.start()
        return health

    def _start_webhook(self) -> None:
        certificates = None
        namespace = self.settings.certificate_namespace
        if namespace is not None:
            certificates = CertificateManager(
                client.CoreV1Api(client.ApiClient()),
                client.AdmissionregistrationV1Api(client.ApiClient()),
                namespace,
                cert_dir_from_env(),
            )
            self.checks["webhook-certificate"] = certificates.ready.is_set
        if certificates is not None or server_from_env() is not None:
            self.checks["webhook-server"] = port_open(webhook_port_from_env())
        threading.Thread(
            target=_serve_webhook, args=(certificates, self.stop), name="webhook", daemon=True
        ).start()


# What a standby replica does while it waits (a report front): run until the event is set,
# the Lease holder's annotations at hand (as last read).
Standby = Callable[[threading.Event, Callable[[], Mapping[str, str]]], None]
STANDBY_STOP_S = 10.0  # how long a standby's part may take to stop when this replica leads


@dataclass
class _Waiting:
    thread: threading.Thread
    done: threading.Event

    def stop(self) -> None:
        self.done.set()
        self.thread.join(STANDBY_STOP_S)
        if self.thread.is_alive():
            log.error("standby: its part did not stop within %gs; leading anyway", STANDBY_STOP_S)


def _start_standby(standby: Standby | None, elector: LeaderElector) -> _Waiting | None:
    if standby is None:
        return None
    done = threading.Event()

    def seen() -> Mapping[str, str]:
        return elector.seen_annotations

    thread = threading.Thread(target=standby, args=(done, seen), name="standby", daemon=True)
    thread.start()
    return _Waiting(thread, done)


def _exit_on_sigterm() -> None:
    """Stop at SIGTERM until kopf takes the signal over (when this replica leads). The
    process is its container's PID 1, for which the kernel drops signals without a handler:
    a standby would otherwise wait out the pod's grace period on every rollout and uninstall."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def _serve_webhook(certificates: CertificateManager | None, stop: threading.Event) -> None:
    """Every replica's webhook side, on its own thread: the certificate first (when
    self-managed), then the admission server, until ``stop``. A certificate that cannot be
    made holds up only the webhook (the replica stays unready), never leadership: recoveries
    do not need the webhook."""
    if certificates is not None:
        if not _first_certificate(certificates, stop):
            return
        threading.Thread(
            target=certificates.run, args=(stop,), name="certificates", daemon=True
        ).start()
    server = server_from_env()  # the files are there now, when self-managed
    asyncio.run(serve(kubeconfig=None, server=server, settings=settings_from_env(), stop_flag=stop))


def _first_certificate(certificates: CertificateManager, stop: threading.Event) -> bool:
    """Wait until the webhook has a certificate (True) or ``stop`` (False); a setup error is
    logged with its fix and retried (the replica stays unready meanwhile), never a crash loop."""
    failures = 0
    while not stop.is_set():
        try:
            certificates.ensure()
            return True
        except CertificateError as e:
            failures += 1
            wait = CERTIFICATE_RETRY.delay(failures)
            log.error("webhook certificate: %s; retrying in %.0fs", e, wait)
        except client.exceptions.ApiException as e:
            failures += 1
            wait = CERTIFICATE_RETRY.delay(failures)
            log.warning("webhook certificate: API error %s %s; retrying", e.status, e.reason)
        stop.wait(wait)
    return False


def _leadership_lost(why: str) -> None:
    """Stop acting now: another replica may already lead. No cleanup runs (it could act)."""
    log.error("leader: leadership lost (%s): exiting", why)
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)
