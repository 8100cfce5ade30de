"""The stop rule (core/no_progress.py): the same failure again and again without the gang
getting further escalates at once; a gang that keeps getting further is never stopped.
And the in-place restart counter JobSet's own does not give (status ``restarts.inPlace``).

Driven through the planner, failure after failure: the running gang's member fails, the
recovery starts, every member reports the new epoch with how far its trainers got."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace import names
from jobset_inplace.core import no_progress
from jobset_inplace.core.gangstate import status_from_dict, status_to_dict
from jobset_inplace.core.model import (
    Cause,
    EscalatePod,
    Event,
    GangStatus,
    NodeView,
    Plan,
    Recovery,
    Repeats,
)
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy, PolicyError, parse_policy
from jobset_inplace.core.statemachine import Phase

from .gangs import NOW, pods, running, snapshot, with_pod

EXITED, HUNG, NODE = "exited", "hung", "node"


def fail_and_recover(
    status: GangStatus,
    kind: str,
    progress: int | None,
    *,
    steps: tuple[int, ...] = (100,),
    recreated_steps: tuple[int, ...] | None = None,
    policy: Policy | None = None,
) -> tuple[Plan, Plan]:
    """Member 1 fails (``kind``) in the running epoch; then every member reports the next
    one, its trainers having got to step ``progress`` (None: no progress records), holding
    checkpoints ``steps`` (a recreated member 1: ``recreated_steps``, default the same; made
    after the barrier's second look at the steps). Returns the two passes' plans."""
    epoch = status.epoch
    if kind == EXITED:
        failing = with_pod(pods(4, epoch=epoch, steps=steps), 1, exited_in_epoch=epoch)
    elif kind == HUNG:
        failing = with_pod(pods(4, epoch=epoch, steps=steps), 1, hung_in_epoch=epoch)
    else:
        failing = pods(4, epoch=epoch, steps=steps)
    node_map = {f"n{i}": NodeView(f"n{i}", lease_renewed=NOW - 1) for i in range(4)}
    if kind == NODE:
        node_map["n1"] = NodeView(
            "n1", ready="Unknown", ready_since=NOW - 60, lease_renewed=NOW - 90
        )
    started = plan(snapshot(status=status, pod_list=failing, node_map=node_map, policy=policy))
    assert started.status.epoch == epoch + 1, started.status
    joined = [
        dataclasses.replace(p, progress_step=progress)
        for p in pods(4, epoch=epoch + 1, steps=steps)
    ]
    rec = started.status.recovery
    assert rec is not None
    if rec.recreated:  # member 1's new pod (its node died, or it failed in place repeatedly)
        joined[1] = dataclasses.replace(
            joined[1],
            uid=f"uid-1-{epoch}",
            name="p1b",
            node="n9",
            reported_steps=steps if recreated_steps is None else recreated_steps,
            rechecked_epoch=epoch + 1,
        )
        node_map["n9"] = NodeView("n9", lease_renewed=NOW - 1)
    opened = plan(
        snapshot(status=started.status, pod_list=joined, node_map=node_map, policy=policy)
    )
    return started, opened


def run(
    failures: Sequence[tuple[str, int | None]], policy: Policy | None = None
) -> tuple[GangStatus, int]:
    """The gang through ``failures`` (kind, progress) until one escalates; (its last status,
    how many failures it went through)."""
    status = running(2, resume_step=100)
    for i, (kind, progress) in enumerate(failures, 1):
        _, opened = fail_and_recover(status, kind, progress, policy=policy)
        status = opened.status
        if status.phase != Phase.RUNNING:
            return status, i
    return status, len(failures)


def escalation(status: GangStatus) -> tuple[Phase, str]:
    return status.phase, status.reason


def test_the_same_crash_three_times_without_progress_escalates_with_budget_left() -> None:
    status = running(2, resume_step=100)
    for i in range(1, 4):
        _, opened = fail_and_recover(status, EXITED, 150)
        status = opened.status
        if i < 3:
            assert status.barrier_open
            assert status.phase == Phase.RUNNING
            assert status.repeats == Repeats("TrainerExited", i, 150)
    assert escalation(status) == (Phase.ESCALATED, "NoProgress")
    assert status.inplace_used == 3, "escalated with 7 in-place recoveries left"
    assert not status.barrier_open, "the trainers are not let go to crash again"
    said = [a.message for a in opened.actions if isinstance(a, Event) and a.reason == "Escalated"]
    assert said == [
        "NoProgress: epoch 5: the same failure (TrainerExited) 3 times in a row, the gang "
        "never past step 150; restarting the JobSet"
    ]
    assert [a.pod for a in opened.actions if isinstance(a, EscalatePod)] == ["p0"]


def test_the_stop_rule_is_named_before_a_missing_common_checkpoint() -> None:
    """The third crash of the same member recreates it (member-repeat-limit) and its new pod
    has none of the others' checkpoints (an emptyDir tier, seen in CI): the gang is escalated
    for the failure that keeps coming back, not for the checkpoint its repeats cost."""
    status = running(2, resume_step=100)
    assert Policy().member_repeat_limit == 3
    for _ in range(3):
        started, opened = fail_and_recover(status, EXITED, 150, recreated_steps=())
        status = opened.status
    rec = started.status.recovery
    assert rec is not None
    assert rec.recreated, "the third time, member 1 gets a new pod"
    assert escalation(status) == (Phase.ESCALATED, "NoProgress")


def test_a_flapping_gang_that_gets_further_each_time_is_never_stopped() -> None:
    status, seen = run([(EXITED, 150 + 5 * i) for i in range(9)])
    assert (status.phase, seen) == (Phase.RUNNING, 9)
    assert status.repeats == Repeats("TrainerExited", 1, 190)


def test_getting_further_starts_a_new_run_from_there() -> None:
    # 150, 140 (no further), 160 (further: a run of one from 160), 160, 155: the third
    # failure in a row not past 160 escalates
    status, seen = run([(EXITED, 150), (EXITED, 140), (EXITED, 160), (EXITED, 160), (EXITED, 155)])
    assert (escalation(status), seen) == ((Phase.ESCALATED, "NoProgress"), 5)


def test_another_kind_of_failure_breaks_the_run() -> None:
    status, seen = run([(EXITED, 150), (EXITED, 150), (HUNG, 150), (EXITED, 150), (EXITED, 150)])
    assert status.phase == Phase.RUNNING
    assert seen == 5
    assert status.repeats == Repeats("TrainerExited", 2, 150)
    status, seen = run([(HUNG, 150)] * 3)
    assert (escalation(status), seen) == ((Phase.ESCALATED, "NoProgress"), 3)


def test_a_node_death_is_not_the_jobs_own_failure_and_breaks_the_run() -> None:
    status, seen = run([(EXITED, 150), (EXITED, 150), (NODE, 150), (EXITED, 150)])
    assert status.phase == Phase.RUNNING
    assert seen == 4
    assert status.repeats == Repeats("TrainerExited", 1, 150)


def test_without_progress_records_the_resume_checkpoint_says_how_far() -> None:
    status, seen = run([(EXITED, None)] * 3)
    assert (escalation(status), seen) == ((Phase.ESCALATED, "NoProgress"), 3)
    assert status.message.endswith("never past step 100")


def test_a_gang_the_rule_cannot_judge_is_never_stopped_by_it() -> None:
    """No progress records and no checkpoint: how far it got is unknown."""
    status = running(2, resume_step=None)
    for _ in range(5):
        _, opened = fail_and_recover(status, EXITED, None, steps=())
        status = opened.status
        assert status.phase == Phase.RUNNING
        assert status.repeats is None


def test_the_limit_is_the_policys_and_zero_turns_the_rule_off() -> None:
    status, seen = run([(EXITED, 150)] * 6, Policy(no_progress_limit=0))
    assert status.phase == Phase.RUNNING
    assert seen == 6
    status, seen = run([(EXITED, 150)] * 6, Policy(no_progress_limit=5))
    assert (escalation(status), seen) == ((Phase.ESCALATED, "NoProgress"), 5)


def test_the_limit_annotation_is_parsed_and_a_bad_one_named() -> None:
    assert parse_policy({names.NO_PROGRESS_LIMIT: "0"}).no_progress_limit == 0
    assert parse_policy({names.NO_PROGRESS_LIMIT: "7"}).no_progress_limit == 7
    assert parse_policy({}).no_progress_limit == 3
    for bad in ("-1", "1001", "3.0", "03", "three"):
        with pytest.raises(PolicyError, match=f"{names.NO_PROGRESS_LIMIT}.*0 to 1000"):
            parse_policy({names.NO_PROGRESS_LIMIT: bad})


def test_a_jobset_restart_starts_the_run_again() -> None:
    status, _ = run([(EXITED, 150)] * 2)
    assert status.repeats is not None
    restarted = plan(snapshot(status=status, pod_list=pods(4, epoch=None), restart_attempt=1))
    assert restarted.status.repeats is None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([EXITED, HUNG]), st.integers(100, 130)),
        min_size=1,
        max_size=8,
    )
)
def test_escalated_exactly_when_the_last_three_had_one_kind_and_none_got_further(
    failures: list[tuple[str, int]],
) -> None:
    """Against a model written from the rule's words: a run is broken by another kind or by
    a failure that got further than the run's first; the third in a run escalates."""
    status, seen = run(failures)
    expected, count, first, kind_of_run = None, 0, 0, ""
    for i, (kind, progress) in enumerate(failures, 1):
        if count and kind == kind_of_run and progress <= first:
            count += 1
        else:
            count, first, kind_of_run = 1, progress, kind
        if count == 3:
            expected = i
            break
    if expected is None:
        assert status.phase == Phase.RUNNING
        assert seen == len(failures)
    else:
        assert (escalation(status), seen) == ((Phase.ESCALATED, "NoProgress"), expected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([EXITED, HUNG]), min_size=1, max_size=9), st.data())
def test_a_gang_that_passes_its_furthest_step_every_time_is_never_stopped(
    kinds: list[str], data: st.DataObject
) -> None:
    gains = data.draw(st.lists(st.integers(1, 50), min_size=len(kinds), max_size=len(kinds)))
    progress, reached = [], 100
    for gain in gains:
        reached += gain
        progress.append(reached)
    status, seen = run(list(zip(kinds, progress, strict=True)))
    assert status.phase == Phase.RUNNING
    assert seen == len(kinds)


# --- the in-place restart counter ---------------------------------------------------------------


def test_in_place_restarts_are_counted_over_the_gangs_life() -> None:
    status, _ = run([(EXITED, 150 + i) for i in range(3)])
    assert status.in_place_restarts == 3
    _, opened = fail_and_recover(status, NODE, 200)
    assert opened.status.in_place_restarts == 4, "the others restarted in place"
    restarted = plan(
        snapshot(status=opened.status, pod_list=pods(4, epoch=None), restart_attempt=1)
    )
    assert restarted.status.in_place_restarts == 4, "JobSet's restart resets only the budgets"
    assert restarted.status.inplace_used == 0


def test_the_counter_and_the_runs_memory_survive_a_status_round_trip() -> None:
    status, _ = run([(EXITED, 150)] * 2)
    again = status_from_dict(status_to_dict(status))
    assert (again.repeats, again.in_place_restarts) == (status.repeats, 2)
    assert status_to_dict(status)["restarts"] == {"inPlace": 2}
    assert status_to_dict(status)["repeats"] == {
        "signature": "TrainerExited",
        "count": 2,
        "furthestStep": 150,
    }
    for bad in ({"signature": 1, "count": 2, "furthestStep": 3}, "x", {"count": 2}):
        assert status_from_dict(status_to_dict(status) | {"repeats": bad}).repeats is None


def test_signature_counts_only_the_jobs_own_failures() -> None:
    rec = Recovery(epoch=3, started=NOW, deadline=NOW + 60)
    assert no_progress.signature(rec) is None
    own = dataclasses.replace(
        rec,
        causes={"a": Cause.TRAINER_EXITED, "b": Cause.REPEATED_FAILURE},
        first_signal=Cause.TRAINER_EXITED,
    )
    assert no_progress.signature(own) == "TrainerExited"
    mixed = dataclasses.replace(own, causes=own.causes | {"c": Cause.NODE_UNHEALTHY})
    assert no_progress.signature(mixed) is None
