"""The watches that feed DRA device taints and allocations into the cache (what planned moves
read: core.device_taints): ResourceClaims, ResourceSlices, DeviceTaintRules, each at the newest
``resource.k8s.io`` version the cluster serves it at, and only those it serves (a cluster
without DRA, or without device taints, gets none of them). A change that can concern a gang
plans it again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kubernetes import client

from jobset_inplace.runtime.watches import RawWatch, WatchEvent

from . import metrics
from .cache import (
    ClaimEntry,
    GangKey,
    RuleEntry,
    SliceEntry,
    claim_entry,
    rule_entry,
    slice_entry,
)
from .reconciler import Reconciler

log = logging.getLogger("jobset_inplace.controller")

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")  # newest first


def served_versions(api: client.CustomObjectsApi) -> dict[str, str]:
    """Plural -> the newest version of ``resource.k8s.io`` that serves it (none: not served)."""
    out: dict[str, str] = {}
    for version in VERSIONS:
        try:
            resources = api.get_api_resources(GROUP, version).resources or []
        except client.exceptions.ApiException:
            continue  # this version is not served
        for r in resources:
            out.setdefault(r.name, version)
    return out


def dra_watches(r: Reconciler) -> list[RawWatch[Any]]:
    # each watch holds a connection for minutes: its own client (as raw_watches)
    api = client.CustomObjectsApi(client.ApiClient())
    try:
        served = served_versions(api)
    except Exception as e:  # discovery failed: plan without device taints, say so
        log.warning("device taints: could not read the served %s versions: %r", GROUP, e)
        return []
    cache = r.cache
    kinds: Sequence[tuple[str, str, Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = (
        ("resourceclaims", "ResourceClaims", claim_entry, cache.replace_claims, claim_events),
        ("resourceslices", "ResourceSlices", slice_entry, cache.replace_slices, slice_events),
        ("devicetaintrules", "DeviceTaintRules", rule_entry, cache.replace_rules, rule_events),
    )
    watches: list[RawWatch[Any]] = []
    for plural, what, decode, replace, on_events in kinds:
        version = served.get(plural)
        if version is None:
            log.info("device taints: %s/%s not served; not watched", GROUP, plural)
            continue
        try:  # an install whose RBAC predates these watches: without them, not a crash loop
            api.list_cluster_custom_object(GROUP, version, plural, limit=1)
        except client.exceptions.ApiException as e:
            log.warning(
                "device taints: cannot list %s/%s %s (%s %s); not watched: apply this "
                "release's manifests/controller/rbac.yaml",
                GROUP, version, plural, e.status, e.reason,
            )  # fmt: skip
            continue
        watches.append(
            RawWatch(
                what,
                partial(api.list_cluster_custom_object, GROUP, version, plural),
                decode=decode,
                replace=replace,
                on_events=partial(on_events, r),
                on_relist=partial(_plan_with_claims, r),
                metrics=metrics.METRICS,
            )
        )
    return watches


def _poke(r: Reconciler, keys: list[GangKey]) -> None:
    for key in keys:
        r.poke(key)


def _plan_with_claims(r: Reconciler) -> None:
    _poke(r, r.cache.gangs_with_claims())


def claim_events(r: Reconciler, events: list[WatchEvent[ClaimEntry]]) -> None:
    for kind, entry in events:
        if r.cache.upsert_claim(entry, deleted=kind == "DELETED"):
            _poke(r, r.cache.gangs_with_claims(entry.pod))


def slice_events(r: Reconciler, events: list[WatchEvent[SliceEntry]]) -> None:
    if any([r.cache.upsert_slice(e, deleted=k == "DELETED") for k, e in events]):
        _plan_with_claims(r)


def rule_events(r: Reconciler, events: list[WatchEvent[RuleEntry]]) -> None:
    if any([r.cache.upsert_rule(e, deleted=k == "DELETED") for k, e in events]):
        _plan_with_claims(r)
