"""The kind cluster's configuration that ``testbed/kind/run.sh`` creates (docs/testing.md#kind).

One control plane and four workers of one node image; the feature gates the in-place path needs
on that release (none from 1.36); pods in ``POD_SUBNET``; kube-proxy in nftables mode (the
locally built node image's kube-proxy has ``nft``); kubelets that start on cgroup v1 hosts too
(from 1.35 they refuse unless told). Two settings only where they apply:

- the locally built node image carries etcd and CoreDNS at their own versions, not the ones
  kubeadm names by default: kubeadm is pointed at their tags;
- where the host lacks ``CAP_SYS_RESOURCE`` the nodes lack it too, and runc cannot give a pod
  sandbox an OOM score below the node's containerd's (kubelet asks for -998): containerd is told
  not to ask (``restrict_oom_score_adj``, as kind does for rootless nodes).

    python -m testbed.kindconfig IMAGE [--etcd-tag T --coredns-tag T] [--restrict-oom-score-adj]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import yaml

from jobset_inplace.platform import gates_needed
from testbed.versions import versions

CLUSTER_NAME = "jsi"
WORKERS = 4
# kind's pods, apart from the local cluster's (testbed/cluster.py POD_CIDR, 10.244.0.0/16): run.sh
# routes this host to them (as the local cluster's pods are reachable from it), and the two
# clusters may share a machine.
POD_SUBNET = "10.245.0.0/16"


@dataclass(frozen=True)
class KindCluster:
    kubernetes: str  # vX.Y.Z
    node_image: str
    etcd_tag: str | None = None
    coredns_tag: str | None = None
    restrict_oom_score_adj: bool = False

    def config(self) -> dict[str, object]:
        if (self.etcd_tag is None) != (self.coredns_tag is None):
            raise ValueError(
                "etcd_tag and coredns_tag: give both (a locally built node image) or neither"
            )
        minor = int(self.kubernetes.removeprefix("v").split(".")[1])
        patches = [yaml.safe_dump({"kind": "KubeletConfiguration", "failCgroupV1": False})]
        if self.etcd_tag is not None:
            patches.append(
                yaml.safe_dump(
                    {
                        "kind": "ClusterConfiguration",
                        "etcd": {"local": {"imageTag": self.etcd_tag}},
                        "dns": {"imageTag": self.coredns_tag},
                    }
                )
            )
        config: dict[str, object] = {
            "kind": "Cluster",
            "apiVersion": "kind.x-k8s.io/v1alpha4",
            "name": CLUSTER_NAME,
        }
        gates = gates_needed(minor)
        if gates:
            config["featureGates"] = {gate: True for gate in gates}
        config["networking"] = {"kubeProxyMode": "nftables", "podSubnet": POD_SUBNET}
        config["kubeadmConfigPatches"] = patches
        if self.restrict_oom_score_adj:
            config["containerdConfigPatches"] = [
                '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
            ]
        config["nodes"] = [
            {"role": role, "image": self.node_image}
            for role in ["control-plane"] + ["worker"] * WORKERS
        ]
        return config


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the patches) as block literals, as kind's documentation writes them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def dump(config: dict[str, object]) -> str:
    return yaml.dump(config, Dumper=_BlockDumper, sort_keys=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.kindconfig", description=__doc__.split("\n")[0]
    )
    parser.add_argument("image", help="the node image of every node")
    parser.add_argument(
        "--etcd-tag", help="etcd's image tag in the node image (with --coredns-tag)"
    )
    parser.add_argument(
        "--coredns-tag", help="CoreDNS's image tag in the node image (with --etcd-tag)"
    )
    parser.add_argument(
        "--restrict-oom-score-adj", action="store_true", help="the host lacks CAP_SYS_RESOURCE"
    )
    args = parser.parse_args(argv)
    if (args.etcd_tag is None) != (args.coredns_tag is None):
        parser.error("--etcd-tag and --coredns-tag go together (a locally built node image)")
    cluster = KindCluster(
        versions().kubernetes,
        args.image,
        args.etcd_tag,
        args.coredns_tag,
        args.restrict_oom_score_adj,
    )
    print(dump(cluster.config()), end="")


if __name__ == "__main__":
    main()
