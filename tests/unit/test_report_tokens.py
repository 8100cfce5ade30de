"""Offline verification of report tokens (runtime/report_tokens.py): a token is accepted
only when signed by a cluster key with the algorithm that key is for, by the cluster's issuer,
for the channel's audience, within its validity, and bound to a pod. Keys and tokens are made
here; tests/integration/test_report_channel.py verifies the apiserver's own tokens."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import threading
import tracemalloc
from typing import Any

import pytest
import urllib3
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.runtime.report_tokens import (
    KEYS_MAX_AGE_S,
    KEYS_RETRY_S,
    MESSAGE_MAX,
    POD_NAME_KEY,
    POD_UID_KEY,
    REJECTED_S,
    REVIEW_QUEUE,
    REVIEW_THREADS,
    Identity,
    PublicKey,
    Rejected,
    TokenVerifier,
    check_claims,
    parse_token,
    public_key,
    verify_signature,
)

ISSUER = "https://kubernetes.default.svc"
NOW = 1_800_000_000.0
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**over: Any) -> dict[str, Any]:
    return {
        "iss": ISSUER,
        "aud": [names.REPORT_TOKEN_AUDIENCE],
        "exp": NOW + 3600,
        "nbf": NOW - 10,
        "iat": NOW - 10,
        "sub": "system:serviceaccount:ns:default",
        "kubernetes.io": {
            "namespace": "ns",
            "pod": {"name": "p-0", "uid": "uid-0"},
            "serviceaccount": {"name": "default", "uid": "sa-uid"},
        },
    } | over


def token(body: dict[str, Any], alg: str = "RS256", key: Any = RSA_KEY) -> str:
    signed = (
        f"{b64(json.dumps({'alg': alg, 'kid': 'k1'}).encode())}.{b64(json.dumps(body).encode())}"
    )
    if isinstance(key, rsa.RSAPrivateKey):
        sig = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = utils.decode_dss_signature(key.sign(signed.encode(), ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return f"{signed}.{b64(sig)}"


def rsa_jwk() -> dict[str, str]:
    n = RSA_KEY.public_key().public_numbers()
    return {
        "kty": "RSA",
        "kid": "k1",
        "n": b64(n.n.to_bytes(256, "big")),
        "e": b64(n.e.to_bytes(3, "big")),
    }


def ec_jwk() -> dict[str, str]:
    n = EC_KEY.public_key().public_numbers()
    return {
        "kty": "EC",
        "crv": "P-256",
        "x": b64(n.x.to_bytes(32, "big")),
        "y": b64(n.y.to_bytes(32, "big")),
    }


def verified(tok: str, key: PublicKey | None) -> Identity:
    assert key is not None
    t = parse_token(tok)
    verify_signature(t, key)
    return check_claims(t.claims, ISSUER, NOW)


def test_a_pod_bound_token_signed_by_a_cluster_key_names_its_pod() -> None:
    want = Identity("ns", "p-0", "uid-0", NOW + 3600, "default")
    assert verified(token(claims()), public_key(rsa_jwk())) == want
    assert verified(token(claims(), "ES256", EC_KEY), public_key(ec_jwk())) == want


@pytest.mark.parametrize(
    ("tok", "says"),
    [
        (token(claims(), "none"), "does not fit its key"),
        (token(claims(), "HS256"), "does not fit its key"),
        (token(claims(), "ES256", EC_KEY), "does not fit its key"),  # an EC token, RSA key
        (token(claims()).rsplit(".", 1)[0] + ".AAAA", "does not verify"),
        (token(claims())[:-8] + "AAAAAAAA", "does not verify"),
        ("a.b", "three parts"),
        ("!!.e30.e30", "malformed token"),
    ],
)
def test_a_signature_that_is_not_the_keys_is_refused(tok: str, says: str) -> None:
    with pytest.raises(Rejected, match=says) as e:
        verified(tok, public_key(rsa_jwk()))
    assert e.value.status == 401


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"iss": "https://evil.example"}, "issuer"),
        ({"aud": ["https://kubernetes.default.svc"]}, "audience"),
        ({"aud": names.REPORT_TOKEN_AUDIENCE + "x"}, "audience"),
        ({"exp": NOW - 61}, "expired"),
        ({"nbf": NOW + 61}, "not yet valid"),
        ({"exp": "soon"}, "numbers"),
        ({"kubernetes.io": {"namespace": "ns"}}, "pod-bound"),
        ({"kubernetes.io": {"namespace": "ns", "pod": {"name": "p-0"}}}, "pod-bound"),
    ],
)
def test_claims_that_do_not_bind_the_token_to_a_pod_of_ours_are_refused(
    over: dict[str, Any], says: str
) -> None:
    with pytest.raises(Rejected, match=says):
        verified(token(claims(**over)), public_key(rsa_jwk()))


def test_the_validity_window_allows_the_apiservers_clock_skew() -> None:
    assert verified(token(claims(exp=NOW - 59)), public_key(rsa_jwk())).uid == "uid-0"


def test_keys_service_accounts_are_not_signed_with_are_skipped() -> None:
    assert public_key({"kty": "oct", "k": "c2VjcmV0"}) is None
    assert public_key({"kty": "EC", "crv": "secp256k1", "x": "AA", "y": "AA"}) is None
    assert public_key({"kty": "RSA", "n": "AQAB"}) is None  # no exponent


# --- the verifier: reading the keys, TokenReviews, what it remembers --------------------------


class Verifier(TokenVerifier):
    """The verifier with the apiserver's answers played by the test: ``fetches`` the results
    of successive reads of the keys (an exception is raised), ``review`` the TokenReview's."""

    def __init__(self, fetches: list[Any], review: Any = None) -> None:
        self.now = NOW
        super().__init__(client.ApiClient(), clock=lambda: self.now)
        self.fetches, self.review, self.fetched, self.reviewed = fetches, review, 0, 0

    def _fetch(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.fetched += 1
        answer = self.fetches.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer[0]), dict(answer[1])

    def _create_review(self, review: client.V1TokenReview) -> Any:
        self.reviewed += 1
        if isinstance(self.review, BaseException):
            raise self.review
        if callable(self.review):
            return self.review()
        return self.review


KEYS = ({"issuer": ISSUER}, {"keys": [rsa_jwk()]})


def api_error(status: int) -> client.exceptions.ApiException:
    return client.exceptions.ApiException(status=status, reason="test")


def identify(v: TokenVerifier, tok: str) -> Identity:
    return asyncio.run(v.identify(tok))


def test_a_key_read_that_may_pass_is_retried_with_backoff_not_given_up() -> None:
    """A 429 (thousands of agents at a new leader) or a connection error: 503 for now, the keys
    read again after KEYS_RETRY_S doubling; never TokenReviews for the life of the process."""
    v = Verifier([api_error(429), OSError("reset"), KEYS])
    good = token(claims())

    def refused_for_now() -> None:
        with pytest.raises(Rejected) as e:
            identify(v, good)
        assert e.value.status == 503

    refused_for_now()  # the 429
    refused_for_now()
    assert v.fetched == 1, "not read again before the backoff"
    v.now += KEYS_RETRY_S
    refused_for_now()  # the connection error
    v.now += KEYS_RETRY_S
    refused_for_now()
    assert v.fetched == 2, "the backoff doubled"
    v.now += KEYS_RETRY_S
    assert identify(v, good).pod == "p-0"
    assert (v.fetched, v.reviewed) == (3, 0)


def review_of(pod: str, uid: str, audiences: list[str]) -> client.V1TokenReview:
    user = client.V1UserInfo(
        username="system:serviceaccount:ns:default",
        extra={POD_NAME_KEY: [pod], POD_UID_KEY: [uid]},
    )
    status = client.V1TokenReviewStatus(authenticated=True, user=user, audiences=audiences)
    return client.V1TokenReview(spec=client.V1TokenReviewSpec(token="x"), status=status)


def test_keys_that_may_not_be_read_switch_to_token_reviews_with_the_audience_checked() -> None:
    v = Verifier([api_error(403)], review_of("p-0", "uid-0", [names.REPORT_TOKEN_AUDIENCE]))
    who = identify(v, token(claims()))
    assert (who.uid, who.service_account) == ("uid-0", "default")
    assert v.reviewed == 1
    other = Verifier([api_error(404)], review_of("p-0", "uid-0", ["another-audience"]))
    with pytest.raises(Rejected, match="audience"):
        identify(other, token(claims()))


def test_a_refused_token_is_answered_from_memory_for_a_while() -> None:
    unauthenticated = client.V1TokenReviewStatus(authenticated=False, error="invalid token")
    spec = client.V1TokenReviewSpec(token="x")
    v = Verifier([api_error(403)], client.V1TokenReview(spec=spec, status=unauthenticated))
    bad = token(claims())
    for _ in range(3):
        with pytest.raises(Rejected) as e:
            identify(v, bad)
        assert e.value.status == 401
    assert v.reviewed == 1, "one TokenReview, then memory"
    v.now += REJECTED_S
    with pytest.raises(Rejected):
        identify(v, bad)
    assert v.reviewed == 2
    with pytest.raises(Rejected, match="three parts"):
        identify(v, "not-a-jwt")
    assert v.reviewed == 2, "not a JWT: no TokenReview"


def test_token_reviews_are_bounded_and_timed_out() -> None:
    """On threads of their own, at most REVIEW_THREADS + REVIEW_QUEUE at once (the rest 503 at
    once), each given up after REVIEW_TIMEOUT_S (503)."""
    release = threading.Event()

    def slow() -> client.V1TokenReview:
        release.wait(10)
        return review_of("p-0", "uid-0", [names.REPORT_TOKEN_AUDIENCE])

    v = Verifier([api_error(403)], slow)

    async def flood() -> list[int]:
        tokens = [token(claims(jti=str(i))) for i in range(REVIEW_THREADS + REVIEW_QUEUE + 5)]
        tasks = [asyncio.ensure_future(v.identify(t)) for t in tokens]
        await asyncio.sleep(0.2)
        release.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return [r.status if isinstance(r, Rejected) else 200 for r in done]

    statuses = asyncio.run(flood())
    assert statuses.count(503) == 5, "what is beyond the queue is refused at once"
    assert statuses.count(200) == REVIEW_THREADS + REVIEW_QUEUE

    never = threading.Event()
    stuck = Verifier([api_error(403)], lambda: never.wait(30))
    with pytest.raises(Rejected, match="took over") as e:
        identify(stuck, token(claims()))
    assert e.value.status == 503
    never.set()


# --- what a peer can grow, transport errors, rotated keys (issue: the channel under attack) ---


def garbage_token(i: int) -> str:
    """~15 KiB that parse as a JWT with the cluster's key id and a zero signature."""
    header = b64(json.dumps({"alg": "RS256", "kid": "k1"}).encode())
    body = b64(json.dumps(claims(pad=f"{i:05d}" + "x" * 11000)).encode())
    return f"{header}.{body}.{b64(bytes(256))}"


def test_a_refused_token_is_remembered_as_a_digest_and_a_short_message_and_then_dropped() -> None:
    """2000 distinct garbage tokens: what the verifier holds grows by under 1 KiB each (their
    digest, a status, a short message: not the token, its claims or an exception), and once
    REJECTED_S has passed they are dropped."""
    v = Verifier([KEYS])
    tokens = [garbage_token(i) for i in range(2000)]
    assert identify(v, token(claims())).pod == "p-0"  # the keys read

    async def refuse_all() -> list[str]:
        answers = []
        for t in tokens:
            with pytest.raises(Rejected) as e:
                await v.identify(t)
            answers.append(f"{e.value.status} {e.value}")
        return answers

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        answers = asyncio.run(refuse_all())
        del answers
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < len(tokens) * 1024, f"{grown / len(tokens):.0f} bytes per refused token"
    assert v.refusals_remembered == len(tokens)
    again = asyncio.run(refuse_all())
    assert set(again) == {"401 token signature does not verify"}, "answered from memory"
    v.now += REJECTED_S
    with pytest.raises(Rejected):
        identify(v, garbage_token(99999))
    assert v.refusals_remembered == 1, "the expired ones dropped"


def test_a_refusals_message_is_short_whatever_it_quotes() -> None:
    e = Rejected(401, "x" * 100_000)
    assert len(str(e)) == MESSAGE_MAX
    assert str(e).endswith("...")


def test_a_key_read_that_fails_in_urllib3_is_retried_soon_not_a_500() -> None:
    """urllib3's MaxRetryError (its retries used up) is not an OSError: a 503 for now and the
    keys read again after KEYS_RETRY_S, as for a connection error."""
    pool = urllib3.HTTPConnectionPool("apiserver")
    lost = urllib3.exceptions.MaxRetryError(pool, "/openid/v1/jwks", OSError("unreachable"))
    v = Verifier([lost, urllib3.exceptions.ProtocolError("reset"), KEYS])
    good = token(claims())
    for _ in range(2):
        with pytest.raises(Rejected) as e:
            identify(v, good)
        assert e.value.status == 503
        v.now += 2 * KEYS_RETRY_S
    assert identify(v, good).pod == "p-0"
    assert v.fetched == 3


def refresh_of(v: TokenVerifier) -> asyncio.Task[None] | None:
    return v.refreshing  # (read anew: mypy keeps an attribute narrowed across awaits)


def test_keys_are_read_again_and_a_rotated_out_keys_tokens_are_refused() -> None:
    """After KEYS_MAX_AGE_S the keys are read again in the background (reports go on); a token
    remembered under a key the cluster no longer lists is verified again, and refused."""
    other = {"kty": "EC", "crv": "P-256", "kid": "k2"} | {
        k: v for k, v in ec_jwk().items() if k in ("x", "y")
    }
    v = Verifier([KEYS, ({"issuer": ISSUER}, {"keys": [other]})])
    good = token(claims())

    async def rotated() -> None:
        assert (await v.identify(good)).pod == "p-0"
        v.now += KEYS_MAX_AGE_S - 1
        assert (await v.identify(good)).pod == "p-0"
        assert v.refreshing is None, "not old yet"
        v.now += 1
        assert (await v.identify(good)).pod == "p-0", "served while the keys are read"
        refreshing = refresh_of(v)
        assert refreshing is not None
        await refreshing
        assert v.fetched == 2
        with pytest.raises(Rejected, match="unknown key 'k1'"):
            await v.identify(good)

    asyncio.run(rotated())


def test_a_caller_cancelled_while_the_keys_are_read_leaves_the_read_to_finish() -> None:
    """The first report's connection closes (its handler cancelled) while the keys are read:
    the read goes on and the next report is verified with them (it was lost half-way, counted
    as made: every report refused 503 for KEYS_REFRESH_S)."""
    release = threading.Event()

    class Slow(Verifier):
        def _fetch(self) -> tuple[dict[str, Any], dict[str, Any]]:
            release.wait(10)
            return super()._fetch()

    v = Slow([KEYS])
    good = token(claims())

    async def cancelled_then_served() -> None:
        first = asyncio.create_task(v.identify(good))
        await asyncio.sleep(0.05)  # the read is under way in its thread, waiting for release
        first.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (await v.identify(good)).pod == "p-0"
        assert v.fetched == 1, "one read, for both"

    asyncio.run(cancelled_then_served())
