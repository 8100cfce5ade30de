"""What a report front sends the leader and what it answers (docs/design/report-fronts.md): the
reports the front took off the wire since its last batch, each already bound to its sender by
the sender's token (the front checked it as the leader checks an agent's), in one request::

    {"front": {"url": <its URL>, "certSHA256": <its pin>},
     "reports": [[<namespace>, <gang>, <pod>, <uid>, {<name>: <value>, ...}], ...]}

each entry's last element the agent's ``report`` object as it sent it (:mod:`.envelope`);
``front`` (optional) the front's hello: where agents reach it (the leader names the fronts it
hears from in the GangState status). A batch of no reports is a hello alone (sent while a
front has nothing to forward, so the leader knows it is still there). And the leader's answer,
one per entry in the same order::

    {"answers": [[<status>, {<the answer the agent gets>}], ...]}

Arrays, not objects, per entry: the leader decodes every entry of a recovery (about two thirds
of a small agent request's JSON is its field names). Standard library only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobset_inplace import names

from .envelope import EnvelopeError, Sender, report_values
from .gangstate import Front, parse_front

# The most reports one batch carries (a front sends more as several batches).
BATCH_MAX: Final = 256
# The answer statuses a leader gives an entry (those of the report channel: accepted, a
# malformed report, a pod that is no member, a report it does not keep, no leader).
ANSWER_STATUSES: Final = frozenset({200, 400, 403, 409, 503})

Entry = tuple[Sender, dict[str, str]]
EntryAnswer = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class Batch:
    entries: list[Entry]
    front: Front | None = None  # the front's hello


def encode_batch(entries: Sequence[Entry], front: Front | None = None) -> bytes:
    least = 0 if front is not None else 1
    if not least <= len(entries) <= BATCH_MAX:
        raise ValueError(f"a batch holds {least} to {BATCH_MAX} reports, got {len(entries)}")
    rows = [[s.namespace, s.gang, s.pod, s.uid, values] for s, values in entries]
    body: dict[str, Any] = {"reports": rows}
    if front is not None:
        body["front"] = {
            names.ENDPOINT_URL: front.url,
            names.ENDPOINT_CERT_SHA256: front.cert_sha256,
        }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_batch(payload: bytes) -> Batch:
    """A batch, checked for form (the hello's URL and pin, each sender's four names, each
    report object as :func:`.envelope.parse_request` checks an agent's); raises
    :class:`EnvelopeError` naming the entry and what is wrong."""
    try:
        body = json.loads(payload)
    except ValueError as e:
        raise EnvelopeError(f"the batch is not JSON: {e}") from e
    except RecursionError:
        raise EnvelopeError("the batch is nested too deep") from None
    if not isinstance(body, dict):
        raise EnvelopeError("the batch is not a JSON object")
    front = None
    if "front" in body:
        front = parse_front(body["front"])
        if front is None:
            raise EnvelopeError(
                "front: {url: https://ADDRESS:PORT/PATH, certSHA256: <64 hex digits>} is required"
            )
    rows = body.get("reports")
    least = 0 if front is not None else 1
    if not isinstance(rows, list) or not least <= len(rows) <= BATCH_MAX:
        raise EnvelopeError(
            f"reports: a list of {least} to {BATCH_MAX} entries is required"
            + ("" if least == 0 else " (none only with a front's hello)")
        )
    entries = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 5:
            raise EnvelopeError(f"reports[{i}]: [namespace, gang, pod, uid, report] is required")
        *who, values = row
        if not all(isinstance(name, str) and name for name in who):
            raise EnvelopeError(f"reports[{i}]: namespace, gang, pod and uid: non-empty strings")
        entries.append((Sender(*who), report_values(values, f"reports[{i}].report")))
    return Batch(entries, front)


def encode_answers(answers: Sequence[EntryAnswer]) -> dict[str, Any]:
    """The leader's answer to a batch (a payload: the channel's HTTP layer encodes it)."""
    return {"answers": [[status, payload] for status, payload in answers]}


def decode_answers(payload: bytes, entries: int) -> list[EntryAnswer]:
    """The leader's answers to a batch of ``entries`` reports; raises :class:`EnvelopeError`."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise EnvelopeError(f"the answers are not JSON: {e}") from None
    rows = body.get("answers") if isinstance(body, dict) else None
    if not isinstance(rows, list) or len(rows) != entries:
        raise EnvelopeError(f"answers: a list of {entries} [status, answer] pairs is required")
    out = []
    for i, row in enumerate(rows):
        ok = isinstance(row, list) and len(row) == 2 and isinstance(row[1], dict)
        if not ok or type(row[0]) is not int or row[0] not in ANSWER_STATUSES:
            raise EnvelopeError(
                f"answers[{i}]: [status (one of {sorted(ANSWER_STATUSES)}), object] is required"
            )
        out.append((row[0], row[1]))
    return out
