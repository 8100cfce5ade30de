"""The benchmark's alternative report path (bench/member_leases.py): a member Lease's
annotations reach the cache as a channel report would, or not at all."""

from __future__ import annotations

from typing import Any

from bench.member_leases import MEMBER_LABEL, keep, lease_report, member_lease
from jobset_inplace import names
from jobset_inplace.core.model import GangStatus
from tests.unit.test_cache import cache_with_gang, pod

KEY = ("ns", "train")


def written(uid: str, annotations: dict[str, str], gang: str = "train") -> dict[str, Any]:
    """The member Lease of pod ``p-<uid>`` after its agent's merge patch of ``annotations``."""
    lease = member_lease(gang, f"p-{uid}", uid)
    lease["metadata"] |= {"namespace": "ns", "annotations": annotations}
    return lease


def test_a_new_lease_is_owned_by_its_pod_and_holds_no_report() -> None:
    lease = member_lease("train", "p-a", "a")
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p-a", "uid": "a"}
    ]
    assert lease["metadata"]["labels"] == {names.JOBSET_NAME_LABEL: "train", MEMBER_LABEL: "a"}
    assert lease_report(written("a", {})) is None


def test_a_report_is_read_from_the_annotations_the_agent_writes() -> None:
    rep = lease_report(
        written("a", {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "200,100", "other": "x"})
    )
    assert rep is not None
    assert (rep.key, rep.uid) == (KEY, "a")
    assert rep.report.reported_epoch == 3
    assert rep.report.reported_steps == (200, 100)


def test_malformed_or_unlabelled_leases_are_ignored() -> None:
    assert lease_report(written("a", {names.REPORT_EPOCH: "three"})) is None
    unlabelled = written("a", {names.REPORT_EPOCH: "3"})
    del unlabelled["metadata"]["labels"][MEMBER_LABEL]
    assert lease_report(unlabelled) is None


def test_reports_take_the_channels_way_into_the_cache() -> None:
    c = cache_with_gang()
    for i, uid in enumerate("ab"):
        c.upsert_pod(pod(uid, index=i))
    c.gangs[KEY].status = GangStatus(epoch=4)
    epoch4 = {names.REPORT_EPOCH: "4", names.REPORT_STEPS: "200"}
    stranger = lease_report(written("x", epoch4))  # not a member pod: not kept
    assert keep(c, [lease_report(written("a", epoch4)), stranger, None]) == {KEY: False}
    assert c.gangs[KEY].pods["a"].reported_epoch == 4
    assert "x" not in c.gangs[KEY].reports
    assert keep(c, [lease_report(written("b", epoch4))]) == {KEY: True}, "the last one"
    older = lease_report(written("b", {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "100"}))
    keep(c, [older])
    assert c.gangs[KEY].pods["b"].reported_epoch == 4, "a late older report does not win"
