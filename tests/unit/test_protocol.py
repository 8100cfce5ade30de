"""The agent-controller protocol (jobset_inplace/protocol): every report survives both wires
(the pod's annotations as the API stores them, and the channel's request as the leader reads
it) unchanged; what is not a request is refused naming the field."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobset_inplace import names
from jobset_inplace.core.decode import pod_view
from jobset_inplace.core.model import PodView
from jobset_inplace.protocol import envelope
from jobset_inplace.protocol.envelope import (
    HEARTBEAT,
    EnvelopeError,
    Heartbeat,
    ProgressNote,
    Sender,
    decode_message,
    decode_request,
    encode_request,
    parse_request,
)
from jobset_inplace.protocol.report import EMPTY, AgentReport, decode_report, encode_report
from jobset_inplace.trainer.checkpoints import MAX_STEP
from jobset_inplace.trainer.progress import MAX_SPAN_MS, ProgressSpan

SENDER = Sender("ns", "train", "train-workers-0-0-x", "uid-0")
numbers = st.integers(0, MAX_STEP)
maybe = st.none() | numbers


@st.composite
def spans(draw: st.DrawFn) -> ProgressSpan:
    first, last = sorted(draw(st.lists(numbers, min_size=2, max_size=2)))
    first_ms, last_ms = sorted(draw(st.lists(st.integers(0, MAX_SPAN_MS), min_size=2, max_size=2)))
    return ProgressSpan(first, first_ms / 1000, last, last_ms / 1000)


steps = st.lists(numbers, max_size=16, unique=True).map(lambda s: tuple(sorted(s, reverse=True)))
reports = st.builds(
    AgentReport,
    reported_epoch=maybe,
    reported_steps=st.none() | steps,
    late_for_epoch=maybe,
    exited_in_epoch=maybe,
    hung_in_epoch=maybe,
    progress_step=maybe,
    progress_span=st.none() | spans(),
    progress_now=st.none() | st.tuples(numbers, st.none() | spans()),
    parked_in_epoch=maybe,
    rechecked_epoch=maybe,
)


def on_pod(annotations: dict[str, str]) -> dict[str, object]:
    labels = {
        names.REPLICATED_JOB_LABEL: "workers",
        names.JOB_INDEX_LABEL: "0",
        names.COMPLETION_INDEX_LABEL: "0",
    }
    meta = {"name": "p", "uid": "u", "labels": labels, "annotations": annotations}
    return {"metadata": meta, "status": {"phase": "Running"}}


@settings(max_examples=400, deadline=None)
@given(reports)
def test_every_report_survives_both_wires(report: AgentReport) -> None:
    encoded = encode_report(report)
    assert decode_report(encoded) == (report, None)
    # the pod: annotations through the API's JSON, read back as the planner's view
    stored = json.loads(json.dumps(encoded))
    view = pod_view(on_pod(stored))
    assert view is not None
    assert view.report_error is None
    assert view.report == report
    # the channel: the leader reads what the agent sent
    if report == EMPTY:
        with pytest.raises(ValueError, match="a heartbeat is Heartbeat"):
            encode_request(SENDER, report)
        return
    assert decode_request(encode_request(SENDER, report)) == (SENDER, report)


@settings(max_examples=100, deadline=None)
@given(numbers, spans())
def test_a_progress_note_and_a_heartbeat_survive_the_channel(
    epoch: int, span: ProgressSpan
) -> None:
    note = ProgressNote(epoch, span)
    assert decode_request(encode_request(SENDER, note)) == (SENDER, note)
    assert decode_request(encode_request(SENDER, HEARTBEAT)) == (SENDER, Heartbeat())


@settings(max_examples=200, deadline=None)
@given(reports, reports)
def test_a_merged_addition_says_what_it_adds_and_keeps_the_rest(
    record: AgentReport, addition: AgentReport
) -> None:
    merged = record.merged(addition)
    for field in AgentReport.__dataclass_fields__:
        added = getattr(addition, field)
        assert getattr(merged, field) == (getattr(record, field) if added is None else added)


@settings(max_examples=100, deadline=None)
@given(reports)
def test_the_planners_view_holds_every_field_of_a_report(report: AgentReport) -> None:
    """PodView.report and with_report name every field (one added to the report and not to
    the view would be lost between the wire and the planner)."""
    assert set(AgentReport.__dataclass_fields__) <= set(PodView.__dataclass_fields__)
    view = PodView("p", "u", "workers/0/0", None, "Running", 0.0, report_error="kept")
    assert view.with_report(report).report == report
    assert view.with_report(report).report_error == "kept"
    said = {f: getattr(report, f) for f in AgentReport.__dataclass_fields__}
    for well_formed in (False, True):
        made = view.with_report(report, well_formed=well_formed)
        error = None if well_formed else "kept"
        assert made == dataclasses.replace(view, report_error=error, **said)
        assert set(vars(made)) == set(PodView.__dataclass_fields__), "no field but the view's"
        assert hash(made) == hash(dataclasses.replace(view, report_error=error, **said))


GOOD = {
    "namespace": "ns",
    "gang": "train",
    "pod": "train-workers-0-0-x",
    "uid": "uid-0",
    "report": {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "200"},
}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "the body is not JSON"),
        (b"[" * 100_000, "nested too deep|not JSON"),
        ([], "must be a JSON object"),
        ({**GOOD, "report": {names.REPORT_EPOCH: 3}}, "report: an object of annotation name"),
        ({**GOOD, "report": {names.REPORT_BUSY: "10"}}, "unknown keys"),
        (
            {**GOOD, "report": {names.REPORT_EPOCH: "3", names.REPORT_PROGRESS_NOTE: "3:1@1,2@2"}},
            "progress-note goes alone in its request",
        ),
        ({**GOOD, "report": {names.REPORT_PROGRESS_NOTE: "3:"}}, "<epoch>:<progress span>"),
        ({**GOOD, "report": {names.REPORT_EPOCH: "03"}}, "report: .*epoch='03' is not an integer"),
        ({**GOOD, "uid": ""}, "uid: a non-empty string is required"),
        ({k: v for k, v in GOOD.items() if k != "gang"}, "gang: a non-empty string"),
    ],
)
def test_a_malformed_request_names_its_field(body: object, says: str) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(EnvelopeError, match=says):
        decode_request(payload)


def test_the_form_of_a_request_is_checked_apart_from_its_report() -> None:
    """A server checks the form before it verifies the sender's token and decodes the report
    only after: a malformed report passes the first look."""
    body = {**GOOD, "report": {names.REPORT_EPOCH: "one"}}
    sender, values = parse_request(json.dumps(body).encode())
    assert (sender, values) == (SENDER, {names.REPORT_EPOCH: "one"})
    with pytest.raises(EnvelopeError, match="epoch='one' is not an integer"):
        decode_message(values)


def test_a_well_formed_request_is_decoded() -> None:
    assert decode_request(json.dumps(GOOD).encode()) == (
        SENDER,
        AgentReport(reported_epoch=3, reported_steps=(200,)),
    )


def test_alike_reports_are_decoded_once_and_what_is_kept_is_bounded() -> None:
    """The leader decodes a recovery's alike reports once (envelope.decode_message): the same
    message for the same report object, however many members send it; a malformed one refused
    each time; a progress note (different each time) and a long report never kept; at most
    DECODED_KEPT kept."""
    envelope._decoded_once.cache_clear()
    values = {names.REPORT_EPOCH: "7", names.REPORT_STEPS: "700,600"}
    first = decode_message(dict(values))
    assert first == AgentReport(reported_epoch=7, reported_steps=(700, 600))
    assert decode_message(dict(values)) is first
    for _ in range(2):
        with pytest.raises(EnvelopeError, match="epoch='07' is not an integer"):
            decode_message({names.REPORT_EPOCH: "07"})
    note = {names.REPORT_PROGRESS_NOTE: "7:10@1000,20@2000"}
    assert isinstance(decode_message(note), ProgressNote)
    many = tuple(range(1100, 1000, -1))
    steps = ",".join(map(str, many))  # longer than DECODED_VALUE_CHARS
    assert decode_message({names.REPORT_EPOCH: "7", names.REPORT_STEPS: steps}) == AgentReport(
        reported_epoch=7, reported_steps=many
    )
    assert envelope._decoded_once.cache_info().currsize == 1
    for epoch in range(envelope.DECODED_KEPT + 10):
        decode_message({names.REPORT_EPOCH: str(epoch)})
    assert envelope._decoded_once.cache_info().currsize == envelope.DECODED_KEPT
