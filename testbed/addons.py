"""JobSet and Kueue as local processes: their manifests rendered from the pinned Go module
sources, rewritten so the kube-apiserver reaches their webhooks on loopback.

In a real cluster both controllers run as Deployments behind Services and manage their own
certificates. Here they are plain processes, so:

* internal certificate management is off; one locally generated CA signs a serving cert for
  127.0.0.1 that both use, and its bundle is put in every webhook ``clientConfig``;
* every ``clientConfig.service`` (admission webhooks and CRD conversion webhooks) becomes
  ``clientConfig.url: https://127.0.0.1:<port><path>``;
* Deployments, Services, APIServices and RBAC for the in-cluster service accounts are dropped
  (the processes use the cluster-admin kubeconfig).

Failure policies, rules, selectors and match conditions are kept exactly as upstream ships them,
so admission behaves as it does in a real cluster.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .kubectl import kustomize
from .versions import module_source, versions

Manifest = dict[str, Any]

KEPT_KINDS = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
)
WEBHOOK_CONFIG_KINDS = frozenset({"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"})


def jobset_source() -> Path:
    return module_source("sigs.k8s.io/jobset", versions().jobset)


def kueue_source() -> Path:
    return module_source("sigs.k8s.io/kueue", versions().kueue)


def jobset_crds() -> list[Path]:
    """The JobSet CRD files, straight from the pinned module."""
    files = sorted((jobset_source() / "config/components/crd/bases").glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"no CRDs under {jobset_source()}/config/components/crd/bases")
    return files


def _url_client_config(client_config: Manifest, base_url: str, ca_bundle: bytes) -> Manifest:
    service = client_config.get("service")
    if service is None:  # already URL-based: leave the target, set the CA
        out = dict(client_config)
    else:
        path = service.get("path", "")
        out = {"url": f"{base_url}{path}"}
    out["caBundle"] = base64.b64encode(ca_bundle).decode()
    return out


def rewrite_for_loopback(
    objs: Iterable[Manifest], base_url: str, ca_bundle: bytes, *, namespace: str
) -> list[Manifest]:
    """Keep the kinds a process-based install needs and point every webhook at ``base_url``.

    Pure: returns new objects. Namespaces other than ``namespace`` are dropped (upstream
    kustomizations sometimes render a placeholder ``system`` namespace)."""
    out: list[Manifest] = []
    for obj in objs:
        kind = obj.get("kind")
        if kind not in KEPT_KINDS:
            continue
        new = copy.deepcopy(obj)
        if kind == "Namespace" and new["metadata"]["name"] != namespace:
            continue
        if kind in WEBHOOK_CONFIG_KINDS:
            for hook in new.get("webhooks") or []:
                hook["clientConfig"] = _url_client_config(hook["clientConfig"], base_url, ca_bundle)
        if kind == "CustomResourceDefinition":
            conv = new.get("spec", {}).get("conversion") or {}
            if conv.get("strategy") == "Webhook":
                webhook = conv["webhook"]
                webhook["clientConfig"] = _url_client_config(
                    webhook["clientConfig"], base_url, ca_bundle
                )
            # cert-manager / cert-controller CA injection annotations mean nothing here.
            new["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
        out.append(new)
    return out


def render(kustomization: Path, base_url: str, ca_bundle: bytes, *, namespace: str) -> str:
    """Render an upstream kustomization and rewrite it for loopback webhooks, as YAML."""
    objs = [o for o in yaml.safe_load_all(kustomize(kustomization)) if o]
    return yaml.safe_dump_all(rewrite_for_loopback(objs, base_url, ca_bundle, namespace=namespace))


def jobset_config(
    *, webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path
) -> Manifest:
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}", "certDir": str(cert_dir)},
    }


def kueue_config(
    *,
    webhook_port: int,
    health_port: int,
    metrics_port: int,
    cert_dir: Path,
    extra: Manifest | None = None,
) -> Manifest:
    cfg: Manifest = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
    }
    cfg.update(extra or {})
    return cfg
