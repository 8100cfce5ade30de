"""Clusters that limit the critical priority classes (GKE: the ResourceQuota admission
plugin's ``limitedResources`` names them) admit a pod of such a class only in a namespace whose
quota covers it. The controller's pods run at ``system-cluster-critical``: the install ships
that quota (manifests/controller/priority-quota.yaml; the chart renders the same object:
tests/integration/test_chart.py). Here a kube-apiserver configured the way GKE's is refuses
the controller's pod without it and admits it with it. docs/managed-clusters.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from testbed.controlplane import ControlPlane, start_control_plane
from testbed.kube import Clients, clients
from testbed.kubectl import kustomize
from testbed.versions import REPO_ROOT

pytestmark = pytest.mark.integration

# As GKE configures it (and the Kubernetes docs' "Limit Priority Class consumption by default").
ADMISSION = {
    "apiVersion": "apiserver.config.k8s.io/v1",
    "kind": "AdmissionConfiguration",
    "plugins": [
        {
            "name": "ResourceQuota",
            "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "ResourceQuotaConfiguration",
                "limitedResources": [
                    {
                        "resource": "pods",
                        "matchScopes": [
                            {
                                "scopeName": "PriorityClass",
                                "operator": "In",
                                "values": ["system-node-critical", "system-cluster-critical"],
                            }
                        ],
                    }
                ],
            },
        }
    ],
}


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    config = tmp_path_factory.mktemp("admission") / "admission.yaml"
    config.write_text(yaml.safe_dump(ADMISSION))
    cp = start_control_plane(
        install_crds=False, apiserver_args=["--admission-control-config-file", str(config)]
    )
    try:
        yield cp
    finally:
        cp.stop()


def _install() -> dict[str, dict[str, Any]]:
    """The kustomize base's objects by kind (one each of those read here)."""
    objects = [o for o in yaml.safe_load_all(kustomize(REPO_ROOT / "manifests" / "default")) if o]
    return {
        o["kind"]: o for o in objects if o["kind"] in {"Namespace", "ResourceQuota", "Deployment"}
    }


def _controller_pod(kube: Clients, deployment: dict[str, Any], namespace: str) -> None:
    template = deployment["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": "c"}}
    pod["spec"] = template["spec"]
    kube.core.create_namespaced_pod(namespace, pod, dry_run="All")


def test_the_controller_is_admitted_where_the_critical_classes_are_limited(
    limited: ControlPlane,
) -> None:
    kube = clients(limited.kubeconfig)
    install = _install()
    deployment, quota = install["Deployment"], install["ResourceQuota"]
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    namespace = install["Namespace"]["metadata"]["name"]
    kube.core.create_namespace(install["Namespace"])
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    with pytest.raises(ApiException) as refused:
        _controller_pod(kube, deployment, namespace)
    # (answered 500 by the apiserver's quota admission: the message is what users see)
    assert "insufficient quota to match these scopes" in str(refused.value.body)
    kube.core.create_namespaced_resource_quota(namespace, quota)
    # what kube-controller-manager's quota controller writes (none runs here)
    status = {"hard": quota["spec"]["hard"], "used": {"pods": "0"}}
    name = quota["metadata"]["name"]
    kube.core.patch_namespaced_resource_quota_status(name, namespace, {"status": status})
    _controller_pod(kube, deployment, namespace)
