"""Who a report token speaks for, checked without an API call per report.

An agent sends its projected service-account token for the audience
:data:`~jobset_inplace.names.REPORT_TOKEN_AUDIENCE`. The leader verifies it offline, the way
the apiserver itself does for bound tokens: the signature against the cluster's
service-account signing keys (``/openid/v1/jwks``, read at the first report and again for an
unknown key id), the issuer (``/.well-known/openid-configuration``), the audience, the
validity window and the pod binding (``kubernetes.io.pod``). A verified token is remembered
until it expires, so a recovery costs no API request and no signature check per member.

A cluster whose keys cannot be read (RBAC, an apiserver without issuer discovery) is served
through TokenReviews instead, cached the same way (then the first report of each new token
costs one API request).

Why not a TokenReview per token always: the kubelet rotates tokens (at 80 % of their life), so
at a recovery hours after the last one every agent's token is new to the leader: 5000 reviews
on the critical path."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from kubernetes import client

from jobset_inplace import names

log = logging.getLogger("jobset_inplace.reports")

LEEWAY_S = 60.0  # clock skew allowed on nbf / exp (as the apiserver's own validator)
KEYS_REFRESH_S = 30.0  # least time between two reads of the signing keys
CACHE_MAX = 4 * 65536  # verified tokens remembered (expired ones dropped beyond this)
SA_PREFIX = "system:serviceaccount:"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"  # TokenReview user extra
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "256": hashes.SHA256,
    "384": hashes.SHA384,
    "512": hashes.SHA512,
}
_CURVES: dict[str, tuple[ec.EllipticCurve, int]] = {
    "P-256": (ec.SECP256R1(), 32),
    "P-384": (ec.SECP384R1(), 48),
    "P-521": (ec.SECP521R1(), 66),
}


class Rejected(Exception):
    """A report refused, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Identity:
    """The pod a token was issued to, and until when it may be trusted."""

    namespace: str
    pod: str
    uid: str
    until: float


def _b64decode(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError) as e:
        raise Rejected(401, f"malformed token: {e}") from None


def _json(part: str) -> dict[str, Any]:
    try:
        doc = json.loads(_b64decode(part))
    except (ValueError, RecursionError):  # RecursionError: nested past the stack, not a JWT
        raise Rejected(401, "malformed token: not JSON") from None
    if not isinstance(doc, dict):
        raise Rejected(401, "malformed token: not a JSON object")
    return doc


@dataclass(frozen=True)
class Token:
    header: dict[str, Any]
    claims: dict[str, Any]
    signed: bytes  # header.payload, as signed
    signature: bytes


def parse_token(token: str) -> Token:
    parts = token.split(".")
    if len(parts) != 3:
        raise Rejected(401, "malformed token: a JWT has three parts")
    header, claims = _json(parts[0]), _json(parts[1])
    return Token(header, claims, f"{parts[0]}.{parts[1]}".encode(), _b64decode(parts[2]))


def public_key(jwk: Mapping[str, Any]) -> PublicKey | None:
    """A JWK's public key (RSA or EC); None for a kind service accounts are not signed with."""
    try:
        if jwk.get("kty") == "RSA":
            n = int.from_bytes(_b64decode(str(jwk["n"])), "big")
            e = int.from_bytes(_b64decode(str(jwk["e"])), "big")
            return rsa.RSAPublicNumbers(e, n).public_key()
        if jwk.get("kty") == "EC" and jwk.get("crv") in _CURVES:
            curve = _CURVES[str(jwk["crv"])][0]
            x = int.from_bytes(_b64decode(str(jwk["x"])), "big")
            y = int.from_bytes(_b64decode(str(jwk["y"])), "big")
            return ec.EllipticCurvePublicNumbers(x, y, curve).public_key()
    except (KeyError, ValueError, Rejected):
        return None
    return None


def verify_signature(t: Token, key: PublicKey) -> None:
    """Raises `Rejected` unless ``t`` is signed by ``key`` with the algorithm its header names
    (RS256/384/512 for RSA keys, ES256/384/512 for EC keys: never "none", never a mismatch)."""
    alg = str(t.header.get("alg") or "")
    digest = _HASHES.get(alg[2:])
    try:
        if isinstance(key, rsa.RSAPublicKey) and alg.startswith("RS") and digest:
            key.verify(t.signature, t.signed, padding.PKCS1v15(), digest())
            return
        if isinstance(key, ec.EllipticCurvePublicKey) and alg.startswith("ES") and digest:
            size = next(n for c, n in _CURVES.values() if c.name == key.curve.name)
            if len(t.signature) != 2 * size:
                raise Rejected(401, "token signature has the wrong length")
            r = int.from_bytes(t.signature[:size], "big")
            s = int.from_bytes(t.signature[size:], "big")
            key.verify(utils.encode_dss_signature(r, s), t.signed, ec.ECDSA(digest()))
            return
    except InvalidSignature:
        raise Rejected(401, "token signature does not verify") from None
    raise Rejected(401, f"token algorithm {alg!r} does not fit its key")


def check_claims(claims: Mapping[str, Any], issuer: str, now: float) -> Identity:
    """The pod a verified token's claims bind it to; raises `Rejected` naming the claim."""
    if claims.get("iss") != issuer:
        raise Rejected(401, f"token issuer {claims.get('iss')!r} is not the cluster's ({issuer})")
    aud = claims.get("aud")
    audiences = aud if isinstance(aud, list) else [aud]
    if names.REPORT_TOKEN_AUDIENCE not in audiences:
        raise Rejected(
            401, f"token audience {aud!r} does not include {names.REPORT_TOKEN_AUDIENCE}"
        )
    exp, nbf = claims.get("exp"), claims.get("nbf", 0)
    if not isinstance(exp, int | float) or not isinstance(nbf, int | float):
        raise Rejected(401, "token exp/nbf must be numbers")
    if now > exp + LEEWAY_S or now < nbf - LEEWAY_S:
        raise Rejected(401, "token expired or not yet valid")
    k8s = claims.get("kubernetes.io")
    pod = k8s.get("pod") if isinstance(k8s, dict) else None
    namespace = k8s.get("namespace") if isinstance(k8s, dict) else None
    if not isinstance(pod, dict) or not pod.get("uid") or not isinstance(namespace, str):
        raise Rejected(401, "not a pod-bound service-account token (no kubernetes.io.pod)")
    return Identity(namespace, str(pod.get("name") or ""), str(pod["uid"]), float(exp))


class TokenVerifier:
    """:meth:`identify` a report token: offline against the signing keys, or (keys
    unreadable) by TokenReview; each verified token remembered until it expires."""

    def __init__(self, api: client.ApiClient, clock: Callable[[], float] = time.time) -> None:
        self.api, self.clock = api, clock
        self._known: dict[str, Identity] = {}
        self._keys: dict[str, PublicKey] = {}
        self._issuer: str | None = None
        self._offline = True  # False once the keys proved unreadable: TokenReviews
        self._keys_read_at = float("-inf")
        self._keys_lock = asyncio.Lock()
        self.verified = 0  # tokens checked (not served from memory)
        self.reviews = 0  # TokenReviews made

    async def identify(self, token: str) -> Identity:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        known = self._known.get(key)
        if known is not None and now <= known.until + LEEWAY_S:
            return known
        identity = await (self._verify(token, now) if self._offline else self._review(token))
        self.verified += 1
        if len(self._known) >= CACHE_MAX:
            self._known = {k: v for k, v in self._known.items() if now <= v.until + LEEWAY_S}
        self._known[key] = identity
        return identity

    async def _verify(self, token: str, now: float) -> Identity:
        t = parse_token(token)
        kid = str(t.header.get("kid") or "")
        if kid not in self._keys or self._issuer is None:
            await self._read_keys()
            if not self._offline:
                return await self._review(token)
        signer = self._keys.get(kid)
        if signer is None:
            raise Rejected(401, f"token signed by unknown key {kid!r}")
        verify_signature(t, signer)
        assert self._issuer is not None
        return check_claims(t.claims, self._issuer, now)

    async def _read_keys(self) -> None:
        async with self._keys_lock:
            if self.clock() - self._keys_read_at < KEYS_REFRESH_S:
                return
            self._keys_read_at = self.clock()
            try:
                config, jwks = await asyncio.to_thread(self._fetch)
            except client.exceptions.ApiException as e:
                log.warning(
                    "report channel: cannot read the service-account signing keys (%s %s); "
                    "verifying tokens by TokenReview",
                    e.status,
                    e.reason,
                )
                self._offline = False
                return
            keys = {str(k.get("kid") or ""): public_key(k) for k in jwks.get("keys") or []}
            self._keys = {kid: k for kid, k in keys.items() if k is not None}
            self._issuer = str(config.get("issuer") or "")
            log.info(
                "report channel: %d service-account signing keys of issuer %s",
                len(self._keys),
                self._issuer,
            )

    def _fetch(self) -> tuple[dict[str, Any], dict[str, Any]]:
        well_known = client.WellKnownApi(self.api)
        config = well_known.get_service_account_issuer_open_id_configuration(_preload_content=False)
        jwks = client.OpenidApi(self.api).get_service_account_issuer_open_id_keyset(
            _preload_content=False
        )
        return _as_dict(config.data), _as_dict(jwks.data)

    async def _review(self, token: str) -> Identity:
        review = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[names.REPORT_TOKEN_AUDIENCE])
        )
        api = client.AuthenticationV1Api(self.api)
        try:
            answer = await asyncio.to_thread(api.create_token_review, review)
        except client.exceptions.ApiException as e:
            raise Rejected(503, f"cannot review the token: API error {e.status} {e.reason}") from e
        self.reviews += 1
        status = answer.status
        if status is None or not status.authenticated or status.user is None:
            why = (status.error if status is not None else None) or "not authenticated"
            raise Rejected(401, f"token not accepted for {names.REPORT_TOKEN_AUDIENCE}: {why}")
        extra = status.user.extra or {}
        pod, uid = (extra.get(POD_NAME_KEY) or [""])[0], (extra.get(POD_UID_KEY) or [""])[0]
        user = status.user.username or ""
        if not user.startswith(SA_PREFIX) or not uid:
            raise Rejected(401, f"not a pod-bound service-account token (user {user!r})")
        namespace = user[len(SA_PREFIX) :].split(":", 1)[0]
        claims = parse_token(token).claims  # authentic now: the apiserver accepted it
        exp = claims.get("exp")
        until = float(exp) if isinstance(exp, int | float) else self.clock() + 300.0
        return Identity(namespace, pod, uid, until)


def _as_dict(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise client.exceptions.ApiException(status=500, reason="not a JSON object")
    return doc
