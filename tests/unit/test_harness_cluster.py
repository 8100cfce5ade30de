"""The local cluster remembers the Kubernetes release it was made with: it refuses to be brought
up on another one while it runs (no state of it touched), and a stopped one of another release
is deleted first instead of restarted with its old binaries (seen in CI: a run killed mid-way on
1.35 left a cluster that the next run's 1.37 leg started as 1.35)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStatus,
    V1PodCondition,
    V1PodStatus,
)

from testbed import cluster as cluster_mod
from testbed import dns, processes
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
    monkeypatch.setattr(LocalCluster, "_api_ready", lambda self: True)

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


def write_kwok_record(c: LocalCluster, kubernetes: str) -> None:
    cluster_dir = c.kwok_workdir / "clusters" / c.name
    cluster_dir.mkdir(parents=True)
    docs = [
        {"kind": "KwokctlConfiguration", "options": {"kubeVersion": kubernetes}},
        {"kind": "KwokConfiguration"},
    ]
    (cluster_dir / "kwok.yaml").write_text(yaml.safe_dump_all(docs))


def test_kwokctls_record_of_the_release_counts_over_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    c = LocalCluster("old")
    write_state(c, versions().kubernetes)  # saved before the old cluster's record was replaced
    write_kwok_record(c, "v1.30.0")
    monkeypatch.setattr(LocalCluster, "_api_ready", lambda self: True)
    with pytest.raises(RuntimeError, match=r"runs Kubernetes v1\.30\.0 but K8S selects"):
        c.up(nodes=1, real_nodes=0)


def test_a_stopped_cluster_of_another_release_is_deleted_before_the_new_one_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    c = LocalCluster("old")
    write_state(c, "v1.30.0")
    write_kwok_record(c, "v1.30.0")
    monkeypatch.setattr(LocalCluster, "_api_ready", lambda self: False)
    calls: list[str] = []

    def down(self: LocalCluster) -> None:
        calls.append("down")
        (self.state_dir / "state.json").unlink()

    class Stop(Exception):
        pass

    def build(*_: str) -> None:
        calls.append("build")
        raise Stop

    monkeypatch.setattr(LocalCluster, "down", down)
    monkeypatch.setattr(cluster_mod, "ensure_binaries", build)
    with pytest.raises(Stop):
        c.up(nodes=1, real_nodes=0)
    assert calls == ["down", "build"]


def test_up_with_other_node_leases_than_the_cluster_was_made_with_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster made with the kubelet's 40 s node Leases is not silently reused (nor remade)
    for a run that asked for longer ones: its nodes would go NotReady as before."""
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    c = LocalCluster("old")
    state = write_state(c, versions().kubernetes)  # no node_lease_s: made before it existed
    monkeypatch.setattr(LocalCluster, "_api_ready", lambda self: True)

    def no_build(*_: str) -> None:
        raise AssertionError("nothing is built for a refused up")

    monkeypatch.setattr(cluster_mod, "ensure_binaries", no_build)
    with pytest.raises(RuntimeError, match="made with 40 s node Leases, 200 s are asked for"):
        c.up(nodes=1, real_nodes=0, node_lease_s=200)
    assert json.loads((c.state_dir / "state.json").read_text()) == state
    with pytest.raises(ValueError, match="node_lease_s: at least 40"):
        c.up(nodes=1, real_nodes=0, node_lease_s=10)


def test_the_grace_period_keeps_upstreams_ratio_to_the_node_lease() -> None:
    assert cluster_mod.node_monitor_grace_s(40) == cluster_mod.NODE_MONITOR_GRACE_SECONDS == 50
    assert cluster_mod.node_monitor_grace_s(200) == 250


def test_no_kwok_record_reads_as_none(tmp_path: Path) -> None:
    assert cluster_mod.kwok_cluster_release(tmp_path) == ""
    (tmp_path / "kwok.yaml").write_text("kind: [unclosed")
    assert cluster_mod.kwok_cluster_release(tmp_path) == ""


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


def test_a_recorded_pid_counts_only_while_it_runs_its_program() -> None:
    """A stale PID in state.json may be another process's by now: it is neither taken for a
    running controller nor signalled."""
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert processes.runs(sleeper.pid, "sleep")
        assert not processes.runs(sleeper.pid, "jobset")
        processes.stop_pid(sleeper.pid, program="jobset")
        assert sleeper.poll() is None
        processes.stop_pid(sleeper.pid, program="sleep")
        assert sleeper.wait(timeout=10) == -signal.SIGTERM
        assert not processes.runs(sleeper.pid, "sleep")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_control_plane_runs_only_while_its_pid_files_name_its_own_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped cluster's pid files may name other processes by now (a killed run's PIDs are
    reused): only a process running the cluster's copy of a binary makes it running."""
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    c = LocalCluster("old")
    cluster_dir = c.kwok_workdir / "clusters" / c.name
    (cluster_dir / "bin").mkdir(parents=True)
    (cluster_dir / "pids").mkdir()
    etcd = cluster_dir / "bin" / "etcd"
    shutil.copy("/bin/sleep", etcd)
    (cluster_dir / "pids" / "etcd.pid").write_text(str(os.getpid()))  # reused: not ours
    assert not c._control_plane_running()
    ours = subprocess.Popen([str(etcd), "60"], start_new_session=True)
    try:
        (cluster_dir / "pids" / "etcd.pid").write_text(str(ours.pid))
        # (its command line reads empty for a moment after exec: see processes.runs)
        processes.wait_until("the cluster's etcd copy runs", c._control_plane_running, 10)
    finally:
        ours.kill()
        ours.wait()
    assert not c._control_plane_running()


def test_a_pod_counts_as_restarted_only_when_every_container_started_after_power_on() -> None:
    def pod(*started: float) -> Any:
        statuses = [
            V1ContainerStatus(
                name=f"c{i}",
                image="i",
                image_id="",
                ready=True,
                restart_count=1,
                state=V1ContainerState(
                    running=V1ContainerStateRunning(started_at=datetime.fromtimestamp(t, UTC))
                ),
            )
            for i, t in enumerate(started)
        ]
        ready = [V1PodCondition(type="Ready", status="True")]
        return SimpleNamespace(status=V1PodStatus(container_statuses=statuses, conditions=ready))

    on = 1_800_000_000.0
    assert cluster_mod._ready(pod(on))
    assert cluster_mod._all_started_after(pod(on + 3, on + 5), on)
    assert not cluster_mod._all_started_after(pod(on + 3, on - 40), on), "one still the old one"
    assert not cluster_mod._all_started_after(pod(), on), "no container status yet"


def test_power_on_of_a_node_whose_kubelet_runs_starts_and_waits_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean-up powers every node on, also those never powered off: their pods started before
    the call, so waiting for them to restart would never end (seen at a soak's end)."""
    monkeypatch.setenv("JSI_CACHE_DIR", str(tmp_path))
    pidfile = tmp_path / "realnode" / "n1" / "kubelet" / "kubelet.pid"
    pidfile.parent.mkdir(parents=True)
    assert not cluster_mod.kubelet_running("n1"), "no PID recorded"
    kubelet = tmp_path / "kubelet"
    shutil.copy("/bin/sleep", kubelet)
    running = subprocess.Popen([str(kubelet), "60"], start_new_session=True)
    try:
        pidfile.write_text(str(os.getpid()))  # a PID reused by another program
        assert not cluster_mod.kubelet_running("n1")
        pidfile.write_text(str(running.pid))
        processes.wait_until("the kubelet copy runs", lambda: cluster_mod.kubelet_running("n1"), 10)
        started: list[tuple[str, ...]] = []
        monkeypatch.setattr(LocalCluster, "_realnode", lambda self, *args: started.append(args))
        LocalCluster("c").power_on("n1")
        assert started == [], "nothing started, nothing waited for"
    finally:
        running.kill()
        running.wait()
    assert not cluster_mod.kubelet_running("n1")
