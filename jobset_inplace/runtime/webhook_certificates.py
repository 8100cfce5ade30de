"""The admission webhook's TLS, managed by the controller itself (no cert-manager needed), the
way JobSet's and Kueue's cert-controller do it:

* a Secret shipped empty with the manifests (``jobset-inplace-webhook-tls``) holds a CA
  (``ca.crt``/``ca.key``) and a serving certificate for the webhook Service's DNS names signed
  by it (``tls.crt``/``tls.key``);
* every replica, at start and then every :data:`CHECK_INTERVAL_S`, reads it; if it is empty,
  unparsable, for other names, or near expiry, the replica makes new material and writes it
  with the Secret's resourceVersion (optimistic concurrency: if two replicas race, one write
  wins and the other re-reads and uses it);
* the CA goes into ``caBundle`` of both webhook configurations (also on resourceVersion),
  whenever it differs;
* the serving pair is written to the replica's certificate directory, where kopf's webhook
  server picks it up (and re-reads it when it changes).

:mod:`jobset_inplace.core.certificate_rules` decides (what can go on serving, which CA may sign);
:func:`~jobset_inplace.runtime.certificates.issue` makes material; :class:`CertificateManager`
loads, writes and acts."""

from __future__ import annotations

import base64
import datetime
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from jobset_inplace.core.certificate_rules import (
    Material,
    renewal_reason,
    service_dns_names,
    usable_ca,
)
from jobset_inplace.runtime.certificates import issue

log = logging.getLogger("jobset_inplace.certificates")

SECRET_NAME = "jobset-inplace-webhook-tls"
# Both webhook configurations (mutating and validating) carry this name.
WEBHOOK_CONFIGURATION = "jobset-inplace-webhook"
CHECK_INTERVAL_S = 60.0


class CertificateError(RuntimeError):
    """The certificate cannot be managed (missing Secret, missing RBAC); says what to fix."""


@dataclass
class CertificateManager:
    core: client.CoreV1Api
    admission: client.AdmissionregistrationV1Api
    namespace: str
    cert_dir: Path
    clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)

    def __post_init__(self) -> None:
        self.ready = threading.Event()  # material written and both caBundles injected

    def ensure(self) -> Material:
        """One round: valid material in the Secret, its CA in both configurations, the serving
        pair in ``cert_dir``."""
        material = self._ensure_secret()
        for kind in ("mutating", "validating"):
            self._inject(kind, material.ca_crt)
        self._write_files(material)
        self.ready.set()
        return material

    def run(self, stop: threading.Event) -> None:
        """Check again every :data:`CHECK_INTERVAL_S` until ``stop`` (renewals, another
        replica's new material, a caBundle someone reset)."""
        while not stop.wait(CHECK_INTERVAL_S):
            try:
                self.ensure()
            except Exception:  # the next round retries; the served pair stays valid meanwhile
                log.exception("webhook certificate check failed")

    # --- the Secret -------------------------------------------------------------------------
    def _ensure_secret(self) -> Material:
        dns = service_dns_names(self.namespace)
        for _ in range(5):
            secret = self._call(self.core.read_namespaced_secret, SECRET_NAME, self.namespace)
            data = {k: _b64decode(v) for k, v in (secret.data or {}).items()}
            have = Material.from_secret_data(data)
            reason = renewal_reason(have, dns, self.clock())
            if not reason and have is not None:
                return have
            new = issue(dns, self.clock(), usable_ca(have, self.clock()))
            secret.data = {k: _b64encode(v) for k, v in new.secret_data().items()}
            try:  # replace carries the resourceVersion read: a concurrent writer wins, we re-read
                self._call(self.core.replace_namespaced_secret, SECRET_NAME, self.namespace, secret)
            except client.exceptions.ApiException as e:
                if e.status == 409:
                    log.info("webhook certificate: another replica wrote it first; re-reading")
                    continue
                raise
            log.info("webhook certificate: new material written (%s)", reason)
            return new
        raise CertificateError(f"Secret {self.namespace}/{SECRET_NAME} keeps changing under us")

    # --- caBundle ---------------------------------------------------------------------------
    def _inject(self, kind: str, ca: bytes) -> None:
        read, replace = (
            (
                self.admission.read_mutating_webhook_configuration,
                self.admission.replace_mutating_webhook_configuration,
            )
            if kind == "mutating"
            else (
                self.admission.read_validating_webhook_configuration,
                self.admission.replace_validating_webhook_configuration,
            )
        )
        bundle = _b64encode(ca)
        for _ in range(5):
            cfg = self._call(read, WEBHOOK_CONFIGURATION)
            stale = [w for w in cfg.webhooks or [] if w.client_config.ca_bundle != bundle]
            if not stale:
                return
            for w in stale:
                w.client_config.ca_bundle = bundle
            try:
                self._call(replace, WEBHOOK_CONFIGURATION, cfg)
            except client.exceptions.ApiException as e:
                if e.status == 409:
                    continue
                raise
            log.info("webhook certificate: CA injected into the %s configuration", kind)
            return
        raise CertificateError(f"{kind} webhook configuration keeps changing under us")

    # --- files ------------------------------------------------------------------------------
    def _write_files(self, m: Material) -> None:
        """Atomically, and only on change (kopf restarts its server when the files change)."""
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for name, content in (("tls.crt", m.tls_crt), ("tls.key", m.tls_key)):
            path = self.cert_dir / name
            if path.exists() and path.read_bytes() == content:
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(content)
            os.chmod(tmp, 0o600)
            tmp.replace(path)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except client.exceptions.ApiException as e:
            if e.status == 404:
                raise CertificateError(
                    f"{fn.__name__}: not found ({', '.join(map(str, args[:2]))}): apply the"
                    " jobset-inplace manifests (the Secret and the webhook configurations are"
                    " part of them)"
                ) from e
            if e.status == 403:
                raise CertificateError(
                    f"{fn.__name__}: forbidden: the controller's ServiceAccount needs the"
                    " webhook-certificate rules of manifests/controller/rbac.yaml"
                ) from e
            raise


def _b64encode(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _b64decode(s: str) -> bytes:
    return base64.b64decode(s)
