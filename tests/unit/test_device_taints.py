"""DRA devices tainted NoSchedule move their members (core/device_taints.py, the cache's
devices_leaving, the planner's planned move): decoding, toleration matching, the decision."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from jobset_inplace.controller import device_taints
from jobset_inplace.controller.cache import (
    ClaimEntry,
    ClusterCache,
    RuleEntry,
    SliceEntry,
    claim_entry,
    rule_entry,
    slice_entry,
)
from jobset_inplace.core import device_taints as dt
from jobset_inplace.core.model import PlannedStop
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy

from .gangs import NOW, member, pods, snapshot

DEV = dt.DeviceRef("gpu.example.com", "node-1", "gpu-0")
OTHER = dt.DeviceRef("gpu.example.com", "node-1", "gpu-1")
NO_SCHEDULE = dt.Taint("maintenance", "true", "NoSchedule")


def claim(name: str, *results: dict[str, Any], pod: str | None = "uid-1") -> dict[str, Any]:
    """A ResourceClaim made for pod UID ``pod`` (None: of no pod's own), allocated ``results``."""
    owners = [] if pod is None else [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod}]
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "ownerReferences": [{**o, "controller": True} for o in owners],
        },
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(
    d: dt.DeviceRef = DEV, tolerations: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "gpu", "driver": d.driver, "pool": d.pool, "device": d.device}
    if tolerations:
        out["tolerations"] = tolerations
    return out


def rule(name: str = "r", effect: str = "NoSchedule", **selector: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "maintenance", "value": "true", "effect": effect},
        },
    }


def test_decoding_claims_slices_rules_and_a_pods_own_claims() -> None:
    assert dt.claim_devices(claim("c", result())) == (dt.Allocated(DEV),)
    assert dt.claim_devices({"metadata": {}, "status": {}}) == (), "not allocated yet"
    tol = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}
    (held,) = dt.claim_devices(claim("c", result(tolerations=[tol])))
    assert held.tolerations == (dt.Toleration("maintenance", "Exists", "", "NoSchedule"),)
    rs = {
        "metadata": {"name": "node-1-gpu"},
        "spec": {
            "driver": DEV.driver,
            "pool": {"name": DEV.pool},
            "devices": [
                {
                    "name": "gpu-0",
                    "taints": [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}],
                },
                {"name": "gpu-1"},
                {"name": "gpu-2", "basic": {"taints": [{"key": "k", "effect": "None"}]}},  # v1beta1
            ],
        },
    }
    assert dt.slice_taints(rs) == {
        DEV: (NO_SCHEDULE,),
        dt.DeviceRef(DEV.driver, DEV.pool, "gpu-2"): (dt.Taint("k", "", "None"),),
    }
    assert dt.taint_rule(rule(driver=DEV.driver, device="gpu-0")) == dt.TaintRule(
        "r", NO_SCHEDULE, DEV.driver, None, "gpu-0"
    )
    cel = rule(selectors=[{"cel": {"expression": "true"}}])  # type: ignore[arg-type]
    assert dt.taint_rule(cel) is None, "v1alpha3's CEL selectors are not evaluated"
    assert dt.claim_owner(claim("c", result(), pod="uid-7")) == "uid-7"
    assert dt.claim_owner(claim("c", result(), pod=None)) == "", "a shared claim is no pod's"


def test_tolerations_match_as_kubernetes_matches_them() -> None:
    def tolerates(**kw: str) -> bool:
        return dt.Toleration(**kw).tolerates(NO_SCHEDULE)

    assert tolerates(key="maintenance", value="true")
    assert tolerates(key="maintenance", operator="Exists")
    assert tolerates(operator="Exists"), "an empty key with Exists tolerates every taint"
    assert tolerates(key="maintenance", value="true", effect="NoSchedule")
    assert not tolerates(key="maintenance", value="false")
    assert not tolerates(key="maintenance", value="true", effect="NoExecute")
    assert not tolerates(key="other", operator="Exists")
    assert not tolerates(value="true"), "Equal needs a key"


def test_which_taints_move_a_member() -> None:
    held = [dt.Allocated(DEV)]
    rules = [dt.TaintRule("r", NO_SCHEDULE, DEV.driver, DEV.pool, DEV.device)]
    why = dt.why_leaving(held, {}, rules)
    assert why == "device gpu.example.com/node-1/gpu-0 tainted maintenance=true:NoSchedule"
    assert dt.why_leaving(held, {DEV: (NO_SCHEDULE,)}, []) == why, "a driver's taint too"
    assert not dt.why_leaving([dt.Allocated(OTHER)], {}, rules), "another device"
    wide = [dt.TaintRule("r", NO_SCHEDULE, driver=DEV.driver)]
    assert dt.why_leaving([dt.Allocated(OTHER)], {}, wide), "unset selector fields match any"
    for effect in ("NoExecute", "None", "SomethingNew"):  # evicted elsewhere / informational
        other = [dt.TaintRule("r", dataclasses.replace(NO_SCHEDULE, effect=effect))]
        assert not dt.why_leaving(held, {}, other), effect
    tolerant = [dt.Allocated(DEV, (dt.Toleration("maintenance", "Exists"),))]
    assert not dt.why_leaving(tolerant, {}, rules), "the claim tolerates it"


def test_the_cache_tells_which_members_hold_a_tainted_device() -> None:
    cache = ClusterCache()
    p = pods(2, epoch=2)
    assert cache.upsert_claim(claim_entry(claim("p1-device", result())))
    assert not cache.upsert_claim(claim_entry(claim("p1-device", result()))), "unchanged"
    shared = claim_entry(claim("everyones", result(OTHER), pod=None))
    assert not cache.upsert_claim(shared), "a claim of no pod's own is not kept"
    assert cache.devices_leaving(p) == {}, "no taint"
    assert cache.upsert_rule(rule_entry(rule(driver=DEV.driver, device=DEV.device)))
    assert cache.devices_leaving(p) == {
        "uid-1": "device gpu.example.com/node-1/gpu-0 tainted maintenance=true:NoSchedule"
    }
    assert cache.upsert_rule(RuleEntry("r", None), deleted=True)
    assert cache.devices_leaving(p) == {}
    assert cache.upsert_slice(SliceEntry("s", {DEV: (NO_SCHEDULE,)}))
    assert set(cache.devices_leaving(p)) == {"uid-1"}
    assert cache.upsert_slice(slice_entry({"metadata": {"name": "s"}, "spec": {"devices": []}}))
    assert cache.slice_taints == {}, "slices without taints are not kept"
    gone = ClaimEntry(("ns", "p1-device"), "uid-1", ())
    assert cache.upsert_claim(gone, deleted=True)
    assert cache.claims == {}


def test_a_claim_or_taint_change_plans_the_gangs_it_concerns() -> None:
    cache = ClusterCache()
    gang = cache.upsert_jobset(
        {"metadata": {"namespace": "ns", "name": "train", "uid": "js"}, "spec": {}},
        Policy(),
        "",
    )
    gang.pods = {p.uid: p for p in pods(2, epoch=2)}
    assert cache.gangs_with_claims() == [], "no member holds a claim of its own"
    cache.upsert_claim(claim_entry(claim("p1-device", result())))
    assert cache.gangs_with_claims() == [("ns", "train")]
    assert cache.gangs_with_claims("uid-1") == [("ns", "train")], "the claim's pod's gang"
    assert cache.gangs_with_claims("uid-9") == []


def test_a_member_holding_a_tainted_device_starts_a_planned_stop() -> None:
    why = "device gpu.example.com/node-1/gpu-0 tainted maintenance=true:NoSchedule"
    s = dataclasses.replace(snapshot(), devices_leaving={"uid-1": why})
    p = plan(s)
    assert p.status.planned_stop == PlannedStop(2, (member(1),), why, NOW, NOW + 600, None)
    off = dataclasses.replace(s, policy=Policy(planned_moves=False))
    assert plan(off).status.planned_stop is None, "planned-moves: false"


def test_the_watches_are_only_of_what_is_served_and_may_be_listed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster serving claims and slices (not DeviceTaintRules), whose controller may not list
    slices (RBAC of an older release): one watch, each omission logged, nothing raised."""

    class Api:  # the client's discovery and list calls, as the apiserver would answer them
        def get_api_resources(self, group: str, version: str) -> Any:
            if version != "v1":
                raise ApiException(status=404, reason="Not Found")
            names = ("resourceclaims", "resourceslices")
            return SimpleNamespace(resources=[SimpleNamespace(name=n) for n in names])

        def list_cluster_custom_object(
            self, group: str, version: str, plural: str, **_: Any
        ) -> Any:
            if plural == "resourceslices":
                raise ApiException(status=403, reason="Forbidden")
            return {"items": []}

    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", lambda *_: Api())
    caplog.set_level(logging.INFO, "jobset_inplace.controller")
    watches = device_taints.dra_watches(SimpleNamespace(cache=ClusterCache()))  # type: ignore[arg-type]
    assert [w.what for w in watches] == ["ResourceClaims"]
    assert "cannot list resource.k8s.io/v1 resourceslices (403 Forbidden)" in caplog.text
    assert "resource.k8s.io/devicetaintrules not served" in caplog.text
