"""The controller cache's relist semantics: a complete list replaces what was cached, so an
object deleted while a watch was down does not linger. Objects go in as the watch threads
decode them."""

from __future__ import annotations

import dataclasses
import random
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobset_inplace import names
from jobset_inplace.controller.cache import (
    ClusterCache,
    EpochReport,
    Gang,
    GangKey,
    JobEntry,
    PodEntry,
    job_entry,
    node_entry,
    pod_entry,
)
from jobset_inplace.controller.operator import node_events
from jobset_inplace.core.decode import lease_renewal, member_view
from jobset_inplace.core.model import GangStatus, NodeView, Recovery, ReportEndpoint
from jobset_inplace.core.policy import Policy
from jobset_inplace.protocol.report import AgentReport
from jobset_inplace.times import parse_time
from jobset_inplace.trainer.progress import ProgressSpan

if TYPE_CHECKING:
    from jobset_inplace.controller.reconciler import Reconciler

NOW = 1_000_000.0


def owner(kind: str, api_version: str, uid: str, controller: bool = True) -> dict[str, object]:
    ref: dict[str, object] = {"apiVersion": api_version, "kind": kind, "name": "x", "uid": uid}
    return ref | {"controller": True} if controller else ref


def pod(
    uid: str, jobset: str = "train", index: int = 0, job: str | None = None, rj: str = "workers"
) -> PodEntry:
    """A member pod as the Job controller makes it: controlled by Job ``job-<index>``."""
    labels = {
        names.JOBSET_NAME_LABEL: jobset,
        names.REPLICATED_JOB_LABEL: rj,
        names.JOB_INDEX_LABEL: str(index),
        names.COMPLETION_INDEX_LABEL: "0",
    }
    refs = [owner("Job", "batch/v1", job if job is not None else f"job-{index}")]
    meta = {
        "name": f"p-{uid}",
        "namespace": "ns",
        "uid": uid,
        "labels": labels,
        "ownerReferences": refs,
    }
    return pod_entry(
        {"metadata": meta, "spec": {"nodeName": f"n-{uid}"}, "status": {"phase": "Running"}}
    )


def node(name: str) -> NodeView:
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return node_entry({"metadata": {"name": name}, "status": {"conditions": [ready]}})


def lease(name: str, renewed: str) -> tuple[str, float | None]:
    return lease_renewal({"metadata": {"name": name}, "spec": {"renewTime": renewed}})


def cache_with_gang() -> ClusterCache:
    c = ClusterCache()
    jobset = {
        "metadata": {"name": "train", "namespace": "ns", "uid": "js"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {}}}]},
    }
    c.upsert_jobset(jobset, Policy(), "")
    for index in range(3):
        c.upsert_job(JobEntry(f"job-{index}", "js"))
    return c


def test_replace_pods_drops_pods_missing_from_the_list_and_keeps_orphans_apart() -> None:
    c = cache_with_gang()
    c.upsert_pod(pod("a", index=0))
    c.upsert_pod(pod("b", index=1))
    c.upsert_pod(pod("x", jobset="later"))  # its JobSet not seen yet
    c.replace_pods([pod("b", index=1), pod("c", index=0), pod("y", jobset="later")])
    assert set(c.gangs[("ns", "train")].pods) == {"b", "c"}
    assert set(c.orphans[("ns", "later")]) == {"y"}


def test_replace_nodes_drops_nodes_missing_from_the_list_and_keeps_their_leases() -> None:
    c = ClusterCache()
    c.set_lease("n1", NOW)
    c.upsert_node(node("n1"))
    c.upsert_node(node("n2"))
    c.replace_nodes([node("n1")])
    assert set(c.nodes) == {"n1"}
    assert c.nodes["n1"].lease_renewed == NOW


def test_a_node_opens_at_its_creation_ready_uncordon_or_taint_removal_kept_across_relists() -> None:
    """When pods could last newly fit on a node (hot spares: a node that opened after a spare
    was placed): its creation, its Ready turning True (both from the object), and its cordon
    lifted or a NoSchedule taint removed (neither dated in the API: when the cache saw it),
    remembered across a relist; never moved back by a later, older-looking view."""
    created, ready_at = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"

    def obj(
        *, unschedulable: bool = False, taints: tuple[str, ...] = (), ready: str = "True"
    ) -> Any:
        condition = {"type": "Ready", "status": ready, "lastTransitionTime": ready_at}
        spec = {
            "unschedulable": unschedulable,
            "taints": [{"key": k, "effect": "NoSchedule"} for k in taints],
        }
        meta = {"name": "n1", "creationTimestamp": created, "labels": {"pool": "a"}}
        return {"metadata": meta, "spec": spec, "status": {"conditions": [condition]}}

    assert node_entry(obj()).opened_at == parse_time(ready_at)
    assert node_entry(obj()).labels == (("pool", "a"),)
    assert node_entry(obj(ready="False")).opened_at == parse_time(created)
    c = ClusterCache()
    c.upsert_node(node_entry(obj(unschedulable=True, taints=("t",))))
    assert c.nodes["n1"].opened_at == parse_time(ready_at)
    before = time.time()
    c.upsert_node(node_entry(obj(taints=("t",))))  # uncordoned
    uncordoned = c.nodes["n1"].opened_at
    assert uncordoned >= before
    c.replace_nodes([node_entry(obj(taints=("t",)))])  # a relist: nothing opened
    assert c.nodes["n1"].opened_at == uncordoned
    c.upsert_node(node_entry(obj(taints=("t", "u"))))  # a taint added: nothing opened
    assert c.nodes["n1"].opened_at == uncordoned
    c.upsert_node(node_entry(obj(taints=("t",))))  # one removed
    assert c.nodes["n1"].opened_at >= uncordoned


def test_replace_leases_forgets_leases_missing_from_the_list() -> None:
    c = ClusterCache()
    c.upsert_node(node("n1"))
    c.upsert_node(node("n2"))
    c.set_lease("n1", NOW)
    c.set_lease("n2", NOW)
    c.replace_leases([lease("n2", "2026-11-21T10:00:00.000000Z")])
    assert "n1" not in c.leases
    assert c.nodes["n1"].lease_renewed is None
    assert c.nodes["n2"].lease_renewed is not None
    assert c.nodes["n2"].lease_renewed > NOW


def reported(uid: str, epoch: int, index: int = 0) -> PodEntry:
    """Pod ``uid`` whose agent wrote its report of ``epoch`` on the pod."""
    entry = pod(uid, index=index)
    assert entry.view is not None
    return PodEntry(
        uid, entry.key, dataclasses.replace(entry.view, reported_epoch=epoch), entry.job
    )


def test_a_channel_report_is_kept_with_its_pod_and_the_newer_report_wins() -> None:
    c = cache_with_gang()
    key = ("ns", "train")
    fields = AgentReport(reported_epoch=3, reported_steps=(200,))
    assert c.set_report(key, "a", fields) is not None, "a pod the cache does not know: refused"
    c.upsert_pod(pod("a"))
    assert c.set_report(key, "a", fields) is not None, "no status loaded: refused"
    c.gangs[key].status = GangStatus(epoch=4)
    assert c.set_report(key, "a", fields) is None
    assert c.gangs[key].pods["a"].reported_epoch == 3
    c.upsert_pod(pod("a"))  # a status change of the pod: the channel's report stays merged
    assert c.gangs[key].pods["a"].reported_epoch == 3
    c.upsert_pod(reported("a", 4))  # the channel failed: epoch 4 written on the pod wins
    assert c.gangs[key].pods["a"].reported_epoch == 4
    c.upsert_pod(pod("b", index=1))
    assert c.set_report(key, "b", fields) is None
    c.replace_pods([pod("a")])  # b gone while the watch was down: so is its report
    assert set(c.gangs[key].reports) == {"a"}
    c.upsert_pod(pod("a"), deleted=True)
    assert c.gangs[key].reports == {}


def test_the_last_report_an_epoch_waits_for_is_flagged_once() -> None:
    c = cache_with_gang()
    key = ("ns", "train")
    for i, uid in enumerate("abc"):
        c.upsert_pod(pod(uid, index=i))
    epoch4 = AgentReport(reported_epoch=4, reported_steps=(200,))
    epoch3 = AgentReport(reported_epoch=3, reported_steps=(200,))
    epoch5 = AgentReport(reported_epoch=5, reported_steps=(200,))
    last, awaited, other = EpochReport.LAST, EpochReport.AWAITED, EpochReport.OTHER

    def report(uid: str, fields: AgentReport) -> EpochReport:
        assert c.set_report(key, uid, fields) is None
        return c.epoch_report(key, uid)

    assert c.epoch_report(key, "a") is other, "no status loaded yet: no hint"
    c.gangs[key].status = GangStatus(epoch=4)
    assert [report(u, epoch4) for u in "ab"] == [awaited, awaited]
    assert report("a", epoch4) is other, "a report again: still waiting for c"
    assert report("c", epoch3) is other, "a report of another epoch does not count"
    assert report("c", epoch4) is last, "the last one"
    assert report("c", epoch4) is other, "once per epoch: a resent report is no news"
    c.gangs[key].status = GangStatus(epoch=5)
    assert [report(u, epoch5) for u in "abc"] == [awaited, awaited, last]


def test_taking_a_report_whole_is_keeping_it_then_hearing_the_agent_then_its_news() -> None:
    """ClusterCache.take_report (the channel's path) answers what set_report, heartbeat and
    epoch_report answer one after the other, on two caches given the same reports, refusals
    included (an unknown pod, no status yet, a report ahead of the gang)."""
    caches = [cache_with_gang(), cache_with_gang()]
    key = ("ns", "train")
    rng = random.Random(59)
    for c in caches:
        for i, uid in enumerate("abcd"):
            c.upsert_pod(pod(uid, index=i))
    for turn in range(200):
        uid = rng.choice("abcdx")  # x: no pod of the gang
        report = AgentReport(reported_epoch=rng.randint(2, 6), reported_steps=(turn,))
        if turn == 20:
            for c in caches:
                c.gangs[key].status = GangStatus(epoch=4)
        elif turn > 20 and rng.random() < 0.05:
            epoch = rng.randint(4, 6)
            for c in caches:
                c.gangs[key].status = GangStatus(epoch=epoch)
        whole, apart = caches
        refused = apart.set_report(key, uid, report)
        expected: tuple[str | None, str | None, EpochReport] = (refused, None, EpochReport.OTHER)
        if refused is None:
            expected = (None, apart.heartbeat(key, uid, 1.0)[1], apart.epoch_report(key, uid))
        assert whole.take_report(key, uid, report, 1.0) == expected, (turn, uid, report)
        assert whole.gangs[key].pods == apart.gangs[key].pods


def test_members_coming_and_going_or_reporting_on_pods_keep_the_last_report_flagged() -> None:
    """The epoch's count follows the member pods: one gone (replaced) is not waited for, its
    replacement is, and one whose report came on its pod (the channel failed it) is counted."""
    c = cache_with_gang()
    key = ("ns", "train")
    for i, uid in enumerate("abc"):
        c.upsert_pod(pod(uid, index=i))
    c.gangs[key].status = GangStatus(epoch=4)
    epoch4 = AgentReport(reported_epoch=4, reported_steps=(200,))
    assert c.set_report(key, "a", epoch4) is None
    assert c.epoch_report(key, "a") is EpochReport.AWAITED
    c.upsert_pod(pod("b", index=1), deleted=True)
    c.upsert_pod(pod("b2", index=1))  # its replacement
    c.upsert_pod(reporting_pod(2, 4, uid="c"))  # c's report on its pod
    assert c.set_report(key, "b2", epoch4) is None
    assert c.epoch_report(key, "b2") is EpochReport.LAST
    c.gangs[key].status = GangStatus(epoch=5)
    epoch5 = AgentReport(reported_epoch=5, reported_steps=(200,))
    for uid in ("a", "b2"):
        assert c.set_report(key, uid, epoch5) is None
        c.epoch_report(key, uid)
    c.replace_pods([pod("a", index=0), pod("b2", index=1)])  # c gone while the watch was down
    assert c.set_report(key, "b2", epoch5) is None
    assert c.epoch_report(key, "b2") is EpochReport.OTHER, "b2 was counted already"
    assert c.gangs[key].behind == set(), "c is not waited for any more"


def test_owner_uids_decide_membership_not_labels() -> None:
    c = cache_with_gang()
    key = ("ns", "train")
    gang = c.gangs[key]
    c.upsert_pod(pod("a", index=0))
    c.upsert_pod(pod("forged", index=1, job="job-of-nobody"))  # member 1's labels, no real Job
    c.upsert_pod(pod("stray", index=1, job=""))  # no controlling Job at all
    c.upsert_job(JobEntry("job-other", "another-jobset"))
    c.upsert_pod(pod("other", index=1, job="job-other"))  # a Job of another JobSet
    assert set(c.members(gang)) == {"a"}
    snap = c.snapshot(gang, NOW)
    assert snap is None  # no status loaded yet; membership is what the snapshot would take
    gang.status = GangStatus(epoch=1)
    snap = c.snapshot(gang, NOW)
    assert snap is not None
    assert [p.uid for p in snap.pods] == ["a"]
    fields = AgentReport(reported_epoch=1)
    assert c.set_report(key, "a", fields) is None
    assert c.set_report(key, "forged", fields) is not None, "no report taken from a non-member"


def test_a_pod_becomes_a_member_when_its_job_is_seen_and_stays_while_the_job_goes() -> None:
    c = cache_with_gang()
    gang = c.gangs[("ns", "train")]
    c.upsert_pod(pod("n", index=1, job="job-new"))  # its Job's event has not arrived yet
    assert "n" not in c.members(gang)
    assert c.upsert_job(JobEntry("job-new", "js")), "membership changed: plan the gang"
    assert not c.upsert_job(JobEntry("job-new", "js")), "a status update of the Job: no change"
    assert "n" in c.members(gang)
    assert not c.upsert_job(JobEntry("job-new", "js"), deleted=True), "its pod is still there"
    assert "n" in c.members(gang), "a deleted Job's pods stay members until they go"
    c.upsert_pod(pod("n", index=1, job="job-new"), deleted=True)
    assert "job-new" not in c.jobs, "forgotten with its last pod"
    assert "job-new" not in c.job_pods


def test_replace_jobs_keeps_a_missing_job_only_while_its_pods_are_cached() -> None:
    c = cache_with_gang()
    gang = c.gangs[("ns", "train")]
    c.upsert_pod(pod("a", index=0))
    c.replace_jobs([JobEntry("job-1", "js")])  # 0 and 2 deleted while the watch was down
    assert "a" in c.members(gang)
    assert set(c.jobs) == {"job-0", "job-1"}, "job-2 had no pod: forgotten at once"
    c.replace_pods([])
    assert set(c.jobs) == {"job-1"}


def test_job_entry_reads_the_controlling_jobset_only() -> None:
    def job(*refs: dict[str, object]) -> JobEntry:
        return job_entry({"metadata": {"uid": "j", "ownerReferences": list(refs)}})

    assert job(owner("JobSet", "jobset.x-k8s.io/v1alpha2", "js")) == JobEntry("j", "js")
    assert job(owner("JobSet", "jobset.x-k8s.io/v1alpha2", "js", controller=False)).jobset == ""
    assert job(owner("JobSet", "evil.example/v1", "js")).jobset == "", "another API group"
    assert job().jobset == ""


def test_the_addresses_of_member_pods_are_known_and_forgotten_with_them() -> None:
    """Only a member's pod (owned through its Job) makes its address one to serve first; a pod
    with a member's labels but no owner does not, nor one deleted, nor an address it left."""
    c = cache_with_gang()
    member = dataclasses.replace(pod("m0", index=0, job="job-0"), ip="10.0.0.5")
    stray = dataclasses.replace(pod("s0", index=1, job=""), ip="10.0.0.6")
    c.upsert_pod(member)
    c.upsert_pod(stray)
    assert c.is_member_address("10.0.0.5")
    assert not c.is_member_address("10.0.0.6"), "labels alone make no member"
    assert not c.is_member_address("10.0.0.7")
    c.upsert_pod(dataclasses.replace(member, ip="10.0.0.8"))  # (a pod's IP never changes; a
    assert not c.is_member_address("10.0.0.5")  # relisted entry may still differ)
    assert c.is_member_address("10.0.0.8")
    c.upsert_pod(member, deleted=True)
    assert not c.is_member_address("10.0.0.8")
    c.replace_pods([dataclasses.replace(member, ip="10.0.0.9")])
    assert c.is_member_address("10.0.0.9")
    assert c.address_pods == {"10.0.0.9": {"m0"}}


def test_a_pods_address_is_read_from_its_status() -> None:
    raw = {
        "metadata": {"uid": "u", "namespace": "ns", "name": "p", "labels": {}},
        "status": {"podIP": "10.1.2.3"},
    }
    assert pod_entry(raw).ip == "10.1.2.3"
    assert pod_entry({**raw, "status": {}}).ip == ""


def cached_gang(
    replicas: int, annotations: dict[str, str] | None = None
) -> tuple[ClusterCache, GangKey]:
    """A cache holding gang ns/train: ``replicas`` workers, each with its Job and pod u<i>."""
    c = ClusterCache()
    meta = {"name": "train", "namespace": "ns", "uid": "js", "annotations": annotations or {}}
    workers = {"name": "workers", "replicas": replicas, "template": {"spec": {}}}
    c.upsert_jobset({"metadata": meta, "spec": {"replicatedJobs": [workers]}}, Policy(), "")
    for index in range(replicas):
        c.upsert_job(JobEntry(f"job-{index}", "js"))
        c.upsert_pod(pod(f"u{index}", index=index))
    return c, ("ns", "train")


def test_a_heartbeat_says_which_slot_the_pod_holds_and_a_revoked_pod_is_not_heard() -> None:
    """Hot spares: the leader's answer renews a lease only for the slot's holder; once the
    planner decided to move a pod's slot (its uid among the recovery's recreated), its
    heartbeats are answered with no slot and not counted as heard, so the slot moves a full
    lease after the last answer that renewed it. Deleted pods keep their last answer."""
    c, key = cached_gang(3, {names.HOT_SPARES: "1"})
    g = c.gangs[key]
    g.status = GangStatus(epoch=2)
    assert c.heartbeat(key, "u1", 10.0) == (None, "workers/1/0")
    assert c.heartbeat(key, "u2", 10.0) == (None, None), "the spare holds none"
    assert c.heartbeat(key, "nobody", 10.0)[0] is not None
    # the planner moved slot 1 to position 2 (it revoked u1 in the recovery first)
    recovery = Recovery(epoch=3, started=NOW, deadline=NOW + 60, recreated={"workers/1/0": "u1"})
    g.status = GangStatus(epoch=3, recovery=recovery, slots={"workers/1/0": "workers/2/0"})
    assert c.heartbeat(key, "u1", 11.0) == (None, None)
    assert g.heard["u1"] == 10.0, "revoked: not heard"
    assert c.heartbeat(key, "u2", 11.0) == (None, "workers/1/0")
    c.report_endpoint = ReportEndpoint("https://x:1/v1/reports", "0" * 64, "l")
    c.upsert_pod(pod("u1", index=1), deleted=True)
    snap = c.snapshot(g, NOW, mono=15.0)
    assert snap is not None
    assert snap.silent["u1"] == 5.0, "its last answer is kept after the pod is gone"
    # the leader's own stalls (its loop late, its process starved) are not the agents' silence
    c.stalled += 1.5
    later = c.snapshot(g, NOW, mono=16.0)
    assert later is not None
    assert later.silent["u1"] == 4.5
    assert c.heartbeat(key, "u2", 16.0) == (None, "workers/1/0")
    after = c.snapshot(g, NOW, mono=17.0)
    assert after is not None
    assert after.silent["u2"] == 1.0, "heard after the stall: counted from then"


def test_a_new_leader_presumes_every_running_agent_heard_when_its_channel_is_named() -> None:
    """A new leader heard none of the heartbeats its predecessor did: the pods running when
    its channel is first named count as heard a lease after that (their silence from then on
    is a signal, and the fence counts from a time no lease of the predecessor's outlives);
    an agent known to have started later, a pod not running and an agent heard later are
    left as they are; a gang without spares keeps no record."""
    c, key = cached_gang(4, {names.HOT_SPARES: "1"})
    g = c.gangs[key]
    g.status = GangStatus(epoch=2)
    c.report_endpoint = ReportEndpoint("https://x:1/v1/reports", "0" * 64, "l")
    named = NOW + 30.0

    def started(uid: str, at: float | None, phase: str = "Running") -> None:
        g.pods[uid] = dataclasses.replace(g.pods[uid], agent_started=at, phase=phase)

    started("u0", named - 100.0)
    started("u1", named + 1.0)  # its agent started after: it reads the endpoint on start
    started("u2", named - 100.0, phase="Pending")
    started("u3", None)  # its agent is restarting (silent for the predecessor too)
    c.stalled = 0.5
    c.presume_heard(g, named, mono=500.0)
    presumed = 500.0 + names.LEASE_S - 0.5
    assert g.heard == {"u0": presumed, "u3": presumed}
    snap = c.snapshot(g, named + 6.0, mono=506.0)
    assert snap is not None
    assert snap.silent == dict.fromkeys(("u0", "u3"), 6.0 - names.LEASE_S)
    assert c.heartbeat(key, "u0", 501.0)[0] is None  # it reached this leader: from then on
    assert g.heard["u0"] == 501.0 - 0.5
    plain, plain_key = cached_gang(2)
    plain.report_endpoint = c.report_endpoint
    for uid in ("u0", "u1"):
        pg = plain.gangs[plain_key]
        pg.pods[uid] = dataclasses.replace(pg.pods[uid], agent_started=named - 100.0)
    plain.presume_heard(plain.gangs[plain_key], named, mono=500.0)
    assert plain.gangs[plain_key].heard == {}, "no spares: no heartbeats to count"


def test_only_the_spares_replicated_job_is_heard() -> None:
    """Only the agents of the spares' replicatedJob hold a lease and heartbeat: a report of
    another replicatedJob's member is no heartbeat (it would count as silent 2 s later and
    lose its pod to a spare of another template), and a new leader presumes none of them."""
    c = ClusterCache()
    meta = {
        "name": "train",
        "namespace": "ns",
        "uid": "js",
        "annotations": {names.HOT_SPARES: "1", names.HOT_SPARES_JOB: "workers"},
    }
    jobs = [
        {"name": "driver", "replicas": 1, "template": {"spec": {}}},
        {"name": "workers", "replicas": 3, "template": {"spec": {}}},
    ]
    c.upsert_jobset({"metadata": meta, "spec": {"replicatedJobs": jobs}}, Policy(), "")
    key = ("ns", "train")
    for index in range(3):
        c.upsert_job(JobEntry(f"job-{index}", "js"))
        c.upsert_pod(pod(f"u{index}", index=index))
    c.upsert_job(JobEntry("job-d", "js"))
    c.upsert_pod(pod("d0", job="job-d", rj="driver"))
    g = c.gangs[key]
    g.status = GangStatus(epoch=2)
    c.report_endpoint = ReportEndpoint("https://x:1/v1/reports", "0" * 64, "l")
    assert g.pods["d0"].member == "driver/0/0"
    assert c.heartbeat(key, "d0", 10.0) == (None, "driver/0/0"), "answered, not heard"
    assert c.heartbeat(key, "u1", 10.0)[0] is None
    assert set(g.heard) == {"u1"}
    c.presume_heard(g, NOW, mono=20.0)
    assert set(g.heard) == {"u0", "u1", "u2"}, "the spares' replicatedJob, the spare too"


def test_a_progress_note_is_kept_under_its_slot_after_the_pod_goes() -> None:
    """How far a member's trainers are, noted by its agent over the channel while the epoch
    runs, outlives the pod (its node died: goodput accounts the epoch from the note); a note
    of another epoch or from a pod whose slot is being given away is not kept."""
    c, key = cached_gang(3, {names.HOT_SPARES: "1"})
    g = c.gangs[key]
    g.status = GangStatus(epoch=2)
    first, newer = ProgressSpan(1, NOW, 5, NOW + 2), ProgressSpan(1, NOW, 60, NOW + 30)
    assert c.progress_note(key, "u0", (2, first), 10.0) == (None, "workers/0/0")
    assert c.progress_note(key, "u0", (2, newer), 40.0) == (None, "workers/0/0")
    assert g.heard["u0"] == 40.0, "a note is heard as a heartbeat is"
    assert c.progress_note(key, "u1", (1, first), 40.0) == (None, "workers/1/0")
    assert c.progress_note(key, "nobody", (2, first), 40.0)[0] is not None
    c.upsert_pod(pod("u0", index=0), deleted=True)
    snap = c.snapshot(g, NOW)
    assert snap is not None
    assert snap.progress_noted == {"workers/0/0": (2, newer)}, "kept; the older epoch's not"
    recovery = Recovery(epoch=3, started=NOW, deadline=NOW + 60, recreated={"workers/1/0": "u1"})
    g.status = GangStatus(epoch=3, recovery=recovery)
    assert c.progress_note(key, "u1", (3, first), 41.0) == (None, None)
    assert set(g.noted) == {"workers/0/0"}, "a pod being replaced notes nothing"


def reporting_pod(index: int, epoch: int | None, uid: str | None = None) -> PodEntry:
    """Member ``index``'s pod (uid ``uid``, default ``u<index>``) with its agent's report of
    ``epoch`` on it (None: nothing on the pod)."""
    entry = pod(uid or f"u{index}", index=index)
    assert entry.view is not None
    if epoch is None:
        return entry
    on_pod = entry.view.with_report(AgentReport(reported_epoch=epoch, reported_steps=(epoch,)))
    return dataclasses.replace(entry, view=dataclasses.replace(on_pod, pod_report_epoch=epoch))


_epochs = st.integers(min_value=1, max_value=6)
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("status"), _epochs, st.just(0)),
        st.tuples(st.just("pod"), st.one_of(st.none(), _epochs), st.integers(0, 2)),
        st.tuples(st.just("report"), _epochs, st.integers(0, 2)),
        st.tuples(st.just("exit"), _epochs, st.integers(0, 2)),
        st.tuples(st.just("gone"), st.just(0), st.integers(0, 2)),
        st.tuples(st.just("relist"), st.just(0), st.just(0)),
        st.tuples(st.just("plan"), st.just(0), st.just(0)),
    ),
    max_size=25,
)


@given(_operations)
@example([("status", 2, 0), ("plan", 0, 0), ("status", 1, 0), ("pod", 2, 0), ("status", 2, 0)])
@settings(max_examples=300, deadline=None)
def test_each_members_view_is_made_for_the_gangs_current_epoch(
    operations: list[tuple[str, int | None, int]],
) -> None:
    """The cache makes a view again at a new epoch only where a report it holds is ahead of
    an epoch (ClusterCache._merged): whatever the reports on pods (ahead of the gang's epoch,
    forged or stale), over the channel, the pods gone and back, and the epoch going up or down
    (a GangState made again), each view is the one made from scratch at the current epoch."""
    c, key = cached_gang(3)
    g = c.gangs[key]
    g.status = GangStatus(epoch=1)
    present = {0, 1, 2}
    for op, epoch, index in operations:
        if op == "status":
            assert epoch is not None
            g.status, g.announced_epoch = GangStatus(epoch=epoch), 0
        elif op == "pod":
            c.upsert_pod(reporting_pod(index, epoch))
            present.add(index)
        elif op in ("report", "exit") and index in present:
            report = (
                AgentReport(reported_epoch=epoch, reported_steps=(epoch or 0,))
                if op == "report"
                else AgentReport(exited_in_epoch=epoch)
            )
            c.set_report(key, f"u{index}", report)
        elif op == "gone":
            c.upsert_pod(pod(f"u{index}", index=index), deleted=True)
            present.discard(index)
        elif op == "relist":
            c.replace_pods([reporting_pod(i, None) for i in sorted(present)])
        if op == "plan":  # views are checked when a pass takes them (between, they may lag)
            check(c, g, present)
    check(c, g, present)


def check(c: ClusterCache, g: Gang, present: set[int]) -> None:
    snap = c.snapshot(g, NOW)
    assert snap is not None
    for uid, on_pod in g.on_pod.items():
        assert g.pods[uid] == member_view(on_pod, g.reports.get(uid), g.epoch), uid
    assert set(g.pods) == {f"u{i}" for i in present}


def test_a_change_of_a_nodes_labels_alone_is_no_change_the_planner_acts_on() -> None:
    c = ClusterCache()
    base = node("n1")
    assert c.upsert_node(base)
    assert not c.upsert_node(dataclasses.replace(base, labels=(("gfd.timestamp", "1"),)))
    assert c.nodes["n1"].labels == (("gfd.timestamp", "1"),), "kept, for the spares' judgement"
    assert c.upsert_node(dataclasses.replace(base, ready="False"))


def test_a_node_that_opens_plans_the_gangs_with_spares_only() -> None:
    """A node that opens holds none of a gang's pods, but may take a spare that shares a node
    with a holder: the watch plans every gang with spares (and only those) when a node appears
    or opens, not on its other updates."""
    c = cache_with_gang()
    spared = {
        "metadata": {
            "name": "spared",
            "namespace": "ns",
            "uid": "js2",
            "annotations": {names.HOT_SPARES: "1"},
        },
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 3, "template": {"spec": {}}}]},
    }
    c.upsert_jobset(spared, Policy(), "")
    poked: list[GangKey] = []
    r = SimpleNamespace(cache=c, poke=lambda key, *a, **kw: poked.append(key))
    base = dataclasses.replace(node("n9"), opened_at=NOW)
    node_events(cast("Reconciler", r), [("ADDED", base)])
    assert poked == [("ns", "spared")]
    poked.clear()
    node_events(cast("Reconciler", r), [("MODIFIED", dataclasses.replace(base, ready="False"))])
    assert poked == [], "closed, and no gang's pod on it"
    node_events(cast("Reconciler", r), [("MODIFIED", dataclasses.replace(base, opened_at=NOW + 5))])
    assert poked == [("ns", "spared")]


def test_a_gangs_members_are_sorted_once_per_spec_not_per_pass() -> None:
    """The members' order is the spec's, made once (every pass walks it); a Kueue-managed
    gang's spec (its Kueue part added in each snapshot) stays the same object while nothing
    in it changed, so its order is not made again either."""
    c = cache_with_gang()
    gang = c.gangs["ns", "train"]
    gang.status = GangStatus()
    first = c.snapshot(gang, time.time())
    assert first is not None
    assert first.gang.ordered == tuple(sorted(first.gang.members))
    assert first.gang.ordered is gang.spec.ordered
    gang.kueue_managed = True
    kueue = [c.snapshot(gang, time.time()) for _ in range(2)]
    assert kueue[0] is not None
    assert kueue[1] is not None
    assert kueue[0].gang.kueue_recovery_timeout_s is not None
    assert kueue[1].gang is kueue[0].gang
    gang.kueue_stand_down = "Kueue evicted the Workload (Preempted)"
    evicted = c.snapshot(gang, time.time())
    assert evicted is not None
    assert evicted.gang.kueue_stand_down == gang.kueue_stand_down, "a change is seen at once"
