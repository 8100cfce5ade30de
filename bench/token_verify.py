"""What verifying a report token costs, this project's verifier against PyJWT, without a
cluster: ``python -m bench.token_verify``.

Both check the same token the same way (RS256 and ES256 signed by a key made here, issuer,
audience, validity, the pod binding): a valid projected token (~1.1 KiB, the size a kubelet
writes), and a ~15 KiB garbage one with the cluster's key id and a zero signature (what an
attacker sends). Each figure is the median of ``--rounds`` rounds of ``--n`` verifications,
the two verifiers alternated round by round, with the ratio's 95 % bootstrap interval. The
verifier's cache is not involved: every call verifies."""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from bench import provenance
from bench.channel_attacks import ISSUER, KID, BenchCluster
from bench.stats import ratio_of_medians
from jobset_inplace import names
from jobset_inplace.runtime import report_tokens
from jobset_inplace.runtime.report_tokens import Rejected, public_key


def ours(token: str, key: Any, now: float) -> None:
    """The project's offline verification, as TokenVerifier._verify does it."""
    t = report_tokens.parse_token(token)
    report_tokens.verify_signature(t, key)
    report_tokens.check_claims(t.claims, ISSUER, now)


def pyjwt(token: str, key: Any, now: float) -> None:
    """The same checks with PyJWT."""
    ecdsa = isinstance(key, ec.EllipticCurvePublicKey)
    algorithms = ["ES256", "ES384", "ES512"] if ecdsa else ["RS256", "RS384", "RS512"]
    claims = jwt.decode(
        token,
        key,
        algorithms=algorithms,
        audience=names.REPORT_TOKEN_AUDIENCE,
        issuer=ISSUER,
        leeway=report_tokens.LEEWAY_S,
        options={"require": ["exp", "iss", "aud"]},
    )
    pod = (claims.get("kubernetes.io") or {}).get("pod")
    if not isinstance(pod, dict) or not pod.get("uid"):
        raise Rejected(401, "not a pod-bound service-account token")


def _ec_token(key: ec.EllipticCurvePrivateKey, claims: dict[str, Any]) -> str:
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": KID})


def timed(check: Callable[[str, Any, float], None], token: str, key: Any, n: int) -> float:
    """Microseconds per verification over ``n`` (a refusal counts as done)."""
    now = time.time()
    started = time.perf_counter()
    for _ in range(n):
        with contextlib.suppress(Rejected, jwt.PyJWTError):
            check(token, key, now)
    return (time.perf_counter() - started) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=500, help="verifications per round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args()
    provenance.refuse_dirty(args.allow_dirty or not args.out)
    origin = provenance.provenance("bench.token_verify", sys.argv[1:])
    cluster = BenchCluster()
    rsa_key = public_key(json.loads(cluster.keys())["jwks"]["keys"][0])
    ec_private = ec.generate_private_key(ec.SECP256R1())
    valid = cluster.token("train-0", "uid-0")
    claims = jwt.decode(valid, options={"verify_signature": False})
    cases = {
        "valid RS256": (valid, rsa_key),
        "valid ES256": (_ec_token(ec_private, claims), ec_private.public_key()),
        "garbage (15 KiB, zero signature)": (
            cluster.token("p", "u", pad="x" * 11000, sign=False),
            rsa_key,
        ),
    }
    for token, key in list(cases.values())[:2]:  # both accept what the other accepts
        ours(token, key, time.time())
        pyjwt(token, key, time.time())
    result: dict[str, Any] = {"cases": {}, "pyjwt": jwt.__version__}
    for name, (token, key) in cases.items():
        mine: list[float] = []
        theirs: list[float] = []
        for _ in range(args.rounds):
            mine.append(timed(ours, token, key, args.n))
            theirs.append(timed(pyjwt, token, key, args.n))
        r = ratio_of_medians(theirs, mine)
        result["cases"][name] = {
            "ours_us": statistics.median(mine),
            "pyjwt_us": statistics.median(theirs),
            "pyjwt_over_ours": r.as_dict(),
            "bytes": len(token),
        }
        print(
            f"{name} ({len(token)} bytes): ours {statistics.median(mine):.1f} us, PyJWT "
            f"{statistics.median(theirs):.1f} us per verification: PyJWT {r.text()}"
        )
    provenance.write(result | origin, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
