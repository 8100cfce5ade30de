"""Certificates made in memory (ECDSA P-256): a CA and a serving certificate signed by it. The
webhook's TLS (:mod:`.webhook_certificates`, kept in a Secret) and the report channel's
(:mod:`.report_tls`, one per process) are both made here."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from jobset_inplace.core.certificate_rules import CA_VALIDITY, CERT_VALIDITY, Material


def issue(
    dns_names: list[str], now: datetime.datetime, ca: tuple[bytes, bytes] | None = None
) -> Material:
    """A serving certificate for ``dns_names`` (ECDSA P-256) signed by ``ca`` (PEM certificate
    and key), or by a new CA when there is none."""
    start = now - datetime.timedelta(minutes=5)  # tolerate clock skew between machines
    pem = serialization.Encoding.PEM
    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jobset-inplace-webhook-ca")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        ca = (ca_cert.public_bytes(pem), _private_pem(ca_key))
    ca_cert = x509.load_pem_x509_certificate(ca[0])
    signer = serialization.load_pem_private_key(ca[1], None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)  # usable_ca() checked it
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(signer, hashes.SHA256())
    )
    return Material(ca[0], ca[1], cert.public_bytes(pem), _private_pem(key))


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
