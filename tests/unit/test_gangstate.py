"""The GangState status: which writes are progress only, and the encoding the controller
writes and reads back (``status_to_dict`` / ``status_from_dict``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from jobset_inplace.core.gangstate import (
    progress_only,
    progress_write_interval,
    status_from_dict,
    status_to_dict,
)
from jobset_inplace.core.goodput import Bucket, Ledger
from jobset_inplace.core.model import (
    Cause,
    GangStatus,
    Mark,
    NotedProgress,
    PlannedStop,
    Recovery,
    Repeats,
    ReportEndpoint,
    StepRecheck,
)
from jobset_inplace.core.statemachine import Edge, Phase
from jobset_inplace.protocol.gangstate import FRONTS_MAX, Endpoint, Front, GangView, parse_gangstate


def test_member_counts_alone_are_progress() -> None:
    old = GangStatus(phase=Phase.RECOVERING, epoch=3, expected=10, reported=4, ready=9)
    assert progress_only(old, dataclasses.replace(old, reported=5))
    assert progress_only(old, dataclasses.replace(old, reported=5, ready=10))


def test_anything_agents_or_the_planner_act_on_is_not() -> None:
    old = GangStatus(phase=Phase.RECOVERING, epoch=3, expected=10, reported=4)
    assert not progress_only(old, old)  # no change: nothing to write at all
    # a channel failing agents is surfaced at once; the count's later changes are progress
    assert not progress_only(old, dataclasses.replace(old, on_pod=1))
    assert progress_only(dataclasses.replace(old, on_pod=1), dataclasses.replace(old, on_pod=2))
    assert progress_only(dataclasses.replace(old, on_pod=2), old)
    assert not progress_only(old, dataclasses.replace(old, reported=10, barrier_open=True))
    assert not progress_only(old, dataclasses.replace(old, epoch=4))
    assert not progress_only(old, dataclasses.replace(old, phase=Phase.RUNNING))
    assert not progress_only(old, dataclasses.replace(old, recreate_used=1))


def test_count_writes_get_rarer_for_large_gangs_only() -> None:
    assert progress_write_interval(4) == 1.0
    assert progress_write_interval(1000) == 1.0
    assert progress_write_interval(5000) == 5.0


# --- the GangState status encoding: what the controller writes, it reads back ------------------
# Times are multiples of 1/64 s: exact in binary and in the 6 decimals of the RFC 3339 encoding.
T0 = 1_790_000_000.0


def full_status() -> GangStatus:
    """Every field away from its default, with a recovery in flight that has opened."""
    return GangStatus(
        phase=Phase.RUNNING,
        epoch=7,
        barrier_open=True,
        resume_step=4200,
        restart_attempt=2,
        recovery=Recovery(
            epoch=7,
            started=T0 + 0.25,
            deadline=T0 + 300.5,
            causes={"workers/1/0": Cause.NODE_UNHEALTHY, "workers/3/0": Cause.TRAINER_EXITED},
            in_place=3,
            recreated={"workers/1/0": "uid-old-1"},
            deadline_extended=True,
            opened=T0 + 12.015625,
            resume_step=4200,
            opened_by=Edge.MEMBER_FAILED,
            first_signal=Cause.NODE_UNHEALTHY,
            first_signal_at=T0 - 14.5,
            signal_window=10.0,
            progress_lost=17,
            hangs_counted=True,
        ),
        history=[{"epoch": 6, "causes": {"workers/0/0": "PodFailed"}, "durationSeconds": 4.5}],
        inplace_used=3,
        recreate_used=1,
        member_failures={"workers/3/0": 2},
        expected=4,
        reported=4,
        ready=4,
        waiting=["workers/2/0"],
        on_pod=1,
        reason="BarrierOpen",
        message="resumed at step 4200",
        restart_request="2026-01-01T00:00:00Z",
        kueue_margin_s=60.0,
        stragglers={"workers/2/0": 1.8},
        straggler_hold_step=4300,
        report_endpoint=ReportEndpoint(
            "https://10.244.0.1:9444/v1/reports",
            "ab" * 32,
            "c0ffee",
            (Front("https://10.244.0.2:9444/v1/reports", "cd" * 32),),
        ),
        goodput=Ledger(
            since=T0 - 3600.5,
            productive=3000.25,
            badput={b: 1.5 + i for i, b in enumerate(Bucket)},
            unmeasured=12.125,
            step_seconds=0.5,
            training_epoch=7,
            training_since=T0 + 12.015625,
            training_resume=4200,
            restarted=True,
            training_noted=NotedProgress(4201, T0 + 14.5, 480, 240.25),
            marks=(Mark(T0 - 3600.5, 0.0, 0.0), Mark(T0 + 12.015625, 3000.25, 3030.5)),
        ),
        planned_stop=PlannedStop(
            epoch=7,
            members=("workers/1/0",),
            reason="node n1 cordoned",
            requested=T0 + 20.5,
            deadline=T0 + 620.5,
            step=4321,
        ),
        slots={"workers/1/0": "workers/4/0", "workers/4/0": "workers/1/0"},
        repeats=Repeats("TrainerHung", 2, 4250),
        step_recheck=StepRecheck(5, (4301, 4300), T0 + 35.25),
        in_place_restarts=11,
    )


def round_trip(s: GangStatus) -> GangStatus:
    """Encode, go through JSON as the API stores it, decode."""
    return status_from_dict(json.loads(json.dumps(status_to_dict(s))))


@pytest.mark.parametrize(
    "value",
    [
        "5",
        {"epoch": "5", "steps": [4300], "deadline": "2026-12-01T10:00:00Z"},
        {"epoch": 5, "steps": None, "deadline": "2026-12-01T10:00:00Z"},
        {"epoch": 5, "steps": [], "deadline": "2026-12-01T10:00:00Z"},
        {"epoch": 5, "steps": [4300, "4301"], "deadline": "2026-12-01T10:00:00Z"},
        {"epoch": 5, "steps": [False], "deadline": "2026-12-01T10:00:00Z"},
        {"epoch": 5, "step": 4300, "deadline": "2026-12-01T10:00:00Z"},
        {"epoch": 5, "steps": [4300], "deadline": 12},
    ],
)
def test_a_malformed_second_look_is_dropped(value: Any) -> None:
    """The barrier then opens on the reports it has (as without the second look)."""
    d = status_to_dict(full_status())
    d["stepRecheck"] = value
    assert status_from_dict(d).step_recheck is None


def test_fully_populated_status_survives_the_round_trip() -> None:
    s = full_status()
    assert s.recovery is not None
    defaults = ((s, GangStatus()), (s.recovery, Recovery(0, 0.0, 0.0)), (s.goodput, Ledger()))
    for obj, default in defaults:
        same = [
            f.name
            for f in dataclasses.fields(obj)
            if getattr(obj, f.name) == getattr(default, f.name)
        ]
        assert not same, f"full_status leaves {same} at their defaults"
    back = round_trip(s)
    assert back == s
    assert back.recovery is not None
    assert back.recovery.causes == {
        "workers/1/0": Cause.NODE_UNHEALTHY,
        "workers/3/0": Cause.TRAINER_EXITED,
    }
    # from the first signal (14.5 s before T0), detection included: one duration everywhere
    assert back.recovery.duration == pytest.approx(12.015625 + 14.5)
    assert back.recovery.detection == pytest.approx(0.25 + 14.5)


def test_encoding_is_the_documented_camel_case_json() -> None:
    d = status_to_dict(full_status())
    assert d["phase"] == "Running"
    assert d["barrierOpen"] is True
    assert d["members"] == {
        "expected": 4,
        "reported": 4,
        "ready": 4,
        "waiting": ["workers/2/0"],
        "onPod": 1,
    }
    assert d["reportEndpoint"] == {
        "url": "https://10.244.0.1:9444/v1/reports",
        "certSHA256": "ab" * 32,
        "leader": "c0ffee",
        "fronts": [{"url": "https://10.244.0.2:9444/v1/reports", "certSHA256": "cd" * 32}],
    }
    assert d["budgets"] == {"inPlaceUsed": 3, "recreateUsed": 1}
    rec = d["recovery"]
    assert rec["causes"] == {"workers/1/0": "NodeUnhealthy", "workers/3/0": "TrainerExited"}
    assert rec["startedAt"].endswith("Z")
    assert rec["durationSeconds"] == pytest.approx(26.516)
    assert rec["detectionSeconds"] == pytest.approx(14.75)
    assert rec["recreated"] == {"workers/1/0": "uid-old-1"}
    assert (rec["openedBy"], rec["firstSignal"]) == ("MemberFailed", "NodeUnhealthy")
    assert rec["firstSignalAt"] == "2026-09-21T14:13:05.500000Z"


def test_a_recovery_written_before_its_opening_edge_was_recorded_still_reads() -> None:
    rec = status_to_dict(full_status())["recovery"]
    for key in ("openedBy", "firstSignal", "firstSignalAt"):
        del rec[key]
    back = status_from_dict(status_to_dict(full_status()) | {"recovery": rec}).recovery
    assert back is not None
    assert (back.opened_by, back.first_signal, back.first_signal_at) == (None, None, None)
    assert back.causes == {"workers/1/0": Cause.NODE_UNHEALTHY, "workers/3/0": Cause.TRAINER_EXITED}


@pytest.mark.parametrize("stored", [None, {}, {"phase": "Running"}])
def test_a_missing_status_is_a_gang_seen_for_the_first_time(stored: Any) -> None:
    assert status_from_dict(stored) == GangStatus()


def test_a_status_without_recovery_round_trips() -> None:
    s = GangStatus(phase=Phase.STOOD_DOWN, epoch=3, reason="Kueue", message="evicted")
    assert round_trip(s) == s
    assert status_to_dict(s)["recovery"] is None


times = st.integers(0, 4_000_000_000 * 64).map(lambda n: n / 64)
members = st.text(alphabet="abcdefghij/0123456789-", min_size=1, max_size=20)
small = st.integers(0, 10_000)

recoveries = st.builds(
    Recovery,
    epoch=st.integers(1, 10_000),
    started=times,
    deadline=times,
    causes=st.dictionaries(members, st.sampled_from(list(Cause)), max_size=5),
    in_place=small,
    recreated=st.dictionaries(members, st.text(max_size=36), max_size=5),
    deadline_extended=st.booleans(),
    opened=st.none() | times,
    resume_step=st.none() | small,
    opened_by=st.none() | st.sampled_from(list(Edge)),
    first_signal=st.none() | st.sampled_from(list(Cause)),
    first_signal_at=st.none() | times,
    signal_window=st.sampled_from([0.0, 10.0, 2.5]),
    progress_lost=st.none() | small,
    hangs_counted=st.booleans(),
)

statuses = st.builds(
    GangStatus,
    phase=st.sampled_from(list(Phase)),
    epoch=st.integers(0, 10_000),
    barrier_open=st.booleans(),
    resume_step=st.none() | small,
    restart_attempt=small,
    recovery=st.none() | recoveries,
    history=st.lists(
        st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=4),
        max_size=3,
    ),
    inplace_used=small,
    recreate_used=small,
    member_failures=st.dictionaries(members, small, max_size=5),
    expected=small,
    reported=small,
    ready=small,
    reason=st.text(max_size=20),
    message=st.text(max_size=40),
    restart_request=st.text(max_size=20),
    kueue_margin_s=st.none() | times,
    stragglers=st.dictionaries(members, st.floats(1, 100).map(lambda f: round(f, 2)), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(statuses)
def test_any_status_survives_the_round_trip(s: GangStatus) -> None:
    event(f"recovery: {'none' if s.recovery is None else 'present'}")
    assert round_trip(s) == s


_STEPS = st.integers(0, 10**6)


@st.composite
def agent_read_statuses(draw: st.DrawFn) -> GangStatus:
    """A status with every field an agent reads drawn (the rest default)."""
    barrier = draw(st.booleans())
    stop = draw(
        st.none()
        | st.builds(
            PlannedStop,
            epoch=st.integers(1, 50),
            members=st.just(("workers/1/0",)),
            reason=st.just("node n1 cordoned"),
            requested=st.just(T0),
            deadline=st.just(T0 + 600),
            step=st.none() | _STEPS,
        )
    )
    return GangStatus(
        phase=draw(st.sampled_from(list(Phase))),
        epoch=draw(st.integers(1, 50)),
        barrier_open=barrier,
        resume_step=draw(st.none() | _STEPS),
        report_endpoint=draw(
            st.none()
            | st.builds(
                ReportEndpoint,
                url=st.just("https://10.0.0.7:9444/v1/reports"),
                cert_sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
                leader=st.text("abcdef0123", min_size=1, max_size=8),
                fronts=st.lists(
                    st.builds(
                        Front,
                        url=st.sampled_from(
                            [
                                "https://10.0.0.8:9444/v1/reports",
                                "https://[fd00::9]:9444/v1/reports",
                            ]
                        ),
                        cert_sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
                    ),
                    max_size=FRONTS_MAX,
                ).map(tuple),
            )
        ),
        planned_stop=stop,
        slots=draw(
            st.dictionaries(st.sampled_from(["workers/0/0", "workers/1/0"]), st.just("workers/2/0"))
        ),
        step_recheck=draw(
            st.none()
            | st.builds(
                StepRecheck,
                epoch=st.integers(1, 50),
                steps=st.lists(_STEPS, min_size=1, max_size=16, unique=True).map(tuple),
                deadline=st.just(T0 + 5),
            )
        ),
    )


@settings(max_examples=300)
@given(agent_read_statuses())
def test_agents_read_what_the_controller_writes(s: GangStatus) -> None:
    """One view of the GangState: the status the core writes, as the API stores it, is what
    the agents' parser (standard library only, a parser of its own) reads, field by field."""
    view = parse_gangstate({"status": json.loads(json.dumps(status_to_dict(s)))})
    assert view is not None
    endpoint = s.report_endpoint
    assert view == GangView(
        epoch=s.epoch,
        barrier_open=s.barrier_open,
        resume_step=s.resume_step if s.barrier_open else None,
        phase=s.phase.value,
        endpoint=None
        if endpoint is None
        else Endpoint(endpoint.url, endpoint.cert_sha256, endpoint.leader, endpoint.fronts),
        planned_stop=None
        if s.planned_stop is None
        else (s.planned_stop.epoch, s.planned_stop.step),
        slots=s.slots,
        step_recheck=None
        if s.step_recheck is None
        else (s.step_recheck.epoch, frozenset(s.step_recheck.steps)),
    )
