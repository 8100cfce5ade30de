"""Small helpers over the official Kubernetes client for tests: clients from a kubeconfig,
throwaway namespaces, bounded waits that report what they last saw."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.decode import condition

T = TypeVar("T")

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


@dataclass(frozen=True)
class Clients:
    api: client.ApiClient
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    coordination: client.CoordinationV1Api


def clients(kubeconfig: Path) -> Clients:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    return Clients(
        api, client.CoreV1Api(api), client.CustomObjectsApi(api), client.CoordinationV1Api(api)
    )


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Call ``probe`` until it returns something truthy; return it. On timeout, fail with
    ``what`` and the last value seen, so a failing test says where it got stuck."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}"
            )
        time.sleep(interval)


def create_unless_exists(call: Callable[..., object], /, *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)``, a create; an AlreadyExists (409) answer is fine: the object
    is there (the test fixtures' objects never change)."""
    try:
        call(*args, **kwargs)
    except ApiException as e:
        if e.status != 409:
            raise


# Every namespace a test makes carries this label: a test that needs the cluster to itself
# (e2e/test_metrics.py) may clean up what earlier tests left, and nothing else.
TEST_NAMESPACE_LABEL = "jobset-inplace.dev/test-namespace"


@contextmanager
def temporary_namespace(c: Clients, prefix: str, *, default_sa: bool = False) -> Iterator[str]:
    """A fresh namespace, deleted afterwards whatever happened in between: its JobSets first,
    so that the controller drops their gangs before any of their pods goes (the namespace
    controller deletes pods and JobSets in no set order, and a member's pod deleted first is a
    failure the controller would start recovering).

    ``default_sa`` creates the ``default`` ServiceAccount, which pod admission requires and
    which only kube-controller-manager would otherwise create (the integration control plane
    runs none)."""
    base = re.sub(r"[^a-z0-9-]+", "-", prefix.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    meta = client.V1ObjectMeta(name=name, labels={TEST_NAMESPACE_LABEL: "true"})
    c.core.create_namespace(client.V1Namespace(metadata=meta))
    if default_sa:
        sa = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        create_unless_exists(c.core.create_namespaced_service_account, name, sa)
    try:
        yield name
    finally:
        try:
            delete_jobsets(c, name)
        finally:
            or_none(c.core.delete_namespace, name, propagation_policy="Background")


def jobsets(c: Clients, namespace: str | None = None) -> list[dict[str, Any]]:
    """The JobSets of ``namespace`` (of every namespace for None); none if JobSet's CRD is not
    installed."""
    args = (JOBSET_GROUP, JOBSET_VERSION)
    try:
        if namespace is None:
            found = c.custom.list_cluster_custom_object(*args, JOBSET_PLURAL)
        else:
            found = c.custom.list_namespaced_custom_object(*args, namespace, JOBSET_PLURAL)
    except ApiException as e:
        if e.status == 404:
            return []
        raise
    items: list[dict[str, Any]] = found["items"]
    return items


def delete_jobsets(c: Clients, namespace: str, timeout: float = 60) -> None:
    """Delete every JobSet of ``namespace`` (their Jobs and pods go after them) and wait until
    the API has none left."""
    for js in jobsets(c, namespace):
        _delete(c, namespace, js["metadata"]["name"], "Background")
    try:
        wait_for(f"the JobSets of {namespace} deleted", lambda: not jobsets(c, namespace), timeout)
    except AssertionError as e:
        left = [j["metadata"]["name"] for j in jobsets(c, namespace)]
        raise AssertionError(f"{e}; still there: {left}") from None


def delete_jobset(c: Clients, namespace: str, name: str, timeout: float = 120) -> None:
    """Delete JobSet ``name`` in the foreground (if it is there) and wait until no pod of it
    is left."""
    _delete(c, namespace, name, "Foreground")
    selector = f"{names.JOBSET_NAME_LABEL}={name}"
    wait_for(
        f"{name}: pods gone",
        lambda: not c.core.list_namespaced_pod(namespace, label_selector=selector).items,
        timeout,
        0.5,
    )


def _delete(c: Clients, namespace: str, name: str, propagation: str) -> None:
    """Delete JobSet ``name`` if it is there."""
    or_none(
        c.custom.delete_namespaced_custom_object,
        JOBSET_GROUP,
        JOBSET_VERSION,
        namespace,
        JOBSET_PLURAL,
        name,
        propagation_policy=propagation,
    )


def namespace_gone(c: Clients, namespace: str, timeout: float = 120) -> None:
    """Delete ``namespace`` if it is there (a run before this one left it) and wait until the
    API has forgotten it."""
    if or_none(c.core.read_namespace, namespace) is None:
        return
    c.core.delete_namespace(namespace)
    wait_for(
        f"old namespace {namespace} gone",
        lambda: or_none(c.core.read_namespace, namespace) is None,
        timeout,
        1,
    )


def pod_token(
    core: client.CoreV1Api,
    namespace: str,
    *,
    service_account: str,
    pod: str,
    uid: str,
    audience: str,
    seconds: int,
) -> str:
    """What the kubelet projects into a pod: a service-account token bound to the pod, for
    ``audience`` (a TokenRequest)."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[audience],
            expiration_seconds=seconds,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=pod, uid=uid
            ),
        )
    )
    answer = core.create_namespaced_service_account_token(service_account, namespace, request)
    return str(answer.status.token)


def get_jobset(c: Clients, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = c.custom.get_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name
    )
    return obj


def create_jobset(c: Clients, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = c.custom.create_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body
    )
    return obj


def node_ready_status(node: client.V1Node) -> str:
    """The node's Ready condition status ("True", "False", "Unknown"; "Missing" if none)."""
    return str((condition(node.to_dict(), "Ready") or {}).get("status", "Missing"))


def remove_taint(c: Clients, node: str, key: str) -> None:
    """Remove the taints with ``key`` from ``node`` (as people do after a repair)."""
    taints = c.core.read_node(node).spec.taints or []
    keep = [t for t in taints if t.key != key]
    if len(keep) != len(taints):
        c.core.patch_node(node, {"spec": {"taints": keep or None}})
