"""The local cluster remembers the Kubernetes release it was made with and refuses to be
brought up on another one (no state of the running cluster is touched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed import cluster as cluster_mod
from testbed import dns
from testbed.cluster import LocalCluster, Ports
from testbed.versions import versions


def write_state(c: LocalCluster, kubernetes: str) -> dict[str, object]:
    state: dict[str, object] = {
        "name": c.name,
        "ports": vars(Ports.allocate()),
        "pids": {"jobset": 1},
        "real_nodes": ["x-real-1"],
        "kubernetes": kubernetes,
    }
    c.state_dir.mkdir(parents=True, exist_ok=True)
    (c.state_dir / "state.json").write_text(json.dumps(state))
    return state


def test_up_on_another_release_refuses_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    c = LocalCluster("old")
    state = write_state(c, "v1.30.0")
    monkeypatch.setattr(LocalCluster, "is_up", lambda self: True)

    def no_build(*_: str) -> None:
        raise AssertionError("nothing is built for a refused up")

    monkeypatch.setattr(cluster_mod, "ensure_binaries", no_build)
    with pytest.raises(RuntimeError) as e:
        c.up(nodes=1, real_nodes=0)
    assert str(e.value) == (
        f"cluster old runs Kubernetes v1.30.0 but K8S selects {versions().kubernetes}: take it"
        " down first (make cluster-down, with the K8S it was made with) or use another"
        " JSI_CLUSTER_NAME"
    )
    assert json.loads((c.state_dir / "state.json").read_text()) == state


def test_state_round_trips_the_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    c = LocalCluster("any")
    write_state(c, "v1.37.2")
    assert c._load_state().kubernetes == "v1.37.2"


def test_coredns_serves_the_kubelets_cluster_domain(tmp_path: Path) -> None:
    kubelet = (Path(__file__).parents[2] / "testbed" / "realnode" / "kubelet.sh").read_text()
    assert f"clusterDomain: {dns.CLUSTER_DOMAIN}\n" in kubelet
    conf = dns.corefile("10.244.0.1", tmp_path / "kubeconfig", 8081, 8082)
    assert "bind 10.244.0.1\n" in conf
    assert f"kubernetes {dns.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{" in conf
    assert f"kubeconfig {tmp_path / 'kubeconfig'}\n" in conf
    assert "ready 127.0.0.1:8082\n" in conf
