"""Keeps, in every namespace with opted-in JobSets, what their agents need from the API: the
ServiceAccount and RoleBinding :mod:`jobset_inplace.core.agent_access` decides (why and what:
there). This module only loads the two objects, asks the core, writes its answer and retries.

A namespace is synced when the set of its opted-in JobSets (or the ServiceAccounts their pods
run as) changes, and again every 5 minutes (an object deleted by hand, or by the garbage
collector in the moment a new JobSet arrived, comes back): :mod:`.keyed_sync`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from jobset_inplace.apierrors import or_none
from jobset_inplace.core.agent_access import (
    AGENT_BINDING,
    AGENT_SERVICE_ACCOUNT,
    Owner,
    Write,
    plan_access,
)
from jobset_inplace.core.policy import is_managed

from .keyed_sync import KeyedSync

log = logging.getLogger("jobset_inplace.controller")

MERGE_PATCH = "application/merge-patch+json"


class AgentAccessKeeper:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.owners: dict[str, dict[str, Owner]] = {}  # namespace -> JobSet name -> owner
        self.keeper = KeyedSync("agent access", self.sync_namespace, lambda: self.owners)
        self._reported: set[str] = set()  # conflicts already logged

    def observe(self, jobset: Mapping[str, Any], deleted: bool) -> None:
        """A JobSet event (on the loop): sync its namespace if its owners changed."""
        meta = jobset.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        owners = self.owners.get(ns, {})
        if deleted or not is_managed(jobset):
            if owners.pop(name, None) is None:
                return
            if not owners:
                self.owners.pop(ns, None)
        else:
            owner = Owner.of(jobset)
            if owners.get(name) == owner:
                return
            self.owners.setdefault(ns, {})[name] = owner
        self.keeper.schedule(ns)

    async def resync_forever(self) -> None:
        await self.keeper.resync_forever()

    def sync_namespace(self, ns: str) -> None:
        self.sync(ns, list(self.owners.get(ns, {}).values()))

    def sync(self, ns: str, owners: list[Owner]) -> None:
        """Load the two objects, plan, write (on a thread)."""
        account = or_none(
            self.core.read_namespaced_service_account,
            AGENT_SERVICE_ACCOUNT,
            ns,
            _preload_content=False,
        )
        binding = or_none(
            self.rbac.read_namespaced_role_binding, AGENT_BINDING, ns, _preload_content=False
        )
        plan = plan_access(
            ns,
            owners,
            None if account is None else json.loads(account.data),
            None if binding is None else json.loads(binding.data),
        )
        for conflict in plan.conflicts:
            if conflict not in self._reported:
                self._reported.add(conflict)
                log.warning("%s: agent access: %s", ns, conflict)
        for w in plan.writes:
            self._write(ns, w)

    def _write(self, ns: str, w: Write) -> None:
        if w.kind == "ServiceAccount":
            if w.create:
                self.core.create_namespaced_service_account(ns, w.body)
            else:
                self.core.patch_namespaced_service_account(
                    AGENT_SERVICE_ACCOUNT, ns, w.body, _content_type=MERGE_PATCH
                )
        elif w.create:
            self.rbac.create_namespaced_role_binding(ns, w.body)
        else:
            self.rbac.patch_namespaced_role_binding(
                AGENT_BINDING, ns, w.body, _content_type=MERGE_PATCH
            )
        log.info(
            "%s: agent access: %s %s/%s",
            ns,
            "created" if w.create else "updated",
            w.kind,
            AGENT_SERVICE_ACCOUNT if w.kind == "ServiceAccount" else AGENT_BINDING,
        )
