"""Straggler detection: the rule (core/stragglers.py), the agent's windows (agent/steptime.py),
the busy report's format, and what the planner does with stragglers."""

from __future__ import annotations

import pytest

from jobset_inplace import names
from jobset_inplace.agent.steptime import BusyWindows
from jobset_inplace.core.model import Cause, Event, PodView, ReplacePod
from jobset_inplace.core.planner import plan
from jobset_inplace.core.policy import Policy, StragglerAction
from jobset_inplace.core.stragglers import stragglers
from jobset_inplace.trainer.progress import Progress, decode_busy, encode_busy

from .gangs import member, pods, snapshot, with_pod

# --- the rule ----------------------------------------------------------------------------


def test_a_member_slower_than_factor_times_the_median_in_every_window() -> None:
    busy = {"a": (100, 100, 100), "b": (110, 100, 95), "c": (250, 240, 260), "d": (105, 99, 101)}
    assert stragglers(busy, 2.0, 3) == {"c": 2.33}  # 250 / median(100, 110, 250, 105) = 107.5


def test_one_fast_window_in_the_run_clears_it() -> None:
    busy = {"a": (100, 100, 100), "b": (100, 100, 100), "c": (250, 150, 260)}
    assert stragglers(busy, 2.0, 3) == {}
    assert stragglers(busy, 2.0, 1) == {"c": 2.5}, "only the newest window counts"


def test_too_few_windows_or_members_say_nothing() -> None:
    assert stragglers({"a": (100,), "b": (100,), "c": (900,)}, 2.0, 2) == {}, "1 window of 2"
    assert stragglers({"a": (100, 100), "c": (900, 900)}, 2.0, 2) == {}, "2 members"
    three = {"a": (100, 100), "b": (100,), "c": (900, 900), "d": (100, 100)}
    assert stragglers(three, 2.0, 2) == {"c": 9.0}, "a member short of windows only abstains"


def test_a_zero_median_does_not_divide_by_zero() -> None:
    assert stragglers({"a": (0,), "b": (0,), "c": (5,)}, 2.0, 1) == {"c": 5.0}


# --- the agent's windows -----------------------------------------------------------------


def rec(step: int, busy: float | None) -> dict[str, Progress]:
    return {"trainer": Progress(step, 0.0, busy)}


def test_windows_average_busy_time_per_step() -> None:
    w = BusyWindows(window=60, keep=3)
    assert w.observe(0, rec(10, 1.0)) is None, "the first record starts the first window"
    assert w.observe(59, rec(50, 9.0)) is None
    assert w.observe(60, rec(60, 11.0)) == (200,)  # 10 s over 50 steps
    assert w.observe(120, rec(110, 21.0)) == (200, 200)
    assert w.observe(180, rec(120, 31.0)) == (1000, 200, 200)
    assert w.observe(240, rec(130, 32.0)) == (100, 1000, 200), "at most keep windows"


def test_a_window_without_steps_or_busy_times_publishes_nothing() -> None:
    w = BusyWindows(window=60, keep=3)
    assert w.observe(0, rec(10, None)) is None
    assert w.observe(100, rec(20, None)) is None, "no busy times: nothing to start from"
    w.observe(101, rec(20, 1.0))
    assert w.observe(161, rec(20, 1.0)) is None, "no step in the window"
    assert w.history == ()


def test_the_slowest_trainer_of_the_pod_counts_and_a_new_epoch_starts_over() -> None:
    w = BusyWindows(window=10, keep=2)
    w.observe(0, {"a": Progress(0, 0, 0.0), "b": Progress(0, 0, 0.0)})
    assert w.observe(10, {"a": Progress(10, 0, 1.0), "b": Progress(10, 0, 3.0)}) == (300,)
    w.opened()
    assert w.history == ()
    assert w.observe(20, {"a": Progress(10, 0, 1.0)}) is None


def test_the_busy_report_format() -> None:
    assert encode_busy((230, 228, 0)) == "230,228,0"
    assert decode_busy("230,228,0") == (230, 228, 0)
    for bad in ["", "1,,2", "-1", "01", "1.5", "a", ",".join(["1"] * 21), str(10**9 + 1)]:
        assert decode_busy(bad) is None, bad


# --- the planner ---------------------------------------------------------------------------

SLOW = (400, 410, 390)
FAST = (100, 100, 100)


def gang(slow: int = 2) -> list[PodView]:
    pl = pods(4, epoch=2)
    for i in range(4):
        pl = with_pod(pl, i, busy_ms=SLOW if i == slow else FAST)
    return pl


def test_stragglers_are_reported_not_acted_on_by_default() -> None:
    policy = Policy(straggler_factor=2.0)
    p = plan(snapshot(pod_list=gang(), policy=policy))
    assert p.status.epoch == 2, "no recovery"
    assert p.status.stragglers == {member(2): 4.0}
    events = [a for a in p.actions if isinstance(a, Event) and a.reason == "StragglerDetected"]
    assert len(events) == 1
    assert member(2) in events[0].message
    assert events[0].warning


def test_straggler_detection_off_reports_nothing() -> None:
    p = plan(snapshot(pod_list=gang(), policy=Policy()))
    assert p.status.stragglers == {}
    assert not any(isinstance(a, Event) and a.reason == "StragglerDetected" for a in p.actions)


def test_a_straggler_is_replaced_on_another_node_with_recreate() -> None:
    policy = Policy(straggler_factor=2.0, straggler_action=StragglerAction.RECREATE)
    p = plan(snapshot(pod_list=gang(), policy=policy))
    assert p.status.epoch == 3
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(2): Cause.STRAGGLER}
    assert set(p.status.recovery.recreated) == {member(2)}
    (replace,) = [a for a in p.actions if isinstance(a, ReplacePod)]
    assert replace.taint_node is not None, "its node tainted, so the new pod goes elsewhere"
    assert replace.taint_key == names.DEVICE_UNHEALTHY_TAINT


@pytest.mark.parametrize("epoch", [1, None])
def test_only_reports_of_the_running_epoch_count(epoch: int | None) -> None:
    policy = Policy(straggler_factor=2.0)
    pl = with_pod(gang(), 2, reported_epoch=epoch)
    assert plan(snapshot(pod_list=pl, policy=policy)).status.stragglers == {}


def newest(pl: list[PodView], *steps: int | None) -> list[PodView]:
    for i, step in enumerate(steps):
        pl = with_pod(pl, i, newest_step=step)
    return pl


def test_recreate_waits_for_the_gangs_next_checkpoint() -> None:
    """The straggler goes once every member has a checkpoint newer than the gang's newest
    when it was found: the replacement then loses (almost) no progress."""
    policy = Policy(straggler_factor=2.0, straggler_action=StragglerAction.RECREATE)
    p = plan(snapshot(pod_list=newest(gang(), 100, 110, 100, 110), policy=policy))
    assert p.status.epoch == 2, "not yet: waiting for the next checkpoint"
    assert p.status.straggler_hold_step == 100
    (pending,) = [
        a for a in p.actions if isinstance(a, Event) and a.reason == "StragglerReplacementPending"
    ]
    assert member(2) in pending.message
    assert "past step 100" in pending.message
    # some members checkpointed since, not all: still waiting (and no second Event)
    p = plan(snapshot(pod_list=newest(gang(), 110, 110, 100, 120), policy=policy, status=p.status))
    assert p.status.epoch == 2
    assert p.status.straggler_hold_step == 100
    # every member past step 100: replaced, the hold cleared with the new epoch
    p = plan(snapshot(pod_list=newest(gang(), 110, 110, 110, 120), policy=policy, status=p.status))
    assert p.status.epoch == 3
    assert p.status.recovery is not None
    assert p.status.recovery.causes == {member(2): Cause.STRAGGLER}
    assert p.status.straggler_hold_step is None


def test_no_checkpoint_signal_replaces_at_once() -> None:
    """An agent that publishes no newest step (it sees no checkpoint) gives nothing to wait for."""
    policy = Policy(straggler_factor=2.0, straggler_action=StragglerAction.RECREATE)
    p = plan(snapshot(pod_list=newest(gang(), 100, 100, None, 100), policy=policy))
    assert p.status.epoch == 3


def test_a_straggler_that_recovers_clears_the_hold() -> None:
    policy = Policy(straggler_factor=2.0, straggler_action=StragglerAction.RECREATE)
    p = plan(snapshot(pod_list=newest(gang(), 100, 100, 100, 100), policy=policy))
    assert p.status.straggler_hold_step == 100
    fast = newest(gang(slow=99), 110, 110, 110, 110)  # no straggler any more
    p = plan(snapshot(pod_list=fast, policy=policy, status=p.status))
    assert (p.status.epoch, p.status.straggler_hold_step, p.status.stragglers) == (2, None, {})
