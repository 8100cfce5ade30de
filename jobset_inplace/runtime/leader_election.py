"""Leader election for ``jobset-inplace run``: the Lease reads and writes behind
:mod:`jobset_inplace.core.leader_rules` (which decides). It runs on threads of its own, so a
busy event loop never delays a renewal, and a watchdog stops the process as soon as the last
successful renewal is ``renew_deadline`` old: a leader that cannot prove it still leads must not
act (client-go does the same). ``on_leading`` hears every change (the wiring feeds the
``jobset_inplace_leader`` gauge with it): True on acquiring the Lease, False on losing or
releasing it."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.core.leader_rules import (
    JITTER,
    ElectionTiming,
    LeaseRecord,
    Step,
    claim,
    lease_body,
    must_stop,
    next_step,
    record_of,
    released,
)

log = logging.getLogger("jobset_inplace.controller")

DEFAULT_LEASE = names.CONTROLLER_NAME
WATCHDOG_PERIOD_S = 0.5
SETUP_RETRY_S = 10.0  # a missing namespace or missing rights: retried this often


class ElectionError(RuntimeError):
    """The election cannot work as configured (retrying would not help)."""


def default_identity() -> str:
    """Pod name (the hostname in a pod) plus a random suffix, as client-go candidates use."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Election:
    """Leader election settings of ``jobset-inplace run`` (flags ``--leader-elect-*``)."""

    namespace: str
    identity: str = field(default_factory=default_identity)
    timing: ElectionTiming = field(default_factory=ElectionTiming)
    lease: str = DEFAULT_LEASE


def _ignore(leading: bool) -> None:
    pass


class LeaderElector:
    def __init__(
        self,
        api: client.CoordinationV1Api,
        election: Election,
        on_leading: Callable[[bool], None] = _ignore,
    ) -> None:
        election.timing.check()
        self.on_leading = on_leading
        self.api, self.namespace, self.name = api, election.namespace, election.lease
        self.identity, self.timing = election.identity, election.timing
        self.renewed_at: float | None = None  # monotonic time of the last successful write
        self.holder = ""  # who held the Lease when last read
        # the holder's annotations when last read (report fronts learn the leader's link
        # there), and what this candidate writes on the Lease while it holds it
        self.seen_annotations: Mapping[str, str] = {}
        self.annotations: Mapping[str, str] = {}
        self._seen: tuple[str, float] | None = None  # (resourceVersion, monotonic first seen)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None  # keep()'s
        # per request: two attempts fit into the renew deadline
        self._timeout = self.timing.renew_deadline_s / 2

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    # --- one round ------------------------------------------------------------------------
    def try_once(self) -> bool:
        """Read the Lease, decide, write: True when this candidate holds it afterwards."""
        # This replica's own renewal is dated before its read (never later than its write: it
        # stops no later than it must); another's record first seen, after the read returned
        # (never earlier than that record's write: client-go's observedTime), so that a
        # successor waits a whole lease-duration after the last renewal it could have missed.
        began = time.monotonic()
        lease, rv = self._read()
        now = time.monotonic()
        if self._seen is None or self._seen[0] != (rv or ""):
            self._seen = (rv or "", now)
        record = None if lease is None else record_of(lease)
        self.holder = record.holder if record else ""
        self.seen_annotations = _annotations(lease)
        step = next_step(record, self.identity, now=now, observed_since=self._seen[1])
        if step is Step.WAIT:
            return False
        new = claim(
            record, self.identity, wall=time.time(), duration_s=int(self.timing.lease_duration_s)
        )
        try:
            self._write(new, rv)
        except ApiException as e:
            if e.status == HTTPStatus.CONFLICT:  # another candidate wrote first
                return False
            if e.status == HTTPStatus.FORBIDDEN:
                raise self._forbidden(e, "create" if lease is None else "update") from None
            if e.status == HTTPStatus.NOT_FOUND and lease is None:
                raise ElectionError(
                    f"cannot create {self.where}: namespace {self.namespace} not found (create"
                    " it, or set --namespace)"
                ) from None
            raise
        self.renewed_at, self.holder = began, self.identity
        if step is not Step.RENEW:
            log.info("leader: %s acquired by %s (%s)", self.where, self.identity, step.value)
        return True

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        """The Lease (JSON) and its resourceVersion; (None, None) when there is none yet."""
        try:
            raw = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        except ApiException as e:
            if e.status == HTTPStatus.FORBIDDEN:
                raise self._forbidden(e, "read") from None
            if e.status != HTTPStatus.NOT_FOUND:
                raise
            return None, None
        lease: dict[str, Any] = json.loads(raw.data)
        return lease, str(lease["metadata"]["resourceVersion"])

    def _forbidden(self, e: ApiException, verb: str) -> ElectionError:
        return ElectionError(
            f"not allowed to {verb} {self.where} ({e.reason}): grant it (manifests/controller/"
            "rbac.yaml, Role jobset-inplace-controller-leader)"
        )

    def _write(self, record: LeaseRecord, rv: str | None) -> None:
        body = lease_body(self.name, self.namespace, record, rv, self.annotations)
        if rv is None:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
        else:
            self.api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self._timeout
            )

    # --- the candidate's life -------------------------------------------------------------
    def acquire(self) -> None:
        """Block until this candidate holds the Lease (retrying every retry period, jittered).
        A setup error (namespace or rights missing) is logged with its fix and retried every
        :data:`SETUP_RETRY_S`: the replica waits, unled, for the fix instead of crash-looping."""
        told = None
        while True:
            pause = self.timing.retry_period_s * random.uniform(1, JITTER)
            try:
                if self.try_once():
                    self.on_leading(True)
                    return
            except ElectionError as e:
                log.error("leader: %s; retrying in %.0fs", e, SETUP_RETRY_S)
                pause = SETUP_RETRY_S
            except Exception as e:
                log.warning("leader: reading/writing %s failed: %s", self.where, e)
            if self.holder != told:
                told = self.holder
                log.info("leader: waiting, %s is held by %s", self.where, self.holder or "nobody")
            time.sleep(pause)

    def fresh(self) -> bool:
        """Whether this candidate can prove it leads now: its last successful renewal is less
        than ``renew_deadline`` old (the watchdog's rule, asked at the moment of acting, so
        that a process paused past it acts on nothing before the watchdog runs)."""
        renewed = self.renewed_at
        return renewed is not None and not must_stop(renewed, time.monotonic(), self.timing)

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew every retry period on a daemon thread; call ``on_lost`` (once, from the
        watchdog thread) when another candidate holds the Lease or the last successful
        renewal is ``renew_deadline`` old."""
        lost = threading.Event()
        why: list[str] = []

        def renew() -> None:
            while not self._stop.wait(self.timing.retry_period_s):
                try:
                    if not self.try_once() and not self._stop.is_set():
                        self.renewed_at = None  # no longer fresh, before the watchdog's turn
                        why.append(f"{self.where} is now held by {self.holder or 'nobody'}")
                        lost.set()
                        return
                except Exception as e:
                    log.warning("leader: renewing %s failed: %s", self.where, e)

        def watchdog() -> None:
            while not self._stop.is_set():
                renewed = self.renewed_at  # once: the renew thread may clear it meanwhile
                late = renewed is not None and must_stop(renewed, time.monotonic(), self.timing)
                if late:
                    why.append(f"no renewal of {self.where} for {self.timing.renew_deadline_s:g}s")
                if lost.is_set() or late:
                    self.on_leading(False)
                    on_lost(why[0])
                    return
                lost.wait(WATCHDOG_PERIOD_S)

        self._renewer = threading.Thread(target=renew, name="leader-renew", daemon=True)
        self._renewer.start()
        threading.Thread(target=watchdog, name="leader-watchdog", daemon=True).start()

    def release(self, after_s: float = 0.0) -> None:
        """Stop renewing and, if this candidate still holds the Lease, hand it over: ``after_s``
        seconds from now (what it granted while it led must end first: the report channel's
        leases), still unrenewed meanwhile, so a successor takes it then or at the lease
        duration, whichever comes first."""
        self._stop.set()
        self.renewed_at = None  # nothing is fresh any more: this replica no longer acts
        self.annotations = {}  # a released Lease names nothing of this replica's
        self.on_leading(False)
        if self._renewer is not None:  # a renewal in flight must not land during the wait
            self._renewer.join(self.timing.renew_deadline_s)
            self.renewed_at = None
        try:
            if not self._holds():
                return
            if after_s > 0:
                log.info("leader: releasing %s in %gs (its grants end first)", self.where, after_s)
                time.sleep(after_s)
            lease, rv = self._read()
            record = None if lease is None else record_of(lease)
            if record is not None and record.holder == self.identity:
                self._write(released(record, wall=time.time()), rv)
                log.info("leader: released %s", self.where)
        except Exception as e:
            log.warning("leader: could not release %s: %s", self.where, e)

    def _holds(self) -> bool:
        lease, _ = self._read()
        return lease is not None and record_of(lease).holder == self.identity


def _annotations(lease: Mapping[str, Any] | None) -> Mapping[str, str]:
    meta = (lease or {}).get("metadata") or {}
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}
