"""Invariants of the planner over generated gangs (hypothesis).

The invariants of a barrier opening only apply to passes that open it: each property records
with ``hypothesis.event`` which branch an example took (``--hypothesis-show-statistics`` shows
the shares), the generator draws a gang that has caught up often enough to open it, and the
example-based tests at the end reach each branch deterministically."""

from __future__ import annotations

import dataclasses

from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from jobset_inplace.core.detection import current_pods
from jobset_inplace.core.model import GangStatus, Plan, PodView, Recovery, Snapshot, StepRecheck
from jobset_inplace.core.planner import (
    STEP_RECHECK_LIMIT,
    STEP_RECHECK_S,
    common_resume_step,
    plan,
)
from jobset_inplace.core.policy import NoCommonCheckpoint, Policy
from jobset_inplace.core.statemachine import Phase

from .gangs import NOW, pods, snapshot, with_pod

STEPS = st.frozensets(st.sampled_from([100, 200, 300, 400]), max_size=4)
PHASES = (Phase.RECOVERING, Phase.RUNNING)


@st.composite
def gangs(draw: st.DrawFn) -> tuple[int, GangStatus, list[PodView], Policy]:
    n = draw(st.integers(1, 6))
    epoch = draw(st.integers(1, 5))
    # A quarter of the gangs have caught up: every member's pod live and reporting the epoch,
    # with checkpoint steps that may or may not have one in common.
    caught_up = draw(st.integers(0, 3)) == 0
    phase = Phase.RECOVERING if caught_up else draw(st.sampled_from(PHASES))
    # ... and of those, some asked their members to look at their steps again, some time ago
    recheck = None
    if caught_up and draw(st.booleans()):
        asked = NOW - draw(st.sampled_from([0.0, 1.0, STEP_RECHECK_S, 10.0]))
        disputed = draw(st.frozensets(st.sampled_from([100, 200, 300, 400]), min_size=1))
        recheck = StepRecheck(epoch, tuple(sorted(disputed, reverse=True)), asked)
    status = GangStatus(
        phase=phase,
        epoch=epoch,
        barrier_open=phase == Phase.RUNNING,
        recovery=Recovery(epoch, NOW - 10, NOW + 290),
        step_recheck=recheck,
    )
    pod_list = []
    for pod in pods(n, epoch=epoch):
        if caught_up:
            answered = epoch if recheck and draw(st.booleans()) else None
            steps = tuple(sorted(draw(STEPS)))
            back = dataclasses.replace(pod, reported_steps=steps, rechecked_epoch=answered)
            pod_list.append(back)
            continue
        pod_list.append(
            dataclasses.replace(
                pod,
                reported_epoch=draw(st.sampled_from([None, epoch - 1, epoch, epoch])),
                reported_steps=tuple(sorted(draw(STEPS))),
                phase=draw(st.sampled_from(["Running", "Running", "Pending", "Failed"])),
                deleting=draw(st.booleans()) and draw(st.booleans()),
                trainer_failed=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    if not caught_up and draw(st.booleans()) and pod_list:
        pod_list.pop(draw(st.integers(0, len(pod_list) - 1)))
    scratch = draw(st.booleans())
    policy = Policy(
        no_common_checkpoint=NoCommonCheckpoint.SCRATCH if scratch else NoCommonCheckpoint.ESCALATE
    )
    return n, status, pod_list, policy


Gang = tuple[int, GangStatus, list[PodView], Policy]


def planned(g: Gang) -> tuple[Snapshot, Plan]:
    n, status, pod_list, policy = g
    s = snapshot(n, status=status, pod_list=pod_list, policy=policy)
    return s, plan(s)


def opened_here(s: Snapshot, p: Plan) -> bool:
    """Whether this pass opened the barrier."""
    return p.status.barrier_open and not s.status.barrier_open


def caught_up_share(s: Snapshot) -> float:
    """Share of the members whose current pod is live and reports the gang's epoch."""
    current = current_pods(s)
    back = sum(
        1
        for pod in current.values()
        if pod.reported_epoch == s.status.epoch
        and not pod.deleting
        and pod.phase in ("Pending", "Running")
        and not pod.trainer_failed
    )
    return back / len(s.gang.members)


def check_no_member_behind(s: Snapshot, p: Plan) -> None:
    """A barrier that opens in this pass has every member's live pod at the new epoch."""
    current = current_pods(s)
    assert set(current) == set(s.gang.members)
    for pod in current.values():
        assert pod.reported_epoch == p.status.epoch
        assert not pod.deleting
        assert pod.phase in ("Pending", "Running")


def check_resume_step(s: Snapshot, p: Plan) -> str:
    """The resume step of a barrier that opens is the newest step every member has (None:
    from scratch, only when they have none in common). Returns which case it was."""
    step = p.status.resume_step
    current = current_pods(s)
    common = set.intersection(*(set(pod.reported_steps or ()) for pod in current.values()))
    if step is None:
        assert not common, f"opened from scratch although every member has {common}"
        return "from scratch"
    assert all(step in (pod.reported_steps or ()) for pod in current.values())
    assert step == max(common)
    return "at a common step"


def disputed_by(s: Snapshot) -> set[int]:
    """The steps newer than the common one that some current member reports: each is missing
    from another member's report."""
    current = list(current_pods(s).values())
    common = common_resume_step(current)
    steps = (step for pod in current for step in pod.reported_steps or ())
    return {step for step in steps if common is None or step > common}


def check_steps_looked_at_again(s: Snapshot, p: Plan) -> str:
    """A barrier that opens where the members' reports disagree on a step newer than the
    common one opens only after asking the members lacking such a step to look again, and
    once each answered or the ask's deadline passed (a member's report may predate a step
    another member kept). Returns the case."""
    if not disputed_by(s):
        return "every report has the newest step"
    ask = s.status.step_recheck
    assert ask is not None, "opened without a second look"
    assert ask.epoch == s.status.epoch, "opened on the second look of another epoch"
    lacking = [
        pod
        for pod in current_pods(s).values()
        if pod.rechecked_epoch != ask.epoch
        and any(step not in (pod.reported_steps or ()) for step in ask.steps)
    ]
    if lacking:
        assert s.now >= ask.deadline, "opened before the members looked again or the deadline"
        return "after the deadline"
    return "after every member asked looked again"


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_barrier_never_opens_with_a_member_behind(
    g: Gang,
) -> None:
    s, p = planned(g)
    target(caught_up_share(s), label="share of members caught up")
    if opened_here(s, p):
        event("barrier opened in this pass")
        check_no_member_behind(s, p)
    else:
        event("barrier did not open in this pass")


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_resume_step_is_available_to_every_member(
    g: Gang,
) -> None:
    s, p = planned(g)
    target(caught_up_share(s), label="share of members caught up")
    if opened_here(s, p):
        event(f"barrier opened: resume {check_resume_step(s, p)}")
    else:
        event("barrier did not open in this pass")


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_resume_step_is_read_after_every_trainer_stopped(g: Gang) -> None:
    s, p = planned(g)
    target(caught_up_share(s), label="share of members caught up")
    if opened_here(s, p):
        event(f"barrier opened: {check_steps_looked_at_again(s, p)}")
    elif p.status.step_recheck is not None and s.status.step_recheck is None:
        event("asked to look again")
        assert p.requeue_after is not None, "an ask without a wake-up at its deadline"
        # every member lacking a disputed step is asked (each may lack a different one), up
        # to one report's worth of steps, the newest
        disputed = sorted(disputed_by(s), reverse=True)[:STEP_RECHECK_LIMIT]
        assert p.status.step_recheck.steps == tuple(disputed), (p.status.step_recheck, disputed)
    else:
        event("barrier did not open in this pass")


@settings(max_examples=400, deadline=None)
@given(gangs())
def test_epoch_moves_forward_by_at_most_one(
    g: Gang,
) -> None:
    s, p = planned(g)
    event("new epoch" if p.status.epoch > s.status.epoch else "same epoch")
    assert s.status.epoch <= p.status.epoch <= s.status.epoch + 1
    assert p.status.inplace_used >= s.status.inplace_used
    assert p.status.recreate_used >= s.status.recreate_used


@settings(max_examples=200, deadline=None)
@given(gangs())
def test_planning_twice_is_stable(g: tuple[int, GangStatus, list[PodView], Policy]) -> None:
    """Re-planning the unchanged world from the new status starts nothing new (crash safety)."""
    n, status, pod_list, policy = g
    first = plan(snapshot(n, status=status, pod_list=pod_list, policy=policy))
    event("new epoch" if first.status.epoch > status.epoch else "same epoch")
    again = plan(snapshot(n, status=first.status, pod_list=pod_list, policy=policy))
    assert again.status.epoch == first.status.epoch
    assert again.status.inplace_used == first.status.inplace_used
    assert again.status.recreate_used == first.status.recreate_used


# --- the branches above, reached deterministically ---------------------------------------------
def recovering(epoch: int = 3) -> GangStatus:
    return GangStatus(
        phase=Phase.RECOVERING, epoch=epoch, recovery=Recovery(epoch, NOW - 10, NOW + 290)
    )


def caught_up(steps: list[tuple[int, ...]], epoch: int = 3) -> list[PodView]:
    """Members back in ``epoch`` reporting ``steps``, each after looking again when asked."""
    return [
        dataclasses.replace(pod, reported_steps=s, rechecked_epoch=epoch)
        for pod, s in zip(pods(len(steps), epoch=epoch), steps, strict=True)
    ]


def asked_again(epoch: int = 3, step: int = 400, asked: float = NOW) -> GangStatus:
    st = recovering(epoch)
    st.step_recheck = StepRecheck(epoch, (step,), asked + STEP_RECHECK_S)
    return st


def test_example_barrier_opens_at_the_newest_common_step() -> None:
    pl = caught_up([(300, 200, 100), (200, 100), (400, 300, 200, 100), (200,)])
    s = snapshot(4, status=asked_again(step=400), pod_list=pl)
    p = plan(s)
    assert opened_here(s, p)
    check_no_member_behind(s, p)
    assert check_resume_step(s, p) == "at a common step"
    assert p.status.resume_step == 200


def test_example_barrier_opens_from_scratch_without_a_common_step() -> None:
    pl = caught_up([(300,), (200, 100), ()])
    s = snapshot(
        3,
        status=asked_again(step=300),
        pod_list=pl,
        policy=Policy(no_common_checkpoint=NoCommonCheckpoint.SCRATCH),
    )
    p = plan(s)
    assert opened_here(s, p)
    check_no_member_behind(s, p)
    assert check_resume_step(s, p) == "from scratch"
    assert p.status.resume_step is None


def test_example_barrier_stays_closed_with_one_member_behind() -> None:
    for behind in (
        {"reported_epoch": 2},
        {"reported_epoch": None},
        {"deleting": True},
        {"phase": "Failed"},
    ):
        pl = with_pod(caught_up([(200, 100)] * 4), 2, **behind)
        s = snapshot(4, status=recovering(), pod_list=pl)
        p = plan(s)
        assert not opened_here(s, p), behind
        assert caught_up_share(s) == 0.75


def test_example_missing_member_keeps_the_barrier_closed() -> None:
    pl = caught_up([(200, 100)] * 3)
    s = snapshot(4, status=recovering(), pod_list=pl)
    p = plan(s)
    assert not opened_here(s, p)
