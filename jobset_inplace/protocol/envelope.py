"""The report channel's request: who sends (the pod, which its token must name) and what (a
report, a progress note or a heartbeat), as one JSON object::

    {"namespace": ..., "gang": ..., "pod": ..., "uid": ..., "report": {<name>: <value>, ...}}

``report`` holds annotation names and values (:mod:`.report`'s codec, as on a pod); empty, it
is a heartbeat; :data:`~jobset_inplace.names.REPORT_PROGRESS_NOTE` goes alone. Standard
library only: the agent encodes, the controller's report server decodes."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from jobset_inplace import names
from jobset_inplace.trainer.progress import ProgressSpan

from .report import (
    AgentReport,
    decode_progress_note,
    decode_report,
    encode_epoch_span,
    encode_report,
)

# What a request's report may hold: the report's keys, or the progress note alone.
ACCEPTED_KEYS: Final = (*names.CHANNEL_REPORT_KEYS, names.REPORT_PROGRESS_NOTE)
SENDER_FIELDS: Final = ("namespace", "gang", "pod", "uid")
_ACCEPTED: Final = frozenset(ACCEPTED_KEYS)


@dataclass(frozen=True)
class Sender:
    namespace: str
    gang: str  # the GangState's (and JobSet's) name
    pod: str
    uid: str


@dataclass(frozen=True)
class ProgressNote:
    """How far the pod's trainers are in the running epoch (over the channel only)."""

    epoch: int
    span: ProgressSpan


@dataclass(frozen=True)
class Heartbeat:
    """The agent is alive (hot spares renew their lease with it); nothing to plan on."""


HEARTBEAT: Final = Heartbeat()
Message = AgentReport | ProgressNote | Heartbeat


class EnvelopeError(ValueError):
    """A request that is not one (the client's fault: HTTP 400), saying which field and the
    accepted form."""


def encode_request(sender: Sender, message: Message) -> bytes:
    who = {f: getattr(sender, f) for f in SENDER_FIELDS}
    return json.dumps({**who, "report": message_values(message)}).encode()


def message_values(message: Message) -> dict[str, str]:
    """The request's ``report`` object for ``message``."""
    if isinstance(message, ProgressNote):
        return {names.REPORT_PROGRESS_NOTE: encode_epoch_span(message.epoch, message.span)}
    if isinstance(message, AgentReport):
        values = encode_report(message)
        if not values:
            raise ValueError("an empty report says nothing (a heartbeat is Heartbeat())")
        return values
    if isinstance(message, Heartbeat):
        return {}
    raise TypeError(f"not a message of the report channel: {message!r:.80}")


def decode_request(payload: bytes) -> tuple[Sender, Message]:
    """The sender and message of a request body; raises :class:`EnvelopeError`."""
    sender, values = parse_request(payload)
    return sender, decode_message(values)


def parse_request(payload: bytes) -> tuple[Sender, dict[str, str]]:
    """The sender and the ``report`` object of a request body, checked for form only: JSON,
    the sender's fields, string values under accepted keys (cheap: what a server may do
    before it has verified the sender's token; :func:`decode_message` after). Raises
    :class:`EnvelopeError`."""
    try:
        body = json.loads(payload)
    except ValueError as e:
        raise EnvelopeError(f"the body is not JSON: {e}") from e
    except RecursionError:  # nested deeper than the interpreter's stack: a report is flat
        raise EnvelopeError("the body is nested too deep for a report") from None
    if not isinstance(body, dict):
        raise EnvelopeError("the body must be a JSON object")
    values = report_values(body.get("report"), "report")
    sender = Sender(*(_text(body, f) for f in SENDER_FIELDS))
    return sender, values


def report_values(values: object, where: str) -> dict[str, str]:
    """``values`` (a request's ``report`` object, at ``where``), checked for form: string values
    under accepted keys, a progress note alone. Raises :class:`EnvelopeError`."""
    # (a JSON object's keys are strings; its values need not be)
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise EnvelopeError(f"{where}: an object of annotation name -> string value is required")
    if not _ACCEPTED.issuperset(values):
        unknown = sorted(set(values) - _ACCEPTED)
        raise EnvelopeError(f"{where}: unknown keys {unknown}; accepted: {list(ACCEPTED_KEYS)}")
    if names.REPORT_PROGRESS_NOTE in values and len(values) > 1:
        raise EnvelopeError(f"{where}: {names.REPORT_PROGRESS_NOTE} goes alone in its request")
    return values


def decode_message(values: Mapping[str, str]) -> Message:
    """The message in a request's ``report`` object (:func:`parse_request`'s); raises
    :class:`EnvelopeError` naming the field that is not in its form.

    A recovery's reports are alike: every member reports the same epoch and, nearly always,
    the same checkpoint steps, in objects that differ only in the envelope around them. So a
    short report (at most :data:`DECODED_VALUE_CHARS` characters of values) is decoded once
    and its message, immutable, kept by its items (at most :data:`DECODED_KEPT` of them, the
    least recently used dropped first). A progress note, different each time, is not kept;
    nor is anything malformed (it raises each time)."""
    if not values:
        return HEARTBEAT
    if names.REPORT_PROGRESS_NOTE in values or sum(map(len, values.values())) > DECODED_VALUE_CHARS:
        return _decode(values)
    return _decoded_once(tuple(values.items()))


# Reports whose decoded message is kept (decode_message): at most this many, each of at most
# this many characters of values (an epoch and a few steps), under 1 MiB in all.
DECODED_KEPT: Final = 1024
DECODED_VALUE_CHARS: Final = 256


@functools.lru_cache(maxsize=DECODED_KEPT)
def _decoded_once(items: tuple[tuple[str, str], ...]) -> Message:
    return _decode(dict(items))


def _decode(values: Mapping[str, str]) -> Message:
    noted = values.get(names.REPORT_PROGRESS_NOTE)
    if noted is not None:
        note, error = decode_progress_note(noted)
        if note is None:
            raise EnvelopeError(f"report: {error}")
        return ProgressNote(*note)
    report, error = decode_report(values)
    if report is None:
        raise EnvelopeError(f"report: {error}")
    return report


def _text(body: Mapping[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise EnvelopeError(f"{field}: a non-empty string is required, got {value!r:.80}")
    return value
