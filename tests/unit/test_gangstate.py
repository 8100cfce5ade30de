import dataclasses

from jobset_inplace.core.gangstate import progress_only, progress_write_interval
from jobset_inplace.core.model import GangStatus, Phase


def test_member_counts_alone_are_progress() -> None:
    old = GangStatus(phase=Phase.RECOVERING, epoch=3, expected=10, reported=4, ready=9)
    assert progress_only(old, dataclasses.replace(old, reported=5))
    assert progress_only(old, dataclasses.replace(old, reported=5, ready=10))


def test_anything_agents_or_the_planner_act_on_is_not() -> None:
    old = GangStatus(phase=Phase.RECOVERING, epoch=3, expected=10, reported=4)
    assert not progress_only(old, old)  # no change: nothing to write at all
    assert not progress_only(old, dataclasses.replace(old, reported=10, barrier_open=True))
    assert not progress_only(old, dataclasses.replace(old, epoch=4))
    assert not progress_only(old, dataclasses.replace(old, phase=Phase.RUNNING))
    assert not progress_only(old, dataclasses.replace(old, recreate_used=1))


def test_count_writes_get_rarer_for_large_gangs_only() -> None:
    assert progress_write_interval(4) == 1.0
    assert progress_write_interval(1000) == 1.0
    assert progress_write_interval(5000) == 5.0
