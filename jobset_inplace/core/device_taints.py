"""DRA device taints that move a member, free of I/O: which members hold a device tainted
``NoSchedule`` (by a ``DeviceTaintRule``, as an administrator takes a device out of service, or
in its ``ResourceSlice``, as its driver does) that their claims do not tolerate.

Such a device keeps serving the pods that hold it, but nothing new may be scheduled on it: it
is being taken out of service, like a cordoned node. Its member is moved as a drained node's
is (core.planned_moves): at a step every trainer stops at, with no step lost; its new pod gets
a new claim, which the scheduler allocates from devices that are not tainted. Only a pod's own
claims count, those made for it from a ``ResourceClaimTemplate`` (the pod is their controller:
:func:`claim_owner`): a claim pods share keeps its devices whatever pod holds it, so moving
would not help.

``NoExecute`` is not handled here: kube-controller-manager evicts such pods at once (the
``DeviceTainted`` cause, core.detection). ``None`` is informational. The objects are decoded
from ``resource.k8s.io`` v1 (1.34+) and the earlier layouts the fields match in; a
``DeviceTaintRule`` that selects by device class or CEL (v1alpha3 only) is not evaluated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]
NO_SCHEDULE = "NoSchedule"


@dataclass(frozen=True)
class DeviceRef:
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "": every effect

    def tolerates(self, taint: Taint) -> bool:
        """As Kubernetes matches a device toleration to a device taint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return bool(self.key) and self.value == taint.value


@dataclass(frozen=True)
class Allocated:
    """One device a claim was allocated, with the tolerations its request had then."""

    device: DeviceRef
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class TaintRule:
    """A DeviceTaintRule: its taint on every device its selector matches (an unset field
    matches any)."""

    name: str
    taint: Taint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def selects(self, d: DeviceRef) -> bool:
        return all(
            want is None or want == have
            for want, have in (
                (self.driver, d.driver),
                (self.pool, d.pool),
                (self.device, d.device),
            )
        )


# --- decoding (the controller's watches keep only these) ---------------------------------------
def _taint(d: Obj) -> Taint:
    return Taint(str(d.get("key") or ""), str(d.get("value") or ""), str(d.get("effect") or ""))


def _toleration(d: Obj) -> Toleration:
    return Toleration(
        str(d.get("key") or ""),
        str(d.get("operator") or "Equal"),
        str(d.get("value") or ""),
        str(d.get("effect") or ""),
    )


def claim_key(claim: Obj) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def claim_owner(claim: Obj) -> str:
    """The UID of the pod the claim was made for (its controller), "" for a claim of no pod's
    own (made by hand, shared)."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return str(ref.get("uid") or "")
    return ""


def claim_devices(claim: Obj) -> tuple[Allocated, ...]:
    """The devices a ResourceClaim was allocated (none while it is not)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return tuple(
        Allocated(
            DeviceRef(str(r.get("driver")), str(r.get("pool")), str(r.get("device"))),
            tuple(_toleration(t) for t in r.get("tolerations") or ()),
        )
        for r in (allocation.get("devices") or {}).get("results") or ()
        if r.get("driver") and r.get("pool") and r.get("device")
    )


def slice_taints(resource_slice: Obj) -> dict[DeviceRef, tuple[Taint, ...]]:
    """The tainted devices of a ResourceSlice (v1: taints on the device; v1beta1: under
    ``basic``)."""
    spec = resource_slice.get("spec") or {}
    driver, pool = str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or "")
    out: dict[DeviceRef, tuple[Taint, ...]] = {}
    for dev in spec.get("devices") or ():
        taints = dev.get("taints") or (dev.get("basic") or {}).get("taints") or ()
        if taints and dev.get("name"):
            out[DeviceRef(driver, pool, str(dev["name"]))] = tuple(_taint(t) for t in taints)
    return out


def taint_rule(rule: Obj) -> TaintRule | None:
    """A DeviceTaintRule's view; None for one this cannot evaluate (a device class or CEL
    selector, v1alpha3) or without a taint."""
    meta, spec = rule.get("metadata") or {}, rule.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    if selector.get("deviceClassName") or selector.get("selectors") or not spec.get("taint"):
        return None
    return TaintRule(
        str(meta.get("name") or ""),
        _taint(spec["taint"]),
        selector.get("driver"),
        selector.get("pool"),
        selector.get("device"),
    )


# --- the decision ------------------------------------------------------------------------------
def why_leaving(
    held: Iterable[Allocated],
    in_slices: Mapping[DeviceRef, tuple[Taint, ...]],
    rules: Iterable[TaintRule],
) -> str:
    """Why a member holding ``held`` should move ("device d/p/x tainted k=v:NoSchedule"), or
    "" when none of its devices is tainted NoSchedule beyond what its claims tolerate."""
    rules = list(rules)
    for a in held:
        taints = [*in_slices.get(a.device, ()), *(r.taint for r in rules if r.selects(a.device))]
        for t in taints:
            if t.effect == NO_SCHEDULE and not any(tol.tolerates(t) for tol in a.tolerations):
                return f"device {a.device} tainted {t}"
    return ""
