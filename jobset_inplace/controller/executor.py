"""Carries out a plan against the API: the GangState status first (so a crash after it is
recovered from the API without a second recovery), then pod actions, then Events.

Every pod action is idempotent and guarded by the pod's UID: a pod that is already gone, or
that was replaced meanwhile, is left alone."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.gangmembers import MemberRow, members_object
from jobset_inplace.core.gangstate import new_gangstate, owned_by, status_from_dict, status_to_dict
from jobset_inplace.core.model import (
    Action,
    EscalatePod,
    Event,
    GangStatus,
    ReplacePod,
    UntaintNode,
)
from jobset_inplace.times import format_time

log = logging.getLogger("jobset_inplace.controller")

COMPONENT = "jobset-inplace"
TERMINAL_PHASES = ("Failed", "Succeeded")


class Executor:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.coordination = client.CoordinationV1Api(api_client)

    def lease_renewals(self, nodes: list[str]) -> dict[str, float | None]:
        """Last renewal of each node's Lease, read from the API (None: no Lease)."""
        out: dict[str, float | None] = {}
        for node in nodes:
            lease = or_none(
                self.coordination.read_namespaced_lease, node, names.NODE_LEASE_NAMESPACE
            )
            renew = None if lease is None else lease.spec.renew_time
            out[node] = renew.timestamp() if renew is not None else None
        return out

    # --- GangState ----------------------------------------------------------------------------
    def load_or_create(self, jobset: dict[str, Any]) -> GangStatus:
        meta = jobset["metadata"]
        where = (names.GROUP, names.VERSION, meta["namespace"], names.GANGSTATE_PLURAL)
        obj: dict[str, Any] | None = or_none(
            self.custom.get_namespaced_custom_object, *where, meta["name"]
        )
        if obj is not None and not owned_by(obj, meta["uid"]):
            # Left by an earlier JobSet of the same name and not garbage-collected yet: its
            # epochs are not this gang's.
            log.info(
                "%s/%s: replacing the GangState of an earlier JobSet", *where[2:3], meta["name"]
            )
            try:
                self.custom.delete_namespaced_custom_object(
                    *where,
                    meta["name"],
                    body=client.V1DeleteOptions(
                        preconditions=client.V1Preconditions(uid=obj["metadata"]["uid"])
                    ),
                )
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
            obj = None
        if obj is None:
            obj = self.custom.create_namespaced_custom_object(*where, new_gangstate(jobset))
        return status_from_dict(obj.get("status"))

    def write_status(self, namespace: str, name: str, status: GangStatus) -> None:
        patch = [{"op": "add", "path": "/status", "value": status_to_dict(status)}]
        self.custom.patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            namespace,
            names.GANGSTATE_PLURAL,
            name,
            patch,
            _content_type="application/json-patch+json",
        )

    def write_members(self, jobset: dict[str, Any], rows: Sequence[MemberRow], now: float) -> None:
        """Create or replace the gang's GangMembers object (server-side apply).

        The body goes out as JSON encoded here, and the answer (the whole object again) is
        read but not parsed: ``CustomObjectsApi.patch_namespaced_custom_object`` validates
        the body with pydantic, walks it in Python (``sanitize_for_serialization``) and
        parses the answer, which at 10,000 rows cost more than everything else of the write
        (docs/benchmarks.md, "The GangMembers write, encoded once")."""
        meta = jobset["metadata"]
        path = (
            f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{meta['namespace']}/"
            f"{names.GANGMEMBERS_PLURAL}/{meta['name']}"
        )
        body = json.dumps(members_object(jobset, rows, now), separators=(",", ":"))
        api = self.api_client
        request = api.param_serialize(
            "PATCH",
            path,
            query_params=[("fieldManager", COMPONENT), ("force", True)],
            header_params={
                "Accept": "application/json",
                "Content-Type": "application/apply-patch+yaml",
            },
            body=body,
            auth_settings=["BearerToken"],
        )
        answer = api.call_api(*request)
        answer.read()
        if not 200 <= answer.status <= 299:
            raise ApiException.from_response(
                http_resp=answer, body=answer.data.decode("utf-8", "replace"), data=None
            )

    # --- pods ---------------------------------------------------------------------------------
    def _fail_pod(
        self,
        namespace: str,
        a: ReplacePod | EscalatePod,
        ctype: str,
        msg: str,
        since: float | None = None,
        *,
        once: bool = False,
    ) -> bool:
        """Mark a pod Failed with a condition through its status (the kubelet is gone or the
        failure must reach the Job's podFailurePolicy). False if the pod is no longer there;
        ``once``: nothing written when it is Failed with the condition already."""
        pod = or_none(self.core.read_namespaced_pod, a.pod, namespace)
        if pod is None or pod.metadata.uid != a.uid:
            return False
        if (
            once
            and pod.status.phase == "Failed"
            and any(c.type == ctype and c.status == "True" for c in pod.status.conditions or [])
        ):
            return True
        drop = {ctype, "Ready"} if since is not None else {ctype}
        conditions = [c for c in (pod.status.conditions or []) if c.type not in drop]
        extra = []
        if since is not None:  # not ready since its node went silent (see ReplacePod)
            extra.append(
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "NodeUnhealthy",
                    "lastTransitionTime": format_time(since, micro=False),
                }
            )
        body = {
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": {
                "phase": "Failed",
                "conditions": [
                    *(self.core.api_client.sanitize_for_serialization(c) for c in conditions),
                    *extra,
                    {
                        "type": ctype,
                        "status": "True",
                        "reason": "JobsetInplace",
                        "message": msg[:1000],
                        "lastTransitionTime": format_time(micro=False),
                    },
                ],
            },
        }
        self.core.patch_namespaced_pod_status(a.pod, namespace, body)
        return True

    def set_unhealthy_taint(
        self, node: str, present: bool, reason: str = "", key: str = names.UNHEALTHY_TAINT
    ) -> None:
        """Add or remove our ``key:NoSchedule`` taint (``jobset-inplace.dev/unhealthy`` by
        default; idempotent; optimistic concurrency on the node's resourceVersion)."""
        for _ in range(5):
            obj = or_none(self.core.read_node, node)
            if obj is None:
                return
            taints = [
                self.core.api_client.sanitize_for_serialization(t)
                for t in obj.spec.taints or []
                if t.key != key
            ]
            had = len(taints) != len(obj.spec.taints or [])
            if present == had:
                return
            if present:
                taints.append({"key": key, "value": reason[:63], "effect": "NoSchedule"})
            body = {
                "metadata": {"resourceVersion": obj.metadata.resource_version},
                "spec": {"taints": taints},
            }
            try:
                self.core.patch_node(node, body)
                log.info(
                    "node %s: %s taint %s",
                    node,
                    "added" if present else "removed",
                    key,
                )
                return
            except ApiException as e:
                if e.status != 409:
                    raise
        log.warning("node %s: gave up updating taint %s (conflicts)", node, key)

    def _untrack(self, namespace: str, a: ReplacePod) -> None:
        """Remove the Job controller's tracking finalizer from a pod about to be replaced, so
        that its end is not counted as a failure of its Job: the Job controller would otherwise
        hold its replacement back (pod-failure backoff, 10 s doubling per failure of the Job,
        never reset while no pod succeeds: 80 s for its fourth failed pod), and count it in
        ``status.failed``. A pod already terminal is left to the Job controller (its
        podFailurePolicy must see it). Best effort: refused (an install without the ``patch
        pods`` right) or raced, the pod is replaced all the same, only later."""
        pod = or_none(self.core.read_namespaced_pod, a.pod, namespace)
        if pod is None or pod.metadata.uid != a.uid or pod.status.phase in TERMINAL_PHASES:
            return
        finalizers = pod.metadata.finalizers or []
        if names.JOB_TRACKING_FINALIZER not in finalizers:
            return
        at = f"/metadata/finalizers/{finalizers.index(names.JOB_TRACKING_FINALIZER)}"
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": a.uid},
            {"op": "test", "path": at, "value": names.JOB_TRACKING_FINALIZER},
            {"op": "remove", "path": at},
        ]
        try:
            self.core.patch_namespaced_pod(a.pod, namespace, patch)
        except ApiException as e:
            if e.status == 403:
                log.warning(
                    "pod %s/%s: may not remove its %s finalizer (%s): its Job counts it as "
                    "failed and may hold the replacement back; apply manifests/controller/"
                    "rbac.yaml of this version",
                    namespace,
                    a.pod,
                    names.JOB_TRACKING_FINALIZER,
                    e.reason,
                )
            elif e.status not in (404, 409, 422):  # gone, or changed since read
                raise

    def replace_pod(self, namespace: str, a: ReplacePod) -> None:
        if a.taint_node:
            self.set_unhealthy_taint(a.taint_node, True, a.cause.value, a.taint_key)
        self._untrack(namespace, a)
        grace = None
        if a.fail_first:
            if not self._fail_pod(
                namespace,
                a,
                names.REPLACED_CONDITION,
                f"{a.cause.value}: replaced",
                since=a.failed_since,
            ):
                return
            grace = 0  # its kubelet is unreachable: nothing would confirm a graceful delete
        try:
            self.core.delete_namespaced_pod(
                a.pod,
                namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=grace, preconditions=client.V1Preconditions(uid=a.uid)
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or a newer pod took the name
                raise

    def escalate(self, namespace: str, a: EscalatePod) -> None:
        """Idempotent: the planner asks again until it sees the condition, and a pod that
        already carries it (and is Failed) is left as it is."""
        self._fail_pod(namespace, a, names.ESCALATION_CONDITION, a.message, once=True)

    # --- events -------------------------------------------------------------------------------
    def post_event(self, jobset: dict[str, Any], e: Event) -> bool:
        """Post ``e`` on the JobSet; False if the API refused it (best effort: never a reason
        to fail a pass)."""
        meta = jobset["metadata"]
        now = dt.datetime.now(dt.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{meta['name']}.", namespace=meta["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version=jobset["apiVersion"],
                kind=jobset["kind"],
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
            ),
            reason=e.reason,
            message=e.message[:1024],
            type="Warning" if e.warning else "Normal",
            source=client.V1EventSource(component=COMPONENT),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as err:
            log.warning("could not post event %s on %s: %s", e.reason, meta["name"], err.reason)
            return False
        return True

    def run(self, jobset: dict[str, Any], actions: list[Action]) -> list[Event]:
        """Carry out a plan's actions; the Events actually posted."""
        ns = jobset["metadata"]["namespace"]
        posted: list[Event] = []
        for a in actions:
            if isinstance(a, ReplacePod):
                self.replace_pod(ns, a)
            elif isinstance(a, EscalatePod):
                self.escalate(ns, a)
        for a in actions:
            if isinstance(a, Event):
                log.info("%s/%s %s: %s", ns, jobset["metadata"]["name"], a.reason, a.message)
                if self.post_event(jobset, a):
                    posted.append(a)
        return posted

    def run_node(self, actions: list[Action]) -> None:
        """Carry out a node's plan (:func:`~jobset_inplace.core.planner.plan_node`)."""
        for a in actions:
            if isinstance(a, UntaintNode):
                self.set_unhealthy_taint(a.node, False)
