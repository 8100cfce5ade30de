"""``jobset-inplace``: the controller's command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from jobset_inplace import names
from jobset_inplace.core.leader_rules import ElectionTiming
from jobset_inplace.core.policy import PolicyError, parse_duration
from jobset_inplace.runtime import log_format
from jobset_inplace.runtime.leader_election import DEFAULT_LEASE, Election, default_identity
from jobset_inplace.runtime.manager import Settings
from jobset_inplace.runtime.webhook_certificates import SECRET_NAME
from jobset_inplace.runtime.webhook_server import settings_from_env

from .operator import WatchFactory
from .operator import run as run_controller

NAMESPACE_ENV = "POD_NAMESPACE"  # set from the downward API in manifests/controller


def _election(args: argparse.Namespace) -> Election | None:
    """The ``--leader-elect-*`` flags; ValueError names the flag and the accepted form."""
    if not args.leader_elect:
        return None
    seconds = {}
    for flag in ("lease_duration", "renew_deadline", "retry_period"):
        value = getattr(args, f"leader_elect_{flag}")
        name = "--leader-elect-" + flag.replace("_", "-")
        try:
            seconds[flag] = parse_duration(name, value)
        except PolicyError:
            raise ValueError(
                f"{name} {value!r}: expected a duration such as 2s, 15s or 1m"
            ) from None
    timing = ElectionTiming(
        seconds["lease_duration"], seconds["renew_deadline"], seconds["retry_period"]
    )
    timing.check()
    return Election(
        namespace=args.namespace,
        identity=args.leader_elect_identity or default_identity(),
        timing=timing,
        lease=args.leader_elect_lease_name,
    )


def main(argv: list[str] | None = None, *, extra_watches: Sequence[WatchFactory] = ()) -> int:
    """``extra_watches``: more watches for the recovery loop (the benchmark's alternative
    report path, bench/member_leases.py); the product has none."""
    parser = argparse.ArgumentParser(prog="jobset-inplace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the recovery controller")
    run.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="serve /healthz, /readyz and /metrics on this port (docs/operations.md)",
    )
    run.add_argument(
        "--namespace",
        default=os.environ.get(NAMESPACE_ENV) or names.INSTALL_NAMESPACE,
        help=f"where jobset-inplace is installed: its Lease and webhook Secret"
        f" (default ${NAMESPACE_ENV}, else {names.INSTALL_NAMESPACE})",
    )
    run.add_argument(
        "--manage-webhook-certificate",
        action="store_true",
        help="make and renew the webhook's CA and certificate in the Secret"
        f" {SECRET_NAME} and inject the CA into the webhook configurations (off: serve the"
        " files in $JSI_WEBHOOK_CERT_DIR, e.g. cert-manager's, if there are any)",
    )
    run.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging (e.g. every planning pass)"
    )
    run.add_argument(
        "--log-format",
        choices=log_format.FORMATS,
        default="text",
        help="text (default) or json: one object per line (time, level, logger, message)",
    )
    le = run.add_argument_group(
        "leader election (several replicas: only the Lease holder acts; docs/operations.md)"
    )
    le.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as a candidate for a coordination.k8s.io Lease (off: this is the only replica)",
    )
    le.add_argument("--leader-elect-lease-name", default=DEFAULT_LEASE)
    le.add_argument(
        "--leader-elect-identity", default="", help="this candidate's name (default: host_random)"
    )
    defaults = ElectionTiming()
    for flag, value, what in (
        ("lease-duration", defaults.lease_duration_s, "how long a silent leader keeps the Lease"),
        ("renew-deadline", defaults.renew_deadline_s, "a leader that cannot renew this long exits"),
        ("retry-period", defaults.retry_period_s, "how often candidates try and leaders renew"),
    ):
        le.add_argument(
            f"--leader-elect-{flag}", default=f"{value:g}s", help=f"{what} (%(default)s)"
        )
    args = parser.parse_args(argv)
    try:
        election = _election(args)
        settings_from_env()  # what the webhook injects: a malformed variable stops here
    except ValueError as e:
        parser.error(str(e))
    log_format.configure(getattr(args, "log_format", "text"))
    # the project's own debug lines only: the API client's would log every response body
    logging.getLogger("jobset_inplace").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.command == "run":
        run_controller(
            Settings(
                election=election,
                health_port=args.health_port,
                certificate_namespace=args.namespace if args.manage_webhook_certificate else None,
            ),
            extra_watches,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
