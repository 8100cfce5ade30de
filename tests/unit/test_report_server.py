"""The report channel's settings and request parsing (controller/report_server.py): bad
settings name the variable and the accepted form, a missing address turns the channel off
(agents then report on their pods), and a malformed request names its field.
tests/integration/test_report_channel.py serves it for real."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import cast

import pytest

from bench import channel_attack
from jobset_inplace import names
from jobset_inplace.controller import report_server
from jobset_inplace.controller.cache import ClusterCache, GangKey
from jobset_inplace.controller.metrics import METRICS
from jobset_inplace.controller.report_front import standby_front
from jobset_inplace.controller.report_server import (
    ReportServer,
    report_server_from_env,
)
from jobset_inplace.core.gangstate import progress_write_interval
from jobset_inplace.runtime.report_http import Answer, Refused, Request
from jobset_inplace.runtime.report_tokens import Identity, Rejected, TokenVerifier


def no_poke(key: GangKey, delay: float | None = None, *, urgent: bool = False) -> None:
    pass


def server(**env: str) -> ReportServer | None:
    return report_server_from_env(ClusterCache(), no_poke, env)


def test_the_channel_listens_where_configured_and_is_off_without_an_address() -> None:
    s = server(POD_IP="10.244.1.7")
    assert s is not None
    assert (s.listen, s.advertise) == (("0.0.0.0", names.DEFAULT_REPORT_PORT), "10.244.1.7")
    s = server(POD_IP="10.244.1.7", JSI_REPORT_ADVERTISE="10.0.0.5", JSI_REPORT_LISTEN="[::]:0")
    assert s is not None
    assert (s.listen, s.advertise) == (("::", 0), "10.0.0.5")
    assert server() is None
    assert server(POD_IP="10.244.1.7", JSI_REPORT_ADVERTISE="off") is None


def test_with_an_election_fronts_batches_are_taken_from_its_own_service_account() -> None:
    own = {"POD_IP": "10.244.1.7", "POD_NAMESPACE": "jsi", names.ENV_SERVICE_ACCOUNT: "ctl"}
    s = report_server_from_env(ClusterCache(), no_poke, own, elected=True)
    assert s is not None
    assert s.link_listen == ("0.0.0.0", names.DEFAULT_REPORT_LINK_PORT)
    assert s.fronts(Identity("jsi", "ctl-1", "u", 1e12, service_account="ctl"))
    assert not s.fronts(Identity("jsi", "train-0", "u", 1e12, service_account="default"))
    assert not s.fronts(Identity("other", "ctl-1", "u", 1e12, service_account="ctl"))
    s = report_server_from_env(
        ClusterCache(),
        no_poke,
        {**own, names.ENV_REPORT_LISTEN: "[::]:9444", names.ENV_REPORT_LINK_LISTEN: ""},
        elected=True,
    )
    assert s is not None
    assert s.link_listen == ("::", names.DEFAULT_REPORT_LINK_PORT), "the channel's address"


@pytest.mark.parametrize(
    ("env", "elected"),
    [
        ({"POD_NAMESPACE": "jsi", names.ENV_SERVICE_ACCOUNT: "ctl"}, False),  # one replica
        ({names.ENV_SERVICE_ACCOUNT: "ctl"}, True),  # whose fronts: unknown
        ({"POD_NAMESPACE": "jsi"}, True),
        (
            {
                "POD_NAMESPACE": "jsi",
                names.ENV_SERVICE_ACCOUNT: "ctl",
                "JSI_REPORT_LINK_LISTEN": "off",
            },
            True,
        ),
    ],
)
def test_no_link_without_an_election_or_knowing_whose_fronts(
    env: dict[str, str], elected: bool
) -> None:
    s = report_server_from_env(
        ClusterCache(), no_poke, {"POD_IP": "10.0.0.1", **env}, elected=elected
    )
    assert s is not None
    assert s.link_listen is None
    assert not s.fronts(Identity("jsi", "ctl-1", "u", 1e12, service_account="ctl"))


def test_a_bad_link_address_names_its_variable() -> None:
    env = {"POD_IP": "10.0.0.1", "POD_NAMESPACE": "jsi", names.ENV_SERVICE_ACCOUNT: "ctl"}
    with pytest.raises(ValueError, match=r"JSI_REPORT_LINK_LISTEN must be ADDRESS:PORT"):
        report_server_from_env(
            ClusterCache(), no_poke, {**env, names.ENV_REPORT_LINK_LISTEN: "9445"}, elected=True
        )


def test_a_standby_serves_a_front_only_where_it_can_send_batches(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    env = {"POD_IP": "10.0.0.2", names.ENV_REPORT_TOKEN_FILE: str(token)}
    assert standby_front(env) is not None
    assert standby_front({**env, names.ENV_REPORT_FRONT: "off"}) is None
    assert standby_front({**env, names.ENV_REPORT_TOKEN_FILE: ""}) is None
    assert standby_front({names.ENV_REPORT_TOKEN_FILE: str(token)}) is None, "no address"
    with pytest.raises(ValueError, match=r"JSI_REPORT_LISTEN must be ADDRESS:PORT"):
        standby_front({**env, names.ENV_REPORT_LISTEN: "nowhere"})
    with pytest.raises(ValueError, match=r"JSI_REPORT_LIMITS"):
        standby_front({**env, names.ENV_REPORT_LIMITS: "max_connections=many"})


@pytest.mark.parametrize(
    "listen", ["9444", "host:", "host:65536", "host:\uff19\uff14\uff14\uff14", "host:-1"]
)
def test_a_bad_listen_address_names_the_variable_and_the_form(listen: str) -> None:
    with pytest.raises(ValueError, match=r"JSI_REPORT_LISTEN must be ADDRESS:PORT"):
        server(POD_IP="10.244.1.7", JSI_REPORT_LISTEN=listen)


def test_refusals_are_logged_once_in_a_while_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    s = server(POD_IP="10.244.1.7")
    assert s is not None
    with caplog.at_level(logging.WARNING, "jobset_inplace.reports"):
        for _ in range(5):
            s._warn("401", "refused (401): token expired or not yet valid")
        s._quiet_until.clear()
        s._warn("401", "refused (401): token expired or not yet valid")
        s._warn("403", "refused (403): pod evil\nFAKE LOG LINE\x00")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "and 4 more of them" in lines[1]
    assert lines[2] == "report channel: refused (403): pod evil\\nFAKE LOG LINE\\x00", (
        "what a client sent is escaped: it cannot forge log lines"
    )


async def test_free_memory_is_given_back_once_after_each_burst_of_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = server(POD_IP="10.244.1.7")
    assert s is not None
    released: list[int] = []
    monkeypatch.setattr(report_server, "QUIET_S", 0.01)
    monkeypatch.setattr(
        report_server, "release_free_memory", lambda _who: released.append(s.handled)
    )

    async def until_released(count: int) -> None:
        for _ in range(500):  # <= 5 s
            if len(released) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"released {released}, expected {count} times")

    task = asyncio.create_task(s._release_after_bursts())
    try:
        await asyncio.sleep(0.05)
        assert released == [], "no request, nothing to give back"
        s.handled += 5000  # a burst: every agent's first report
        await until_released(1)
        await asyncio.sleep(0.1)
        assert released == [5000], "once per burst, not every quiet interval"
        s.handled += 1
        await until_released(2)
        assert released == [5000, 5001]
    finally:
        task.cancel()


def test_a_request_refused_by_the_http_layer_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = server(POD_IP="10.244.1.7")
    assert s is not None
    counter = METRICS.report_channel_requests.labels("404")
    before = counter._value.get()
    with caplog.at_level(logging.WARNING, logger="jobset_inplace.reports"):
        s._refused(Refused(404, "no such path; reports go to POST /v1/reports"))
    assert counter._value.get() == before + 1
    assert s.handled == 1
    assert "refused (404): no such path" in caplog.text


def test_the_leaders_stalls_are_added_up() -> None:
    """A loop busy with other work (or a starved process) cannot read a heartbeat: that time
    is measured, so that it is not taken for the agents' silence (ClusterCache.stalled)."""
    cache = ClusterCache()

    async def stall() -> None:
        task = asyncio.create_task(report_server.measure_stalls(cache, tick=0.01))
        await asyncio.sleep(0.05)
        quiet = cache.stalled
        time.sleep(0.5)  # the loop blocked: no timer, no socket read
        await asyncio.sleep(0.05)
        task.cancel()
        assert cache.stalled - quiet >= 0.45

    asyncio.run(stall())


class Remembering:
    """A verifier that knows a token only once ``identify`` has checked it."""

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.checked = 0

    def remembered(self, token: str) -> Identity | None:
        return self._who() if token in self.known else None

    async def identify(self, token: str) -> Identity:
        self.checked += 1
        if token != "good":
            raise Rejected(401, "token expired or not yet valid")
        self.known.add(token)
        return self._who()

    @staticmethod
    def _who() -> Identity:
        return Identity(channel_attack.NAMESPACE, channel_attack.POD, channel_attack.UID, 1e12)


async def test_a_report_with_a_remembered_token_is_answered_at_once() -> None:
    """The first report of a token waits for its verification (a task); the next ones are
    answered in the call, as are requests refused before any token is checked; a refused
    token is checked again, never remembered."""
    verifier = Remembering()
    as_verifier = cast(TokenVerifier, verifier)
    s = ReportServer(channel_attack._cache(), no_poke, as_verifier, ("127.0.0.1", 0), "127.0.0.1")
    body = channel_attack.report_body(0)

    def report(token: str, payload: bytes = body) -> Answer | Awaitable[Answer]:
        return s.handle(Request(f"Bearer {token}" if token else "", payload, True))

    first = report("good")
    assert not isinstance(first, Answer), "a token not yet verified: answered by a task"
    assert (await first).status == 200
    again = report("good")
    assert isinstance(again, Answer)
    assert (again.status, again.identity) == (200, channel_attack.UID)
    assert verifier.checked == 1
    for token, payload, status in [("", body, 401), ("good", b"{", 400)]:
        refused = report(token, payload)
        assert isinstance(refused, Answer)
        assert refused.status == status
    for _ in range(2):
        bad = report("stolen")
        assert not isinstance(bad, Answer)
        assert (await bad).status == 401
    assert verifier.checked == 3
    assert s.accepted == 2


async def test_a_replica_that_cannot_prove_it_leads_answers_no_report() -> None:
    """While its last renewal of the Lease is too old (a process paused past its watchdog's
    moment, whose successor may already act), every report is refused with 503 before its
    token is read: no heartbeat's answer renews an agent's lease (hot spares' fence), no
    report is taken; once it can prove it leads again, it answers."""
    verifier = Remembering()
    leading = [False]
    s = ReportServer(
        channel_attack._cache(),
        no_poke,
        cast(TokenVerifier, verifier),
        ("127.0.0.1", 0),
        "127.0.0.1",
        leads=lambda: leading[0],
    )
    request = Request("Bearer good", channel_attack.report_body(0), True)
    refused = s.handle(request)
    assert isinstance(refused, Answer)
    assert refused.status == 503
    assert "cannot prove it still leads" in refused.payload["error"]
    assert (verifier.checked, s.accepted) == (0, 0)
    leading[0] = True
    answer = s.handle(request)
    assert not isinstance(answer, Answer)
    assert (await answer).status == 200


class MemberTokens:
    """A verifier whose token ``m<i>`` is member ``i``'s pod's (channel_attack's gang)."""

    def remembered(self, token: str) -> Identity | None:
        name, uid = channel_attack.member_pod(int(token[1:]))
        return Identity(channel_attack.NAMESPACE, name, uid, 1e12)

    async def identify(self, token: str) -> Identity:
        who = self.remembered(token)
        assert who is not None
        return who


def test_a_report_the_barrier_waited_for_asks_for_a_pass_within_the_counts_interval() -> None:
    """Each report of the epoch but the last changes only the count the barrier waits for,
    which the status shows no sooner than every progress_write_interval (10 s at 10,000
    members): its gang is planned within that long, not sooner (a pass in between could write
    nothing); the last report is planned at once."""
    members = 2500
    pokes: list[tuple[float | None, bool]] = []

    def poke(key: GangKey, delay: float | None = None, *, urgent: bool = False) -> None:
        pokes.append((delay, urgent))

    cache = channel_attack._cache(members)
    s = ReportServer(
        cache, poke, cast(TokenVerifier, MemberTokens()), ("127.0.0.1", 0), "127.0.0.1"
    )
    for i in range(members):
        answer = s.handle(Request(f"Bearer m{i}", channel_attack.report_body(i), True))
        assert isinstance(answer, Answer)
        assert answer.status == 200, answer.payload
    assert progress_write_interval(members) == 2.5
    assert pokes[:-1] == [(2.5, False)] * (members - 1)
    assert pokes[-1] == (None, True), "the last report: at once"
