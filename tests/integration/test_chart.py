"""The Helm chart (charts/jobset-inplace) and the kustomize manifests describe one install:
with its defaults the chart renders exactly the kustomize base's objects, and each chart
option exactly the objects of the matching kustomize component. Bad values are refused by
name. (Installing the chart on the local cluster: e2e/test_lifecycle.py.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobset_inplace import __version__
from jobset_inplace.runtime.webhook_server import settings_from_env
from testbed.helm import CHART, Helm
from testbed.kubectl import kustomize
from testbed.versions import REPO_ROOT

pytestmark = pytest.mark.integration

MANIFESTS = REPO_ROOT / "manifests"
# What only the chart says: keep the CRD (and so every GangState) on `helm uninstall`.
HELM_ONLY_ANNOTATIONS = {"helm.sh/resource-policy"}

Key = tuple[str, str, str, str]


def _key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _by_key(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {}
    for obj in objects:
        annotations = obj["metadata"].get("annotations") or {}
        for a in HELM_ONLY_ANNOTATIONS & set(annotations):
            del annotations[a]
        if not annotations:
            obj["metadata"].pop("annotations", None)
        out[_key(obj)] = obj
    return out


def _kustomized(tmp_path: Path, components: list[str]) -> dict[Key, dict[str, Any]]:
    """The base (manifests/default) with ``components``, without its Namespace (helm installs
    into a namespace it is given: ``--create-namespace``)."""
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [f"{rel}/default"],
                "components": [f"{rel}/components/{c}" for c in components],
            }
        )
    )
    objects = [d for d in yaml.safe_load_all(kustomize(tmp_path)) if d]
    return _by_key([o for o in objects if o["kind"] != "Namespace"])


def _same(chart: dict[Key, dict[str, Any]], kust: dict[Key, dict[str, Any]]) -> None:
    assert sorted(chart) == sorted(kust), "the same objects"
    for key, obj in kust.items():
        assert chart[key] == obj, f"{key} differs"


@pytest.fixture(scope="module")
def helm() -> Helm:
    return Helm()


def test_chart_lints(helm: Helm) -> None:
    out = helm.run("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_the_packaged_chart_renders_as_the_directory(helm: Helm, tmp_path: Path) -> None:
    """``helm package`` follows the links under files/: a published chart is self-contained."""
    helm.run("package", str(CHART), "-d", str(tmp_path))
    (package,) = tmp_path.glob("jobset-inplace-*.tgz")
    assert helm.template(chart=package) == helm.template()


def test_chart_defaults_are_the_kustomize_base(helm: Helm, tmp_path: Path) -> None:
    _same(_by_key(helm.template()), _kustomized(tmp_path, []))


# What Pod Security's `restricted` profile allows a pod's volumes to be (its other rules are
# checked one by one below).
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def test_the_controller_runs_in_a_namespace_enforcing_restricted(tmp_path: Path) -> None:
    """The install's namespace enforces `restricted` and the controller's pods meet it (as
    JobSet's manager's do): many platforms enforce it by default. The chart renders the same
    pods (the test above); the e2e install runs them under that enforcement."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [os.path.relpath(MANIFESTS / "default", tmp_path)]})
    )
    objects = [d for d in yaml.safe_load_all(kustomize(tmp_path)) if d]
    (ns,) = [o for o in objects if o["kind"] == "Namespace"]
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Deployment"]
    assert pods, "the controller's Deployment"
    for pod in pods:
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        for volume in pod.get("volumes") or []:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = {**(pod.get("securityContext") or {}), **(c.get("securityContext") or {})}
            assert sc.get("runAsNonRoot") is True, c["name"]
            assert sc.get("allowPrivilegeEscalation") is False, c["name"]
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
            assert sc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost")
            assert not sc.get("privileged"), c["name"]


def test_chart_options_are_the_kustomize_components(helm: Helm, tmp_path: Path) -> None:
    values = {
        "webhook": {"certificate": "cert-manager"},
        "metrics": {
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
        },
    }
    _same(_by_key(helm.template(values)), _kustomized(tmp_path, ["cert-manager", "prometheus"]))


def test_the_runbook_base_url_makes_every_alerts_runbook_a_url(helm: Helm) -> None:
    base = "https://docs.example/jsi/runbooks.html"
    values = {"metrics": {"prometheusRule": {"enabled": True, "runbookBaseURL": base + "/"}}}
    (rule,) = [o for o in helm.template(values) if o["kind"] == "PrometheusRule"]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts
    for r in alerts:
        assert r["annotations"]["runbook_url"] == f"{base}#{r['alert'].lower()}"
    with pytest.raises(RuntimeError, match="runbookBaseURL"):
        helm.template({"metrics": {"prometheusRule": {"runbookBaseURL": "docs.example/rb"}}})


def test_chart_values_reach_the_deployment(helm: Helm) -> None:
    values = {
        "image": {"repository": "registry.example/jsi/controller", "tag": "1.2.3"},
        "agentImage": {
            "repository": "registry.example/jsi/agent",
            "pullPolicy": "Always",
            "pullSecrets": ["agent-registry", "team.registry"],
        },
        "agentResources": {"requests": {"cpu": "20m"}, "limits": {"memory": "128Mi"}},
        "imagePullSecrets": ["regcred"],
        "replicas": 3,
        "leaderElection": {"leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "4s"},
        "resources": {"requests": {"cpu": "1"}},
        "tolerations": [{"operator": "Exists"}],
        "logFormat": "json",
    }
    (deploy,) = [o for o in helm.template(values) if o["kind"] == "Deployment"]
    spec = deploy["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert deploy["spec"]["replicas"] == 3
    assert container["image"] == "registry.example/jsi/controller:1.2.3"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JSI_AGENT_IMAGE"] == f"registry.example/jsi/agent:{__version__}"  # appVersion
    assert env["JSI_AGENT_IMAGE_PULL_POLICY"] == "Always"
    assert env["JSI_AGENT_IMAGE_PULL_SECRETS"] == "agent-registry,team.registry"
    # what the controller will inject (it parses the variables as it starts)
    agent = settings_from_env(env)
    assert agent.image_pull_secrets == ("agent-registry", "team.registry")
    assert agent.resources == {"requests": {"cpu": "20m"}, "limits": {"memory": "128Mi"}}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert {
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=20s",
        "--leader-elect-retry-period=4s",
        "--log-format=json",
    } <= set(container["args"])
    # helm merges maps with the defaults
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert "strategy" not in deploy["spec"], "several replicas: the Lease tells who acts"


def test_a_single_replica_without_election_is_replaced_not_surged(helm: Helm) -> None:
    """With no Lease to tell two replicas apart, an update stops the old one before the new
    one starts: both would act (and answer agents' heartbeats) during a rolling surge."""
    values = {"replicas": 1, "leaderElection": {"enabled": False}}
    (deploy,) = [o for o in helm.template(values) if o["kind"] == "Deployment"]
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--leader-elect") for a in container["args"])


def test_a_digest_pins_each_image(helm: Helm) -> None:
    """What a release's chart sets: both images by digest (the tag kept for people)."""
    ctl, agent = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    values = {
        "image": {"repository": "registry.example/jsi/controller", "tag": "x", "digest": ctl},
        "agentImage": {"repository": "registry.example/jsi/agent", "digest": agent},
    }
    (deploy,) = [o for o in helm.template(values) if o["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.example/jsi/controller:x@{ctl}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JSI_AGENT_IMAGE"] == f"registry.example/jsi/agent:{__version__}@{agent}"


def test_the_report_channel_can_be_narrowed_to_labelled_namespaces(helm: Helm) -> None:
    """Anyone who can create a pod can label it as an agent; namespace labels are usually the
    platform's: the policy then admits agent-labelled pods of those namespaces only."""
    chosen = {"matchLabels": {"jobset-inplace.dev/training": "true"}}
    values = {"networkPolicy": {"agentNamespaceSelector": chosen}}
    (policy,) = [o for o in helm.template(values) if o["kind"] == "NetworkPolicy"]
    reports, *others = policy["spec"]["ingress"]
    assert reports["from"] == [
        {"namespaceSelector": chosen, "podSelector": {"matchLabels": AGENT_LABEL}}
    ]
    default = next(o for o in helm.template() if o["kind"] == "NetworkPolicy")
    assert others == default["spec"]["ingress"][1:], (
        "the fronts' link, webhook, metrics as by default"
    )


AGENT_LABEL = {"jobset-inplace.dev/agent": "true"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhook": {"certificate": "vault"}}, "webhook.certificate"),
        ({"networkPolicy": {"agentNamespaceSelector": {"matchLabel": {}}}}, "matchLabel"),
        ({"image": {"digest": "sha256:abc"}}, "digest"),
        ({"agentImage": {"digest": "latest"}}, "digest"),
        ({"replicas": 2, "leaderElection": {"enabled": False}}, "leaderElection.enabled"),
        ({"replicas": "two"}, "replicas"),
        ({"leaderElection": {"leaseDuration": 15}}, "leaseDuration"),
        ({"agentImage": {"pullSecrets": ["RegCred"]}}, "pullSecrets"),
        ({"agentResources": {"requests": {"cpu": "ten"}}}, "cpu"),
        ({"agentResources": {"requets": {"cpu": "1"}}}, "requets"),
        ({"logFormat": "yaml"}, "logFormat"),
    ],
)
def test_bad_values_are_refused_by_name(helm: Helm, values: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        helm.template(values)


@pytest.mark.parametrize(
    ("priority_class", "quota_for"),
    [
        ("system-cluster-critical", ["system-cluster-critical"]),
        ("system-node-critical", ["system-node-critical"]),
        ("team-high", None),
        ("", None),
    ],
)
def test_a_critical_priority_class_comes_with_its_quota(
    helm: Helm, priority_class: str, quota_for: list[str] | None
) -> None:
    """GKE admits critical pods only under a quota naming their class (docs/managed-clusters.md,
    tests/integration/test_priority_quota.py): the chart renders it for the class it uses."""
    objects = helm.template({"priorityClassName": priority_class})
    quotas = [o for o in objects if o["kind"] == "ResourceQuota"]
    if quota_for is None:
        assert quotas == []
        return
    (quota,) = quotas
    (scope,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert (scope["scopeName"], scope["values"]) == ("PriorityClass", quota_for)
    assert quota["spec"]["hard"] == {"pods": "10"}


def test_the_quota_makes_room_for_the_replicas_and_stays_out_of_kube_system(helm: Helm) -> None:
    (quota,) = [o for o in helm.template({"replicas": 7}) if o["kind"] == "ResourceQuota"]
    assert quota["spec"]["hard"] == {"pods": "14"}, "twice the replicas: a rollout's surge"
    system = helm.template(namespace="kube-system")
    assert [o for o in system if o["kind"] == "ResourceQuota"] == [], "it would cap the cluster's"
