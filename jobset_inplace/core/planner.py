"""The recovery planner: a pure function from a :class:`~.model.Snapshot` (one JobSet's
pods, their nodes, the persisted gang status, the time) to a :class:`~.model.Plan` (the next
status, the actions, when to look again). No I/O: the controller's adapters build snapshots
and carry out plans; tests drive it directly.

State machine (see docs/architecture.md)::

    Recovering --all members report epoch E--> Running (barrier of E open, resume step chosen)
    Running --any member failure--> Recovering (epoch E+1; unhealthy-node pods replaced,
                                                 all others restart in place)
    Recovering --new node/device failure--> Recovering (same epoch, that pod replaced)
    Recovering --deadline--> lagging members replaced, deadline renewed once --> Escalated
    any --budget exhausted / no common checkpoint--> Escalated (JobSet failure policy restarts)
    Escalated --JobSet restart observed--> Recovering (new epoch, budgets reset)
    any --JobSet suspended--> StoodDown --resumed--> Recovering (new epoch)
    any --JobSet finished--> Failed (if escalated) or stays as is
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping

from jobset_inplace import names
from jobset_inplace.core.gangstate import rfc3339
from jobset_inplace.core.model import (
    HISTORY_LIMIT,
    RECREATE_CAUSES,
    Cause,
    EscalatePod,
    Event,
    NodeView,
    Phase,
    Plan,
    PodView,
    Recovery,
    ReplacePod,
    Snapshot,
)
from jobset_inplace.core.policy import ForceDelete, NoCommonCheckpoint, Policy

# The kubelet renews its node Lease every 10 s; a Lease older than this is a missed renewal.
LEASE_RENEW_INTERVAL_S = 10.0
# Taints that always mean the node's pods cannot run (besides the configured ones).
BUILTIN_UNHEALTHY_TAINTS = frozenset(
    {
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/out-of-service",
    }
)
IN_PLACE_CAUSES = frozenset({Cause.TRAINER_EXITED, Cause.RESTARTING})
# Share of Kueue's recoveryTimeout a recovery may use at most (the rest is the safety margin).
KUEUE_RECOVERY_SHARE = 0.8


# --- node health ------------------------------------------------------------------------------
def unhealthy_since(node: NodeView, policy: Policy, now: float) -> float | None:
    """Since when the node shows any unhealthy signal (None: healthy now)."""
    since: list[float] = []
    if node.ready != "True":
        since.append(node.ready_since)
    if node.lease_renewed is not None and now - node.lease_renewed > LEASE_RENEW_INTERVAL_S:
        since.append(node.lease_renewed + LEASE_RENEW_INTERVAL_S)
    taints = BUILTIN_UNHEALTHY_TAINTS | policy.unhealthy_taints
    since += [added for key, added in node.taints if key in taints]
    since += [t for ctype, t in node.conditions if ctype in policy.unhealthy_conditions]
    return min(since) if since else None


def node_state(node: NodeView | None, policy: Policy, now: float) -> tuple[bool, float | None]:
    """(unhealthy, time it will count as unhealthy if the signal persists).

    A signal counts only once it has lasted ``node_unhealthy_after``: shorter flaps do nothing."""
    if node is None:
        return False, None
    since = unhealthy_since(node, policy, now)
    if since is None:
        # Healthy now; a Lease that stops being renewed makes no event, so look again when
        # it would have gone stale for long enough.
        if node.lease_renewed is None:
            return False, None
        return False, node.lease_renewed + LEASE_RENEW_INTERVAL_S + policy.node_unhealthy_after_s
    due = since + policy.node_unhealthy_after_s
    return (True, None) if now >= due else (False, due)


def stale_lease_nodes(s: Snapshot) -> list[str]:
    """Ready nodes that count as unhealthy only because of their Lease: the adapter reads
    those Leases afresh before planning, so a lagging watch never replaces a pod."""
    return sorted(
        name
        for name, node in s.nodes.items()
        if node.ready == "True"
        and node.lease_renewed is not None
        and s.now - node.lease_renewed > LEASE_RENEW_INTERVAL_S + s.policy.node_unhealthy_after_s
    )


def may_untaint(node: NodeView | None, lease_renewed: float | None, now: float) -> bool:
    """Whether the controller's unhealthy taint may come off ``node``: it carries the taint,
    is Ready, and its kubelet has just renewed its Lease (it is back)."""
    if node is None or lease_renewed is None or node.ready != "True":
        return False
    tainted = any(key == names.UNHEALTHY_TAINT for key, _ in node.taints)
    return tainted and now - lease_renewed < LEASE_RENEW_INTERVAL_S


# --- members ----------------------------------------------------------------------------------
def current_pods(s: Snapshot) -> dict[str, PodView]:
    """Each member's current pod: of this JobSet restart attempt, live ones first, newest."""
    best: dict[str, PodView] = {}
    for pod in s.pods:
        if pod.member not in s.gang.members or pod.restart_attempt != s.gang.restart_attempt:
            continue
        have = best.get(pod.member)
        if have is None or _rank(pod) > _rank(have):
            best[pod.member] = pod
    return best


def _rank(pod: PodView) -> tuple[bool, float]:
    return (not pod.deleting and pod.phase != "Failed", pod.created)


def member_causes(
    s: Snapshot, current: Mapping[str, PodView]
) -> tuple[dict[str, Cause], float | None]:
    """Failure cause per failing member (first signal), and when to look again for signals
    that are not old enough yet (node flaps under the threshold)."""
    causes: dict[str, Cause] = {}
    wake: float | None = None
    for member in sorted(s.gang.members):
        pod = current.get(member)
        if pod is not None and (pod.escalated or pod.by_kueue or pod.phase == "Succeeded"):
            continue  # ours, Kueue's own action (its replacement follows), or done
        if pod is None or pod.deleting:
            causes[member] = Cause.POD_DELETED
            continue
        if pod.phase == "Failed":
            causes[member] = Cause.POD_FAILED
            continue
        bad_node, due = node_state(s.nodes.get(pod.node or ""), s.policy, s.now)
        if due is not None:
            wake = due if wake is None else min(wake, due)
        if bad_node:
            causes[member] = Cause.NODE_UNHEALTHY
        elif pod.devices_unhealthy:
            causes[member] = Cause.DEVICE_UNHEALTHY
        elif pod.trainer_failed:
            causes[member] = Cause.TRAINER_EXITED
        elif pod.restarting:
            causes[member] = Cause.RESTARTING
    return causes, wake


def common_resume_step(pods: Iterable[PodView]) -> int | None:
    """The newest checkpoint step every member reports (None: no common step)."""
    common: set[int] | None = None
    for pod in pods:
        steps = set(pod.reported_steps or ())
        common = steps if common is None else common & steps
    return max(common) if common else None


# --- planning ---------------------------------------------------------------------------------
def plan(s: Snapshot) -> Plan:
    """The next status and actions for one gang."""
    return _Planning(s).run()


class _Planning:
    """One planning pass: the snapshot, the status being built and the plan's actions."""

    def __init__(self, s: Snapshot) -> None:
        self.s = s
        self.st = copy.deepcopy(s.status)
        self.p = Plan(self.st)
        self.current = current_pods(s)

    @property
    def recovery_timeout(self) -> float | None:
        """Kueue's waitForPodsReady.recoveryTimeout for this gang, if Kueue manages it."""
        return self.s.policy.kueue_recovery_timeout_s or self.s.gang.kueue_recovery_timeout_s

    @property
    def barrier_timeout(self) -> float:
        """The barrier deadline, kept inside Kueue's recoveryTimeout: the ladder can take two
        deadlines (laggards recreated once), which must fit in 80% of it."""
        bt = self.s.policy.barrier_timeout_s
        rt = self.recovery_timeout
        return bt if rt is None else min(bt, KUEUE_RECOVERY_SHARE * rt / 2)

    def check_kueue_margin(self) -> None:
        rt, st = self.recovery_timeout, self.st
        margin = None if rt is None else round(rt - 2 * self.barrier_timeout, 3)
        if margin != st.kueue_margin_s and rt is not None:
            bt = self.s.policy.barrier_timeout_s
            if self.barrier_timeout < bt:
                self.event(
                    "KueueRecoveryTimeout",
                    f"barrier-timeout {bt:.0f}s does not fit twice in Kueue's recoveryTimeout "
                    f"{rt:.0f}s: using {self.barrier_timeout:.0f}s",
                    warning=True,
                )
        st.kueue_margin_s = margin

    def run(self) -> Plan:
        s, st = self.s, self.st
        self.check_kueue_margin()
        st.expected = len(s.gang.members)
        st.ready = sum(1 for pod in self.current.values() if pod.phase == "Running")
        for pod in self.current.values():
            if pod.report_error:
                self.event("MalformedReport", f"pod {pod.name}: {pod.report_error}", warning=True)
        if self.stand_down_or_restart():
            return self.p
        causes, wake = member_causes(s, self.current)
        if wake is not None:
            self.p.wake_at(s.now, wake)
        if st.phase == Phase.RUNNING:
            st.reported = sum(1 for p in self.current.values() if p.reported_epoch == st.epoch)
            if causes:
                self.start_recovery(causes)
            elif s.gang.restart_request and s.gang.restart_request != st.restart_request:
                st.restart_request = s.gang.restart_request
                self.begin_epoch(f"manual restart ({s.gang.restart_request})", Cause.MANUAL_RESTART)
        else:
            self.continue_recovery(causes)
        return self.p

    # -- helpers --
    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.p.actions.append(Event(reason, message, warning))

    def set_phase(self, phase: Phase, reason: str, message: str = "") -> None:
        self.st.phase, self.st.reason, self.st.message = phase, reason, message

    def replace(self, pod: PodView, cause: Cause) -> None:
        unreachable = self.s.policy.force_delete == ForceDelete.UNREACHABLE
        fail_first = cause == Cause.NODE_UNHEALTHY and unreachable
        node = self.s.nodes.get(pod.node or "")
        dead = cause == Cause.NODE_UNHEALTHY
        device = cause == Cause.DEVICE_UNHEALTHY and self.s.policy.taint_on_device_fault
        self.p.actions.append(
            ReplacePod(
                pod.name,
                pod.uid,
                pod.member,
                cause,
                fail_first,
                taint_node=pod.node if dead or device else None,
                taint_key=names.UNHEALTHY_TAINT if dead else names.DEVICE_UNHEALTHY_TAINT,
                failed_since=unhealthy_since(node, self.s.policy, self.s.now)
                if node and dead
                else None,
            )
        )

    def live(self, member: str) -> PodView | None:
        pod = self.current.get(member)
        ok = pod is not None and not pod.deleting and pod.phase in ("Pending", "Running")
        return pod if ok else None

    # -- lifecycle outside recoveries --
    def stand_down_or_restart(self) -> bool:
        """Handle JobSet-level states; True when the pass is done."""
        gang, st = self.s.gang, self.st
        if gang.finished:
            if st.phase == Phase.ESCALATED:
                self.set_phase(Phase.FAILED, "JobSetFailed", "the JobSet failed after escalation")
            return True
        if gang.suspended or gang.kueue_stand_down:
            why = gang.kueue_stand_down or "the JobSet is suspended"
            if st.phase != Phase.STOOD_DOWN:
                reason = "Kueue" if gang.kueue_stand_down else "Suspended"
                self.set_phase(Phase.STOOD_DOWN, reason, why)
                st.barrier_open = False
                st.recovery = None  # an in-flight recovery is cancelled, not resumed later
                self.event("StoodDown", f"{why}: recovery stands down")
            return True
        if st.phase == Phase.STOOD_DOWN:
            self.begin_epoch("resumed after suspension")
            return True
        if gang.restart_attempt != st.restart_attempt:
            st.restart_attempt = gang.restart_attempt
            st.inplace_used = st.recreate_used = 0
            st.member_failures.clear()
            self.begin_epoch(f"JobSet restart {gang.restart_attempt}")
            return True
        return st.phase in (Phase.ESCALATED, Phase.FAILED)

    def begin_epoch(self, why: str, cause: Cause = Cause.JOBSET_RESTARTED) -> None:
        """A new epoch every member joins (no failure to charge to a budget)."""
        s, st = self.s, self.st
        st.epoch += 1
        st.barrier_open = False
        st.resume_step = None
        st.recovery = Recovery(st.epoch, s.now, s.now + self.barrier_timeout)
        self.set_phase(Phase.RECOVERING, cause.value, why)
        self.event("EpochStarted", f"epoch {st.epoch}: {why}")

    # -- recoveries --
    def start_recovery(self, causes: dict[str, Cause]) -> None:
        s, st, policy = self.s, self.st, self.s.policy
        decided = {
            m: Cause.REPEATED_FAILURE
            if c in IN_PLACE_CAUSES
            and st.member_failures.get(m, 0) + 1 >= policy.member_repeat_limit
            else c
            for m, c in causes.items()
        }
        replaced = {m: c for m, c in decided.items() if c not in IN_PLACE_CAUSES}
        if st.inplace_used + 1 > policy.inplace_budget:
            self.escalate(
                "InPlaceBudgetExhausted",
                f"in-place budget of {policy.inplace_budget} recoveries used up",
            )
            return
        if st.recreate_used + len(replaced) > policy.recreate_budget:
            self.escalate(
                "RecreateBudgetExhausted",
                f"recreate budget of {policy.recreate_budget} pods used up",
            )
            return
        st.inplace_used += 1
        st.recreate_used += len(replaced)
        for member in s.gang.members:
            if decided.get(member) in IN_PLACE_CAUSES:
                st.member_failures[member] = st.member_failures.get(member, 0) + 1
            else:
                st.member_failures.pop(member, None)

        st.epoch += 1
        st.barrier_open = False
        st.resume_step = None
        rec = st.recovery = Recovery(
            epoch=st.epoch,
            started=s.now,
            deadline=s.now + self.barrier_timeout,
            causes={m: c.value for m, c in decided.items()},
            in_place=len(s.gang.members) - len(replaced),
        )
        for member, cause in sorted(replaced.items()):
            pod = self.current.get(member)
            rec.recreated[member] = pod.uid if pod else ""
            if pod is not None and cause in RECREATE_CAUSES and not pod.deleting:
                self.replace(pod, cause)
        self.set_phase(Phase.RECOVERING, _main_cause(decided))
        self.event(
            "RecoveryStarted",
            f"epoch {st.epoch}: {_describe(decided)}; {rec.in_place} in place, "
            f"{len(rec.recreated)} recreated",
        )
        self.p.wake_at(s.now, rec.deadline)

    def continue_recovery(self, causes: dict[str, Cause]) -> None:
        s, st = self.s, self.st
        rec = st.recovery
        if rec is None:  # first look at a gang: epoch 1 opens like any other
            rec = st.recovery = Recovery(st.epoch, s.now, s.now + self.barrier_timeout)
        if not self.fold_failures(rec, causes):
            return
        members = sorted(s.gang.members)
        joined = [
            pod
            for m in members
            if (pod := self.live(m)) is not None
            and pod.reported_epoch == st.epoch
            and pod.uid != rec.recreated.get(m)
            and m not in causes  # still failing: not back yet
        ]
        st.reported = len(joined)
        if len(joined) == len(members):
            self.open_barrier(rec, joined)
        elif not rec.causes:
            pass  # a fresh epoch (start, JobSet restart, resume): pods are still being made
        elif s.now < rec.deadline:
            self.p.wake_at(s.now, rec.deadline)
        else:
            self.deadline_missed(rec, [m for m in members if m not in {p.member for p in joined}])

    def fold_failures(self, rec: Recovery, causes: dict[str, Cause]) -> bool:
        """Failures while the barrier waits join this recovery: members restarting in place
        rejoin the same epoch; a member whose (new) pod fails again gets another pod.
        False when that escalated."""
        st, policy = self.st, self.s.policy
        for member, cause in sorted(causes.items()):
            pod = self.current.get(member)
            uid = pod.uid if pod else ""
            if cause in IN_PLACE_CAUSES:
                continue
            if not rec.causes and cause in (Cause.POD_DELETED, Cause.POD_FAILED):
                continue  # a fresh epoch: JobSet is still making (or remaking) its pods
            if pod is None and member not in rec.recreated:
                # No pod at all: its Job is making one (a gang still starting up, or a pod
                # that vanished). Nothing to replace or charge; the barrier waits for it and
                # its deadline bounds the wait.
                continue
            recorded = rec.recreated.get(member)
            if recorded is not None and (pod is None or recorded in ("", uid)):
                # Already decided (and charged): repeat the replacement, which is idempotent,
                # in case the last pass stopped (a crash) before carrying it out.
                if pod is not None and cause in RECREATE_CAUSES and not pod.deleting:
                    self.replace(pod, cause)
                continue
            if st.recreate_used + 1 > policy.recreate_budget:
                self.escalate(
                    "RecreateBudgetExhausted",
                    f"recreate budget of {policy.recreate_budget} pods used up",
                )
                return False
            st.recreate_used += 1
            if member not in rec.recreated:
                rec.in_place -= 1
            rec.recreated[member] = uid
            rec.causes.setdefault(member, cause.value)
            if pod is not None and cause in RECREATE_CAUSES and not pod.deleting:
                self.replace(pod, cause)
            self.event("RecoveryExtended", f"epoch {st.epoch}: {member} {cause.value}, recreated")
        return True

    def deadline_missed(self, rec: Recovery, lagging: list[str]) -> None:
        st, policy = self.st, self.s.policy
        names = ", ".join(lagging[:5]) + (" ..." if len(lagging) > 5 else "")
        if rec.deadline_extended:
            self.escalate(
                "BarrierTimeout",
                f"epoch {st.epoch}: {len(lagging)} member(s) never joined ({names})",
            )
            return
        live = [pod for m in lagging if (pod := self.live(m)) is not None]
        if st.recreate_used + len(live) > policy.recreate_budget:
            self.escalate(
                "RecreateBudgetExhausted", f"barrier timeout needs {len(live)} more recreations"
            )
            return
        for pod in live:
            st.recreate_used += 1
            if pod.member not in rec.recreated:
                rec.in_place -= 1
            rec.recreated[pod.member] = pod.uid
            rec.causes.setdefault(pod.member, Cause.BARRIER_TIMEOUT.value)
            self.replace(pod, Cause.BARRIER_TIMEOUT)
        rec.deadline_extended = True
        rec.deadline = self.s.now + self.barrier_timeout
        self.event(
            "BarrierTimeout",
            f"epoch {st.epoch}: {len(lagging)} member(s) did not join in time ({names}); "
            f"{len(live)} recreated",
            warning=True,
        )
        self.p.wake_at(self.s.now, rec.deadline)

    def open_barrier(self, rec: Recovery, joined: list[PodView]) -> None:
        st = self.st
        step = common_resume_step(joined)
        no_common = step is None and any(pod.reported_steps for pod in joined)
        if no_common and self.s.policy.no_common_checkpoint == NoCommonCheckpoint.ESCALATE:
            self.escalate(
                "NoCommonCheckpoint",
                f"epoch {st.epoch}: no checkpoint step is available to every member",
            )
            return
        st.barrier_open = True
        st.resume_step = step
        rec.opened = self.s.now
        rec.resume_step = step
        self.set_phase(Phase.RUNNING, "BarrierOpen")
        if rec.causes:
            st.history.append(_summary(rec))
            del st.history[:-HISTORY_LIMIT]
        where = "from scratch" if step is None else f"at step {step}"
        if rec.causes:
            how = (
                f"{rec.opened - rec.started:.1f}s after the first signal; "
                f"{rec.in_place} in place, {len(rec.recreated)} recreated"
            )
        else:
            how = f"all {len(joined)} members joined"
        self.event("BarrierOpened", f"epoch {st.epoch}: resume {where}; {how}")

    def escalate(self, reason: str, message: str) -> None:
        live = [pod for m in sorted(self.current) if (pod := self.live(m)) is not None]
        self.st.barrier_open = False
        self.set_phase(Phase.ESCALATED, reason, message)
        if live:
            self.p.actions.append(EscalatePod(live[0].name, live[0].uid, f"{reason}: {message}"))
        self.event("Escalated", f"{reason}: {message}; restarting the JobSet", warning=True)


def _main_cause(causes: Mapping[str, Cause]) -> str:
    return Counter(causes.values()).most_common(1)[0][0].value if causes else ""


def _describe(causes: Mapping[str, Cause]) -> str:
    counts = Counter(c.value for c in causes.values())
    first = sorted(causes)[:3]
    more = f" +{len(causes) - 3}" if len(causes) > 3 else ""
    kinds = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
    return f"{kinds} ({', '.join(first)}{more})"


def _summary(rec: Recovery) -> dict[str, object]:
    return {
        "epoch": rec.epoch,
        "causes": dict(Counter(rec.causes.values())),
        "inPlace": rec.in_place,
        "recreated": len(rec.recreated),
        "startedAt": rfc3339(rec.started),
        "openedAt": rfc3339(rec.opened),
        "durationSeconds": rec.duration,
        "resumeStep": rec.resume_step,
    }
