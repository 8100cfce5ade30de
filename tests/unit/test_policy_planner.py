"""Whatever policy the webhook admits, the planner plans with it and the controller can write
the result (hypothesis).

Annotation values are drawn across each key's whole accepted range (both ends included, and
in several spellings), parsed with ``parse_policy`` as the webhook and the controller do, and
planned on gangs in the situations where the policy's numbers are used: a failure starting a
recovery (barrier deadline), a node going bad (flap filter), a recovery past its deadline
(laggards recreated, then escalation), a gang managed by Kueue (deadline capped), budgets and
the repeat limit at their edge. Every status is then encoded as the controller writes it
(``status_to_dict`` and JSON). A value past the range, such as ``barrier-timeout: 99999999h``
(a deadline past the year 9999), crashed every planning pass of its gang before the range.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from jobset_inplace import names
from jobset_inplace.core import policy as pol
from jobset_inplace.core.detection import LEASE_RENEW_INTERVAL_S
from jobset_inplace.core.gangstate import status_from_dict, status_to_dict
from jobset_inplace.core.model import Cause, NodeView, Plan, Recovery, ReplacePod, Snapshot
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy, format_duration, parse_policy
from jobset_inplace.core.statemachine import Phase
from jobset_inplace.times import format_time

from .gangs import NOW, member, nodes, pods, running, snapshot, with_pod


# --- annotation values across the accepted ranges ---------------------------------------------
def durations(bounds: tuple[float, float]) -> st.SearchStrategy[str]:
    """Durations from ``bounds[0]`` to ``bounds[1]``: the ends, whole and fractional seconds in
    between, written as ``1h2m3s`` or as seconds alone (``3723s``)."""
    lo, hi = bounds
    seconds = st.one_of(
        st.sampled_from([lo, hi]),
        st.integers(math.ceil(lo), math.floor(hi)).map(float),
        st.floats(lo, hi, allow_nan=False).map(lambda x: min(max(round(x, 3), lo), hi)),
    )
    as_seconds = st.integers(math.ceil(lo), math.floor(hi)).map(lambda n: f"{n}s")
    return st.one_of(
        seconds.map(format_duration), as_seconds, st.sampled_from([lo, hi]).map(format_duration)
    )


def integers(bounds: tuple[int, int]) -> st.SearchStrategy[str]:
    lo, hi = bounds
    return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi)).map(str)


VALUES: dict[str, st.SearchStrategy[str]] = {
    names.INPLACE_BUDGET: integers(pol.INPLACE_BUDGET_RANGE),
    names.RECREATE_BUDGET: integers(pol.RECREATE_BUDGET_RANGE),
    names.BARRIER_TIMEOUT: durations(pol.BARRIER_TIMEOUT_RANGE_S),
    names.NODE_UNHEALTHY_AFTER: durations(pol.NODE_UNHEALTHY_AFTER_RANGE_S),
    names.MEMBER_REPEAT_LIMIT: integers(pol.MEMBER_REPEAT_LIMIT_RANGE),
    names.RESTART_EXIT_CODE: integers(pol.RESTART_EXIT_CODE_RANGE),
    names.KUEUE_RECOVERY_TIMEOUT: durations(pol.KUEUE_RECOVERY_TIMEOUT_RANGE_S),
    names.FORCE_DELETE: st.sampled_from([e.value for e in pol.ForceDelete]),
    names.NO_COMMON_CHECKPOINT: st.sampled_from([e.value for e in pol.NoCommonCheckpoint]),
    names.ESCALATION: st.sampled_from([e.value for e in pol.Escalation]),
    names.TAINT_ON_DEVICE_FAULT: st.sampled_from(["true", "false"]),
    names.RESTART_SCOPE: st.sampled_from([e.value for e in names.RestartScope]),
    names.TRAINER_STOP_GRACE: durations(pol.TRAINER_STOP_GRACE_RANGE_S),
    names.UNHEALTHY_TAINTS: st.just("example.com/gpu-fault"),
    names.UNHEALTHY_CONDITIONS: st.just("GPUFault"),
}


@st.composite
def policy_annotations(draw: st.DrawFn) -> dict[str, str]:
    """An opted-in JobSet's annotations: every number most of the time, each key sometimes
    left to its default."""
    out = {names.ENABLED: "true"}
    for key, values in VALUES.items():
        if draw(st.integers(0, 4)):
            out[key] = draw(values)
    return out


# The planner's clock: the unit tests' NOW (1970), today, and the end of this century.
NOWS = st.sampled_from([NOW, 1_800_000_000.0, 4_102_444_800.0])


# --- gangs in the situations where the policy's numbers matter -------------------------------
Draw = Callable[[st.SearchStrategy[Any]], Any]  # st.DataObject.draw
Scenario = Callable[[Draw, Policy, float], Snapshot]


def _recovering(now: float, policy: Policy, *, extended: bool, past: bool) -> Recovery:
    bt = policy.barrier_timeout_s
    return Recovery(
        epoch=3,
        started=now - 2 * bt,
        deadline=now - 1 if past else now + bt / 2,
        causes={member(0): Cause.TRAINER_EXITED},
        in_place=4,
        deadline_extended=extended,
    )


def failing_member(draw: Draw, policy: Policy, now: float) -> Snapshot:
    """A running gang whose member's trainer exits (maybe again: the repeat limit, and maybe
    with the budgets used up)."""
    status = running(
        member_failures={member(1): draw(st.sampled_from([0, policy.member_repeat_limit - 1]))},
        inplace_used=draw(st.sampled_from([0, policy.inplace_budget])),
        recreate_used=draw(st.sampled_from([0, policy.recreate_budget])),
    )
    pl = with_pod(pods(4, epoch=2), 1, trainer_failed=True)
    return snapshot(status=status, pod_list=pl, now=now)


def unhealthy_node(draw: Draw, policy: Policy, now: float) -> Snapshot:
    """A running gang with a member's node NotReady for some time around the flap filter's
    threshold, its Lease stale as long (or fresh)."""
    nua = policy.node_unhealthy_after_s
    since = max(0.0, now - draw(st.sampled_from([0.0, nua / 2, nua, nua + 1, 3 * nua])))
    nm = nodes(4, now)
    lease = draw(st.sampled_from([None, now - 1, since - LEASE_RENEW_INTERVAL_S]))
    nm["n2"] = NodeView(
        "n2", ready=draw(st.sampled_from(["False", "Unknown"])), ready_since=since,
        lease_renewed=lease, lease_read_at=now,
    )  # fmt: skip
    return snapshot(status=running(), node_map=nm, now=now)


def past_deadline(draw: Draw, policy: Policy, now: float) -> Snapshot:
    """A recovering gang past its barrier deadline with a member behind: the laggard is
    recreated and the deadline extended, or (extended already) the gang escalates."""
    rec = _recovering(now, policy, extended=draw(st.booleans()), past=True)
    status = dataclasses.replace(running(3), phase=Phase.RECOVERING, barrier_open=False)
    status.recovery, status.inplace_used, status.resume_step = rec, 1, None
    pl = with_pod(pods(4, epoch=3), 2, reported_epoch=2)
    return snapshot(status=status, pod_list=pl, now=now)


def caught_up(draw: Draw, policy: Policy, now: float) -> Snapshot:
    """A recovering gang before its deadline, every member back: the barrier opens (or, with
    no checkpoint in common, it escalates or starts from scratch)."""
    rec = _recovering(now, policy, extended=draw(st.booleans()), past=False)
    status = dataclasses.replace(running(3), phase=Phase.RECOVERING, barrier_open=False)
    status.recovery, status.inplace_used, status.resume_step = rec, 1, None
    pl = pods(4, epoch=3)
    if draw(st.booleans()):
        pl = with_pod(pl, 0, reported_steps=(300,))  # no step common to all
    return snapshot(status=status, pod_list=pl, now=now)


def kueue_failure(draw: Draw, policy: Policy, now: float) -> Snapshot:
    """A failure in a Kueue-managed gang: the barrier deadline is capped to fit its
    recoveryTimeout (the policy's, else Kueue's configured one)."""
    configured = draw(st.sampled_from([None, *pol.KUEUE_RECOVERY_TIMEOUT_RANGE_S, 1800.0]))
    pl = with_pod(pods(4, epoch=2), 3, trainer_failed=True)
    return snapshot(pod_list=pl, now=now, kueue_recovery_timeout_s=configured)


SCENARIOS: dict[str, Scenario] = {
    "failing member": failing_member,
    "unhealthy node": unhealthy_node,
    "past its deadline": past_deadline,
    "caught up": caught_up,
    "Kueue-managed failure": kueue_failure,
}


# --- what the controller does with a plan -----------------------------------------------------
def written(p: Plan) -> dict[str, Any]:
    """The status as the controller writes it (JSON, no NaN or infinity), read back."""
    body = json.dumps(status_to_dict(p.status), allow_nan=False)
    status_from_dict(json.loads(body))
    for a in p.actions:
        if isinstance(a, ReplacePod) and a.failed_since is not None:
            format_time(a.failed_since, micro=False)  # the replaced pod's Ready transition
    return dict(json.loads(body))


# The documented ranges (docs/annotations.md), written out rather than read from the module: a
# range widened there must make this test fail, not widen what it checks.
SHORTEST_BARRIER_S = 30.0  # barrier-timeout's minimum (and Kueue's cut deadline: 40 % of 75s)
LONGEST_BARRIER_S = 24 * 3600.0  # barrier-timeout's maximum
# The longest a plan may ask to wait: the longest barrier or a stale Lease plus the longest
# node-unhealthy-after (1h).
LONGEST_WAIT_S = max(LONGEST_BARRIER_S, LEASE_RENEW_INTERVAL_S + 3600.0)


@settings(max_examples=300, deadline=None)
@given(policy_annotations(), st.sampled_from(sorted(SCENARIOS)), NOWS, st.data())
def test_any_admitted_policy_plans_and_the_status_can_be_written(
    a: dict[str, str], scenario: str, now: float, data: st.DataObject
) -> None:
    policy = parse_policy(a)  # everything drawn is in the accepted range
    s = dataclasses.replace(SCENARIOS[scenario](data.draw, policy, now), policy=policy)
    p = plan(s)
    event(f"{scenario}: {' '.join(e.value for e in p.edges) or 'no edge'}")
    status = written(p)
    # The controller schedules the next pass after requeue_after seconds: finite, not negative,
    # at most the longest wait a policy can ask for.
    assert p.requeue_after is None or 0.0 <= p.requeue_after <= LONGEST_WAIT_S
    rec = p.status.recovery
    before = None if s.status.recovery is None else s.status.recovery.deadline
    if rec is not None and rec.deadline != before:
        # A deadline set in this pass leaves the members at least the shortest barrier-timeout
        # (also when it is cut to fit Kueue's recoveryTimeout), at most the longest.
        assert SHORTEST_BARRIER_S <= rec.deadline - now <= LONGEST_BARRIER_S
        assert status["recovery"]["deadline"] == format_time(rec.deadline)
