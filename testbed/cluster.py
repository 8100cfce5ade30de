"""The full local cluster: kwokctl (binary runtime, our locally built binaries) for etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and the kwok controller with N fake
nodes; plus the real JobSet and Kueue controllers as processes whose admission and conversion
webhooks the apiserver calls on loopback.

Everything is idempotent: ``up`` on a running cluster only fills in what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jobset_inplace.platform import RESTART_ALL_FEATURE

from . import addons, certs, dns, images, processes
from .images import NODE_IMAGE
from .kube import clients
from .kubectl import Kubectl
from .versions import (
    COMPONENT_OF,
    Binaries,
    binaries,
    cache_dir,
    ensure_binaries,
    module_source,
    real_node_dir,
    versions,
)

DEFAULT_NAME = "jsi"
DEFAULT_NODES = 4
# Real kubelet nodes (containerd + runc) beside the kwok nodes: in-place restarts need them.
DEFAULT_REAL_NODES = 2
REAL_NODE_LABEL = "jobset-inplace.dev/real-node"
REALNODE_DIR = Path(__file__).resolve().parent / "realnode"
# The demo trainer, a module of its own in the image (``python3 -m demo_trainer``).
DEMO_TRAINER = Path(__file__).resolve().parent / "demo_trainer.py"
# The apiserver's address for pods on real nodes (they cannot reach the host's loopback): an
# address of the host outside every node's 10.244.<n>.0/24 pod subnet (n >= 1). The apiserver
# advertises it, so the ``kubernetes`` Service's endpoint is this address.
POD_API_ADDRESS = "10.244.0.1"
POD_CIDR = "10.244.0.0/16"
# Services: kube-proxy (iptables mode, one per host: the real nodes share its network stack)
# routes ClusterIPs, so in-cluster clients reach the apiserver at KUBERNETES_SERVICE_IP (in its
# certificate) and the apiserver reaches webhook Services, as in any cluster.
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
# Upstream defaults (kube-controller-manager >= 1.32): a silent node is marked Unknown after
# node-monitor-grace-period, checked every node-monitor-period. Kept realistic on purpose: the
# benchmarks compare against stock Kubernetes timing.
NODE_MONITOR_GRACE_SECONDS = 50
NODE_MONITOR_PERIOD_SECONDS = 5
# The simulated kubelets' node Lease (kwok renews it every quarter: 10 s), the kubelet's
# default. A cluster may be made with a longer one (``up(node_lease_s=...)``), the grace period
# scaled with it: kwok's renewals for thousands of nodes on these 2 cores fall behind (at 5008
# nodes, while a 5000-pod gang was made, 25-70 renewals a second came where 500 were due, and
# 388 nodes were NotReady at once: docs/bench/gang-setup-2026-12-06), and a NotReady node
# takes no pod.
KWOK_NODE_LEASE_SECONDS = 40


def node_monitor_grace_s(node_lease_s: int) -> int:
    """kube-controller-manager's grace period for a cluster whose node Leases last
    ``node_lease_s``: the upstream ratio (50 s to 40 s)."""
    return NODE_MONITOR_GRACE_SECONDS * node_lease_s // KWOK_NODE_LEASE_SECONDS


KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Kueue (v0.19) reads its metrics serving cert from this fixed path whenever its internal
# certificate management is off; there is no setting for it.
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# kwok's default Stages minus ``pod-complete``, which would finish every Job pod a moment
# after it starts Running: training pods here run until a test says otherwise. (Passing any
# Stage to kwokctl replaces all of its defaults, hence the full list.)
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


# kwok's default of 4 workers each for Leases and pod/node stages falls behind with thousands
# of nodes on 2 cores: node Leases went unrenewed for 25+ s while a 1000-pod gang was being
# created (seen by the bench), which is a dead node to anyone reading Leases. More workers keep
# the simulated kubelets' heartbeats on time.
KWOK_CONTROLLER_CONFIG = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    "options": {
        "nodeLeaseParallelism": 32,
        "podPlayStageParallelism": 16,
        "nodePlayStageParallelism": 16,
    },
}


# What a kubelet does with a pod deleted while it runs, if the pod is not to be restarted (since
# Kubernetes 1.27, kubernetes#115331: it stops the containers and writes a terminal phase before the
# pod goes): kwok's pod-delete Stage only removes a pod with no finalizer left, and the Job
# controller keeps its tracking finalizer on a pod that never turns terminal when its Job has a
# podFailurePolicy, so a pod deleted by anyone but the bench (the taint-eviction controller, a
# drain, a user) stayed Terminating while Running for good (2026-12-07, the 10,000-pod run). This
# Stage marks such a pod Failed, its containers ended by the deletion's SIGTERM (143), as the
# kubelet would; the Job controller then counts it and drops the finalizer, and pod-delete removes
# it. A pod without finalizers is pod-delete's alone. (It marks every such pod whatever its
# restartPolicy: the Job pods here, and any with a podFailurePolicy, restart Never.)
KWOK_POD_TERMINATE_ON_DELETE = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1",
    "kind": "Stage",
    "metadata": {"name": "pod-terminate-on-delete"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {
            "matchExpressions": [
                {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".metadata.finalizers", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]},
            ]
        },
        "next": {
            "statusTemplate": """{{ $now := Now }}
containerStatuses:
{{ range $index, $item := .spec.containers }}
- image: {{ $item.image | Quote }}
  name: {{ $item.name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: 143
      finishedAt: {{ $now | Quote }}
      reason: Error
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Failed
"""
        },
    },
}


def kwok_stages() -> list[dict[str, object]]:
    """The Stages above, read from the pinned kwok module source, and the testbed's own."""
    src = module_source("sigs.k8s.io/kwok", versions().kwok)
    upstream = [yaml.safe_load((src / f).read_text()) for f in KWOK_STAGE_FILES]
    for stage in upstream:
        # kwok v0.8.0's pod-delete takes every pod being deleted, finalizers or not, and where
        # two Stages match kwok picks one at random (pkg/utils/lifecycle, Lifecycle.Match): a
        # pod with finalizers is pod-terminate-on-delete's alone (newer kwok's pod-delete
        # selects only pods without finalizers too)
        if stage["metadata"]["name"] == "pod-delete":
            exprs = stage["spec"]["selector"]["matchExpressions"]
            exprs.append({"key": ".metadata.finalizers", "operator": "DoesNotExist"})
    return [*upstream, KWOK_POD_TERMINATE_ON_DELETE]


@dataclass
class Ports:
    jobset_webhook: int
    jobset_health: int
    jobset_metrics: int
    kueue_webhook: int
    kueue_health: int
    kueue_metrics: int

    @classmethod
    def allocate(cls) -> Ports:
        return cls(*(processes.free_port() for _ in range(6)))


@dataclass
class ClusterState:
    """What ``up`` decided once and every later call reuses (``state.json``)."""

    name: str
    ports: Ports
    pids: dict[str, int] = field(default_factory=dict)
    real_nodes: list[str] = field(default_factory=list)
    kubernetes: str = ""  # the release the cluster was brought up with
    node_lease_s: int = KWOK_NODE_LEASE_SECONDS  # the simulated kubelets' node Lease


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())


def kubelet_running(node: str) -> bool:
    """Whether real ``node``'s kubelet runs (the PID realnode/kubelet.sh recorded)."""
    try:
        pid = int((real_node_dir(node) / "kubelet" / "kubelet.pid").read_text())
    except (OSError, ValueError):
        return False
    return processes.runs(pid, "kubelet")


def _all_started_after(pod: Any, moment: float) -> bool:
    """Whether every container of ``pod`` (a V1Pod) runs, started at or after ``moment`` (the
    API's whole seconds: one second of slack)."""
    statuses = pod.status.container_statuses or []
    return bool(statuses) and all(
        c.state.running is not None and c.state.running.started_at.timestamp() >= moment - 1
        for c in statuses
    )


def kwok_cluster_release(cluster_dir: Path) -> str:
    """``options.kubeVersion`` of the kwokctl cluster in ``cluster_dir`` (its ``kwok.yaml``:
    kwokctl's own record of what it made); "" when there is no such cluster or record."""
    try:
        docs = list(yaml.safe_load_all((cluster_dir / "kwok.yaml").read_text()))
    except (OSError, yaml.YAMLError):
        return ""
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "KwokctlConfiguration":
            release = (doc.get("options") or {}).get("kubeVersion")
            return release if isinstance(release, str) else ""
    return ""


class LocalCluster:
    def __init__(self, name: str = DEFAULT_NAME) -> None:
        self.name = name
        self.state_dir = cache_dir() / "clusters" / name
        self.kwok_workdir = cache_dir() / "kwok"
        self.kubeconfig = self.kwok_workdir / "clusters" / name / "kubeconfig.yaml"
        self.pki = self.kwok_workdir / "clusters" / name / "pki"
        self.logs_dir = self.state_dir / "logs"
        self.cert_dir = self.state_dir / "webhook-certs"
        self._images: list[str] = []

    # ----- state -------------------------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.state_dir / "state.json"

    def _load_state(self) -> ClusterState:
        if self._state_file.exists():
            raw = json.loads(self._state_file.read_text())
            return ClusterState(
                raw["name"],
                Ports(**raw["ports"]),
                raw.get("pids", {}),
                raw.get("real_nodes", []),
                raw.get("kubernetes", ""),
                raw.get("node_lease_s", KWOK_NODE_LEASE_SECONDS),
            )
        return ClusterState(self.name, Ports.allocate())

    def _save_state(self, state: ClusterState) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._state_file.write_text(json.dumps(asdict(state), indent=2))

    # ----- kwokctl -----------------------------------------------------------------------
    def _kwokctl(
        self, bins: Binaries, *args: str, check: bool = True, capture: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KWOK_WORKDIR": str(self.kwok_workdir),
            # kwokctl shells out to kubectl; make sure it finds the pinned one.
            "PATH": f"{bins.kubernetes_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        return subprocess.run(
            [str(bins.kwokctl), *args], env=env, text=True, check=check, capture_output=capture
        )

    def _kwokctl_config(self, bins: Binaries, node_lease_s: int) -> Path:
        cfg = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            # kwokctl's kwok-controller manages all nodes by default; here it must leave real
            # kubelet nodes alone and let a test silence one kwok node (kwoknodes.py).
            "componentsPatches": [
                {
                    # `kubectl logs/exec` on real kubelet nodes: the apiserver dials the node IP
                    # and authenticates with the admin cert, signed by the CA the kubelets trust.
                    "name": "kube-apiserver",
                    "extraArgs": [
                        {"key": "kubelet-client-certificate", "value": str(self.pki / "admin.crt")},
                        {"key": "kubelet-client-key", "value": str(self.pki / "admin.key")},
                        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
                        {"key": "advertise-address", "value": POD_API_ADDRESS},
                        {"key": "service-cluster-ip-range", "value": SERVICE_CIDR},
                    ],
                },
                # One replica of each: leader election only adds a way to die. Under a stall of
                # etcd (seen in CI: 2 s reads on the loaded 2-core machine) a candidate that
                # misses its renewal exits ("leaderelection lost") and kwokctl's binary runtime
                # does not restart it: no Job, namespace or garbage-collection controller for the
                # rest of the run, every later test fails.
                *(
                    {"name": name, "extraArgs": [{"key": "leader-elect", "value": "false"}]}
                    for name in ("kube-controller-manager", "kube-scheduler")
                ),
                {
                    "name": "kwok-controller",
                    "extraArgs": [
                        {"key": "manage-all-nodes", "value": "false", "override": True},
                        {
                            "key": "manage-nodes-with-annotation-selector",
                            "value": f"{KWOK_NODE_ANNOTATION}=fake",
                        },
                    ],
                },
            ],
            "options": {
                "runtime": "binary",
                "kubeVersion": versions().kubernetes,
                "etcdVersion": versions().etcd,
                "kwokVersion": versions().kwok,
                "kubeApiserverBinary": str(bins.kube_apiserver),
                "kubeControllerManagerBinary": str(bins.kube_controller_manager),
                "kubeSchedulerBinary": str(bins.kube_scheduler),
                "kubectlBinary": str(bins.kubectl),
                "etcdBinary": str(bins.etcd),
                "kwokControllerBinary": str(bins.kwok),
                "kubeFeatureGates": versions().feature_gates,
                "kubeRuntimeConfig": versions().runtime_config,
                "kubeAuthorization": True,
                "kubeAdmission": True,
                "securePort": True,
                # Real-node pods reach the apiserver at POD_API_ADDRESS (see _ensure_pod_api).
                "bindAddress": "0.0.0.0",
                "kubeApiserverCertSANs": [POD_API_ADDRESS, KUBERNETES_SERVICE_IP],
                "heartbeatFactor": 1,
                "nodeLeaseDurationSeconds": node_lease_s,
                "kubeControllerManagerNodeMonitorGracePeriodMilliseconds": (
                    node_monitor_grace_s(node_lease_s) * 1000
                ),
                "kubeControllerManagerNodeMonitorPeriodMilliseconds": NODE_MONITOR_PERIOD_SECONDS
                * 1000,
            },
        }
        path = self.state_dir / "kwokctl.yaml"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all([cfg, KWOK_CONTROLLER_CONFIG, *kwok_stages()]))
        return path

    def _made_with(self, state: ClusterState) -> str:
        """The Kubernetes release this cluster was made with ("" when there is none): kwokctl's
        own record of the control plane (it copied that release's binaries), else ours."""
        return kwok_cluster_release(self.kwok_workdir / "clusters" / self.name) or state.kubernetes

    def _kwok_cluster_exists(self, bins: Binaries) -> bool:
        out = self._kwokctl(bins, "get", "clusters", check=False).stdout
        return self.name in out.split()

    def _api_ready(self) -> bool:
        if not self.kubeconfig.exists() or not binaries().kubectl.exists():
            return False
        res = subprocess.run(
            [
                str(binaries().kubectl),
                "--kubeconfig",
                str(self.kubeconfig),
                "get",
                "--raw",
                "/readyz",
                "--request-timeout=3s",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return res.returncode == 0

    def _ensure_control_plane(self, bins: Binaries, node_lease_s: int) -> None:
        if self._kwok_cluster_exists(bins):
            if self._api_ready():
                log(f"control plane '{self.name}' already running")
                return
            log(f"control plane '{self.name}' exists but is stopped: starting it")
            self._kwokctl(
                bins, "start", "cluster", "--name", self.name, "--wait", "2m", capture=False
            )
        else:
            log(f"creating control plane '{self.name}' with kwokctl (binary runtime) ...")
            self._kwokctl(
                bins,
                "create",
                "cluster",
                "--name",
                self.name,
                "--config",
                str(self._kwokctl_config(bins, node_lease_s)),
                "--kubeconfig",
                str(self.state_dir / "kubeconfig-merged.yaml"),
                "--wait",
                "2m",
                capture=False,
            )
        processes.wait_until("kube-apiserver", self._api_ready, 60)

    def scale_nodes(self, count: int) -> None:
        bins = ensure_binaries()
        log(f"ensuring {count} kwok nodes ...")
        self._kwokctl(
            bins, "scale", "node", "--name", self.name, "--replicas", str(count), capture=False
        )
        self._declare_kwok_features()

    def _declare_kwok_features(self) -> None:
        """kwok nodes run no kubelet to declare node features; pods with restart rules are only
        scheduled onto nodes that declare ``RestartAllContainersOnContainerExits``, so declare it
        for them (what a 1.36+ kubelet, or a 1.35 one with the gate on, reports). Concurrent
        patches: a bench cluster has thousands of nodes."""
        core = clients(self.kubeconfig).core
        names = [
            n.metadata.name
            for n in core.list_node(label_selector="type=kwok").items
            if RESTART_ALL_FEATURE not in (n.status.declared_features or [])
        ]
        patch = {"status": {"declaredFeatures": [RESTART_ALL_FEATURE]}}
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: core.patch_node_status(n, patch), names))
        if names:
            log(f"declared {RESTART_ALL_FEATURE} on {len(names)} kwok nodes")

    # ----- JobSet + Kueue ----------------------------------------------------------------
    def _controller_running(self, state: ClusterState, name: str) -> bool:
        pid = state.pids.get(name)
        return pid is not None and processes.runs(pid, name)

    def _start_addon(
        self, state: ClusterState, name: str, cmd: list[str | Path], health_port: int
    ) -> None:
        logfile = self.logs_dir / f"{name}.log"
        if self._controller_running(state, name):
            log(f"{name} controller already running (pid {state.pids[name]})")
        else:
            proc = processes.start(
                cmd, logfile, detach=True, env={"KUBECONFIG": str(self.kubeconfig)}
            )
            state.pids[name] = proc.pid
            self._save_state(state)
            log(f"started {name} controller (pid {proc.pid}, log {logfile})")
        pid = state.pids[name]

        def ready() -> bool:
            if not processes.pid_alive(pid):
                tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"{name} controller exited; last lines of {logfile}:\n{tail}")
            return processes.http_ok(f"http://127.0.0.1:{health_port}/readyz")

        processes.wait_until(f"{name} controller", ready, 120, log=logfile)

    def _ensure_addons(self, bins: Binaries, state: ClusterState) -> None:
        cert = certs.ensure_serving_cert(self.cert_dir, ips=["127.0.0.1"], dns=["localhost"])
        kubectl = Kubectl(self.kubeconfig, bins.kubectl)
        p = state.ports
        jobset_src, kueue_src = addons.jobset_source(), addons.kueue_source()

        log(f"installing JobSet {versions().jobset} CRDs and webhooks from {jobset_src}")
        kubectl.apply_yaml(
            addons.render(
                jobset_src / "config/default",
                f"https://127.0.0.1:{p.jobset_webhook}",
                cert.ca_bundle(),
                namespace="jobset-system",
            ),
            server_side=True,
        )
        log(f"installing Kueue {versions().kueue} CRDs and webhooks from {kueue_src}")
        kubectl.apply_yaml(
            addons.render(
                kueue_src / "config/default",
                f"https://127.0.0.1:{p.kueue_webhook}",
                cert.ca_bundle(),
                namespace="kueue-system",
            ),
            server_side=True,
        )

        # Both controllers set up informers at start and exit if a kind is not served yet.
        crds = kubectl.run("get", "crd", "-o", "jsonpath={.items[*].metadata.name}").split()
        kubectl.wait_crds_established(
            [c for c in crds if c.endswith((".jobset.x-k8s.io", ".kueue.x-k8s.io"))]
        )

        kueue_cfg = self.state_dir / "kueue-config.yaml"
        kueue_cfg.write_text(
            yaml.safe_dump(
                addons.kueue_config(
                    webhook_port=p.kueue_webhook,
                    health_port=p.kueue_health,
                    metrics_port=p.kueue_metrics,
                    cert_dir=self.cert_dir,
                )
            )
        )

        self._start_jobset(bins, state)
        self._install_kueue_metrics_cert(cert)
        # The visibility API server needs an in-cluster APIService; it is not used here.
        self._start_addon(
            state,
            "kueue",
            [
                bins.kueue,
                "--config",
                kueue_cfg,
                "--kubeconfig",
                self.kubeconfig,
                "--feature-gates",
                "VisibilityOnDemand=false",
                # V(3) logs why Kueue evicts (TAS node failures, failed replacement)
                "--zap-log-level=3",
            ],
            p.kueue_health,
        )
        self._wait_webhooks_serving(kubectl)

    def _start_jobset(
        self, bins: Binaries, state: ClusterState, gates: dict[str, bool] | None = None
    ) -> None:
        p = state.ports
        config = addons.jobset_config(
            webhook_port=p.jobset_webhook,
            health_port=p.jobset_health,
            metrics_port=p.jobset_metrics,
            cert_dir=self.cert_dir,
        )
        if gates:
            config["featureGates"] = gates  # v0.12's binary has no --feature-gates flag
        jobset_cfg = self.state_dir / "jobset-config.yaml"
        jobset_cfg.write_text(yaml.safe_dump(config))
        self._start_addon(
            state,
            "jobset",
            [bins.jobset, "--config", jobset_cfg, "--kubeconfig", self.kubeconfig],
            p.jobset_health,
        )

    @contextmanager
    def jobset_feature_gates(self, gates: dict[str, bool]) -> Iterator[None]:
        """The JobSet controller restarted with ``gates`` (e.g. upstream's alpha
        ``InPlaceRestart``) for the duration; restarted with its defaults afterwards."""
        self._restart_jobset(gates)
        try:
            yield
        finally:
            self._restart_jobset(None)

    def _restart_jobset(self, gates: dict[str, bool] | None) -> None:
        bins = ensure_binaries("jobset")
        state = self._load_state()
        pid = state.pids.pop("jobset", None)
        if pid is not None:
            processes.stop_pid(pid, program="jobset")
        self._start_jobset(bins, state, gates)
        log(f"JobSet controller restarted with feature gates {gates or 'as default'}")

    @staticmethod
    def _install_kueue_metrics_cert(cert: certs.ServingCert) -> None:
        try:
            KUEUE_METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
            for src in (cert.crt, cert.key):
                dst = KUEUE_METRICS_CERT_DIR / src.name
                if not dst.exists() or dst.read_bytes() != src.read_bytes():
                    dst.write_bytes(src.read_bytes())
        except PermissionError as e:
            raise RuntimeError(
                f"Kueue needs its metrics certificate in {KUEUE_METRICS_CERT_DIR} (fixed path in "
                f"Kueue when internal cert management is off); cannot write there: {e}. "
                "Run as root or create that directory writable for this user."
            ) from e

    def _wait_webhooks_serving(self, kubectl: Kubectl) -> None:
        """A server-side dry-run create goes through JobSet's and Kueue's admission webhooks:
        it only succeeds once the apiserver really reaches both."""
        probe = yaml.safe_dump(
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": "webhook-probe", "namespace": "default"},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "w",
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "busybox"}],
                                        }
                                    }
                                }
                            },
                        }
                    ]
                },
            }
        )

        def ok() -> bool:
            try:
                kubectl.run("create", "--dry-run=server", "-f", "-", stdin=probe)
            except RuntimeError:
                return False
            return True

        processes.wait_until("JobSet/Kueue admission webhooks", ok, 60)
        log("JobSet and Kueue admission webhooks are serving")

    # ----- real kubelet nodes ------------------------------------------------------------
    def real_nodes(self) -> list[str]:
        """The real kubelet nodes the cluster has now."""
        return list(self._load_state().real_nodes)

    def real_node_names(self, count: int) -> list[str]:
        return [f"{self.name}-real-{i}" for i in range(1, count + 1)]

    def _node_images(self) -> list[str]:
        """The images every real node gets (``build-images.sh --image`` specs): the product
        images (``make images``) and python:local, this checkout's package and the demo
        trainer on the Python image (the e2e tests' trainers; agents of the local-process
        controller)."""
        overlay = cache_dir() / "overlay" / self.name
        images.copy_package(overlay, DEMO_TRAINER)
        return [f"python={NODE_IMAGE}={overlay}", *images.image_specs(images.prepare_trees())]

    def _realnode(self, script: str, *args: str) -> None:
        env = {
            **os.environ,
            "JSI_KUBELET_CLIENT_CA_FILE": str(self.pki / "ca.crt"),
            "JSI_IMAGES": " ".join(self._images),
            "JSI_CLUSTER_DNS": POD_API_ADDRESS,
        }
        subprocess.run(["bash", str(REALNODE_DIR / script), *args], check=True, env=env)

    def add_real_node(self) -> str:
        """One more real kubelet node (a test that needs a third: hot spares); its name."""
        state = self._load_state()
        count = len(state.real_nodes) + 1
        self._ensure_real_nodes(state, count)
        return self.real_node_names(count)[-1]

    def remove_real_node(self, node: str) -> None:
        """Purge real ``node`` (kubelet, containerd, its containers) and delete its Node."""
        state = self._load_state()
        log(f"removing real node {node} (kubelet, containerd, its containers)")
        self._realnode("kubelet.sh", "purge", node)
        if node in state.real_nodes:
            state.real_nodes.remove(node)
            self._save_state(state)
        kubectl = [str(ensure_binaries("kubectl").kubectl), "--kubeconfig", str(self.kubeconfig)]
        subprocess.run([*kubectl, "delete", "node", node, "--ignore-not-found"], check=True)

    def power_off(self, node: str) -> None:
        """Kill real ``node``'s kubelet and every container of it at one instant (frozen, then
        killed: testbed/realnode/kubelet.sh), then its containerd: the node goes silent, as a
        host that lost power looks to the cluster."""
        self._realnode("kubelet.sh", "down", node)

    def power_on(self, node: str) -> None:
        """Start real ``node`` again (containerd, kubelet) and wait until it is Ready and its
        kubelet has restarted every pod the API still shows Ready there. Until then such a pod
        keeps its Service endpoints with nothing serving (an outage shorter than the node
        grace period never marks it NotReady): seen in CI as a webhook call refused right after
        the controller's node came back. Nothing on a node whose kubelet runs (a clean-up after
        a run that may have stopped between off and on)."""
        if kubelet_running(node):  # powered on already: nothing was restarted to wait for
            return
        on = time.time()
        self._realnode("kubelet.sh", "up", node, str(self.kubeconfig))
        core = clients(self.kubeconfig).core

        def stale_ready() -> list[str]:
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
            return [
                f"{p.metadata.namespace}/{p.metadata.name}"
                for p in pods
                if p.status.phase == "Running"
                and p.metadata.deletion_timestamp is None
                and _ready(p)
                and not _all_started_after(p, on)
            ]

        processes.wait_until(
            f"the pods on {node} restarted by its kubelet", lambda: not stale_ready(), 120
        )

    @property
    def pod_reachable_address(self) -> str:
        """A host address pods reach (POD_API_ADDRESS once the real nodes gave the host it;
        else loopback: only host processes, the kwok clusters' simulated agents, connect)."""
        have = subprocess.run(
            ["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=False
        )
        return POD_API_ADDRESS if f" {POD_API_ADDRESS}/" in have.stdout else "127.0.0.1"

    def _ensure_pod_api(self) -> None:
        """Give the host POD_API_ADDRESS (on ``lo``: pods' packets for it arrive over their
        bridge and are delivered locally)."""
        if self.pod_reachable_address == POD_API_ADDRESS:
            return
        cmd = ["ip", "addr", "add", f"{POD_API_ADDRESS}/32", "dev", "lo", "label", "lo:jsi"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0 and "File exists" not in res.stderr:
            raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")

    @property
    def pod_api_server(self) -> str:
        """The apiserver URL for agents in real-node pods."""
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        port = server.rsplit(":", 1)[1]
        return f"https://{POD_API_ADDRESS}:{port}"

    def _ensure_real_nodes(self, state: ClusterState, count: int) -> None:
        if count == 0:
            return
        self._ensure_pod_api()
        log(f"ensuring {count} real kubelet node(s) (containerd + runc, local images) ...")
        self._images = self._node_images()
        self._realnode("install-runtime.sh")
        self._realnode("build-images.sh")
        self._ensure_dns(state)
        for node in self.real_node_names(count):
            if node not in state.real_nodes:
                state.real_nodes.append(node)
                self._save_state(state)
            self._realnode("kubelet.sh", "up", node, str(self.kubeconfig))
        # Nodes that were already up get this checkout's images too (a no-op when they have
        # them: the import compares build hashes).
        imports = [
            a for n in self.real_node_names(count) for a in ("--import", str(images.node_socket(n)))
        ]
        self._realnode("build-images.sh", *imports)
        self._ensure_kube_proxy(state)

    def _ensure_dns(self, state: ClusterState) -> None:
        """CoreDNS on POD_API_ADDRESS:53 (the host address every real node's pods reach), the
        kubelets' clusterDNS (testbed/dns.py)."""
        if self._controller_running(state, "coredns"):
            log(f"cluster DNS already running (pid {state.pids['coredns']})")
            return
        health, ready = processes.free_port(), processes.free_port()
        config = self.state_dir / "Corefile"
        config.write_text(dns.corefile(POD_API_ADDRESS, self.kubeconfig, health, ready))
        logfile = self.logs_dir / "coredns.log"
        proc = processes.start([binaries().coredns, "-conf", config], logfile, detach=True)
        state.pids["coredns"] = proc.pid
        self._save_state(state)
        log(f"started CoreDNS on {POD_API_ADDRESS}:53 (pid {proc.pid}, log {logfile})")
        processes.wait_until(
            "CoreDNS",
            lambda: processes.http_ok(f"http://127.0.0.1:{ready}/ready"),
            60,
            log=logfile,
        )

    def _ensure_kube_proxy(self, state: ClusterState) -> None:
        """kube-proxy (iptables mode) for the host the real nodes share: Service ClusterIPs work
        from their pods and from the host (the apiserver calling a webhook Service)."""
        if self._controller_running(state, "kube-proxy"):
            log(f"kube-proxy already running (pid {state.pids['kube-proxy']})")
            return
        health = processes.free_port()
        config = self.state_dir / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "hostnameOverride": state.real_nodes[0],
                    "mode": "iptables",
                    "clusterCIDR": POD_CIDR,
                    "nodePortAddresses": ["primary"],
                    "healthzBindAddress": f"127.0.0.1:{health}",
                    "metricsBindAddress": f"127.0.0.1:{processes.free_port()}",
                    "conntrack": {"maxPerCore": 0},  # leave the host's conntrack sysctls alone
                }
            )
        )
        logfile = self.logs_dir / "kube-proxy.log"
        proc = processes.start([binaries().kube_proxy, "--config", config], logfile, detach=True)
        state.pids["kube-proxy"] = proc.pid
        self._save_state(state)
        log(f"started kube-proxy (pid {proc.pid}, log {logfile})")
        processes.wait_until(
            "kube-proxy",
            lambda: processes.http_ok(f"http://127.0.0.1:{health}/healthz"),
            60,
            log=logfile,
        )

    def _stop_kube_proxy(self, state: ClusterState) -> None:
        pid = state.pids.pop("kube-proxy", None)
        if pid is None:
            return
        log(f"stopping kube-proxy (pid {pid}) and removing its iptables rules")
        processes.stop_pid(pid, program="kube-proxy")
        subprocess.run([str(binaries().kube_proxy), "--cleanup"], capture_output=True, check=False)

    def _remove_real_nodes(self, state: ClusterState) -> None:
        self._stop_kube_proxy(state)
        if (pid := state.pids.pop("coredns", None)) is not None:
            log(f"stopping CoreDNS (pid {pid})")
            processes.stop_pid(pid, program="coredns")
        for node in state.real_nodes:
            log(f"removing real node {node} (kubelet, containerd, its containers)")
            self._realnode("kubelet.sh", "purge", node)
        state.real_nodes.clear()

    # ----- public ------------------------------------------------------------------------
    def up(
        self,
        nodes: int = DEFAULT_NODES,
        real_nodes: int = DEFAULT_REAL_NODES,
        node_lease_s: int = KWOK_NODE_LEASE_SECONDS,
    ) -> None:
        """Bring the cluster up (or reuse it) with ``nodes`` kwok nodes whose Leases last
        ``node_lease_s`` (a cluster made with other Leases is refused, not replaced)."""
        if node_lease_s < KWOK_NODE_LEASE_SECONDS:
            raise ValueError(
                f"node_lease_s: at least {KWOK_NODE_LEASE_SECONDS} (the kubelet's default), "
                f"got {node_lease_s}"
            )
        t0 = time.monotonic()
        wanted = versions().kubernetes
        state = self._load_state()
        if self._made_with(state) and state.node_lease_s != node_lease_s:
            raise RuntimeError(
                f"cluster {self.name} was made with {state.node_lease_s} s node Leases, "
                f"{node_lease_s} s are asked for: take it down first (make cluster-down) or "
                "use another JSI_CLUSTER_NAME"
            )
        made_with = self._made_with(state)
        if made_with not in ("", wanted):
            # running: a process of kwokctl's pid files still runs its copy of a binary (an
            # apiserver slow to answer on a loaded machine is not a stopped one)
            if self._control_plane_running() or self._api_ready():
                raise RuntimeError(
                    f"cluster {self.name} runs Kubernetes {made_with} but K8S selects {wanted}:"
                    " take it down first (make cluster-down, with the K8S it was made with)"
                    " or use another JSI_CLUSTER_NAME"
                )
            # Its processes are gone (a session or CI run ended mid-way): `kwokctl start` would
            # bring back its own copies of the old release's binaries under the new K8S.
            log(
                f"cluster {self.name} was made with Kubernetes {made_with} and is stopped:"
                f" deleting it to make one with {wanted}"
            )
            self.down()
            state = self._load_state()
        runtime = ("containerd", "runc", "coredns")
        bins = ensure_binaries(
            *(n for n, c in COMPONENT_OF.items() if real_nodes or c not in runtime)
        )
        state.kubernetes = wanted
        state.node_lease_s = node_lease_s
        self._save_state(state)
        self._ensure_control_plane(bins, node_lease_s)
        self.scale_nodes(nodes)
        self._ensure_addons(bins, state)
        self._ensure_real_nodes(state, real_nodes)
        log(f"cluster '{self.name}' ready in {time.monotonic() - t0:.1f}s")
        self.print_info()

    def is_up(self) -> bool:
        state = self._load_state()
        return (
            self._api_ready()
            and self._controller_running(state, "jobset")
            and self._controller_running(state, "kueue")
        )

    def down(self) -> None:
        bins = ensure_binaries("kwokctl", "kubectl")
        state = self._load_state()
        self._remove_real_nodes(state)
        for name, pid in state.pids.items():
            log(f"stopping {name} controller (pid {pid})")
            processes.stop_pid(pid, program=name)
        if self._kwok_cluster_exists(bins):
            log(f"deleting control plane '{self.name}'")
            self._kwokctl(
                bins,
                "delete",
                "cluster",
                "--name",
                self.name,
                "--kubeconfig",
                str(self.state_dir / "kubeconfig-merged.yaml"),
                capture=False,
            )
        if self._state_file.exists():
            self._state_file.unlink()
        log(f"cluster '{self.name}' is down (logs kept in {self.logs_dir})")

    def control_plane_commands(self) -> dict[str, list[str]]:
        """The running control-plane processes' command lines by component (kwokctl's pid
        files); a component whose process is gone is absent."""
        commands: dict[str, list[str]] = {}
        for pid_file in (self.kwok_workdir / "clusters" / self.name / "pids").glob("*.pid"):
            try:
                raw = Path(f"/proc/{int(pid_file.read_text())}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            commands[pid_file.stem] = raw.decode().rstrip("\0").split("\0")
        return commands

    def _control_plane_running(self) -> bool:
        """Whether a process of kwokctl's pid files runs one of this cluster's binaries (a pid
        file left by a killed run may name another process by now)."""
        bin_dir = f"{self.kwok_workdir / 'clusters' / self.name / 'bin'}/"
        return any(cmd[0].startswith(bin_dir) for cmd in self.control_plane_commands().values())

    def print_info(self) -> None:
        print(f"kubeconfig: {self.kubeconfig}")
        print(f"  export KUBECONFIG={self.kubeconfig}")
        print(f"control-plane logs: {self.kwok_workdir / 'clusters' / self.name / 'logs'}")
        print(f"JobSet/Kueue logs:  {self.logs_dir}")
