"""The pinned upstream versions (single source: ``testbed/versions.env``; ``K8S`` in the
environment picks the Kubernetes minor) and where their binaries and module sources live."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from jobset_inplace.platform import device_taint_runtime_config, gates_flag

TESTBED_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTBED_DIR.parent
VERSIONS_FILE = TESTBED_DIR / "versions.env"
BUILD_SCRIPT = TESTBED_DIR / "build-binaries.sh"


def cache_dir() -> Path:
    """Root of everything built or generated outside the repository."""
    default = Path.home() / ".cache" / "jobset-inplace"
    return Path(os.environ.get("JSI_CACHE_DIR", default))


def real_node_dir(node: str) -> Path:
    """Everything of the local cluster's real node ``node``: its ``kubelet/`` and ``containerd/``
    (realnode/kubelet.sh and containerd.sh keep them there)."""
    return cache_dir() / "realnode" / node


K8S_ENV = "K8S"
"""Environment variable that picks the Kubernetes minor (``1.35``); versions.sh reads it too."""


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str
    jobset: str
    kueue: str
    containerd: str
    runc: str
    helm: str
    prometheus: str
    krew: str
    actionlint: str
    kind: str
    cni_plugins: str
    crictl: str

    @property
    def kubernetes_minor(self) -> int:
        return int(self.kubernetes.split(".")[1])

    @property
    def feature_gates(self) -> str:
        """``--feature-gates`` for the in-place path, device health and DRA device taints on
        this Kubernetes (empty on 1.37+)."""
        return gates_flag(self.kubernetes_minor, device_health=True, device_taints=True)

    @property
    def runtime_config(self) -> str:
        """``--runtime-config`` of kube-apiserver: the APIs the tests need that this Kubernetes
        does not serve by default (empty on 1.37+)."""
        return device_taint_runtime_config(self.kubernetes_minor)


def parse_versions(text: str, k8s: str = "") -> Versions:
    """Parse ``KEY=VALUE`` lines (comments and blank lines ignored) and resolve the Kubernetes
    minor ``k8s`` (``1.35``; empty: ``K8S_DEFAULT``) to its pinned release."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{VERSIONS_FILE.name}: expected KEY=VALUE, got {raw!r}")
        values[key.strip()] = value.strip()
    try:
        minor = k8s or values["K8S_DEFAULT"]
        supported = sorted(
            k.removeprefix("KUBERNETES_").replace("_", ".")
            for k in values
            if k.startswith("KUBERNETES_")
        )
        kubernetes = values.get("KUBERNETES_" + minor.replace(".", "_"))
        if not re.fullmatch(r"1\.\d+", minor) or kubernetes is None:
            raise ValueError(
                f"{K8S_ENV}={minor}: not a supported Kubernetes minor"
                f" (accepted: {' '.join(supported)})"
            )
        return Versions(
            kubernetes=kubernetes,
            etcd=values["ETCD_VERSION"],
            kwok=values["KWOK_VERSION"],
            jobset=values["JOBSET_VERSION"],
            kueue=values["KUEUE_VERSION"],
            containerd=values["CONTAINERD_VERSION"],
            runc=values["RUNC_VERSION"],
            helm=values["HELM_VERSION"],
            prometheus=values["PROMETHEUS_VERSION"],
            krew=values["KREW_VERSION"],
            actionlint=values["ACTIONLINT_VERSION"],
            kind=values["KIND_VERSION"],
            cni_plugins=values["CNI_PLUGINS_VERSION"],
            crictl=values["CRICTL_VERSION"],
        )
    except KeyError as missing:
        raise ValueError(f"{VERSIONS_FILE.name}: missing {missing.args[0]}") from None


@cache
def versions() -> Versions:
    """The pinned versions, Kubernetes as ``K8S`` selects it."""
    return parse_versions(VERSIONS_FILE.read_text(), os.environ.get(K8S_ENV, ""))


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the cached upstream binaries."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kubelet: Path
    kube_proxy: Path
    kubeadm: Path
    etcd: Path
    kwok: Path
    kwokctl: Path
    jobset: Path
    kueue: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path
    runc: Path
    helm: Path
    promtool: Path  # the alerts' rule checks and tests
    prometheus: Path  # the server: e2e/test_prometheus.py scrapes the controller
    krew: Path  # the plugin's krew install test
    actionlint: Path  # make lint: the GitHub Actions workflows
    kind: Path  # make e2e-kind
    cni_ptp: Path  # kind's node image: the CNI plugins (host-local, loopback, portmap beside it)
    crictl: Path  # kind's node image
    jobset_ipr_agent: Path  # upstream JobSet's in-place restart agent (benchmark only)
    test_device_plugin: Path  # testbed/deviceplugin, for the device-health tests
    test_dra_driver: Path  # testbed/draplugin, for the DRA device-taint test
    coredns: Path  # testbed/coredns: the real nodes' cluster DNS

    @property
    def kubernetes_dir(self) -> Path:
        return self.kubectl.parent


def binaries(v: Versions | None = None) -> Binaries:
    v = v or versions()
    b = cache_dir() / "bin"
    k8s = b / f"kubernetes-{v.kubernetes}"
    kwok = b / f"kwok-{v.kwok}"
    containerd = b / f"containerd-{v.containerd}"
    return Binaries(
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kubectl=k8s / "kubectl",
        kubelet=k8s / "kubelet",
        kube_proxy=k8s / "kube-proxy",
        kubeadm=k8s / "kubeadm",
        etcd=b / f"etcd-{v.etcd}" / "etcd",
        kwok=kwok / "kwok",
        kwokctl=kwok / "kwokctl",
        jobset=b / f"jobset-{v.jobset}" / "jobset",
        kueue=b / f"kueue-{v.kueue}" / "kueue",
        containerd=containerd / "containerd",
        containerd_shim=containerd / "containerd-shim-runc-v2",
        ctr=containerd / "ctr",
        runc=b / f"runc-{v.runc}" / "runc",
        helm=b / f"helm-{v.helm}" / "helm",
        promtool=b / f"prometheus-{v.prometheus}" / "promtool",
        prometheus=b / f"prometheus-{v.prometheus}" / "prometheus",
        krew=b / f"krew-{v.krew}" / "krew",
        actionlint=b / f"actionlint-{v.actionlint}" / "actionlint",
        kind=b / f"kind-{v.kind}" / "kind",
        cni_ptp=b / f"cni-plugins-{v.cni_plugins}" / "ptp",
        crictl=b / f"crictl-{v.crictl}" / "crictl",
        jobset_ipr_agent=b / f"jobset-ipr-agent-{v.jobset}" / "in-place-restart-agent",
        test_device_plugin=b
        / f"test-device-plugin-{local_module_version('deviceplugin')}"
        / "jsi-test-device-plugin",
        test_dra_driver=b
        / f"test-dra-driver-{local_module_version('draplugin')}"
        / "jsi-test-dra-driver",
        coredns=b / f"coredns-{local_module_version('coredns')}" / "jsi-coredns",
    )


# This repository's own Go modules under testbed/ (the device plugin, the DRA driver, CoreDNS): each
# build is keyed by its sources (build-binaries.sh hashes the same files, in this order).
LOCAL_MODULE_SOURCES = ("main.go", "go.mod", "go.sum")


def local_module_version(name: str) -> str:
    data = b"".join((TESTBED_DIR / name / f).read_bytes() for f in LOCAL_MODULE_SOURCES)
    return hashlib.sha256(data).hexdigest()[:12]


# Which build-binaries.sh component produces each binary.
COMPONENT_OF = {
    "kube_apiserver": "kubernetes",
    "kube_controller_manager": "kubernetes",
    "kube_scheduler": "kubernetes",
    "kubectl": "kubernetes",
    "kubelet": "kubernetes",
    "kube_proxy": "kubernetes",
    "kubeadm": "kubernetes",
    "etcd": "etcd",
    "kwok": "kwok",
    "kwokctl": "kwok",
    "jobset": "jobset",
    "kueue": "kueue",
    "containerd": "containerd",
    "containerd_shim": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "helm": "helm",
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "krew": "krew",
    "actionlint": "actionlint",
    "kind": "kind",
    "cni_ptp": "cni-plugins",
    "crictl": "crictl",
    "jobset_ipr_agent": "jobset-ipr-agent",
    "test_device_plugin": "test-device-plugin",
    "test_dra_driver": "test-dra-driver",
    "coredns": "coredns",
}


def ensure_binaries(*needed: str) -> Binaries:
    """Return the binaries, building the missing ones among ``needed`` (attribute names of
    :class:`Binaries`; all when empty). Idempotent; the build script shows progress."""
    bins = binaries()
    names = needed or tuple(COMPONENT_OF)
    missing = [n for n in names if not os.access(getattr(bins, n), os.X_OK)]
    if missing:
        components = sorted({COMPONENT_OF[n] for n in missing})
        subprocess.run(["bash", str(BUILD_SCRIPT), *components], check=True)
        still = [n for n in names if not os.access(getattr(bins, n), os.X_OK)]
        if still:
            raise RuntimeError(f"{BUILD_SCRIPT} finished but these are missing: {still}")
    return bins


def module_source(module: str, version: str) -> Path:
    """Directory of a pinned Go module in the module cache (downloaded if needed)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=cache_dir() if cache_dir().exists() else None,
    ).stdout
    return Path(json.loads(out)["Dir"])
