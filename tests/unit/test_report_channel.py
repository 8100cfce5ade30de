"""The report channel in the decision core: a report over the channel decodes like the pod
annotations (same keys, same errors), the newer of the two wins, and the status names the
leader's channel (a change is written at once: it is how agents learn to send again)."""

from __future__ import annotations

import dataclasses

import pytest

from jobset_inplace import names
from jobset_inplace.core.decode import pod_view, with_channel_report
from jobset_inplace.core.model import (
    WAITING_SHOWN,
    Event,
    Plan,
    PodView,
    Recovery,
    ReportEndpoint,
)
from jobset_inplace.core.planner import plan
from jobset_inplace.core.statemachine import Phase
from jobset_inplace.protocol.report import AgentReport, decode_report, newer_report
from jobset_inplace.trainer.progress import ProgressSpan

from .gangs import NOW, pods, running, snapshot, with_pod

# The gang's epoch in the merge tests: no report of theirs is ahead of it.
GANG_EPOCH = 9
ENDPOINT = ReportEndpoint("https://10.244.0.1:9444/v1/reports", "ab" * 32, "leader-1")


def report(**values: str) -> dict[str, str]:
    return {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "200,100"} | values


def decoded(values: dict[str, str]) -> AgentReport:
    report, error = decode_report(values)
    assert report is not None, error
    return report


def view(**fields: object) -> PodView:
    return dataclasses.replace(pods(1, epoch=2)[0], **fields)  # type: ignore[arg-type]


def test_a_channel_report_decodes_like_the_annotations() -> None:
    fields, error = decode_report(
        report(
            **{
                names.REPORT_EXITED: "3",
                names.REPORT_PROGRESS_STEP: "217",
                names.REPORT_PROGRESS_SPAN: "101@1790000000250,217@1790000058250",
                names.REPORT_RECHECKED: "3",
            }
        )
    )
    assert error is None
    assert fields == AgentReport(
        reported_epoch=3,
        reported_steps=(200, 100),
        exited_in_epoch=3,
        progress_step=217,
        progress_span=ProgressSpan(101, 1_790_000_000.25, 217, 1_790_000_058.25),
        rechecked_epoch=3,
    )
    _, error = decode_report(report(**{names.REPORT_PROGRESS_STEP: "-1"}))
    assert error is not None
    assert names.REPORT_PROGRESS_STEP in error


@pytest.mark.parametrize(
    ("key", "raw", "says"),
    [
        (names.REPORT_EPOCH, "three", "is not an integer"),
        (names.REPORT_EPOCH, "03", "is not an integer"),
        (names.REPORT_STEPS, "200,x", names.REPORT_STEPS),
        (names.REPORT_HUNG, "-1", "is not an integer"),
        (names.REPORT_PROGRESS_SPAN, "101@5", "<first step>@<ms since the epoch>"),
        (names.REPORT_PROGRESS_SPAN, "101@5,100@6", "neither going backwards"),
        (names.REPORT_PROGRESS_SPAN, "1@6,2@5", "neither going backwards"),
        (names.REPORT_PROGRESS_SPAN, "1@05,2@6", "canonical integers"),
        (names.REPORT_PROGRESS_SPAN, "1@5,2@" + "9" * 15, "canonical integers"),
        (names.REPORT_PROGRESS_NOW, "3", "<epoch>:<progress span, or nothing>"),
        (names.REPORT_PROGRESS_NOW, "3:1@5", "<epoch>:<progress span, or nothing>"),
        (names.REPORT_PARKED, "three", "is not an integer"),
        (names.REPORT_RECHECKED, " 3", "is not an integer"),
    ],
)
def test_a_malformed_report_names_the_field_and_sets_nothing(key: str, raw: str, says: str) -> None:
    fields, error = decode_report(report(**{key: raw}))
    assert fields is None
    assert error is not None
    assert key in error
    assert says in error


def test_the_newer_report_wins_whichever_way_it_came() -> None:
    annotated = view()  # reported epoch 2 on its pod
    fields = decoded(report())  # epoch 3 over the channel
    assert with_channel_report(annotated, fields, GANG_EPOCH).reported_epoch == 3
    # the channel failed for epoch 4: the agent wrote it on its pod; the older channel report
    # of epoch 3 must not hide it
    newer_on_pod = view(reported_epoch=4, reported_steps=(300,))
    assert with_channel_report(newer_on_pod, fields, GANG_EPOCH) == newer_on_pod
    # an exit seen in the same epoch comes after that epoch's report
    exited = decoded(report(**{names.REPORT_EXITED: "3"}))
    same_epoch_on_pod = view(reported_epoch=3, reported_steps=(200, 100))
    assert with_channel_report(same_epoch_on_pod, exited, GANG_EPOCH).exited_in_epoch == 3
    assert (
        with_channel_report(
            view(reported_epoch=3, exited_in_epoch=3), fields, GANG_EPOCH
        ).exited_in_epoch
        == 3
    )


def test_an_exit_written_on_the_pod_after_the_epochs_channel_report_is_not_hidden() -> None:
    """The channel took epoch 3's report, then failed: the agent wrote the trainer's exit on
    its pod. Whatever the pod holds (the whole record, or, from an older agent, the exit
    alone), the exit is what the planner sees, with the epoch's steps."""
    fields = decoded(report())  # epoch 3 over the channel
    whole = view(reported_epoch=3, reported_steps=(200, 100), exited_in_epoch=3)
    alone = view(reported_epoch=None, reported_steps=None, exited_in_epoch=3)
    for on_pod in (whole, alone):
        merged = with_channel_report(on_pod, fields, GANG_EPOCH)
        assert (merged.reported_epoch, merged.exited_in_epoch) == (3, 3)
        assert merged.reported_steps == (200, 100)
    # a hang alone on the pod, the same
    hung = with_channel_report(view(reported_epoch=None, hung_in_epoch=3), fields, GANG_EPOCH)
    assert (hung.reported_epoch, hung.hung_in_epoch) == (3, 3)
    # an exit of an older epoch on the pod is not newer than epoch 3's report
    old = with_channel_report(view(reported_epoch=None, exited_in_epoch=2), fields, GANG_EPOCH)
    assert (old.reported_epoch, old.exited_in_epoch) == (3, None)


def test_a_late_older_channel_report_does_not_replace_a_newer_one() -> None:
    newer = decoded(report(**{names.REPORT_EPOCH: "4"}))
    exited = decoded(report(**{names.REPORT_EXITED: "3"}))
    older = decoded(report())
    assert newer_report(None, older, GANG_EPOCH)
    assert newer_report(older, newer, GANG_EPOCH)
    assert not newer_report(newer, older, GANG_EPOCH)
    assert newer_report(older, exited, GANG_EPOCH), (
        "an exit in epoch 3 comes after epoch 3's report"
    )
    assert not newer_report(exited, older, GANG_EPOCH)
    assert newer_report(older, older, GANG_EPOCH), "the same report again (a resend) is kept"


def test_a_channel_report_clears_an_older_malformed_annotation() -> None:
    bad = view(reported_epoch=None, reported_steps=None, report_error="epoch='x' is bad")
    fields = decoded(report())
    merged = with_channel_report(bad, fields, GANG_EPOCH)
    assert merged.report_error is None
    assert merged.reported_epoch == 3


def test_the_status_names_the_leaders_channel_and_a_new_leader_rewrites_it() -> None:
    gang = pods(4, epoch=2)
    first = plan(
        dataclasses.replace(snapshot(status=running(), pod_list=gang), report_endpoint=ENDPOINT)
    )
    assert first.status.report_endpoint == ENDPOINT
    assert first.status != running()  # a change the reconciler writes at once
    taken_over = ReportEndpoint(ENDPOINT.url, ENDPOINT.cert_sha256, "leader-2")
    s = snapshot(status=first.status, pod_list=gang)
    assert (
        plan(dataclasses.replace(s, report_endpoint=taken_over)).status.report_endpoint
        == taken_over
    )
    # a controller without the channel tells agents to write their reports on their pods
    assert plan(s).status.report_endpoint is None


def test_the_status_names_the_members_a_recovery_still_waits_for() -> None:
    gang = pods(12, epoch=3)
    late = [
        dataclasses.replace(p, reported_epoch=2) if i in (1, 5) else p for i, p in enumerate(gang)
    ]
    status = dataclasses.replace(running(), phase=Phase.RECOVERING, epoch=3, barrier_open=False)
    status.recovery = Recovery(epoch=3, started=NOW - 1, deadline=NOW + 300, causes={})
    p = plan(snapshot(12, status=status, pod_list=late))
    assert p.status.waiting == [late[1].member, late[5].member]
    everyone_late = [dataclasses.replace(x, reported_epoch=2) for x in gang]
    p = plan(snapshot(12, status=status, pod_list=everyone_late))
    assert len(p.status.waiting) == WAITING_SHOWN
    opened = plan(snapshot(12, status=status, pod_list=gang)).status
    assert opened.barrier_open
    assert opened.waiting == []


def _events(p: Plan, reason: str) -> list[Event]:
    return [a for a in p.actions if isinstance(a, Event) and a.reason == reason]


def test_an_exit_that_reached_only_the_pod_is_acted_on_and_surfaced() -> None:
    """The crashed member's channel failed: its agent wrote the exit on its pod. The recovery
    starts as from a channel report, and a Warning Event names it and the channel. The
    status's count is of the new epoch's reports, none yet (epoch 2's counts are not written
    with epoch 3: a member that then reports on its pod again is counted from 0 to 1, which is
    written at once)."""
    gang = with_pod(pods(4, epoch=2), 1, exited_in_epoch=2, pod_report_epoch=2)
    s = dataclasses.replace(snapshot(status=running(), pod_list=gang), report_endpoint=ENDPOINT)
    p = plan(s)
    assert (p.status.epoch, p.status.phase) == (3, Phase.RECOVERING)
    assert (p.status.on_pod, p.status.reported) == (0, 0)
    assert p.status.waiting == [f"workers/{i}/0" for i in range(4)]
    [event] = _events(p, "ReportChannelUnreachable")
    assert event.warning
    assert "workers/1/0" in event.message
    assert ENDPOINT.url in event.message
    assert "epoch 2" in event.message
    # posted once: the next pass with the same count posts nothing
    again = dataclasses.replace(s, posted=frozenset({event.once_key or ""}))
    assert _events(plan(again), "ReportChannelUnreachable") == []


def test_reports_on_pods_are_surfaced_in_bounded_events() -> None:
    """A channel broken for a whole gang: one Event when the count first reaches 1, 2, 4, 8,
    ... in an epoch, not one per member."""
    n, keys = 64, set[str]()
    for k in range(1, n + 1):
        gang = [
            dataclasses.replace(x, pod_report_epoch=2) if i < k else x
            for i, x in enumerate(pods(n, epoch=2))
        ]
        s = dataclasses.replace(
            snapshot(n, status=running(), pod_list=gang),
            report_endpoint=ENDPOINT,
            posted=frozenset(keys),
        )
        p = plan(s)
        assert p.status.on_pod == k
        keys |= {e.once_key or "" for e in _events(p, "ReportChannelUnreachable")}
    assert len(keys) == 7  # 1, 2, 4, 8, 16, 32, 64


def test_reports_on_pods_are_not_surfaced_without_a_channel_or_from_an_older_epoch() -> None:
    on_pod = [dataclasses.replace(x, pod_report_epoch=2) for x in pods(4, epoch=2)]
    # no channel served: the pod is where every report goes
    p = plan(snapshot(status=running(), pod_list=on_pod))
    assert (p.status.on_pod, _events(p, "ReportChannelUnreachable")) == (0, [])
    # an older epoch's report left on a pod (its agent has not cleared it yet) is not counted
    old = [dataclasses.replace(x, pod_report_epoch=1) for x in pods(4, epoch=2)]
    s = dataclasses.replace(snapshot(status=running(), pod_list=old), report_endpoint=ENDPOINT)
    p = plan(s)
    assert (p.status.on_pod, _events(p, "ReportChannelUnreachable")) == (0, [])


@pytest.mark.parametrize(
    ("annotations", "epoch"),
    [
        ({}, None),
        ({names.REPORT_EPOCH: "3"}, 3),
        ({names.REPORT_EXITED: "4"}, 4),  # an older agent's fallback: the exit alone
        ({names.REPORT_EPOCH: "3", names.REPORT_HUNG: "3"}, 3),
        ({names.REPORT_EPOCH: "x"}, None),  # malformed: no report at all
    ],
)
def test_the_pod_view_says_which_epoch_its_own_report_is_of(
    annotations: dict[str, str], epoch: int | None
) -> None:
    pod = {
        "metadata": {
            "name": "p",
            "uid": "u",
            "labels": {
                names.REPLICATED_JOB_LABEL: "workers",
                names.JOB_INDEX_LABEL: "0",
                names.COMPLETION_INDEX_LABEL: "0",
            },
            "annotations": annotations,
        },
        "status": {"phase": "Running"},
    }
    v = pod_view(pod)
    assert v is not None
    assert v.pod_report_epoch == epoch
    # a channel report merged in keeps what the pod itself says
    fields = decoded(report(**{names.REPORT_EPOCH: "9"}))
    assert with_channel_report(v, fields, GANG_EPOCH).pod_report_epoch == epoch
