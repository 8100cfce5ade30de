"""``jobset-inplace``: the controller's command line."""

from __future__ import annotations

import argparse
import logging
import sys

from .operator import run as run_controller


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobset-inplace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the recovery controller")
    run.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    run.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging (e.g. every planning pass)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # the project's own debug lines only: the API client's would log every response body
    logging.getLogger("jobset_inplace").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.command == "run":
        run_controller(liveness=args.liveness)
    return 0


if __name__ == "__main__":
    sys.exit(main())
