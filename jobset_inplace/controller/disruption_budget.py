"""Keeps each opted-in JobSet's PodDisruptionBudget as :mod:`jobset_inplace.core.disruption_budget`
decides (why and what: there): loads it, asks the core, writes the answer; synced on JobSet
events that change what it should be, and every 5 minutes (:mod:`.keyed_sync`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from jobset_inplace.apierrors import or_none
from jobset_inplace.core.disruption_budget import budget_name, desired_budget, plan_budget
from jobset_inplace.core.policy import Policy, PolicyError, parse_policy

from .keyed_sync import KeyedSync

log = logging.getLogger("jobset_inplace.controller")

MERGE_PATCH = "application/merge-patch+json"


class DisruptionBudgetKeeper:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.policy = client.PolicyV1Api(api_client)
        # "namespace/name" -> the budget its JobSet should have (None: none)
        self.desired: dict[str, dict[str, Any] | None] = {}
        self.keeper = KeyedSync("disruption budget", self.sync, lambda: self.desired)
        self._reported: set[str] = set()  # conflicts already logged

    def observe(self, jobset: Mapping[str, Any], deleted: bool) -> None:
        """A JobSet event (on the loop): sync its budget if what it should be changed. A
        deleted JobSet's budget goes with it (garbage collection)."""
        meta = jobset.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if deleted:
            self.desired.pop(key, None)
            return
        try:
            policy: Policy | None = parse_policy(meta.get("annotations"))
        except PolicyError:
            policy = None  # an InvalidPolicy Event says why; no budget for it
        want = desired_budget(jobset, policy)
        if key in self.desired and self.desired[key] == want:
            return
        self.desired[key] = want
        self.keeper.schedule(key)

    async def resync_forever(self) -> None:
        await self.keeper.resync_forever()

    def sync(self, key: str) -> None:
        """Load the budget, plan, write (on a thread)."""
        if key not in self.desired:
            return
        ns, name = key.split("/", 1)
        desired = self.desired[key]
        current = or_none(
            self.policy.read_namespaced_pod_disruption_budget,
            budget_name(name),
            ns,
            _preload_content=False,
        )
        write, conflict = plan_budget(
            desired, None if current is None else json.loads(current.data)
        )
        if conflict is not None and conflict not in self._reported:
            self._reported.add(conflict)
            log.warning("%s: %s", key, conflict)
        if write is None:
            return
        if write.verb == "create":
            self.policy.create_namespaced_pod_disruption_budget(ns, write.body)
        elif write.verb == "patch":
            self.policy.patch_namespaced_pod_disruption_budget(
                budget_name(name), ns, write.body, _content_type=MERGE_PATCH
            )
        else:
            self.policy.delete_namespaced_pod_disruption_budget(budget_name(name), ns)
        log.info("%s: PodDisruptionBudget %s: %s", key, budget_name(name), write.verb)
