"""The report channel's TLS: a certificate made for this process (:mod:`.certificates`), held
in memory only, and the context the server speaks it with. Agents pin the certificate's
SHA-256, which the GangState status names."""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl

from .certificates import issue


def serving_context() -> tuple[ssl.SSLContext, str]:
    """A TLS context with a certificate made for this process, and its SHA-256 (DER)."""
    material = issue(["jobset-inplace-reports"], datetime.datetime.now(datetime.UTC))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # TLS 1.3 only (no renegotiation in it), and no session tickets: agents keep their
    # connection instead, and a ticket is state a client makes the server compute
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.options |= ssl.OP_NO_TICKET | ssl.OP_NO_RENEGOTIATION
    _load_chain(ctx, material.tls_crt, material.tls_key)
    der = ssl.PEM_cert_to_DER_cert(material.tls_crt.decode())
    return ctx, hashlib.sha256(der).hexdigest()


def _load_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``ssl`` loads a chain from files only: anonymous in-memory files (the controller's root
    filesystem is read-only, and the key never touches a disk)."""
    fds: list[int] = []
    try:
        for data in (cert, key):
            fd = os.memfd_create("jobset-inplace-report-tls")
            fds.append(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)
