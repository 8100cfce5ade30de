"""Network faults for one pod of a real-kubelet node (docs/real-node.md): the pod's own network
namespace (CRI names it /var/run/netns/cni-*) gets an iptables rule in its OUTPUT chain, so
only that pod's traffic to one address and port (or to one port) is affected, and the rule
goes away with the context (or with the pod). Needs root, like the real nodes themselves."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit

NETNS_DIR = Path("/var/run/netns")


class Block(StrEnum):
    DROP = "drop"  # packets vanish: connects and reads time out
    REJECT = "reject"  # refused at once: a TCP reset


def pod_netns(pod_ip: str) -> str:
    """The name of the network namespace holding ``pod_ip`` (ValueError: none does)."""
    for ns in sorted(NETNS_DIR.glob("cni-*")):
        out = subprocess.run(
            ["ip", "-n", ns.name, "-o", "-4", "addr", "show"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if f" {pod_ip}/" in out:
            return ns.name
    raise ValueError(f"no network namespace under {NETNS_DIR} holds {pod_ip}")


def _rule(url: str, how: Block, *, every_host: bool = False) -> list[str]:
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"not a URL with a host and a port: {url!r}")
    target = ["DROP"] if how == Block.DROP else ["REJECT", "--reject-with", "tcp-reset"]
    host = [] if every_host else ["-d", parts.hostname]
    return ["OUTPUT", "-p", "tcp", *host, "--dport", str(parts.port), "-j", *target]


def _iptables(netns: str, *args: str) -> None:
    cmd = ["ip", "netns", "exec", netns, "iptables", "-w", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")


@contextmanager
def blocked(pod_ip: str, url: str, how: Block, *, every_host: bool = False) -> Iterator[None]:
    """The pod at ``pod_ip`` cannot reach ``url``'s host and port (``every_host``: that port
    on any host) while in the context: every packet it sends there (new and established
    connections) is dropped or rejected."""
    netns, rule = pod_netns(pod_ip), _rule(url, how, every_host=every_host)
    _iptables(netns, "-I", *rule)
    try:
        yield
    finally:
        if (NETNS_DIR / netns).exists():  # gone with its pod otherwise
            _iptables(netns, "-D", *rule)
