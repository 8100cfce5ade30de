"""The agents' access per namespace: what the controller writes (core/agent_access.py) and when
it writes it (controller/agent_access.py)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from jobset_inplace import names
from jobset_inplace.backoff import Backoff
from jobset_inplace.controller import keyed_sync as keeper_module
from jobset_inplace.controller.agent_access import AgentAccessKeeper
from jobset_inplace.controller.keyed_sync import KeyedSync
from jobset_inplace.core.agent_access import (
    AGENT_BINDING,
    AGENT_BINDING_LABEL,
    AGENT_CLUSTER_ROLE,
    AGENT_SERVICE_ACCOUNT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Owner,
    account_before_pods,
    desired_binding,
    desired_service_account,
    jobset_service_accounts,
    plan_access,
)
from jobset_inplace.core.transform import AgentSettings, TransformError, transform
from testbed import workloads

A = Owner("a", "uid-a", frozenset({AGENT_SERVICE_ACCOUNT}))
B = Owner("b", "uid-b", frozenset({"trainer"}))


def _applied(plan_writes: Any, sa: dict[str, Any] | None, rb: dict[str, Any] | None) -> Any:
    """The objects after the writes (a merge patch on the top-level keys it names)."""
    objs = {"ServiceAccount": copy.deepcopy(sa), "RoleBinding": copy.deepcopy(rb)}
    for w in plan_writes:
        if w.create:
            objs[w.kind] = copy.deepcopy(w.body)
        else:
            obj = objs[w.kind]
            assert obj is not None
            for key, value in w.body.items():
                if key == "metadata":
                    meta = dict(value)
                    labels = {**obj["metadata"].get("labels", {}), **meta.pop("labels", {})}
                    obj["metadata"].update(meta, labels=labels)
                else:
                    obj[key] = value
    return objs["ServiceAccount"], objs["RoleBinding"]


def test_the_agents_account_is_made_at_admission_only_where_pods_run_as_it() -> None:
    """Ownerless (the JobSet has no UID yet) and ours: the keeper adds the JobSet as its owner
    afterwards, as it would to the account it made itself."""
    mine = workloads.jobset("g", [("workers", 2, 1)])
    account = account_before_pods("ml", mine)
    assert account == desired_service_account("ml", [])
    assert account is not None
    assert account["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    assert account["metadata"]["ownerReferences"] == []
    owned = plan_access("ml", [A], account, None).writes
    assert [(w.kind, w.create) for w in owned] == [
        ("ServiceAccount", False),
        ("RoleBinding", True),
    ]
    assert owned[0].body["metadata"]["ownerReferences"][0]["uid"] == A.uid
    own = workloads.jobset("g", [("workers", 2, 1)], pod={"serviceAccountName": "trainer"})
    assert account_before_pods("ml", own) is None


def test_no_opted_in_jobset_writes_nothing() -> None:
    """The garbage collector removes both with their last owner: an empty owner list written
    by us would orphan them instead."""
    sa, rb = desired_service_account("ml", [A]), desired_binding("ml", [A])
    assert plan_access("ml", [], sa, rb).writes == ()
    assert plan_access("ml", [], None, None).writes == ()


def test_the_first_jobset_gets_the_account_then_the_binding_both_owned_by_it() -> None:
    plan = plan_access("ml", [B], None, None)
    assert [(w.kind, w.create) for w in plan.writes] == [
        ("ServiceAccount", True),
        ("RoleBinding", True),
    ], "the account first: pods wait for it"
    sa, rb = (w.body for w in plan.writes)
    assert sa["metadata"]["name"] == AGENT_SERVICE_ACCOUNT
    assert rb["metadata"]["name"] == AGENT_BINDING
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": AGENT_CLUSTER_ROLE,
    }
    assert rb["subjects"] == [
        {"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": "ml"},
        {"kind": "ServiceAccount", "name": "trainer", "namespace": "ml"},
    ]
    for obj in (sa, rb):
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "name": "b",
                "uid": "uid-b",
            }
        ]
        assert "blockOwnerDeletion" not in obj["metadata"]["ownerReferences"][0]


def test_owners_coming_and_going_change_subjects_and_owners_only_and_converge() -> None:
    sa, rb = _applied(plan_access("ml", [A], None, None).writes, None, None)
    assert [s["name"] for s in rb["subjects"]] == [AGENT_SERVICE_ACCOUNT]
    assert plan_access("ml", [A], sa, rb).writes == (), "nothing to change: nothing written"

    plan = plan_access("ml", [A, B], sa, rb)
    assert [(w.kind, w.create, sorted(w.body)) for w in plan.writes] == [
        ("ServiceAccount", False, ["metadata"]),
        ("RoleBinding", False, ["metadata", "subjects"]),
    ]
    sa, rb = _applied(plan.writes, sa, rb)
    assert [s["name"] for s in rb["subjects"]] == [AGENT_SERVICE_ACCOUNT, "trainer"]
    assert [o["name"] for o in rb["metadata"]["ownerReferences"]] == ["a", "b"]
    assert plan_access("ml", [B, A], sa, rb).writes == (), "order does not matter"

    # B deleted: its account is no subject any more (nor confined by the policy)
    sa, rb = _applied(plan_access("ml", [A], sa, rb).writes, sa, rb)
    assert [s["name"] for s in rb["subjects"]] == [AGENT_SERVICE_ACCOUNT]
    assert [o["name"] for o in sa["metadata"]["ownerReferences"]] == ["a"]


def test_the_binding_carries_the_label_the_admission_policy_selects_it_by() -> None:
    """Its label is how the policy finds its parameter (never by name: Kubernetes 1.37 then
    GETs it on every pod write of a namespace without it); an earlier release's binding gets
    the label added, nothing else."""
    sa, rb = _applied(plan_access("ml", [A], None, None).writes, None, None)
    assert rb["metadata"]["labels"][AGENT_BINDING_LABEL] == "true"
    old = copy.deepcopy(rb)
    del old["metadata"]["labels"][AGENT_BINDING_LABEL]
    (write,) = plan_access("ml", [A], sa, old).writes
    assert (write.kind, write.create, write.body) == (
        "RoleBinding",
        False,
        {"metadata": {"labels": {AGENT_BINDING_LABEL: "true"}}},
    )
    _, fixed = _applied([write], sa, old)
    assert fixed == rb


def test_a_jobset_recreated_under_its_name_is_a_new_owner() -> None:
    sa, rb = _applied(plan_access("ml", [A], None, None).writes, None, None)
    again = Owner("a", "uid-a2", A.service_accounts)
    plan = plan_access("ml", [again], sa, rb)
    assert {w.kind for w in plan.writes} == {"ServiceAccount", "RoleBinding"}
    assert all(w.body["metadata"]["ownerReferences"][0]["uid"] == "uid-a2" for w in plan.writes)


def test_objects_of_our_names_made_by_someone_else_are_left_alone() -> None:
    by_hand_sa = {"metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": "ml"}}
    by_hand_rb = {"metadata": {"name": AGENT_BINDING}, "roleRef": {"name": "x"}}
    plan = plan_access("ml", [B], by_hand_sa, by_hand_rb)
    assert plan.writes == (), "never taken over"
    [conflict] = plan.conflicts
    assert f"RoleBinding ml/{AGENT_BINDING}" in conflict
    assert "not made by the controller" in conflict
    # an account made by hand (earlier releases' manifests) serves as it is: no conflict
    plan = plan_access("ml", [B], by_hand_sa, None)
    assert [(w.kind, w.create) for w in plan.writes] == [("RoleBinding", True)]
    assert plan.conflicts == ()


def test_our_binding_to_another_role_cannot_be_patched_and_is_reported() -> None:
    rb = desired_binding("ml", [A])
    rb["roleRef"] = {**rb["roleRef"], "kind": "Role"}
    plan = plan_access("ml", [A], desired_service_account("ml", [A]), rb)
    assert plan.writes == ()
    assert "a roleRef cannot change" in plan.conflicts[0]


def test_the_accounts_a_jobsets_pods_run_as() -> None:
    js = workloads.jobset("g", [("workers", 2, 2), ("ps", 1, 1)])
    assert jobset_service_accounts(js) == {AGENT_SERVICE_ACCOUNT}
    pod = js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    pod["serviceAccount"] = "legacy"  # the deprecated field alone
    assert jobset_service_accounts(js) == {AGENT_SERVICE_ACCOUNT, "legacy"}
    assert Owner.of(js).service_accounts == {AGENT_SERVICE_ACCOUNT, "legacy"}


def test_the_webhook_refuses_the_shared_default_account_and_keeps_a_deprecated_one() -> None:
    settings = AgentSettings(image="agent:1")
    js = workloads.jobset("g", [("workers", 2, 2)], annotations={names.ENABLED: "true"})
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["serviceAccountName"] = "default"
    with pytest.raises(TransformError) as info:
        transform(js, settings)
    assert str(info.value).startswith(
        "spec.replicatedJobs[0].template.spec.template.spec.serviceAccountName: default is refused"
    )
    del pod["serviceAccountName"]
    pod["serviceAccount"] = "legacy"
    out = transform(js, settings)
    prepared = out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "serviceAccountName" not in prepared, "a pod naming an account keeps it"
    assert (
        transform(
            workloads.jobset("h", [("w", 1, 1)], annotations={names.ENABLED: "true"}), settings
        )["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["serviceAccountName"]
        == AGENT_SERVICE_ACCOUNT
    )


# --- when the keeper syncs ---------------------------------------------------------------------


class RecordingKeeper(AgentAccessKeeper):
    def __init__(self, fail: int = 0) -> None:
        self.owners, self._reported = {}, set()
        self.keeper = KeyedSync("agent access", self.sync_namespace, lambda: self.owners)
        self.synced: list[tuple[str, list[str]]] = []
        self.fail = fail

    def sync(self, ns: str, owners: list[Owner]) -> None:
        self.synced.append((ns, sorted(o.name for o in owners)))
        if self.fail:
            self.fail -= 1
            raise RuntimeError("apiserver unavailable")


def _jobset(name: str, ns: str = "ml", enabled: bool = True, sa: str | None = None) -> Any:
    js = workloads.jobset(name, [("w", 1, 1)], annotations={names.ENABLED: str(enabled).lower()})
    js["metadata"].update(namespace=ns, uid=f"uid-{name}")
    if sa:
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "serviceAccountName"
        ] = sa
    return js


async def _settle(keeper: AgentAccessKeeper) -> None:
    while keeper.keeper._running:
        await asyncio.gather(*keeper.keeper._running.values())


async def test_the_keeper_syncs_a_namespace_when_its_owners_change_only() -> None:
    k = RecordingKeeper()
    k.observe(_jobset("a"), deleted=False)
    k.observe(_jobset("a"), deleted=False)  # the same again (a status update): no change
    await _settle(k)
    k.observe(_jobset("a"), deleted=False)  # nothing changed: no sync
    k.observe(_jobset("x", enabled=False), deleted=False)  # not opted in: none of ours
    k.observe(_jobset("x", enabled=False), deleted=True)
    await _settle(k)
    assert k.synced == [("ml", ["a"])]
    k.observe(_jobset("b", sa="trainer"), deleted=False)
    k.observe(_jobset("c", ns="other"), deleted=False)
    await _settle(k)
    k.observe(_jobset("b", sa="other-sa"), deleted=False)  # its accounts changed
    await _settle(k)
    k.observe(_jobset("a"), deleted=True)
    await _settle(k)
    assert k.synced[1:] == [
        ("ml", ["a", "b"]),
        ("other", ["c"]),
        ("ml", ["a", "b"]),
        ("ml", ["b"]),
    ]
    k.observe(_jobset("b"), deleted=True)
    await _settle(k)
    assert k.synced[-1] == ("ml", [])
    assert "ml" not in k.owners


async def test_a_failed_sync_is_retried_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper_module, "RETRY", Backoff(0.01, 0.02))
    k = RecordingKeeper(fail=2)
    k.observe(_jobset("a"), deleted=False)
    await _settle(k)
    assert k.synced == [("ml", ["a"])] * 3
