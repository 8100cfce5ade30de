"""The kind cluster's configuration (testbed/kindconfig.py), as kind and kubeadm read it."""

from __future__ import annotations

import tomllib
from ipaddress import ip_network
from typing import Any

import pytest
import yaml

from testbed.cluster import POD_CIDR
from testbed.kindconfig import POD_SUBNET, KindCluster, dump, main


def _patches(config: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in map(yaml.safe_load, config["kubeadmConfigPatches"]) if p["kind"] == kind]


def test_a_public_node_image_gets_one_control_plane_four_workers_and_no_image_tags() -> None:
    config = yaml.safe_load(dump(KindCluster("v1.37.2", "kindest/node:v1.37.2").config()))
    assert [n["role"] for n in config["nodes"]] == ["control-plane"] + ["worker"] * 4
    assert {n["image"] for n in config["nodes"]} == {"kindest/node:v1.37.2"}
    assert config["networking"] == {"kubeProxyMode": "nftables", "podSubnet": "10.245.0.0/16"}
    assert _patches(config, "KubeletConfiguration") == [
        {"kind": "KubeletConfiguration", "failCgroupV1": False}
    ]
    assert _patches(config, "ClusterConfiguration") == []
    assert "containerdConfigPatches" not in config
    assert "featureGates" not in config  # none needed from 1.36


def test_kind_pods_do_not_overlap_the_local_cluster_s() -> None:
    assert not ip_network(POD_SUBNET).overlaps(ip_network(POD_CIDR))


def test_the_local_node_image_points_kubeadm_at_its_etcd_and_coredns() -> None:
    cluster = KindCluster("v1.37.2", "jobset-inplace/kind-node:x", "3.6.16-0", "v1.15.0-jsi")
    (patch,) = _patches(yaml.safe_load(dump(cluster.config())), "ClusterConfiguration")
    assert patch["etcd"] == {"local": {"imageTag": "3.6.16-0"}}
    assert patch["dns"] == {"imageTag": "v1.15.0-jsi"}


def test_a_host_without_sys_resource_restricts_the_oom_score_in_valid_toml() -> None:
    cluster = KindCluster("v1.37.2", "img", restrict_oom_score_adj=True)
    (patch,) = yaml.safe_load(dump(cluster.config()))["containerdConfigPatches"]
    assert tomllib.loads(patch) == {
        "plugins": {"io.containerd.grpc.v1.cri": {"restrict_oom_score_adj": True}}
    }


def test_an_older_release_gets_the_gates_the_in_place_path_needs() -> None:
    config = KindCluster("v1.35.4", "img").config()
    assert config["featureGates"] == {
        "RestartAllContainersOnContainerExits": True,
        "NodeDeclaredFeatures": True,
    }


def test_one_image_tag_without_the_other_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="etcd_tag and coredns_tag"):
        KindCluster("v1.37.2", "img", etcd_tag="3.6.16-0").config()
    with pytest.raises(SystemExit):
        main(["img", "--etcd-tag", "3.6.16-0"])
    assert "--etcd-tag and --coredns-tag go together" in capsys.readouterr().err
