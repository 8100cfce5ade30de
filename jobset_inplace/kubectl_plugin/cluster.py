"""Thin API access for the plugin: kubeconfig loading like kubectl (``--kubeconfig``,
``--context``, ``-n``), and reads/writes returning plain dicts (the JSON the API sent, so
fields newer than the client's models, such as ``status.declaredFeatures``, are kept)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from jobset_inplace import names
from jobset_inplace.apierrors import or_none

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

__all__ = ["ApiException", "Cluster", "ClusterConfigError", "api_error_message", "connect"]


def api_error_message(e: Exception) -> str:
    """The apiserver's own message (from the Status body) when there is one."""
    status, reason, body = (getattr(e, a, None) for a in ("status", "reason", "body"))
    msg = f"{status} {reason}" if status else str(e)
    if body:
        with contextlib.suppress(ValueError, AttributeError):
            msg = json.loads(body).get("message") or msg
    return str(msg)


class ClusterConfigError(RuntimeError):
    """No usable kubeconfig (or in-cluster config)."""


@dataclass
class Cluster:
    api_client: client.ApiClient
    namespace: str

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api_client)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api_client)

    def set_request_timeout(self, seconds: float) -> None:
        """Every request of this client waits at most ``seconds`` (``--request-timeout``):
        the generated API methods pass their own ``_request_timeout`` (None unless given) to
        ``call_api``, which is where the default goes in."""
        call_api = self.api_client.call_api

        def with_timeout(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_request_timeout") is None:
                kwargs["_request_timeout"] = seconds
            return call_api(*args, **kwargs)

        self.api_client.call_api = with_timeout

    # --- raw JSON helpers ----------------------------------------------------------------------
    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(resp.data)
        return data

    # --- jobset-inplace objects ------------------------------------------------------------------
    def gangstate(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.GANGSTATE_PLURAL, name
        )
        return obj

    def gangmembers(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.GANGMEMBERS_PLURAL, name
        )
        return obj

    def gangstates(self, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
        """The GangStates of this namespace, or of every namespace."""
        g = (names.GROUP, names.VERSION)
        if all_namespaces:
            doc = self.custom.list_cluster_custom_object(*g, names.GANGSTATE_PLURAL)
        else:
            doc = self.custom.list_namespaced_custom_object(
                *g, self.namespace, names.GANGSTATE_PLURAL
            )
        items: list[dict[str, Any]] = doc.get("items") or []
        return items

    def jobset(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSET_PLURAL, name
        )
        return obj

    def annotate_jobset(self, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            JOBSET_GROUP,
            JOBSET_VERSION,
            self.namespace,
            JOBSET_PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
            _content_type="application/merge-patch+json",
        )
        return obj

    def jobset_pods(self, name: str) -> list[dict[str, Any]]:
        resp = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=f"{names.JOBSET_NAME_LABEL}={name}",
            _preload_content=False,
        )
        items: list[dict[str, Any]] = self._json(resp).get("items") or []
        return items

    def node(self, name: str) -> dict[str, Any] | None:
        """The node, or ``None`` if it does not exist (other errors raise)."""
        resp = or_none(self.core.read_node, name, _preload_content=False)
        return None if resp is None else self._json(resp)

    # --- cluster-wide reads for doctor -----------------------------------------------------------
    def server_version(self) -> dict[str, Any]:
        v = client.VersionApi(self.api_client).get_code()
        return {"major": v.major, "minor": v.minor, "gitVersion": v.git_version}

    def crd(self, name: str) -> dict[str, Any] | None:
        """The CustomResourceDefinition, or ``None`` if it does not exist."""
        api = client.ApiextensionsV1Api(self.api_client)
        resp = or_none(api.read_custom_resource_definition, name, _preload_content=False)
        return None if resp is None else self._json(resp)

    def admission_policy(self, name: str) -> dict[str, Any] | None:
        """The ValidatingAdmissionPolicy, or ``None`` if it does not exist."""
        api = client.AdmissionregistrationV1Api(self.api_client)
        resp = or_none(api.read_validating_admission_policy, name, _preload_content=False)
        return None if resp is None else self._json(resp)

    def admission_policy_binding(self, name: str) -> dict[str, Any] | None:
        """The ValidatingAdmissionPolicyBinding, or ``None`` if it does not exist."""
        api = client.AdmissionregistrationV1Api(self.api_client)
        read = api.read_validating_admission_policy_binding
        resp = or_none(read, name, _preload_content=False)
        return None if resp is None else self._json(resp)

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (
            self._json(self.core.list_node(_preload_content=False)).get("items") or []
        )
        return items

    def dry_run_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json(
            self.core.create_namespaced_pod(
                self.namespace,
                body,
                dry_run="All",
                field_validation="Strict",
                _preload_content=False,
            )
        )

    def configmap(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json(
            self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        )

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Deployment, or ``None`` if it does not exist."""
        read = client.AppsV1Api(self.api_client).read_namespaced_deployment
        resp = or_none(read, name, namespace, _preload_content=False)
        return None if resp is None else self._json(resp)

    def lease(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]:
        """The Lease (or ``None`` if it does not exist) and the apiserver's ``Date`` header:
        its age is judged by the cluster's clock, not this machine's."""
        read = client.CoordinationV1Api(self.api_client).read_namespaced_lease
        resp = or_none(read, name, namespace, _preload_content=False)
        if resp is None:
            return None, ""
        return self._json(resp), str(resp.headers.get("Date") or "")

    def dry_run_jobset(self, body: dict[str, Any]) -> dict[str, Any]:
        """A server-side dry-run create of a JobSet in this namespace: the mutated object."""
        return self._json(
            self.custom.create_namespaced_custom_object(
                JOBSET_GROUP,
                JOBSET_VERSION,
                self.namespace,
                JOBSET_PLURAL,
                body,
                dry_run="All",
                _preload_content=False,
            )
        )

    def namespace_object(self, name: str) -> dict[str, Any] | None:
        resp = or_none(self.core.read_namespace, name, _preload_content=False)
        return None if resp is None else self._json(resp)

    def cluster_role(self, name: str) -> dict[str, Any] | None:
        read = client.RbacAuthorizationV1Api(self.api_client).read_cluster_role
        resp = or_none(read, name, _preload_content=False)
        return None if resp is None else self._json(resp)

    def role_binding(self, namespace: str, name: str) -> dict[str, Any] | None:
        read = client.RbacAuthorizationV1Api(self.api_client).read_namespaced_role_binding
        resp = or_none(read, name, namespace, _preload_content=False)
        return None if resp is None else self._json(resp)

    def allowed(self, user: str, groups: list[str], attributes: dict[str, str]) -> bool:
        """Whether ``user`` may do what ``attributes`` (a SubjectAccessReview's
        resourceAttributes) say, as the apiserver's authorizer answers."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        }
        resp = client.AuthorizationV1Api(self.api_client).create_subject_access_review(
            review, _preload_content=False
        )
        return bool((self._json(resp).get("status") or {}).get("allowed"))

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        resp = or_none(self.core.read_namespaced_pod, name, namespace, _preload_content=False)
        return None if resp is None else self._json(resp)

    def pod_proxy_get(self, namespace: str, pod: str, port: int, path: str) -> tuple[int, str]:
        """GET ``path`` from the pod's ``port`` over HTTPS through the apiserver's proxy: the
        status and body the pod answered (an apiserver error raises)."""
        try:
            resp = self.core.connect_get_namespaced_pod_proxy_with_path(
                f"https:{pod}:{port}", namespace, path.lstrip("/"), _preload_content=False
            )
        except ApiException as e:
            return int(e.status or 0), str(e.body or "")
        return int(resp.status), resp.data.decode("utf-8", "replace")

    def deployment_images(self, namespace: str) -> list[str]:
        resp = client.AppsV1Api(self.api_client).list_namespaced_deployment(
            namespace, _preload_content=False
        )
        return [
            c.get("image", "")
            for d in self._json(resp).get("items") or []
            for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
            or []
        ]


def _context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = active
    if context is not None:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            raise ClusterConfigError(f"context {context!r} not found in the kubeconfig")
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return str(ns) if ns else None


def connect(
    kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
) -> Cluster:
    """Connect as kubectl would: ``kubeconfig`` (else ``$KUBECONFIG``, else ~/.kube/config,
    else in-cluster config), ``context`` (else the current one), ``namespace`` (else the
    context's, else ``default``)."""
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        ctx_ns = _context_namespace(kubeconfig, context)
    except (ConfigException, OSError) as e:
        if kubeconfig is not None or context is not None:
            raise ClusterConfigError(f"cannot load kubeconfig: {e}") from e
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ClusterConfigError(
                f"no usable kubeconfig ({e}); pass --kubeconfig or set KUBECONFIG"
            ) from e
        api_client = client.ApiClient()
        ctx_ns = SA_NAMESPACE_FILE.read_text().strip() if SA_NAMESPACE_FILE.exists() else None
    return Cluster(api_client, namespace or ctx_ns or "default")
