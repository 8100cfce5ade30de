"""The admission webhook's certificate, decided (pure: material and ``now`` in, a verdict
out): which names it must serve, whether what the Secret holds can go on serving, and whether
its CA may sign the next serving certificate. Making material and writing it are
:mod:`jobset_inplace.runtime.webhook_certificates`'."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

SERVICE_NAME = "jobset-inplace-webhook"
CA_VALIDITY = datetime.timedelta(days=3650)
CERT_VALIDITY = datetime.timedelta(days=365)
# New material once less than this is left of either certificate.
RENEW_BEFORE = datetime.timedelta(days=30)
KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def service_dns_names(namespace: str) -> list[str]:
    """The names the apiserver may use for the webhook Service."""
    base = f"{SERVICE_NAME}.{namespace}.svc"
    return [base, f"{base}.cluster.local"]


@dataclass(frozen=True)
class Material:
    """PEM bytes of the CA and of the serving certificate and their keys."""

    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    @classmethod
    def from_secret_data(cls, data: dict[str, bytes]) -> Material | None:
        if not all(data.get(k) for k in KEYS):
            return None
        return cls(*(data[k] for k in KEYS))

    def secret_data(self) -> dict[str, bytes]:
        return dict(zip(KEYS, (self.ca_crt, self.ca_key, self.tls_crt, self.tls_key), strict=True))


def renewal_reason(  # noqa: PLR0911 (one reason per check)
    m: Material | None, dns_names: list[str], now: datetime.datetime
) -> str:
    """Why ``m`` cannot serve ``dns_names`` until well after ``now`` ("" if it can)."""
    if m is None:
        return "no certificate yet"
    try:
        ca = x509.load_pem_x509_certificate(m.ca_crt)
        cert = x509.load_pem_x509_certificate(m.tls_crt)
        serialization.load_pem_private_key(m.tls_key, None)
        serialization.load_pem_private_key(m.ca_key, None)
    except ValueError as e:
        return f"unreadable material ({e})"
    for what, c in (("CA", ca), ("serving certificate", cert)):
        if c.not_valid_after_utc - now < RENEW_BEFORE:
            return f"{what} expires {c.not_valid_after_utc:%Y-%m-%d}"
        if c.not_valid_before_utc > now:
            return f"{what} not valid before {c.not_valid_before_utc:%Y-%m-%d %H:%M}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as e:
        return f"serving certificate not signed by the CA ({type(e).__name__})"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    missing = set(dns_names) - set(sans.get_values_for_type(x509.DNSName))
    if missing:
        return f"serving certificate lacks {', '.join(sorted(missing))}"
    return ""


def usable_ca(m: Material | None, now: datetime.datetime) -> tuple[bytes, bytes] | None:
    """``m``'s CA and key if they can sign for a while yet: a new serving certificate keeps
    the CA, so clients that have the bundle keep trusting the webhook."""
    if m is None:
        return None
    try:
        ca = x509.load_pem_x509_certificate(m.ca_crt)
        key = serialization.load_pem_private_key(m.ca_key, None)
    except ValueError:
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or ca.not_valid_after_utc - now < (
        RENEW_BEFORE + CERT_VALIDITY
    ):
        return None
    return m.ca_crt, m.ca_key
