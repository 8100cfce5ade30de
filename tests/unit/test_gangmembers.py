"""What each member reported, for people (core/gangmembers.py): the rows, when they are
written, how they read back, and a member's restarts in place."""

from __future__ import annotations

import dataclasses

from jobset_inplace.core.gangmembers import (
    MemberRow,
    inplace_restarts,
    member_rows,
    members_object,
    next_write_at,
    rows_by_pod,
    write_interval,
)
from jobset_inplace.core.model import HISTORY_LIMIT, Cause, Recovery
from jobset_inplace.times import rfc3339

from .gangs import NOW, member, pods, running


def test_a_row_per_member_pod_not_being_deleted_with_its_newest_step() -> None:
    p0, p1, p2 = pods(3, epoch=4, steps=(100, 200))
    p1 = dataclasses.replace(p1, newest_step=300, reported_epoch=None, reported_steps=None)
    p2 = dataclasses.replace(p2, deleting=True)
    assert member_rows([p1, p2, p0]) == (
        MemberRow(member(0), "p0", 4, 200),
        MemberRow(member(1), "p1", None, 300),
    )


def test_rows_are_in_the_rows_own_order_whatever_order_the_pods_come_in() -> None:
    many = pods(30, epoch=2, steps=(100,))
    # a member with two pods at once (its replacement made before the old one went)
    twin = dataclasses.replace(many[7], name="p7-new", uid="u7-new", reported_epoch=None)
    shuffled = [*many[::-1][:10], twin, *many[::-1][10:]]
    rows = member_rows(shuffled)
    assert rows == tuple(sorted(rows))  # the dataclass's own order
    assert [r.pod for r in rows if r.member == member(7)] == ["p7", "p7-new"]


def test_rows_are_written_at_most_every_interval_for_their_count() -> None:
    rows = member_rows(pods(2, epoch=2))
    assert next_write_at(None, None, 100.0) == 100.0, "nothing written yet by this process"
    assert next_write_at(rows, 100.0, 101.0) == 105.0
    assert next_write_at(rows, 100.0, 106.0) == 106.0, "the interval is over: at once"
    assert write_interval(2) == 5.0
    assert write_interval(5000) == 10.0
    many = member_rows(pods(10_000, epoch=2))
    assert next_write_at(many, 100.0, 101.0) == 120.0, "20 s for 10,000 rows"


def test_the_object_reads_back_as_its_rows_and_malformed_rows_are_skipped() -> None:
    rows = (MemberRow("w/0/0", "p0", 2, None), MemberRow("w/1/0", "p1", None, 40))
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "g", "namespace": "ml", "uid": "u"},
    }
    obj = members_object(jobset, rows, NOW)
    assert obj["members"][0] == {"member": "w/0/0", "pod": "p0", "epoch": 2}, "absent: no key"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert rows_by_pod(obj) == {"p0": rows[0], "p1": rows[1]}
    obj["members"] += [{"member": "w/2/0"}, {"member": "w/3/0", "pod": "p3", "epoch": "x"}]
    assert set(rows_by_pod(obj)) == {"p0", "p1"}
    assert rows_by_pod(None) == {}


def test_restarts_in_place_are_the_recoveries_begun_after_the_pod() -> None:
    history = [{"startedAt": rfc3339(NOW - 300 + 100 * i)} for i in range(3)]  # -300 -200 -100
    status = running(4, history=history)
    assert inplace_restarts(NOW - 1000, status) == (3, False)
    assert inplace_restarts(NOW - 150, status) == (1, False)
    ongoing = Recovery(epoch=5, started=NOW - 10, deadline=NOW + 60)
    assert inplace_restarts(NOW - 150, running(4, history=history, recovery=ongoing)) == (
        1,
        False,
    ), "a recovery without causes (the gang's start) restarts nobody"
    ongoing = dataclasses.replace(ongoing, causes={member(0): Cause.TRAINER_EXITED})
    assert inplace_restarts(NOW - 150, running(4, history=history, recovery=ongoing)) == (2, False)
    full = [{"startedAt": rfc3339(NOW - 100 + i)} for i in range(HISTORY_LIMIT)]
    assert inplace_restarts(NOW - 1000, running(4, history=full)) == (HISTORY_LIMIT, True)
    assert inplace_restarts(NOW - 90.5, running(4, history=full)) == (10, False)
