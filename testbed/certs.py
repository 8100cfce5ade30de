"""Self-managed TLS material for local components, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServingCert:
    ca_crt: Path
    crt: Path
    key: Path

    def ca_bundle(self) -> bytes:
        return self.ca_crt.read_bytes()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def ensure_serving_cert(directory: Path, *, ips: list[str], dns: list[str]) -> ServingCert:
    """A CA plus a serving cert/key signed by it, named ``tls.crt``/``tls.key`` as
    controller-runtime expects. Kept if already present (idempotent)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert = ServingCert(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if cert.ca_crt.exists() and cert.crt.exists() and cert.key.exists():
        return cert
    ca_key = directory / "ca.key"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-subj",
        "/CN=jobset-inplace-local-ca",
        "-keyout",
        str(ca_key),
        "-out",
        str(cert.ca_crt),
    )
    csr = directory / "tls.csr"
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=jobset-inplace-local",
        "-keyout",
        str(cert.key),
        "-out",
        str(csr),
    )
    sans = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{d}" for d in dns)])
    ext = directory / "san.ext"
    ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(cert.ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "3650",
        "-extfile",
        str(ext),
        "-out",
        str(cert.crt),
    )
    return cert


def ensure_service_account_keypair(directory: Path) -> tuple[Path, Path]:
    """RSA key pair kube-apiserver uses to sign and verify service-account tokens."""
    directory.mkdir(parents=True, exist_ok=True)
    key, pub = directory / "sa.key", directory / "sa.pub"
    if not key.exists():
        _openssl("genrsa", "-out", str(key), "2048")
    if not pub.exists():
        _openssl("rsa", "-in", str(key), "-pubout", "-out", str(pub))
    return key, pub
