"""The planner's inputs and outputs: plain, immutable views of the cluster (built by the
controller's adapters from API objects) and the gang state persisted in the GangState status.

Times are seconds since the epoch (floats); the adapters convert API timestamps."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from jobset_inplace import names
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Edge, Phase
from jobset_inplace.protocol.gangstate import Front
from jobset_inplace.protocol.report import AgentReport, report_order
from jobset_inplace.strenum import StrEnum
from jobset_inplace.trainer.progress import ProgressSpan

HISTORY_LIMIT = 20
WAITING_SHOWN = 10  # members named in GangStatus.waiting


class Cause(StrEnum):
    """Why a member needs recovery (first signal wins per member)."""

    TRAINER_EXITED = "TrainerExited"  # a main container terminated non-zero
    TRAINER_HUNG = "TrainerHung"  # its agent saw no progress for hang-timeout (or startup-timeout)
    STRAGGLER = "Straggler"  # slower than the gang (straggler-action: recreate)
    RESTARTING = "ContainersRestarting"  # pod condition AllContainersRestarting=True
    # its agent reported after the barrier had opened and waits for the next epoch: the member
    # restarted (a failure the controller did not see, e.g. while it was down)
    AGENT_WAITING = "AgentWaiting"
    # not Ready for barrier-timeout while the gang runs: stuck (e.g. its agent cannot report)
    NOT_READY = "NotReady"
    POD_FAILED = "PodFailed"
    POD_DELETED = "PodDeleted"  # deleting, or gone with no replacement yet
    NODE_UNHEALTHY = "NodeUnhealthy"
    DEVICE_UNHEALTHY = "DeviceUnhealthy"  # allocatedResourcesStatus Unhealthy
    # evicted for a NoExecute DRA device taint (DeviceTaintRule or the driver's ResourceSlice)
    DEVICE_TAINTED = "DeviceTainted"
    REPEATED_FAILURE = "RepeatedFailure"  # failed in place member-repeat-limit times in a row
    # hot spares: its agent's heartbeats stopped (names.SILENT_AFTER_S); its slot goes to a
    # spare once its lease has ended (core/spares.py)
    AGENT_SILENT = "AgentSilent"
    BARRIER_TIMEOUT = "BarrierTimeout"
    JOBSET_RESTARTED = "JobSetRestarted"
    MANUAL_RESTART = "ManualRestart"  # kubectl jobset-inplace restart (no budget charged)
    # its node is cordoned (drained) or marked for maintenance: moved to another node once the
    # gang stopped at one step (no budget charged)
    PLANNED_MOVE = "PlannedMove"


# Causes whose member must get a new pod (possibly on another node) rather than restart in place.
RECREATE_CAUSES = frozenset(
    {
        Cause.NODE_UNHEALTHY,
        Cause.DEVICE_UNHEALTHY,
        Cause.DEVICE_TAINTED,
        Cause.REPEATED_FAILURE,
        Cause.BARRIER_TIMEOUT,
        Cause.STRAGGLER,
        Cause.PLANNED_MOVE,
        Cause.AGENT_SILENT,
    }
)


@dataclass(frozen=True)
class ReportEndpoint:
    """Where the leading controller takes agents' reports (the report channel,
    docs/architecture.md): its URL, the SHA-256 of its serving certificate (agents pin it
    before sending a token) and a per-process id: a new one tells agents to send again."""

    url: str
    cert_sha256: str
    leader: str
    fronts: tuple[Front, ...] = ()  # report fronts (docs/design/report-fronts.md), sorted


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    member: str  # stable slot id: "<replicatedJob>/<jobIndex>/<completionIndex>"
    node: str | None
    phase: str  # Pending | Running | Succeeded | Failed
    created: float
    deleting: bool = False
    restart_attempt: int = 0  # JobSet's restart-attempt label
    # its agent's report (protocol.report.AgentReport's fields: .report, .with_report), from
    # its pod's annotations or the channel, whichever is newer (core/decode.py)
    reported_epoch: int | None = None
    reported_steps: tuple[int, ...] | None = None
    report_error: str | None = None  # malformed agent report (never acted on)
    late_for_epoch: int | None = None  # its agent reported this epoch after its barrier opened
    exited_in_epoch: int | None = None  # its agent saw its trainer exit non-zero in this epoch
    hung_in_epoch: int | None = None  # its agent saw its trainer hang in this epoch
    # with its report of an epoch: the newest step its trainers reported progress for in the
    # epoch before (None: no progress records)
    progress_step: int | None = None
    # ... and their span: first and newest step and when (None: their records do not say)
    progress_span: ProgressSpan | None = None
    # a planned stop: its agent's answer (epoch, its trainers' span so far, None: no records),
    # and the epoch in which its trainers parked at the planned step
    progress_now: tuple[int, ProgressSpan | None] | None = None
    parked_in_epoch: int | None = None
    # the epoch whose checkpoint steps its agent scanned again when the status asked
    # (status.stepRecheck): its report is made after every member's trainer stopped
    rechecked_epoch: int | None = None
    # the epoch of the report its agent wrote on the pod (None: nothing on the pod); with a
    # report channel served, a report there means the channel failed that agent
    pod_report_epoch: int | None = None
    busy_ms: tuple[int, ...] = ()  # busy ms per step in its agent's last windows, newest first
    newest_step: int | None = None  # the newest complete checkpoint its agent saw (with busy_ms)
    busy_epoch: int | None = None  # the epoch of busy_ms and newest_step (None: not recorded)
    not_ready_since: float | None = None  # its Ready condition is not True since then
    agent_started: float | None = None  # when its running agent container started
    trainer_failed: bool = False
    restarting: bool = False
    devices_unhealthy: bool = False
    # being evicted by kube-controller-manager for a NoExecute taint on a DRA device it holds
    device_taint_evicted: bool = False
    escalated: bool = False  # carries our escalation condition
    by_kueue: bool = False  # failed or terminated by Kueue itself (not a worker failure)

    # (each field named, here and in with_report, rather than spliced by name: mypy checks
    # every one; tests/unit/test_protocol.py checks that none is missing)
    @property
    def report(self) -> AgentReport:
        """Its agent's report, as the view holds it."""
        return AgentReport(
            reported_epoch=self.reported_epoch,
            reported_steps=self.reported_steps,
            late_for_epoch=self.late_for_epoch,
            exited_in_epoch=self.exited_in_epoch,
            hung_in_epoch=self.hung_in_epoch,
            progress_step=self.progress_step,
            progress_span=self.progress_span,
            progress_now=self.progress_now,
            parked_in_epoch=self.parked_in_epoch,
            rechecked_epoch=self.rechecked_epoch,
        )

    def report_order(self) -> tuple[int, int]:
        """``self.report.order()``, without making the report."""
        return report_order(self.reported_epoch, self.exited_in_epoch, self.hung_in_epoch)

    def with_report(self, report: AgentReport, *, well_formed: bool = False) -> PodView:
        """This view holding ``report`` (every field of it: what it does not say, None);
        ``well_formed``: and no malformed report (one copy of the view, not two: the leader
        makes a view per report it takes). The copy is of the instance's ``__dict__``, not
        ``dataclasses.replace``: 1.0 us against 5.8 for its 31 fields (the frozen dataclass's
        ``__init__`` takes every field by name); tests/unit/test_protocol.py checks it against
        ``replace``."""
        view = object.__new__(PodView)
        fields = view.__dict__
        fields.update(self.__dict__)
        fields.update(
            report_error=None if well_formed else self.report_error,
            reported_epoch=report.reported_epoch,
            reported_steps=report.reported_steps,
            late_for_epoch=report.late_for_epoch,
            exited_in_epoch=report.exited_in_epoch,
            hung_in_epoch=report.hung_in_epoch,
            progress_step=report.progress_step,
            progress_span=report.progress_span,
            progress_now=report.progress_now,
            parked_in_epoch=report.parked_in_epoch,
            rechecked_epoch=report.rechecked_epoch,
        )
        return view


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: str = "True"  # status of the Ready condition: True | False | Unknown
    ready_since: float = 0.0  # lastTransitionTime of Ready
    lease_renewed: float | None = None  # node Lease renewTime
    taints: tuple[tuple[str, float], ...] = ()  # (key, timeAdded) of NoSchedule/NoExecute taints
    conditions: tuple[tuple[str, float], ...] = ()  # (type, since) of conditions that are True
    # When the controller last read the Lease from the API itself (not from its watch).
    lease_read_at: float | None = None
    # spec.unschedulable (kubectl cordon / drain), or a maintenance condition the admin set
    # (DrainInProgress, MaintenancePlanned, MaintenanceInProgress: Kubernetes 1.37)
    leaving: str = ""  # why its pods should move ("" : they need not)
    # When pods could last newly fit on it, as far as known: its creation, its Ready turning
    # True, and (seen by this controller: core.decode.carry_opening) its cordon lifted or a
    # NoSchedule/NoExecute taint removed. Hot spares: a node that opened after a spare was
    # placed is one the scheduler did not know of then (core.spares.spares_to_spread).
    opened_at: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()  # its labels, sorted


@dataclass(frozen=True)
class GangSpec:
    namespace: str
    name: str
    members: frozenset[str]  # every member slot (core/spares.py: the user's replicas)
    spares: frozenset[str] = frozenset()  # the positions that are hot spares at first
    restart_attempt: int = 0  # JobSet status.restarts
    suspended: bool = False
    finished: bool = False  # JobSet Completed or Failed
    restart_request: str = ""  # value of the restart-request annotation
    kueue_stand_down: str = ""  # why Kueue took the gang away (evicted, deactivated, finished)
    # Kueue waitForPodsReady.recoveryTimeout for a Kueue-managed gang (None: not managed/known)
    kueue_recovery_timeout_s: float | None = None

    @functools.cached_property
    def ordered(self) -> tuple[str, ...]:
        """``members`` in order: sorted once per spec (the cache keeps a gang's spec from one
        JobSet event to the next), not in every planning pass (at 10,000 members a sort takes
        ~1.2 ms on the bench machine, and a pass made up to three)."""
        return tuple(sorted(self.members))


@dataclass
class Recovery:
    epoch: int
    started: float
    deadline: float
    causes: dict[str, Cause] = field(default_factory=dict)  # failing member -> first signal
    # Members restarted in place: every member not in ``recreated`` (a count, not a list: the
    # GangState is watched by every agent and must stay small at thousands of members).
    in_place: int = 0
    recreated: dict[str, str] = field(default_factory=dict)  # member -> uid of replaced pod
    deadline_extended: bool = False
    opened: float | None = None
    resume_step: int | None = None
    # The edge that opened this epoch (None: written by a controller that did not record it).
    opened_by: Edge | None = None
    # A member failure's recovery: the earliest failure signal of the members that started it,
    # and since when it showed (the snapshot's times: see planner.first_signal).
    first_signal: Cause | None = None
    first_signal_at: float | None = None
    # How long before its first signal the failure may have come: a node's missed Lease
    # renewal shows a renew interval after the last one, the node died somewhere in between
    # (0: the signal shows the failure itself, e.g. a container's exit).
    signal_window: float = 0.0
    # Training steps this recovery makes the gang redo: the newest step any member's trainers
    # reported progress for before it, minus the resume step (None: no member reported one).
    progress_lost: int | None = None
    # Whether the hung members among ``causes`` were counted toward member-repeat-limit when
    # it started (all of them or none: PlanningPass.waiting_on_a_peer); the count is taken back
    # at the barrier where another member turned out to have failed for another cause.
    hangs_counted: bool = False

    @property
    def began(self) -> float:
        """When the recovery's time counts from: the first signal of the failure that started
        it when known (detection included), else the pass that started it."""
        if self.first_signal_at is None:
            return self.started
        return min(self.first_signal_at, self.started)

    @property
    def detection(self) -> float | None:
        """First signal -> the pass that started the recovery (None: no signal time)."""
        return None if self.first_signal_at is None else self.started - self.began

    @property
    def duration(self) -> float | None:
        """First signal (detection included) -> barrier opened; the one duration everywhere
        a recovery's time is shown (status, Event, plugin, metrics)."""
        return None if self.opened is None else self.opened - self.began


# --- goodput accounting (the account's rules: core/goodput.py) ---
class Bucket(StrEnum):
    """Badput buckets; docs/metrics.md maps them to Google's ML goodput library's."""

    SCHEDULING = "scheduling"  # gang (re)start -> barrier open: pods placed, pulled, started
    STARTUP = "startup"  # first barrier open -> training began (program start, no restore)
    DETECTION = "detection"  # a failure's first signal -> its recovery started
    RECOVERY = "recovery"  # recovery started -> barrier open (restarts, replacements, barrier)
    RESTORE = "restore"  # barrier open after a recovery -> training resumed (restart, restore)
    WASTED_PROGRESS = "wastedProgress"  # training thrown away: steps redone, the step in flight


@dataclass(frozen=True)
class Mark:
    """The account when a barrier opened (or the gang started, or its training ended): the
    cumulative productive and measured (productive + badput) seconds then. A recent window's
    goodput is read between two of them (core.goodput.recent)."""

    at: float
    productive: float
    measured: float


@dataclass(frozen=True)
class NotedProgress:
    """The running epoch's training as its members' agents noted it to the leader
    (names.REPORT_PROGRESS_NOTE), summed over members: the earliest first step and its time,
    and the steps and seconds each member's note spans, added up (the epoch's pace). Persisted,
    so that a new leader accounts an epoch whose pods went with the old leader's notes."""

    first_step: int
    first_at: float
    steps: int
    seconds: float
    # the newest step's time any member noted (0: unknown, a status written before it): the
    # span's own end is first_at + the members' seconds added up, far past it
    last_at: float = 0.0

    def span(self) -> ProgressSpan:
        """As one member's span with the gang's pace (what the account reads of it: its end is
        not a time, :attr:`last_at` is)."""
        return ProgressSpan(
            self.first_step,
            self.first_at,
            self.first_step + self.steps,
            self.first_at + self.seconds,
        )


@dataclass(frozen=True)
class Ledger:
    """A gang's goodput account up to its running epoch's barrier (persisted in the GangState
    status), and that epoch's training so far (added by :func:`live`)."""

    since: float | None = None  # when the gang first started (its first recovery began)
    productive: float = 0.0
    badput: Mapping[Bucket, float] = field(default_factory=dict)
    # training time of ended epochs whose trainers reported no span (no progress records, or
    # pods replaced with them): neither productive nor badput, left out of the ratio
    unmeasured: float = 0.0
    step_seconds: float | None = None  # the pace of the newest epoch measured
    # the running epoch: its barrier opened then, resuming at that step (None: none runs)
    training_epoch: int | None = None
    training_since: float | None = None
    training_resume: int | None = None
    restarted: bool = False  # that epoch follows a recovery (restore), not a start (startup)
    # that epoch's training as its agents noted it (None: not yet, or no channel)
    training_noted: NotedProgress | None = None
    # the account at each barrier of about the last window (oldest first; core.goodput.recent)
    marks: tuple[Mark, ...] = ()

    @property
    def badput_total(self) -> float:
        return sum(self.badput.values())


@dataclass(frozen=True)
class Repeats:
    """The stop rule's memory (core/no_progress.py): the gang's last failures in a row that
    had one ``signature`` and got no further than ``furthest`` (the furthest step the gang had
    reached when the first of them happened): ``count`` of them."""

    signature: str
    count: int
    furthest: int


@dataclass(frozen=True)
class PlannedStop:
    """A planned move in progress (core.planned_moves): the gang stops at ``step`` (None:
    asking the agents how far their trainers are), then ``members`` get new pods elsewhere
    and the others restart in place; at ``deadline`` the move happens whatever the trainers
    did."""

    epoch: int
    members: tuple[str, ...]
    reason: str
    requested: float
    deadline: float
    step: int | None = None


@dataclass(frozen=True)
class StepRecheck:
    """A second look at the checkpoint steps before the barrier of ``epoch`` opens: ``steps``
    (newest first) are the steps newer than the common one that some members reported and
    others did not. Members whose report lacks any of them scan again (their report may
    predate another member's kept step in a root they share; each member may lack a
    different one); at ``deadline`` the barrier opens on what it has."""

    epoch: int
    steps: tuple[int, ...]
    deadline: float


@dataclass
class GangStatus:
    """What the controller persists (GangState ``.status``); the planner's memory."""

    phase: Phase = Phase.RECOVERING
    epoch: int = 1
    barrier_open: bool = False
    resume_step: int | None = None
    restart_attempt: int = 0
    recovery: Recovery | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    inplace_used: int = 0
    recreate_used: int = 0
    member_failures: dict[str, int] = field(default_factory=dict)  # consecutive, per member
    expected: int = 0
    reported: int = 0
    ready: int = 0
    # during a recovery, the first WAITING_SHOWN members whose report the barrier still waits
    # for (agents on the report channel leave nothing on their pods to show it)
    waiting: list[str] = field(default_factory=list)
    # members whose report of the current epoch is on their pods although this leader serves
    # a report channel (it failed them: a NetworkPolicy, a dead route, an agent older than it)
    on_pod: int = 0
    reason: str = ""
    message: str = ""
    restart_request: str = ""  # the last manual restart request acted on
    # Kueue recoveryTimeout minus the worst-case recovery (two barrier deadlines); None: n/a
    kueue_margin_s: float | None = None
    # Members slower than the gang (straggler detection): busy time per step / the median
    stragglers: dict[str, float] = field(default_factory=dict)
    # straggler-action recreate: the gang's newest common checkpoint when stragglers were
    # found; they are replaced once every member has a newer one (None: none pending)
    straggler_hold_step: int | None = None
    # the report channel the agents use (None: they write their reports on their pods)
    report_endpoint: ReportEndpoint | None = None
    # goodput accounting up to the running epoch's barrier (core.goodput)
    goodput: Ledger = field(default_factory=Ledger)
    # members to move off nodes being drained, and the step the gang stops at first
    planned_stop: PlannedStop | None = None
    # hot spares (core/spares.py): slot -> the position holding it, where not its own
    slots: dict[str, str] = field(default_factory=dict)
    # the same failure in a row without progress (core/no_progress.py; None: no such run)
    repeats: Repeats | None = None
    # the barrier of the recovering epoch waits for a second look at the steps (None: not)
    step_recheck: StepRecheck | None = None
    # epochs this controller opened restarting the gang in place (a failure's recovery, a
    # manual restart, a planned move), over the gang's life: JobSet's own restart counter
    # counts none of them, and the budgets are reset by its restarts
    in_place_restarts: int = 0


@dataclass(frozen=True)
class Snapshot:
    now: float
    gang: GangSpec
    policy: Policy
    pods: tuple[PodView, ...]
    nodes: dict[str, NodeView]
    status: GangStatus
    status_written_at: float = 0.0  # when ``status`` was last written (0: not by this process)
    posted: frozenset[str] = frozenset()  # keys of once-only Events already posted
    # Since when the controller could see every Lease renewal (its start, the end of an outage)
    leases_observed_since: float = 0.0
    # every node the controller knows (to tell one node's death from a cluster-wide disruption)
    cluster_nodes: Mapping[str, NodeView] = field(default_factory=dict)
    # this leader's report channel (None: not served; agents report on their pods)
    report_endpoint: ReportEndpoint | None = None
    # Since when this controller can have heard every agent's report of the gang: from its
    # first status write naming this leader's channel (or its start, if the status named it
    # already; the snapshot's time until it is written). Reports sent over the channel to a
    # leader before were in that one's memory only; agents send them again once they read it.
    reports_since: float = 0.0
    # pod UID -> why it should move: a DRA device its own claims hold is tainted NoSchedule
    # (core.device_taints)
    devices_leaving: Mapping[str, str] = field(default_factory=dict)
    # hot spares with a report channel: pod UID -> seconds since this leader last heard its
    # agent (a report or a heartbeat), counted from when it could first (its channel named):
    # every agent it heard in the last minutes, so near 0 for one that heartbeats (absent: not
    # a heartbeating pod, or not heard for minutes); silent_for() reads it
    silent: Mapping[str, float] = field(default_factory=dict)
    # slot -> (epoch, progress span): how far its trainers were in that epoch, as its agent last
    # noted it over this leader's channel (names.REPORT_PROGRESS_NOTE); kept when its pod goes,
    # so an epoch whose pods died with their node is still accounted (goodput.epoch_spans)
    progress_noted: Mapping[str, tuple[int, ProgressSpan]] = field(default_factory=dict)


# --- actions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplacePod:
    """Get a member a new pod: delete this one (the Job controller recreates it), first
    removing its Job tracking finalizer so its Job does not count it as failed. With
    ``fail_first`` the pod is first marked Failed through its status (its kubelet is gone, so
    nothing else would make it terminal) and deleted without grace. With ``taint_node`` the
    pod's node is first marked NoSchedule (``jobset-inplace.dev/unhealthy``) so that the
    replacement does not land on it; the controller removes that taint once the node renews its
    Lease again."""

    pod: str
    uid: str
    member: str
    cause: Cause
    fail_first: bool = False
    taint_node: str | None = None
    taint_key: str = names.UNHEALTHY_TAINT
    # When the pod stopped being seen alive (its node's first unhealthy signal); written as the
    # time its Ready condition went False, which the Job controller's pod-failure backoff
    # (10 s, doubling per failure of the Job) counts from, instead of from the deletion, should
    # the finalizer's removal be refused.
    failed_since: float | None = None


@dataclass(frozen=True)
class EscalatePod:
    """Mark a pod Failed with the escalation condition; the injected Job podFailurePolicy
    turns that into a Job failure, which JobSet's failure policy handles (restart or fail)."""

    pod: str
    uid: str
    message: str


@dataclass(frozen=True)
class UntaintNode:
    """Remove the controller's unhealthy taint from a node whose kubelet is back."""

    node: str


@dataclass(frozen=True)
class ReadLeases:
    """Read these nodes' Leases from the API and plan again: each counts as unhealthy only
    because of a Lease the watch may be late with, and a stale cache must never replace a pod."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False
    # posted only if no Event with this key was (the snapshot's ``posted``: the keys this
    # controller process posted, the most recent 1000 per gang)
    once_key: str | None = None


# (Union: evaluated at import, and the kubectl plugin runs on Python 3.9: strenum.py)
Action = Union[ReplacePod, EscalatePod, UntaintNode, ReadLeases, Event]  # noqa: UP007


@dataclass
class Plan:
    status: GangStatus
    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None  # seconds until the planner must look again
    edges: list[Edge] = field(default_factory=list)  # the transitions this pass took

    def wake_at(self, now: float, when: float) -> None:
        delay = max(0.0, when - now)
        self.requeue_after = delay if self.requeue_after is None else min(self.requeue_after, delay)
