"""Cluster DNS for the local cluster's real nodes: CoreDNS (testbed/coredns, built from its Go
module) on the host the real nodes share, serving ``cluster.local`` from the API server as a
cluster's DNS does, and the kubelets' ``clusterDNS`` pointing at it. Pods then resolve Service
names and JobSet's per-pod names (``<pod hostname>.<jobset>``, its headless Service) and reach
each other across the real nodes (docs/local-cluster.md)."""

from __future__ import annotations

from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"  # the kubelets' clusterDomain (realnode/kubelet.sh)


def corefile(address: str, kubeconfig: Path, health_port: int, ready_port: int) -> str:
    """CoreDNS's configuration: the cluster domain and reverse zones from the API server
    (``pods insecure``: A records for pod IPs, as kube-dns had), everything else forwarded to
    the host's resolvers; ``ready`` answers 200 once the kubernetes plugin has synced."""
    return f"""\
.:53 {{
    bind {address}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""
