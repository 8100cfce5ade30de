"""A report front's batches to the leader (protocol/front_link.py, docs/design/report-fronts.md):
every batch survives its codec; what is not one is refused naming the entry and the field; the
leader takes a batch's reports exactly as it takes them one request each."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, cast

import pytest

from bench import channel_attack
from jobset_inplace import names
from jobset_inplace.controller import report_server
from jobset_inplace.controller.cache import GangKey
from jobset_inplace.controller.metrics import METRICS
from jobset_inplace.controller.report_server import ReportServer
from jobset_inplace.protocol.envelope import EnvelopeError, Sender, parse_request
from jobset_inplace.protocol.front_link import (
    BATCH_MAX,
    Batch,
    EntryAnswer,
    decode_answers,
    decode_batch,
    encode_answers,
    encode_batch,
)
from jobset_inplace.protocol.gangstate import Front
from jobset_inplace.runtime.report_http import Answer, Request
from jobset_inplace.runtime.report_limits import OVER_UNAUTHENTICATED
from jobset_inplace.runtime.report_tokens import Identity, TokenVerifier

from .test_report_server import MemberTokens

SENDER = Sender("ns", "train", "train-workers-0-0-x", "uid-0")
REPORT = {names.REPORT_EPOCH: "3", names.REPORT_STEPS: "300,200"}


HELLO = Front("https://10.0.0.7:9444/v1/reports", "ab" * 32)


def test_a_batch_and_its_answers_survive_their_codec() -> None:
    entries = [(SENDER, REPORT), (Sender("ns", "train", "p1", "u1"), {})]
    assert decode_batch(encode_batch(entries)) == Batch(entries)
    assert decode_batch(encode_batch(entries, HELLO)) == Batch(entries, HELLO)
    assert decode_batch(encode_batch([], HELLO)) == Batch([], HELLO), "a hello alone"
    answers: list[EntryAnswer] = [
        (200, {"accepted": True, "holds": None}),
        (409, {"error": "not a member"}),
    ]
    payload = json.dumps(encode_answers(answers)).encode()
    assert decode_answers(payload, 2) == answers
    with pytest.raises(ValueError, match=f"1 to {BATCH_MAX} reports"):
        encode_batch([])


ROW = ["ns", "train", "pod", "uid", REPORT]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "the batch is not JSON"),
        (b"[" * 100_000, "nested too deep|not JSON"),
        ([ROW], "the batch is not a JSON object"),
        ({"reports": []}, r"reports: a list of 1 to 256 entries .*none only with a front's hello"),
        ({"reports": [ROW], "front": None}, "front: {url: https://"),
        ({"reports": [], "front": {"url": HELLO.url}}, "front: {url: https://.*certSHA256"),
        ({"reports": [], "front": {"url": "http://x:1/", "certSHA256": "ab" * 32}}, "front: "),
        ({"reports": [], "front": {"url": HELLO.url, "certSHA256": "AB" * 32}}, "front: "),
        (
            {
                "reports": [ROW] * (BATCH_MAX + 1),
                "front": {"url": HELLO.url, "certSHA256": "a" * 64},
            },
            "reports: a list of 0 to 256 entries",
        ),
        ({"reports": [ROW] * (BATCH_MAX + 1)}, "reports: a list of 1 to 256 entries"),
        ({"reports": [ROW, ROW[:4]]}, r"reports\[1\]: \[namespace, gang, pod, uid, report\]"),
        ({"reports": [{"pod": "p"}]}, r"reports\[0\]: \[namespace, gang, pod, uid, report\]"),
        ({"reports": [["ns", "train", "", "uid", {}]]}, r"reports\[0\]: .*non-empty strings"),
        ({"reports": [["ns", "train", 7, "uid", {}]]}, r"reports\[0\]: .*non-empty strings"),
        ({"reports": [["ns", "t", "p", "u", {names.REPORT_EPOCH: 3}]]}, r"reports\[0\]\.report"),
        ({"reports": [["ns", "t", "p", "u", {"evil": "1"}]]}, r"reports\[0\]\.report: unknown"),
        (
            {"reports": [["ns", "t", "p", "u", {names.REPORT_PROGRESS_NOTE: "x", **REPORT}]]},
            r"reports\[0\]\.report: .* goes alone",
        ),
    ],
)
def test_what_is_not_a_batch_is_refused_naming_the_entry(body: object, says: str) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(EnvelopeError, match=says):
        decode_batch(payload)


@pytest.mark.parametrize(
    "answers",
    [
        [[200, {}]],  # one answer for two reports
        [[200, {}], [200, {}], [200, {}]],
        [[200, {}], [True, {}]],
        [[200, {}], [200.0, {}]],
        [[200, {}], [302, {}]],
        [[200, {}], [200, "accepted"]],
    ],
)
def test_answers_that_do_not_fit_the_batch_are_refused(answers: list[Any]) -> None:
    with pytest.raises(EnvelopeError, match=r"answers"):
        decode_answers(json.dumps({"answers": answers}).encode(), 2)


def test_the_leader_takes_a_batch_as_it_takes_each_report_alone() -> None:
    """Two leaders of one gang, the same requests: one handles them one each (their tokens
    checked), the other takes them as a front's batches. The same answers, in order (refusals
    included: a member's malformed report, a pod of no member, a report ahead of the gang),
    the same views in their caches, the same planner pokes."""
    members = 300
    pokes: dict[str, list[tuple[float | None, bool]]] = {"alone": [], "batched": []}

    def leader(which: str) -> ReportServer:
        def poke(key: GangKey, delay: float | None = None, *, urgent: bool = False) -> None:
            pokes[which].append((delay, urgent))

        cache = channel_attack._cache(members)
        verifier = cast(TokenVerifier, MemberTokens())
        return ReportServer(cache, poke, verifier, ("127.0.0.1", 0), "127.0.0.1")

    def body(i: int) -> bytes:
        doc = json.loads(channel_attack.report_body(i))
        if i == 7:
            doc["report"] = {names.REPORT_EPOCH: "07"}  # malformed: 400
        elif i == 11:
            doc["report"] = {names.REPORT_EPOCH: "9"}  # ahead of the gang's epoch 2: 409
        return json.dumps(doc).encode()

    alone, batched = leader("alone"), leader("batched")
    requests = [(f"m{i}", body(i)) for i in range(members)]
    stranger = json.loads(body(1)) | {"pod": "train-workers-x", "uid": "uid-x"}  # no member: 409
    want = []
    for token, raw in requests:
        answer = alone.handle(Request(f"Bearer {token}", raw, True))
        assert isinstance(answer, Answer)
        want.append((answer.status, answer.payload))
    entries = [parse_request(raw) for _, raw in requests]
    got = []
    for start in range(0, members, 64):
        got += batched.take_batch(entries[start : start + 64])
    assert got == want
    assert sorted({status for status, _ in got}) == [200, 400, 409]
    assert batched.take_batch([parse_request(json.dumps(stranger).encode())])[0][0] == 409
    key = (channel_attack.NAMESPACE, channel_attack.GANG)
    assert batched.cache.gangs[key].pods == alone.cache.gangs[key].pods
    assert pokes["batched"] == pokes["alone"]


def test_a_replica_that_cannot_prove_it_leads_takes_no_batch() -> None:
    s = ReportServer(
        channel_attack._cache(2),
        lambda key, delay=None, *, urgent=False: None,
        cast(TokenVerifier, MemberTokens()),
        ("127.0.0.1", 0),
        "127.0.0.1",
        leads=lambda: False,
    )
    answers = s.take_batch([parse_request(channel_attack.report_body(i)) for i in range(2)])
    assert [status for status, _ in answers] == [503, 503]
    assert s.accepted == 0


class FrontTokens(MemberTokens):
    """MemberTokens, and ``front``: a pod of the controller's own service account."""

    def remembered(self, token: str) -> Identity | None:
        if token == "front":
            return Identity(channel_attack.NAMESPACE, "controller-1", "uid-front", 1e12, "jsi")
        return super().remembered(token)


def linked_leader(members: int) -> ReportServer:
    """A leader of channel_attack's gang of ``members``, with a link for fronts: pods of the
    service account ``jsi`` (FrontTokens' ``front``)."""
    return ReportServer(
        channel_attack._cache(members),
        lambda key, delay=None, *, urgent=False: None,
        cast(TokenVerifier, FrontTokens()),
        ("127.0.0.1", 0),
        "127.0.0.1",
        link=("127.0.0.1", 0),
        fronts=lambda who: who.service_account == "jsi",
    )


async def post(port: int, path: str, token: str, body: bytes) -> tuple[int, bytes]:
    """One request over TLS to the leader's ``port``: (status, body)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: leader\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await reader.readexactly(length)
    finally:
        writer.close()


async def test_fronts_send_batches_over_the_link_and_nobody_else_does() -> None:
    """The leader's link for report fronts, over TLS on loopback: a batch from a pod of the
    controller's own service account is taken and answered per report; a member's token is
    refused (403: an agent speaks only for its own pod); a body that is no batch 400, one
    beyond the link's limit 413 (before its token is looked at), and a report sent to the
    link's port is no batch (404)."""
    s = linked_leader(4)
    await s.start()
    try:
        assert s.link_port is not None
        path = names.REPORT_LINK_PATH
        batch = encode_batch([parse_request(channel_attack.report_body(i)) for i in range(4)])
        status, body = await post(s.link_port, path, "front", batch)
        assert status == 200
        assert [a for a, _ in decode_answers(body, 4)] == [200] * 4
        assert (s.batches, s.accepted) == (1, 4)
        status, body = await post(s.link_port, path, "m1", batch)
        assert status == 403, body
        assert b"no report front" in body
        assert (await post(s.link_port, path, "front", b'{"reports": 7}'))[0] == 400
        big = b" " * (report_server.LINK_MAX_BODY + 1)
        assert (await post(s.link_port, path, "front", big))[0] == 413
        report = channel_attack.report_body(1)
        assert (await post(s.link_port, names.REPORT_PATH, "m1", report))[0] == 404
        assert s.accepted == 4
    finally:
        await s.stop()


async def test_the_link_holds_few_strangers() -> None:
    """The link serves a few replicas: from one address, at most LINK_LIMITS'
    max_unauthenticated_per_source connections wait unauthenticated (each may hold a body of
    up to LINK_MAX_BODY before its token is looked at); the next is dropped at once and
    counted, and a front's batch still gets through once they are gone."""
    s = linked_leader(2)
    dropped = METRICS.report_channel_connections_refused.labels(OVER_UNAUTHENTICATED)
    before = dropped._value.get()
    await s.start()
    held = []
    try:
        assert s.link_port is not None
        assert s.link is not None
        per_source = report_server.LINK_LIMITS.max_unauthenticated_per_source
        for _ in range(per_source + 1):
            held.append(await asyncio.open_connection("127.0.0.1", s.link_port))
        for _ in range(200):  # the leader takes them in its loop's next turns
            if dropped._value.get() > before:
                break
            await asyncio.sleep(0.01)
        assert dropped._value.get() == before + 1
        assert len(s.link.unauthenticated) == per_source
        for _, writer in held:
            writer.close()
        held.clear()
        batch = encode_batch([parse_request(channel_attack.report_body(0))])
        for _ in range(200):  # closed connections leave the count as the leader sees them end
            if not s.link.unauthenticated:
                break
            await asyncio.sleep(0.01)
        assert (await post(s.link_port, names.REPORT_LINK_PATH, "front", batch))[0] == 200
    finally:
        for _, writer in held:
            writer.close()
        await s.stop()
