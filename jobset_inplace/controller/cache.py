"""The controller's in-memory view of the cluster, fed by watch events: opted-in JobSets,
their pods (as small :class:`~jobset_inplace.core.model.PodView` values, indexed by JobSet),
nodes and node Lease renewals, and the DRA device taints and allocations planned moves read
(core.device_taints). Building a snapshot for one gang touches only that gang's pods."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobset_inplace import names
from jobset_inplace.core import device_taints as dt
from jobset_inplace.core.decode import (
    KUEUE_V1BETA2_PODS_READY_TIMEOUT_S,
    carry_opening,
    controller_uid,
    gang_spec,
    member_view,
    node_view,
    pod_view,
)
from jobset_inplace.core.gangmembers import MemberRow
from jobset_inplace.core.model import (
    GangSpec,
    GangStatus,
    NodeView,
    PodView,
    ReportEndpoint,
    Snapshot,
)
from jobset_inplace.core.policy import Policy, PolicyError
from jobset_inplace.core.spares import moved_positions, spares_job
from jobset_inplace.protocol.report import AgentReport, newer_report
from jobset_inplace.trainer.progress import ProgressSpan

GangKey = tuple[str, str]  # (namespace, JobSet name)
POSTED_MAX = 1000  # once-only Event keys remembered per gang


class EpochReport(enum.Enum):
    """What a report the channel just took is to its gang's current epoch (a scheduling
    hint: :meth:`ClusterCache.epoch_report`)."""

    LAST = "last"  # the last one the epoch waited for: plan now
    AWAITED = "awaited"  # one it waited for, more to come
    OTHER = "other"  # of another epoch, the same again, or from a pod it does not wait for


@dataclass(frozen=True)
class PodEntry:
    """What the cache keeps of a pod, decoded on the watch thread (a listed or watched pod's
    JSON is dropped at once: 5000 of them decoded take ~100 MiB)."""

    uid: str
    key: GangKey | None  # (namespace, JobSet label); None: not a JobSet's pod
    view: PodView | None  # None: not a gang member
    job: str = ""  # UID of the Job controlling the pod ("": none); see ClusterCache.is_member
    ip: str = ""  # status.podIP ("": none yet)


def pod_entry(pod: Mapping[str, Any]) -> PodEntry:
    meta = pod["metadata"]
    jobset = (meta.get("labels") or {}).get(names.JOBSET_NAME_LABEL)
    key = (meta["namespace"], jobset) if jobset else None
    job = controller_uid(meta, "Job", "batch")
    ip = str((pod.get("status") or {}).get("podIP") or "")
    return PodEntry(meta["uid"], key, pod_view(pod) if key else None, job, ip)


@dataclass(frozen=True)
class JobEntry:
    """What the cache keeps of a JobSet's Job: its UID and its controlling JobSet's."""

    uid: str
    jobset: str  # "": no JobSet controls it


def job_entry(job: Mapping[str, Any]) -> JobEntry:
    meta = job["metadata"]
    return JobEntry(meta["uid"], controller_uid(meta, "JobSet", "jobset.x-k8s.io"))


@dataclass(frozen=True)
class ClaimEntry:
    key: tuple[str, str]  # (namespace, name)
    pod: str  # the UID of the pod it was made for ("": none)
    devices: tuple[dt.Allocated, ...]


def claim_entry(claim: Mapping[str, Any]) -> ClaimEntry:
    return ClaimEntry(dt.claim_key(claim), dt.claim_owner(claim), dt.claim_devices(claim))


@dataclass(frozen=True)
class SliceEntry:
    name: str
    taints: dict[dt.DeviceRef, tuple[dt.Taint, ...]]


def slice_entry(resource_slice: Mapping[str, Any]) -> SliceEntry:
    name = str((resource_slice.get("metadata") or {}).get("name") or "")
    return SliceEntry(name, dt.slice_taints(resource_slice))


@dataclass(frozen=True)
class RuleEntry:
    name: str
    rule: dt.TaintRule | None  # None: one core.device_taints cannot evaluate


def rule_entry(rule: Mapping[str, Any]) -> RuleEntry:
    return RuleEntry(str((rule.get("metadata") or {}).get("name") or ""), dt.taint_rule(rule))


def node_entry(node: Mapping[str, Any]) -> NodeView:
    """A node's view, decoded on the watch thread (its Lease renewal comes from the cache)."""
    return node_view(node, None, time.time())


# How long the time an agent was last heard is kept after that (hot spares: its pod may be
# gone; its slot is given away LEASE_S + FENCE_MARGIN_S after it, long before this).
HEARD_KEPT_S = 300.0


@dataclass
class Gang:
    key: GangKey
    spec: GangSpec
    policy: Policy | None  # None: the annotations are malformed (reported, nothing done)
    policy_error: str = ""
    jobset: dict[str, Any] = field(default_factory=dict)
    # uid -> view, with its agent's report over the channel merged in (with_channel_report)
    pods: dict[str, PodView] = field(default_factory=dict)
    # uid -> the agent's newest report over the channel, for pods in `pods`
    reports: dict[str, AgentReport] = field(default_factory=dict)
    # uid -> the view of its pod alone (as decoded), for the pods in `pods`; and the gang epoch
    # their views in `pods` were last checked for (_merged: what is valid and what ranks newer
    # depend on it, core.decode.member_view)
    on_pod: dict[str, PodView] = field(default_factory=dict)
    merged_for: int | None = None
    # members whose view was made with a report that names an epoch beyond the gang's then (a
    # forged or stale one): theirs depends on the epoch, made again whenever it moves; and the
    # newest epoch any report of the gang named so far (-1: none; only ever grows)
    ahead: set[str] = field(default_factory=set)
    newest_named: int = -1
    # counts every change of a member's view or of the set of pods (ClusterCache.rows_stamp):
    # the GangMembers rows are made again only after one
    changes: int = 0
    status: GangStatus | None = None  # last persisted; None until loaded from the API
    # the newest epoch this process has begun to write (set before the write returns: an agent
    # may read it from the API first); 0 once the GangState is to be loaded again
    announced_epoch: int = 0
    kueue_stand_down: str = ""  # from the JobSet's Kueue Workload (decode.kueue_stand_down)
    kueue_managed: bool = False  # Kueue made a Workload for it
    kueue_spec: GangSpec | None = None  # its spec with Kueue's part, as last planned
    # keys of once-only Events posted (insertion-ordered; the oldest go beyond POSTED_MAX)
    posted: dict[str, None] = field(default_factory=dict)
    status_written_at: float = 0.0  # wall time of this process's last status write
    # wall time of this process's first status write that named its report channel (0: none
    # yet): the agents can have sent their reports again only after it (Snapshot.reports_since)
    endpoint_named_at: float = 0.0
    # uid -> when (monotonic) this leader last took a report or heartbeat of that pod's agent
    # (or presumed one: presume_heard)
    heard: dict[str, float] = field(default_factory=dict)
    # slot -> (epoch, progress span) its agent last noted over the channel while that epoch
    # ran (progress_note); kept when the pod goes: Snapshot.progress_noted
    noted: dict[str, tuple[int, ProgressSpan]] = field(default_factory=dict)
    # members whose report is behind `behind_epoch` (epoch_report's hint)
    behind: set[str] = field(default_factory=set)
    behind_epoch: int | None = None
    # the GangMembers rows this process last wrote (or failed to: retried when one changes),
    # and when (monotonic); the rows_stamp they were last made at
    members_written: tuple[MemberRow, ...] | None = None
    members_written_at: float | None = None
    members_stamp: tuple[int, int] | None = None

    @property
    def uid(self) -> str:
        return str(self.jobset.get("metadata", {}).get("uid") or "")

    @property
    def epoch(self) -> int | None:
        """The newest epoch an agent may have read from this gang's GangState (None: its
        status is not loaded): no honest report names a later one."""
        if self.status is None:
            return None
        return max(self.status.epoch, self.announced_epoch)

    def remember_posted(self, keys: Iterable[str]) -> None:
        """Record once-only Events as posted; memory stays bounded (a pod writing garbage
        reports could otherwise grow it forever): the oldest keys are forgotten first."""
        for key in keys:
            self.posted[key] = None
        while len(self.posted) > POSTED_MAX:
            del self.posted[next(iter(self.posted))]


@dataclass
class ClusterCache:
    gangs: dict[GangKey, Gang] = field(default_factory=dict)
    # counts every change of the JobSets' uids or of the Jobs they own (what is_member reads)
    membership_changes: int = 0
    # Kueue's recoveryTimeout from its configuration (None: it never evicts a recovery), once
    # read; until then (or when it cannot be read) its v1beta2 default is assumed (override per
    # JobSet: jobset-inplace.dev/kueue-recovery-timeout).
    kueue_recovery_timeout_s: float | None = None
    kueue_config_read: bool = False
    nodes: dict[str, NodeView] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    lease_reads: dict[str, float] = field(default_factory=dict)  # node -> last direct read
    # Since when the controller has watched node Leases without a break (its start, or the end
    # of an outage): a renewal it could not have seen does not make a node silent.
    leases_observed_since: float = 0.0
    # Pods seen before their JobSet (watch order is arbitrary), kept until it shows up.
    orphans: dict[GangKey, dict[str, PodView]] = field(default_factory=dict)
    # this leader's report channel, advertised in every gang's status (None: not served)
    report_endpoint: ReportEndpoint | None = None
    # when this process started leading (the earliest Snapshot.reports_since)
    reports_since: float = 0.0
    # Seconds this leader's event loop ran late so far (report_server.measure_stalls): it
    # could not hear heartbeats then. Silence is counted without them, so a busy leader (or a
    # starved process) does not take its own delay for its agents' silence: a heartbeat
    # waiting unread in a socket is not a dead node. It can only lengthen a silence's start,
    # never shorten the fence (which needs that much silence).
    stalled: float = 0.0
    # Membership by ownership (is_member): Job UID -> its controlling JobSet's UID; pod UID ->
    # its controlling Job's UID; how many cached pods name each Job (a deleted Job is kept
    # while its pods are, so that they stay members until they are gone too).
    jobs: dict[str, str] = field(default_factory=dict)
    pod_jobs: dict[str, str] = field(default_factory=dict)
    job_pods: Counter[str] = field(default_factory=Counter)
    gone_jobs: set[str] = field(default_factory=set)
    # The addresses of the cached gang pods (is_member_address): pod UID -> (address, its gang);
    # address -> the pod UIDs at it (host-network pods share their node's)
    pod_addresses: dict[str, tuple[str, GangKey]] = field(default_factory=dict)
    address_pods: dict[str, set[str]] = field(default_factory=dict)
    # DRA, where served (core.device_taints): the devices allocated to the pods' own
    # ResourceClaims, by pod UID and claim; the tainted devices of each ResourceSlice that has
    # any; DeviceTaintRules
    claims: dict[str, dict[tuple[str, str], tuple[dt.Allocated, ...]]] = field(default_factory=dict)
    slice_taints: dict[str, dict[dt.DeviceRef, tuple[dt.Taint, ...]]] = field(default_factory=dict)
    taint_rules: dict[str, dt.TaintRule] = field(default_factory=dict)

    def upsert_jobset(self, jobset: Mapping[str, Any], policy: Policy | None, error: str) -> Gang:
        try:
            spec = gang_spec(jobset)
        except PolicyError as e:  # its spares malformed: no planning, as for its policy's
            spec, policy, error = gang_spec(jobset, spares=False), None, error or str(e)
        key = (spec.namespace, spec.name)
        gang = self.gangs.get(key)
        if gang is None:
            pods = self.orphans.pop(key, {})
            gang = Gang(key, spec, policy, error, pods=pods, on_pod=dict(pods))
            self.gangs[key] = gang
        gang.spec, gang.policy, gang.policy_error = spec, policy, error
        self.membership_changes += 1
        gang.jobset = {
            "apiVersion": jobset.get("apiVersion", "jobset.x-k8s.io/v1alpha2"),
            "kind": jobset.get("kind", "JobSet"),
            "metadata": {k: jobset["metadata"][k] for k in ("name", "namespace", "uid")},
        }
        return gang

    def forget_jobset(self, key: GangKey) -> None:
        self.gangs.pop(key, None)
        self.orphans.pop(key, None)

    def is_member(self, gang: Gang, pod_uid: str) -> bool:
        """A pod is a member of ``gang`` only through its owners' UIDs (pod -> Job -> JobSet):
        a pod anyone made with a member's labels is not one (nothing is planned on it, no
        report is taken from it). Until its Job is seen, a new pod is not a member yet."""
        owner = self.jobs.get(self.pod_jobs.get(pod_uid, ""), "")
        return bool(owner) and owner == gang.uid

    def members(self, gang: Gang) -> dict[str, PodView]:
        """``gang``'s pods that are its members (:meth:`is_member`, its owner's UID read once:
        this runs over every pod in every planning pass)."""
        owner, jobs, pod_jobs = gang.uid, self.jobs, self.pod_jobs
        if not owner:
            return {}
        return {u: v for u, v in gang.pods.items() if jobs.get(pod_jobs.get(u, "")) == owner}

    def rows_stamp(self, gang: Gang) -> tuple[int, int]:
        """Equal at two moments only if no member of ``gang`` can have changed between them
        (a view made, a pod gone, a Job or JobSet seen): what its GangMembers rows are made of
        (core.gangmembers.member_rows) is the same then. Counted, not compared: comparing the
        rows is O(members), and a planning pass must not be."""
        return gang.changes, self.membership_changes

    def upsert_job(self, job: JobEntry, deleted: bool = False) -> bool:
        """Record a Job event; whether membership may have changed (a new Job, or one gone
        with no pod left)."""
        if deleted:
            self.gone_jobs.add(job.uid)
            return self._forget_job(job.uid)
        changed = self.jobs.get(job.uid) != job.jobset
        self.jobs[job.uid] = job.jobset
        self.gone_jobs.discard(job.uid)
        self.membership_changes += changed
        return changed

    def replace_jobs(self, jobs: Sequence[JobEntry]) -> None:
        """A complete list of the JobSets' Jobs (a relist): others are gone once their pods
        are."""
        listed = {j.uid: j.jobset for j in jobs}
        self.gone_jobs = {u for u in self.jobs if u not in listed}
        self.jobs.update(listed)
        self.membership_changes += 1
        for uid in list(self.gone_jobs):
            self._forget_job(uid)

    def _forget_job(self, uid: str) -> bool:
        if uid in self.gone_jobs and not self.job_pods[uid]:
            self.gone_jobs.discard(uid)
            self.job_pods.pop(uid, None)
            self.membership_changes += 1
            return self.jobs.pop(uid, None) is not None
        return False

    def is_member_address(self, address: str) -> bool:
        """Whether a current member pod of a cached gang has ``address`` (the report channel
        does not hold their handshakes: report_limits.HandshakeGate). Safe while the
        prime fills the cache on another thread (copies taken under the GIL)."""
        for uid in tuple(self.address_pods.get(address, ())):
            where = self.pod_addresses.get(uid)
            gang = self.gangs.get(where[1]) if where is not None else None
            if gang is not None and self.is_member(gang, uid):
                return True
        return False

    def _at_address(self, pod_uid: str, where: tuple[str, GangKey] | None) -> None:
        """Record (``where``: its address and gang) or drop (None) a cached pod's address."""
        old = self.pod_addresses.pop(pod_uid, None)
        if old is not None:
            uids = self.address_pods[old[0]]
            uids.discard(pod_uid)
            if not uids:
                del self.address_pods[old[0]]
        if where is not None and where[0]:
            self.pod_addresses[pod_uid] = where
            self.address_pods.setdefault(where[0], set()).add(pod_uid)

    def _owned_by(self, pod_uid: str, job: str | None) -> None:
        """Record (``job``) or drop (None) the Job controlling a cached pod."""
        old = self.pod_jobs.pop(pod_uid, None)
        if old is not None:
            self.job_pods[old] -= 1
            self._forget_job(old)
        if job:
            self.pod_jobs[pod_uid] = job
            self.job_pods[job] += 1

    def upsert_pod(self, pod: PodEntry, deleted: bool = False) -> GangKey | None:
        """Record a pod event; returns the gang it belongs to."""
        if pod.key is None:
            return None
        self._owned_by(pod.uid, None if deleted or pod.view is None else pod.job)
        self._at_address(pod.uid, None if deleted or pod.view is None else (pod.ip, pod.key))
        gang = self.gangs.get(pod.key)
        pods = gang.pods if gang is not None else self.orphans.setdefault(pod.key, {})
        if deleted or pod.view is None:
            pods.pop(pod.uid, None)
            if gang is not None:
                gang.changes += 1
                gang.reports.pop(pod.uid, None)
                gang.on_pod.pop(pod.uid, None)
                gang.ahead.discard(pod.uid)
                self._still_behind(gang, pod.uid, present=False)
        elif gang is None:
            pods[pod.uid] = pod.view
        else:
            gang.on_pod[pod.uid] = pod.view
            self._merged(gang)  # every view made at one epoch: the one merged_for names
            self._view(gang, pod.uid, gang.epoch)
            self._still_behind(gang, pod.uid, present=True)
        return pod.key

    def replace_pods(self, pods: Sequence[PodEntry]) -> None:
        """A complete list of the labelled pods (a relist): pods not in it are gone."""
        for gang in self.gangs.values():
            gang.pods, gang.on_pod, gang.ahead = {}, {}, set()
            gang.changes += 1
        self.orphans = {}
        self.pod_jobs, self.job_pods = {}, Counter()
        self.pod_addresses, self.address_pods = {}, {}
        for pod in pods:
            self.upsert_pod(pod)
        for uid in list(self.gone_jobs):
            self._forget_job(uid)
        for gang in self.gangs.values():
            gang.reports = {u: r for u, r in gang.reports.items() if u in gang.pods}
            gang.behind.intersection_update(gang.pods)

    def heartbeat(self, key: GangKey, uid: str, at: float) -> tuple[str | None, str | None]:
        """An agent said it is alive (an empty report, or any report) at ``at`` (monotonic):
        (None, or why it is not taken: ``uid`` is not a known member pod of gang ``key``;
        the slot its pod holds, or None).

        Hot spares' fence (docs/design/hot-spares.md, section 5): the answer tells the agent
        whether its pod still holds its slot, and its lease is renewed only if it does. A pod
        whose slot the planner has decided to move (its uid among the recovery's recreated)
        holds none from then on, and its heartbeats are not counted as heard: the planner
        gives the slot away only LEASE_S + FENCE_MARGIN_S after the last answer that renewed
        its lease, whenever it decided. Only the agents of the spares' replicatedJob are
        counted as heard: the others hold no lease and send no heartbeats (their reports are
        no sign of life to wait for)."""
        gang = self.gangs.get(key)
        if gang is None or uid not in gang.pods or not self.is_member(gang, uid):
            return f"is not a known member of gang {key[1]}", None
        return None, self._heard(gang, uid, at)

    def _heard(self, gang: Gang, uid: str, at: float) -> str | None:
        """:meth:`heartbeat` of a known member pod: the slot it holds, or None."""
        view, status = gang.on_pod.get(uid), gang.status
        holds = None
        if view is not None and status is not None:
            member = view.member
            # (hot spares: no slot has moved without them)
            slot = moved_positions(status.slots).get(member, member) if status.slots else member
            holds = slot if slot in gang.spec.members else None
            rec = status.recovery
            if rec is not None and uid in rec.recreated.values():
                return None  # revoked: not heard from now on
        spares = gang.spec.spares
        if spares and spares_job(gang.pods[uid].member, spares):  # the others send no heartbeats
            gang.heard[uid] = at - self.stalled  # on the clock that stops while the leader stalls
        return holds

    def presume_heard(self, gang: Gang, named_at: float, mono: float) -> None:
        """This leader's channel was first named in ``gang``'s status at wall time
        ``named_at`` (``mono`` on the monotonic clock). Each pod of the spares' replicatedJob
        running then (its agent not known to have started after) heartbeated the leader
        before this one, which heard none of it: it counts as heard ``names.LEASE_S`` after
        ``mono``, so that its silence from then on is a signal as it was for the predecessor,
        not only its node's Lease (docs/design/hot-spares.md, section 5). That late, because
        an agent needs time to read the new endpoint and reach this leader (its heartbeat may
        be stuck with the old one, its connection refused in the burst), and one that has not
        by then holds no lease from either leader: its trainer is frozen already, so a swap
        costs the gang nothing a wait would not.

        The fence holds: a replica answers no report unless it can prove it leads
        (:class:`.report_server.ReportServer`'s ``leads``), and its successor acquires the
        Lease only once it lapsed (or was released after the channel stopped), before its
        first status write: every lease the predecessor gave ended before ``mono`` +
        ``names.LEASE_S``, the presumed heartbeat, and the slot moves ``names.LEASE_S +
        names.FENCE_MARGIN_S`` after that. An agent that starts later counts from its first
        heartbeat, as always."""
        if not gang.spec.spares or self.report_endpoint is None:
            return
        at = mono + names.LEASE_S - self.stalled
        for uid, pod in self.members(gang).items():
            started = pod.agent_started
            if (
                spares_job(pod.member, gang.spec.spares)
                and pod.phase == "Running"
                and (started is None or started <= named_at)
            ):
                gang.heard[uid] = max(gang.heard.get(uid, at), at)

    def progress_note(
        self, key: GangKey, uid: str, note: tuple[int, ProgressSpan], at: float
    ) -> tuple[str | None, str | None]:
        """An agent's note of how far its trainers are in the running epoch (``(epoch,
        span)``), heard as a heartbeat is (same answer): kept under the slot its pod holds if
        it is of the gang's current epoch (a note of an older one, or from a pod whose slot is
        being given away, is not)."""
        refused, holds = self.heartbeat(key, uid, at)
        gang = self.gangs.get(key)
        if refused is None and holds is not None and gang is not None and note[0] == gang.epoch:
            gang.noted[holds] = note
        return refused, holds

    def set_report(self, key: GangKey, uid: str, report: AgentReport) -> str | None:
        """Keep an agent's report over the channel: None, or why it is not kept (the agent
        then writes it on its pod): ``uid`` is not a known member pod of gang ``key``, the
        gang's status is not loaded here yet, or the report names an epoch beyond the gang's
        (:func:`~jobset_inplace.protocol.report.newer_report`: it would hide every later
        report)."""
        gang = self.gangs.get(key)
        if gang is None:
            return f"is not a known member of gang {key[1]}"
        return self._kept(gang, uid, report)

    def take_report(
        self, key: GangKey, uid: str, report: AgentReport, at: float
    ) -> tuple[str | None, str | None, EpochReport]:
        """One report over the channel, whole: :meth:`set_report`, then (kept) the agent
        heard (:meth:`heartbeat`: the slot its pod holds) and what the report is to the epoch
        (:meth:`epoch_report`), with the gang looked up and the pod's membership checked once:
        (None, or why it is not kept; the slot held; the news)."""
        gang = self.gangs.get(key)
        if gang is None:
            return f"is not a known member of gang {key[1]}", None, EpochReport.OTHER
        refused = self._kept(gang, uid, report)
        if refused is not None:
            return refused, None, EpochReport.OTHER
        return None, self._heard(gang, uid, at), self._news(gang, uid)

    def _kept(self, gang: Gang, uid: str, report: AgentReport) -> str | None:
        """:meth:`set_report` in ``gang``."""
        view = gang.pods.get(uid)
        if view is None or not self.is_member(gang, uid):
            return f"is not a known member of gang {gang.key[1]}"
        epoch = gang.epoch
        if epoch is None:
            return f"gang {gang.key[1]}'s state is not loaded by this leader yet"
        if report.epoch > epoch:
            return f"its report names epoch {report.epoch}, beyond the gang's {epoch}"
        if newer_report(gang.reports.get(uid), report, epoch):  # else a late one, overtaken
            gang.reports[uid] = report
            self._merged(gang)  # every view made at one epoch: the one merged_for names
            self._view(gang, uid, epoch)
        return None

    @staticmethod
    def _view(gang: Gang, uid: str, epoch: int | None) -> None:
        """Make member ``uid``'s view at the gang's epoch ``epoch`` (member_view), noting
        whether it depends on that epoch (:meth:`_merged`)."""
        on_pod, report = gang.on_pod[uid], gang.reports.get(uid)
        named = on_pod.report_order()[0]
        if report is not None:
            named = max(named, report.epoch)
        gang.pods[uid] = member_view(on_pod, report, epoch)
        gang.changes += 1
        gang.newest_named = max(gang.newest_named, named)
        if epoch is not None and named > epoch:
            gang.ahead.add(uid)
        else:
            gang.ahead.discard(uid)

    def _merged(self, gang: Gang) -> None:
        """Bring the members' views to the gang's epoch if it moved since they were checked.
        A view depends on the epoch only through whether a report it holds names a later one
        (member_view, AgentReport.rank); one made at an epoch no earlier than its reports' is
        the same at every such epoch. So only the views made with a report ahead are made again
        (none, normally: the channel takes no report ahead of the gang), unless some report
        names an epoch beyond the new one (a GangState made again starts over at 1): then all.
        (Making every view again cost ~10 us a member at each new epoch, a micro-benchmark.)"""
        epoch = gang.epoch
        if gang.merged_for == epoch:
            return
        if gang.merged_for is None or (epoch is not None and gang.newest_named > epoch):
            gang.newest_named = -1  # counted again from the views made now
            redo: Iterable[str] = list(gang.on_pod)
        else:
            redo = [uid for uid in gang.ahead if uid in gang.on_pod]
        for uid in redo:
            self._view(gang, uid, epoch)
        gang.merged_for = epoch

    def epoch_report(self, key: GangKey, uid: str) -> EpochReport:
        """What the report just kept for ``uid`` is to the gang's current epoch: the last one
        it waited for (at most once per epoch), one of those with more to come, or neither. A
        scheduling hint (:class:`EpochReport`), counted over the channel's reports from the
        first one of an epoch, the members' pods coming and going included: a hint missed (a
        report on the pod) leaves the pass to the usual spacing, one given early costs one
        pass."""
        gang = self.gangs.get(key)
        return EpochReport.OTHER if gang is None else self._news(gang, uid)

    def _news(self, gang: Gang, uid: str) -> EpochReport:
        """:meth:`epoch_report` in ``gang``."""
        if gang.status is None:
            return EpochReport.OTHER
        self._merged(gang)
        epoch, view = gang.status.epoch, gang.pods.get(uid)
        if view is None or view.reported_epoch != epoch:
            return EpochReport.OTHER
        if gang.behind_epoch != epoch:  # once per epoch: O(members)
            gang.behind = {u for u, p in self.members(gang).items() if p.reported_epoch != epoch}
            gang.behind_epoch = epoch
        elif uid in gang.behind:
            gang.behind.discard(uid)
        else:
            return EpochReport.OTHER
        return EpochReport.AWAITED if gang.behind else EpochReport.LAST

    def _still_behind(self, gang: Gang, uid: str, present: bool) -> None:
        """Keep :meth:`epoch_report`'s count as member pods come and go, or report on pods."""
        if gang.behind_epoch is None:
            return
        view = gang.pods.get(uid) if present else None
        if (
            view is None
            or view.reported_epoch == gang.behind_epoch
            or not self.is_member(gang, uid)
        ):
            gang.behind.discard(uid)
        else:
            gang.behind.add(uid)

    def upsert_node(self, node: NodeView, deleted: bool = False) -> bool:
        """Record a node event; whether the planner's view of the node changed."""
        old = self.nodes.get(node.name)
        if deleted:
            self.nodes.pop(node.name, None)
            return old is not None
        new = self.nodes[node.name] = self._node(node, old)
        if new == old:
            return False
        # a change of labels alone (some change on every update: a feature discoverer's time
        # stamp) is not one the planner acts on where the node's pods are
        return old is None or dataclasses.replace(new, labels=old.labels) != old

    def gangs_with_spares(self) -> list[GangKey]:
        """The gangs with hot spares: where a node that opens may take a spare that shares a
        node with a holder (core.planner.hot_spares)."""
        return [k for k, g in self.gangs.items() if g.spec.spares]

    def replace_nodes(self, nodes: Sequence[NodeView]) -> None:
        """A complete list of the nodes (a relist): nodes not in it are gone."""
        before, self.nodes = self.nodes, {}
        for node in nodes:
            self.nodes[node.name] = self._node(node, before.get(node.name))

    def _node(self, node: NodeView, old: NodeView | None) -> NodeView:
        """A node's new view with its Lease, and when it opened as seen from ``old``."""
        return dataclasses.replace(
            carry_opening(old, node, time.time()),
            lease_renewed=self.leases.get(node.name),
            lease_read_at=self.lease_reads.get(node.name),
        )

    def set_lease(self, node: str, renewed: float | None, read_at: float | None = None) -> None:
        """Record a Lease renewal, from the watch or (``read_at``: when) read directly; the
        node's view carries both (snapshots copy nothing)."""
        cached = self.leases.get(node)
        if renewed is None:  # no Lease: nothing to confirm either
            self.leases.pop(node, None)
            self.lease_reads.pop(node, None)
        elif read_at is None and cached is not None and renewed < cached:
            return  # a lagging watch's older renewal: a direct read already saw a newer one
        else:
            if read_at is not None:
                self.lease_reads[node] = read_at
            elif cached != renewed:  # a direct read confirmed an older renewal
                self.lease_reads.pop(node, None)
            self.leases[node] = renewed
        view = self.nodes.get(node)
        read = self.lease_reads.get(node)
        if view is not None and (view.lease_renewed, view.lease_read_at) != (renewed, read):
            self.nodes[node] = dataclasses.replace(view, lease_renewed=renewed, lease_read_at=read)

    def replace_leases(self, leases: Sequence[tuple[str, float | None]]) -> None:
        """A complete list of the node Leases, as ``lease_renewal`` decodes them (a relist):
        nodes without one have none."""
        fresh = dict(leases)
        for node in set(self.leases) - set(fresh):
            self.set_lease(node, None)
        for node, renewed in fresh.items():
            self.set_lease(node, renewed)

    # -- DRA --
    def upsert_claim(self, entry: ClaimEntry, deleted: bool = False) -> bool:
        """Record a ResourceClaim event (a pod's own, allocated); whether what it holds
        changed."""
        if not entry.pod:
            return False
        held = self.claims.get(entry.pod, {})
        old = held.get(entry.key)
        if deleted or not entry.devices:
            held.pop(entry.key, None)
            if not held:
                self.claims.pop(entry.pod, None)
            return old is not None
        self.claims.setdefault(entry.pod, {})[entry.key] = entry.devices
        return old != entry.devices

    def replace_claims(self, entries: Sequence[ClaimEntry]) -> None:
        self.claims = {}
        for e in entries:
            self.upsert_claim(e)

    def upsert_slice(self, entry: SliceEntry, deleted: bool = False) -> bool:
        """Record a ResourceSlice event; whether its tainted devices changed."""
        old = self.slice_taints.get(entry.name)
        if deleted or not entry.taints:
            self.slice_taints.pop(entry.name, None)
            return old is not None
        self.slice_taints[entry.name] = entry.taints
        return old != entry.taints

    def replace_slices(self, entries: Sequence[SliceEntry]) -> None:
        self.slice_taints = {e.name: e.taints for e in entries if e.taints}

    def upsert_rule(self, entry: RuleEntry, deleted: bool = False) -> bool:
        """Record a DeviceTaintRule event; whether the taints it puts changed."""
        old = self.taint_rules.get(entry.name)
        if deleted or entry.rule is None:
            self.taint_rules.pop(entry.name, None)
            return old is not None
        self.taint_rules[entry.name] = entry.rule
        return old != entry.rule

    def replace_rules(self, entries: Sequence[RuleEntry]) -> None:
        self.taint_rules = {e.name: e.rule for e in entries if e.rule is not None}

    def gangs_with_claims(self, pod: str | None = None) -> list[GangKey]:
        """Gangs some of whose pods have claims of their own (``pod``: that pod's gang): the
        ones a device taint or allocation can concern."""
        if pod is not None:
            return [k for k, g in self.gangs.items() if pod in g.pods]
        return [k for k, g in self.gangs.items() if any(u in self.claims for u in g.pods)]

    def devices_leaving(self, pods: Iterable[PodView]) -> dict[str, str]:
        """Pod UID -> why it should move: a device its own claims hold is tainted NoSchedule."""
        with_claims = [p for p in pods if p.uid in self.claims]
        if not with_claims:
            return {}
        in_slices = {d: t for taints in self.slice_taints.values() for d, t in taints.items()}
        out: dict[str, str] = {}
        for p in with_claims:
            held = [a for devices in self.claims[p.uid].values() for a in devices]
            if why := dt.why_leaving(held, in_slices, self.taint_rules.values()):
                out[p.uid] = why
        return out

    def gangs_on_node(self, node: str) -> list[GangKey]:
        return [k for k, g in self.gangs.items() if any(p.node == node for p in g.pods.values())]

    def reports_heard_since(self, gang: Gang, now: float) -> float:
        """Since when this leader can have heard every report of ``gang``'s agents: from when
        its status first named this leader's channel (or none, where it serves none), not from
        the leader's start: reports sent to the leader before went over its channel only, and
        agents send them again once they read the new endpoint. Not named yet: ``now`` (the
        wait has not begun)."""
        if gang.endpoint_named_at:
            return max(self.reports_since, gang.endpoint_named_at)
        if gang.status is not None and gang.status.report_endpoint == self.report_endpoint:
            return self.reports_since  # named before this process wrote anything
        return max(self.reports_since, now)

    def snapshot(self, gang: Gang, now: float, mono: float | None = None) -> Snapshot | None:
        """The planner's view of ``gang`` at wall time ``now`` (``mono``: the same instant on
        the monotonic clock the agents' heartbeats were taken by; None: now's)."""
        if gang.policy is None or gang.status is None:
            return None
        self._merged(gang)
        names = {p.node for p in gang.pods.values() if p.node}
        nodes = {n: self.nodes[n] for n in names if n in self.nodes}
        spec = gang.spec
        if gang.kueue_managed:
            rt = (
                self.kueue_recovery_timeout_s
                if self.kueue_config_read
                else KUEUE_V1BETA2_PODS_READY_TIMEOUT_S
            )
            spec = dataclasses.replace(
                spec, kueue_stand_down=gang.kueue_stand_down, kueue_recovery_timeout_s=rt
            )
            if spec == gang.kueue_spec:  # the same as last pass's: its members' order kept
                spec = gang.kueue_spec
            gang.kueue_spec = spec
        members = tuple(self.members(gang).values())
        return Snapshot(
            now=now,
            gang=spec,
            policy=gang.policy,
            pods=members,
            nodes=nodes,
            status=gang.status,
            status_written_at=gang.status_written_at,
            posted=frozenset(gang.posted),
            leases_observed_since=self.leases_observed_since,
            cluster_nodes=self.nodes,
            report_endpoint=self.report_endpoint,
            reports_since=self.reports_heard_since(gang, now),
            devices_leaving=self.devices_leaving(members),
            silent=self._silent(gang, time.monotonic() if mono is None else mono),
            progress_noted=dict(gang.noted),
        )

    def _silent(self, gang: Gang, mono: float) -> dict[str, float]:
        """Seconds since each heard agent of a heartbeating gang was last heard (Snapshot),
        this leader's own stalls since not counted; pods deleted since included (the fence
        counts from their last answer); entries older than HEARD_KEPT_S are dropped (bounded
        by the pods of the last minutes)."""
        if not gang.spec.spares or self.report_endpoint is None:
            return {}
        now = mono - self.stalled
        old = [uid for uid, at in gang.heard.items() if now - at > HEARD_KEPT_S]
        for uid in old:
            del gang.heard[uid]
        return {uid: max(0.0, now - at) for uid, at in gang.heard.items()}
