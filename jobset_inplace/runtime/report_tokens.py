"""Who a report token speaks for, checked without an API call per report.

An agent sends its projected service-account token for the audience
:data:`~jobset_inplace.names.REPORT_TOKEN_AUDIENCE`. The leader verifies it offline, the way
the apiserver itself does for bound tokens: the signature against the cluster's
service-account signing keys (``/openid/v1/jwks``, read at the first report and again for an
unknown key id), the issuer (``/.well-known/openid-configuration``), the audience, the
validity window and the pod binding (``kubernetes.io.pod``). A verified token is remembered
until it expires, so a recovery costs no API request and no signature check per member. The
keys are read again every ``KEYS_MAX_AGE_S`` (in the background: reports go on meanwhile), and
tokens remembered under a key the cluster no longer lists are forgotten (rotated keys).

What a peer can grow here, by construction: a refused token is remembered as its digest, a
status and a message of at most ``MESSAGE_MAX`` characters (never the token, its claims or an
exception), for ``REJECTED_S``, expired entries dropped first, at most ``REJECTED_MAX`` of them
(``REJECTED_MAX`` x ~0.5 KiB: under 9 MiB); a remembered verified token needs a token the
cluster signed for one of our pods.

A cluster whose keys cannot be read (RBAC, an apiserver without issuer discovery) is served
through TokenReviews instead, cached the same way (then the first report of each new token
costs one API request).

Why not PyJWT (measured with ``python -m bench.token_verify``, docs/bench/token-verify.json):
the same checks cost 1.97x this module's per valid RS256 token, the clusters' default key
(95 % interval 1.47-2.58: 125 us against 63 us), 1.37x per ES256 one, and 6.5x per 15 KiB
garbage token, what an attacker sends (PyJWT 2.15 checks each base64url byte in a Python
loop: 0.86 ms per such token, against 0.13 ms here). What is hand-written is the
framing (three base64url parts, two JSON objects) and the claims; the signatures are
``cryptography``'s.

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
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from kubernetes import client
from urllib3.exceptions import HTTPError

from jobset_inplace import names
from jobset_inplace.backoff import Backoff

log = logging.getLogger("jobset_inplace.reports")

LEEWAY_S = 60.0  # clock skew allowed on nbf / exp (as the apiserver's own validator)
KEYS_REFRESH_S = 30.0  # least time between two reads of the signing keys
# A read of the keys that failed for a reason that may pass (429 while thousands of agents
# reach a new leader, 5xx, a connection error) is tried again after this, doubling to
# KEYS_REFRESH_S; meanwhile reports are answered 503 (their agents write them on their pods).
# Only a definite 403 or 404 (RBAC, no issuer discovery) switches to TokenReviews.
KEYS_RETRY_S = 0.5
KEYS_RETRY = Backoff(KEYS_RETRY_S, KEYS_REFRESH_S)
KEYS_MAX_AGE_S = 300.0  # the keys are read again this often (a rotation drops a key)
KEYS_READ_TIMEOUT_S = 10.0  # each of the two reads of the keys
# What a read of the keys can fail with short of an answer: a connection error (OSError) or
# urllib3's own (MaxRetryError, ProtocolError: not OSErrors).
TRANSPORT_ERRORS = (OSError, HTTPError)
CACHE_MAX = 4 * 65536  # verified tokens remembered (expired ones dropped beyond this)
REJECTED_S = 60.0  # a refused token is answered from memory this long
REJECTED_MAX = 16384  # refused tokens remembered (the expired, then the oldest, dropped first)
MESSAGE_MAX = 160  # characters of a refusal's message kept (and answered)
# TokenReviews run on threads of their own (never the pool status writes and pod actions
# share), at most this many at once and this many waiting; beyond, a report is answered 503.
REVIEW_THREADS = 2
REVIEW_QUEUE = 64
REVIEW_TIMEOUT_S = 5.0
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
    """A report refused, with its HTTP status and a message of at most ``MESSAGE_MAX``
    characters. ``lasting``: the token itself is refused, and would be again (not so for a
    key this leader has not read yet)."""

    def __init__(self, status: int, message: str, *, lasting: bool = True) -> None:
        if len(message) > MESSAGE_MAX:
            message = message[: MESSAGE_MAX - 3] + "..."
        super().__init__(message)
        self.status = status
        self.lasting = lasting and status == 401


@dataclass(frozen=True)
class Identity:
    """The pod a token was issued to, until when it may be trusted, and its service account
    ("": not named)."""

    namespace: str
    pod: str
    uid: str
    until: float
    service_account: str = ""


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
    account = k8s.get("serviceaccount") if isinstance(k8s, dict) else None
    name = account.get("name") if isinstance(account, dict) else None
    return Identity(
        namespace,
        str(pod.get("name") or ""),
        str(pod["uid"]),
        float(exp),
        name if isinstance(name, str) else "",
    )


class TokenVerifier:
    """:meth:`identify` a report token: offline against the signing keys, or (keys
    unreadable) by TokenReview; each verified token remembered until it expires (or its key is
    no longer the cluster's), each refused one for REJECTED_S."""

    def __init__(self, api: client.ApiClient, clock: Callable[[], float] = time.time) -> None:
        self.api, self.clock = api, clock
        # sha256 of the token -> who it is, and the key id it was verified with ("": review)
        self._known: dict[bytes, tuple[Identity, str]] = {}
        # sha256 of the token -> (until, status, message): nothing of the token itself
        self._rejected: OrderedDict[bytes, tuple[float, int, str]] = OrderedDict()
        self.refreshing: asyncio.Task[None] | None = None  # a background read of the keys
        self._keys: dict[str, PublicKey] = {}
        self._issuer: str | None = None
        self._offline = True  # False once the keys proved unreadable: TokenReviews
        self._keys_read_at = float("-inf")
        self._keys_failures = 0  # reads failed in a row (for a reason that may pass)
        self._reading: asyncio.Task[None] | None = None  # the read of the keys under way
        self._reviewer: ThreadPoolExecutor | None = None
        self._reviews_pending = 0
        self.verified = 0  # tokens checked (not served from memory)
        self.reviews = 0  # TokenReviews made

    @property
    def refusals_remembered(self) -> int:
        return len(self._rejected)

    def remembered(self, token: str) -> Identity | None:
        """Who ``token`` is, from memory (a token verified before and not expired), without
        waiting: None where it must be verified or was refused (:meth:`identify`). The report
        server answers most reports from here, in the read's own callback, without a task per
        report."""
        now = self.clock()
        self._refresh_keys_if_old(now)
        known = self._known.get(hashlib.sha256(token.encode()).digest())
        if known is not None and now <= known[0].until + LEEWAY_S:
            return known[0]
        return None

    async def identify(self, token: str) -> Identity:
        key = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        self._refresh_keys_if_old(now)
        known = self._known.get(key)
        if known is not None and now <= known[0].until + LEEWAY_S:
            return known[0]
        refused = self._rejected.get(key)
        if refused is not None and now < refused[0]:
            raise Rejected(refused[1], refused[2])  # a new one: nothing chained to the old
        try:
            if self._offline:
                identity, kid = await self._verify(token, now)
            else:
                identity, kid = await self._review(token), ""
        except Rejected as e:
            if e.lasting:  # the same answer next time: given from memory
                self._remember_rejected(key, now, e)
            raise
        self.verified += 1
        if len(self._known) >= CACHE_MAX:
            self._known = {k: v for k, v in self._known.items() if now <= v[0].until + LEEWAY_S}
        self._known[key] = (identity, kid)
        return identity

    def _remember_rejected(self, key: bytes, now: float, e: Rejected) -> None:
        rejected = self._rejected
        while rejected and next(iter(rejected.values()))[0] <= now:  # the oldest first
            rejected.popitem(last=False)
        rejected[key] = (now + REJECTED_S, e.status, str(e))
        rejected.move_to_end(key)
        while len(rejected) > REJECTED_MAX:
            rejected.popitem(last=False)

    def _refresh_keys_if_old(self, now: float) -> None:
        """Read the keys again in the background once they are KEYS_MAX_AGE_S old (reports
        go on with the keys read before)."""
        wait = KEYS_RETRY.delay(self._keys_failures) if self._keys_failures else KEYS_MAX_AGE_S
        old = self._issuer is not None and now - self._keys_read_at >= wait
        if self._offline and old and (self.refreshing is None or self.refreshing.done()):
            self.refreshing = asyncio.get_running_loop().create_task(self._read_keys())

    async def _verify(self, token: str, now: float) -> tuple[Identity, str]:
        t = parse_token(token)
        kid = str(t.header.get("kid") or "")
        if kid not in self._keys or self._issuer is None:
            await self._read_keys()
            if not self._offline:
                return await self._review(token), ""
            if self._issuer is None:
                raise Rejected(503, "the signing keys could not be read yet; report on the pod")
        signer = self._keys.get(kid)
        if signer is None:
            raise Rejected(401, f"token signed by unknown key {kid!r}", lasting=False)
        verify_signature(t, signer)
        assert self._issuer is not None
        return check_claims(t.claims, self._issuer, now), kid

    def _keys_due(self) -> bool:
        wait = KEYS_RETRY.delay(self._keys_failures) if self._keys_failures else KEYS_REFRESH_S
        return self.clock() - self._keys_read_at >= wait

    async def _read_keys(self) -> None:
        """Read the keys if due, or wait for the read under way: one read at a time, in a task
        of its own that a waiting caller's cancellation (its connection closed) does not stop
        (a read cancelled half-way, already counted as made, left no keys: every report was
        refused 503 until the next was due)."""
        reading = self._reading
        if reading is None or reading.done():
            if not self._keys_due():
                return
            self._keys_read_at = self.clock()
            reading = self._reading = asyncio.get_running_loop().create_task(self._read_now())
        await asyncio.shield(reading)

    async def _read_now(self) -> None:
        try:
            config, jwks = await asyncio.to_thread(self._fetch)
        except client.exceptions.ApiException as e:
            if e.status in (403, 404):
                log.warning(
                    "report channel: the service-account signing keys may not be read "
                    "(%s %s); verifying tokens by TokenReview",
                    e.status,
                    e.reason,
                )
                self._offline = False
                return
            self._read_failed(f"{e.status} {e.reason}")
            return
        except TRANSPORT_ERRORS as e:  # no answer: the connection, urllib3's retries
            self._read_failed(f"{type(e).__name__}: {e}")
            return
        self._keys_failures = 0
        keys = {str(k.get("kid") or ""): public_key(k) for k in jwks.get("keys") or []}
        self._keys = {kid: k for kid, k in keys.items() if k is not None}
        self._issuer = str(config.get("issuer") or "")
        # a token verified with a key the cluster no longer lists is verified again
        self._known = {k: v for k, v in self._known.items() if v[1] in self._keys}
        log.info(
            "report channel: %d service-account signing keys of issuer %s",
            len(self._keys),
            self._issuer,
        )

    def _read_failed(self, why: str) -> None:
        self._keys_failures += 1
        log.warning(
            "report channel: cannot read the service-account signing keys (%s); trying again "
            "in %.1f s",
            why,
            KEYS_RETRY.delay(self._keys_failures),
        )

    def _fetch(self) -> tuple[dict[str, Any], dict[str, Any]]:
        well_known = client.WellKnownApi(self.api)
        config = well_known.get_service_account_issuer_open_id_configuration(
            _preload_content=False, _request_timeout=KEYS_READ_TIMEOUT_S
        )
        jwks = client.OpenidApi(self.api).get_service_account_issuer_open_id_keyset(
            _preload_content=False, _request_timeout=KEYS_READ_TIMEOUT_S
        )
        return _as_dict(config.data), _as_dict(jwks.data)

    def _create_review(self, review: client.V1TokenReview) -> Any:
        return client.AuthenticationV1Api(self.api).create_token_review(review)

    async def _review(self, token: str) -> Identity:
        parse_token(token)  # not even a JWT: no API request for it
        if self._reviews_pending >= REVIEW_THREADS + REVIEW_QUEUE:
            raise Rejected(503, "too many token reviews in flight; report on the pod")
        if self._reviewer is None:
            self._reviewer = ThreadPoolExecutor(REVIEW_THREADS, "jsi-token-review")
        review = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[names.REPORT_TOKEN_AUDIENCE])
        )
        loop = asyncio.get_running_loop()
        self._reviews_pending += 1
        try:
            call = loop.run_in_executor(self._reviewer, self._create_review, review)
            answer = await asyncio.wait_for(call, REVIEW_TIMEOUT_S)
        except TimeoutError:
            raise Rejected(503, f"the token review took over {REVIEW_TIMEOUT_S:g} s") from None
        except client.exceptions.ApiException as e:
            raise Rejected(
                503, f"cannot review the token: API error {e.status} {e.reason}"
            ) from None
        except TRANSPORT_ERRORS as e:
            raise Rejected(503, f"cannot review the token: {type(e).__name__}") from None
        finally:
            self._reviews_pending -= 1
        self.reviews += 1
        status = answer.status
        if status is None or not status.authenticated or status.user is None:
            why = (status.error if status is not None else None) or "not authenticated"
            raise Rejected(401, f"token not accepted for {names.REPORT_TOKEN_AUDIENCE}: {why}")
        if names.REPORT_TOKEN_AUDIENCE not in (status.audiences or []):
            raise Rejected(401, f"token not valid for the audience {names.REPORT_TOKEN_AUDIENCE}")
        extra = status.user.extra or {}
        pod, uid = (extra.get(POD_NAME_KEY) or [""])[0], (extra.get(POD_UID_KEY) or [""])[0]
        user = status.user.username or ""
        if not user.startswith(SA_PREFIX) or not uid:
            raise Rejected(401, f"not a pod-bound service-account token (user {user!r})")
        namespace, _, account = user[len(SA_PREFIX) :].partition(":")
        claims = parse_token(token).claims  # authentic now: the apiserver accepted it
        exp = claims.get("exp")
        until = float(exp) if isinstance(exp, int | float) else self.clock() + 300.0
        return Identity(namespace, pod, uid, until, account)


def _as_dict(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise client.exceptions.ApiException(status=500, reason="not a JSON object")
    return doc
