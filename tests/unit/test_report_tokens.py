"""Offline verification of report tokens (controller/report_tokens.py): a token is accepted
only when signed by a cluster key with the algorithm that key is for, by the cluster's issuer,
for the channel's audience, within its validity, and bound to a pod. Keys and tokens are made
here; tests/integration/test_report_channel.py verifies the apiserver's own tokens."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from jobset_inplace import names
from jobset_inplace.controller.report_tokens import (
    Identity,
    PublicKey,
    Rejected,
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
    want = Identity("ns", "p-0", "uid-0", NOW + 3600)
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
