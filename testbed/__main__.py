"""``python -m testbed``: manage the local cluster (used by ``make cluster-up`` etc.)."""

from __future__ import annotations

import argparse
import os
import sys

from .cluster import DEFAULT_NAME, DEFAULT_NODES, DEFAULT_REAL_NODES, LocalCluster
from .install import Installation
from .versions import ensure_binaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed", description="Local jobset-inplace test cluster."
    )
    parser.add_argument(
        "--name",
        default=os.environ.get("JSI_CLUSTER_NAME", DEFAULT_NAME),
        help="cluster name (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create or complete the cluster (safe to re-run)")
    up.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("JSI_NODES", DEFAULT_NODES)),
        help="number of kwok nodes (default: %(default)s)",
    )
    up.add_argument(
        "--real-nodes",
        type=int,
        default=int(os.environ.get("JSI_REAL_NODES", DEFAULT_REAL_NODES)),
        help="number of real kubelet nodes (default: %(default)s; 0 for none)",
    )
    sub.add_parser("down", help="stop and delete the cluster")
    sub.add_parser("status", help="say whether the cluster is up and where it lives")
    sub.add_parser("binaries", help="build any missing upstream binaries")
    sub.add_parser(
        "install",
        help="install jobset-inplace in the cluster as a user would (images on the real nodes,"
        " kubectl apply -k manifests/overlays/local)",
    )
    sub.add_parser("uninstall", help="delete what install applied (gangs keep running)")
    args = parser.parse_args(argv)

    if args.command == "binaries":
        ensure_binaries()
        return 0
    cluster = LocalCluster(args.name)
    if args.command == "up":
        if args.nodes < 1:
            parser.error("--nodes must be a positive integer")
        if args.real_nodes < 0:
            parser.error("--real-nodes must be 0 or a positive integer")
        cluster.up(args.nodes, args.real_nodes)
    elif args.command == "install":
        Installation(cluster.kubeconfig, cluster).install()
    elif args.command == "uninstall":
        Installation(cluster.kubeconfig, cluster).uninstall()
    elif args.command == "down":
        cluster.down()
    elif args.command == "status":
        up_now = cluster.is_up()
        print(f"cluster '{cluster.name}': {'up' if up_now else 'down'}")
        cluster.print_info()
        return 0 if up_now else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
