"""The report channel on the real apiserver (docs/architecture.md, "Report channel"):

* the leader's server with the agent's client: a pod's own report is accepted with one
  TokenReview per token; another pod's token, a token for another audience, a malformed report,
  an unknown pod and a wrong certificate pin are each refused and say why;
* crash safety: the leader is killed mid-recovery after half the members reported over the
  channel; the new leader gets those reports again from the agents themselves and opens the
  barrier, with no report written on any pod and one recovery charged;
* degraded mode: agents that cannot reach the channel write their reports on their pods and the
  recovery completes;
* one member's hostile reports (malformed, of other epochs, abusive HTTP, sent with its own
  token) never hold its gang's barrier: its later valid report counts, in this epoch and after
  another member's pod is replaced.

Agents are real agent processes (no kubelet: the test plays it with pod status patches, as
gangsim does); the controller is ``jobset-inplace run`` as a process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client

from jobset_inplace import names
from jobset_inplace.agent.channel import ChannelError, ReportChannel
from jobset_inplace.controller.cache import ClusterCache, GangKey, job_entry, pod_entry
from jobset_inplace.controller.report_server import ReportServer
from jobset_inplace.core.model import GangStatus
from jobset_inplace.core.policy import Policy
from jobset_inplace.protocol.gangstate import Endpoint, parse_endpoint
from jobset_inplace.runtime.report_tokens import TokenVerifier
from jobset_inplace.times import parse_time
from testbed.controlplane import ControlPlane
from testbed.gangsim import (
    CRD,
    CRD_NAME,
    Controller,
    Gang,
    LeaseKeeper,
    renew_lease,
    set_node_ready,
)
from testbed.kube import Clients, pod_token, wait_for

from .agentproc import AgentProc, StartAgent

pytestmark = pytest.mark.integration

FAST = {names.NODE_UNHEALTHY_AFTER: "5s", names.BARRIER_TIMEOUT: "60s"}


def request(ch: ReportChannel, values: dict[str, str]) -> bytes:
    """The channel's request of ``ch``'s pod carrying ``values`` as they are (well formed or
    not: what the leader must refuse is sent too)."""
    return json.dumps({**dataclasses.asdict(ch.sender), "report": values}).encode()


def report_token(
    kube: Clients, ns: str, pod: Any, audience: str = names.REPORT_TOKEN_AUDIENCE
) -> str:
    """The agent's channel token (or, with ``audience``, another pod-bound token)."""
    meta = pod.metadata
    return pod_token(
        kube.core,
        ns,
        service_account="default",
        pod=meta.name,
        uid=meta.uid,
        audience=audience,
        seconds=names.REPORT_TOKEN_SECONDS,
    )


# --- the server and the client ---------------------------------------------------------------


async def test_only_a_pods_own_well_formed_report_is_accepted(
    kube: Clients, namespace: str, gangstate_crd: None, tmp_path: Path
) -> None:
    # one member and a hot spare: its agents heartbeat (only a spares' replicatedJob does)
    gang = Gang(kube, namespace, f"g-{uuid.uuid4().hex[:4]}", 2, {names.HOT_SPARES: "1"})
    gang.create()
    cache, pokes = ClusterCache(), list[GangKey]()
    jobset = kube.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", gang.name
    )
    cache.upsert_jobset(jobset, Policy(), "")
    for job in client.BatchV1Api(kube.api).list_namespaced_job(namespace).items:
        cache.upsert_job(job_entry(kube.api.sanitize_for_serialization(job)))
    pods = [gang.pod(i) for i in range(2)]
    for pod in pods:
        cache.upsert_pod(pod_entry(kube.api.sanitize_for_serialization(pod)))
    cache.gangs[namespace, gang.name].status = GangStatus(epoch=1)  # as the leader loads it
    verifier = TokenVerifier(kube.api)

    def poke(key: GangKey, delay: float | None = None, *, urgent: bool = False) -> None:
        pokes.append(key)

    server = ReportServer(cache, poke, verifier, ("127.0.0.1", 0), "127.0.0.1")
    advertised = await server.start()
    endpoint = Endpoint(advertised.url, advertised.cert_sha256, advertised.leader)
    key = (namespace, gang.name)
    try:

        def channel(i: int, token: str, *, uid: str | None = None) -> ReportChannel:
            path = tmp_path / f"token-{i}-{uuid.uuid4().hex[:4]}"
            path.write_text(token)
            pod = pods[i].metadata
            return ReportChannel(namespace, gang.name, pod.name, uid or pod.uid, path)

        async def send(ch: ReportChannel, report: dict[str, str], to: Endpoint = endpoint) -> str:
            try:
                await asyncio.to_thread(ch.post, to, request(ch, report))
            except ChannelError as e:
                return str(e)
            finally:
                ch.close()
            return "accepted"

        own = report_token(kube, namespace, pods[0])
        good = {names.REPORT_EPOCH: "1", names.REPORT_STEPS: "200,100"}
        ch0 = channel(0, own)
        assert await send(ch0, good) == "accepted"
        assert await send(ch0, {**good, names.REPORT_EXITED: "1"}) == "accepted"
        assert (verifier.verified, verifier.reviews) == (1, 0), "verified offline, once"
        assert pokes == [key, key]
        # a heartbeat (hot spares): an empty report, its time kept, nothing planned on it
        heard = cache.gangs[key].heard[pods[0].metadata.uid]
        assert await send(ch0, {}) == "accepted"
        assert cache.gangs[key].heard[pods[0].metadata.uid] > heard
        assert pokes == [key, key]
        view = cache.gangs[key].reports[pods[0].metadata.uid]
        assert (view.reported_epoch, view.exited_in_epoch) == (1, 1)
        # a progress note: kept under the member's slot, heard, the report untouched, no pass
        note = {names.REPORT_PROGRESS_NOTE: "1:1@1790000000000,40@1790000020000"}
        assert await send(ch0, note) == "accepted"
        assert cache.gangs[key].noted["workers/0/0"][1].last_step == 40
        assert cache.gangs[key].reports[pods[0].metadata.uid] == view
        assert pokes == [key, key]
        malformed = await send(ch0, {names.REPORT_PROGRESS_NOTE: "1:"})
        assert "HTTP 400" in malformed
        assert "<epoch>:<progress span>" in malformed

        # member 0's token speaking for member 1
        other = await send(channel(0, own, uid=pods[1].metadata.uid), good)
        assert "HTTP 403" in other
        assert "may not report" in other
        # the agent's apiserver token (another audience) is not accepted by the channel
        api_token = report_token(
            kube, namespace, pods[1], audience="https://kubernetes.default.svc"
        )
        refused = await send(channel(1, api_token), good)
        assert "HTTP 401" in refused
        assert names.REPORT_TOKEN_AUDIENCE in refused
        # malformed: the field is named
        bad = await send(channel(0, own), {**good, names.REPORT_EPOCH: "one"})
        assert "HTTP 400" in bad
        assert names.REPORT_EPOCH in bad
        # ... but read only once the token is the pod's own: a stranger's costs no decoding
        stranger = await send(channel(1, api_token), {**good, names.REPORT_EPOCH: "one"})
        assert "HTTP 401" in stranger
        unknown = await send(channel(0, own), {**good, "example.com/x": "1"})
        assert "HTTP 400" in unknown
        assert "unknown keys" in unknown
        # a pod the leader does not know as a member (yet): the agent writes on its pod
        cache.upsert_pod(pod_entry(kube.api.sanitize_for_serialization(pods[1])), deleted=True)
        token1 = report_token(kube, namespace, pods[1])
        assert "HTTP 409" in await send(channel(1, token1), good)
        assert "HTTP 409" in await send(channel(1, token1), {}), "nor its heartbeat"
        # a certificate that is not the pinned one: refused before any token is sent
        verified = verifier.verified
        wrong = Endpoint(endpoint.url, "0" * 64, endpoint.leader)
        pinned = await send(channel(0, report_token(kube, namespace, pods[0])), good, wrong)
        assert "does not match the GangState's pin" in pinned
        assert verifier.verified == verified
        assert server.accepted == 4

        # a cluster whose signing keys cannot be read: the apiserver reviews each new token
        def forbidden() -> Any:
            raise client.exceptions.ApiException(status=403, reason="Forbidden")

        reviewing = TokenVerifier(kube.api)
        reviewing._fetch = forbidden  # type: ignore[method-assign]
        server.verifier = reviewing
        assert await send(channel(0, own), good) == "accepted"
        assert await send(channel(0, own), good) == "accepted"
        assert "HTTP 401" in await send(channel(1, api_token), good)
        assert (reviewing.verified, reviewing.reviews) == (1, 2), "a review per new token only"
    finally:
        await server.stop()


# --- with the controller and real agents -----------------------------------------------------


def controller(control_plane: ControlPlane, tmp_path: Path, name: str, **env: str) -> Controller:
    control_plane.kubectl().apply_files([CRD], server_side=True)
    control_plane.kubectl().wait_crds_established([CRD_NAME])
    ctl = Controller(control_plane.kubeconfig, tmp_path / f"{name}.log", env=env)
    ctl.start()
    return ctl


CHANNEL = {"JSI_REPORT_ADVERTISE": "127.0.0.1", "JSI_REPORT_LISTEN": "127.0.0.1:0"}


def start_member(
    start_agent: StartAgent, kube: Clients, gang: Gang, i: int, tmp_path: Path
) -> AgentProc:
    """Member ``i``'s agent as the webhook injects it: its pod's UID and its channel token."""
    pod = gang.pod(i)
    token = tmp_path / f"report-token-{i}-{uuid.uuid4().hex[:4]}"
    token.write_text(report_token(kube, gang.namespace, pod))
    return start_agent(
        gang.pods[i],
        gang.name,
        POD_UID=pod.metadata.uid,
        # process scope without launchers: the agent stops no trainer and joins the next
        # epoch from the same process (its resend to a new leader is what is tested)
        JSI_RESTART_SCOPE="process",
        JSI_LAUNCHED_CONTAINERS="trainer",
        **{names.ENV_REPORT_TOKEN_FILE: str(token)},
    )


def endpoint_leader(gang: Gang) -> str:
    return str((gang.state().get("reportEndpoint") or {}).get("leader") or "")


def pod_reports(gang: Gang) -> dict[int, str | None]:
    return {i: (gang.pod(i).metadata.annotations or {}).get(names.REPORT_EPOCH) for i in gang.pods}


StartLeader = Callable[[str], Controller]


@pytest.fixture
def leaders(control_plane: ControlPlane, tmp_path: Path) -> Iterator[StartLeader]:
    """``jobset-inplace run`` with the report channel, one per call (its leader identity), all
    stopped afterwards: the failover tests kill one and start its successor."""
    started: list[Controller] = []

    def start(identity: str) -> Controller:
        started.append(controller(control_plane, tmp_path, identity, **CHANNEL))
        return started[-1]

    yield start
    for ctl in started:
        ctl.stop()


def test_a_new_leader_learns_every_report_from_the_agents(  # noqa: PLR0917 (fixtures)
    kube: Clients,
    namespace: str,
    leaders: StartLeader,
    start_agent: StartAgent,
    leases: LeaseKeeper,
    tmp_path: Path,
) -> None:
    first = leaders("leader-1")
    gang = Gang(kube, namespace, f"train-{uuid.uuid4().hex[:4]}", 4, dict(FAST), leases=leases)
    gang.create()
    agents = [start_member(start_agent, kube, gang, i, tmp_path) for i in range(4)]
    gang.wait_state("epoch 1 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 1)
    leader_1 = endpoint_leader(gang)
    assert leader_1
    # Members 2 and 3 are slow to come back from the next failure: their agents are gone
    # until the new leader runs (they then start as the kubelet would restart them).
    for a in agents[2:]:
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
    gang.fail_trainer(0)
    gang.wait_state("epoch 2 recovering", lambda s: s.get("epoch") == 2)
    for i in range(4):
        gang.restart_in_place(i)
    for a in agents[:2]:
        a.wait_log(r"reported epoch 2, checkpoint steps .*\(on the channel\)")
    first.kill()  # SIGKILL mid-recovery: half the members' reports were only in its memory
    assert not gang.state().get("barrierOpen")

    leaders("leader-2")
    wait_for(
        "the new leader to advertise its channel",
        lambda: endpoint_leader(gang) not in ("", leader_1),
        30,
        0.2,
    )
    for a in agents[:2]:
        a.wait_log(r"a new leader: report of epoch 2 sent again \(on the channel\)")
    agents += [start_member(start_agent, kube, gang, i, tmp_path) for i in (2, 3)]
    state = gang.wait_state("epoch 2 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 2)
    assert state["budgets"]["inPlaceUsed"] == 1, "one recovery charged"
    assert [h["epoch"] for h in state["history"]] == [2]
    assert pod_reports(gang) == dict.fromkeys(range(4)), "no report written on a pod"
    for a in (agents[0], agents[1], agents[4], agents[5]):
        a.wait_barrier(200, "epoch 2")


def test_a_new_leader_past_the_barrier_deadline_recreates_nobody_who_had_reported(  # noqa: PLR0917
    kube: Clients,
    namespace: str,
    leaders: StartLeader,
    start_agent: StartAgent,
    leases: LeaseKeeper,
    tmp_path: Path,
) -> None:
    """The leader dies with two of three members' reports in its memory only; its successor
    starts after the barrier deadline has passed. It recreates nobody for not having reported
    to it: the agents send their reports again, the slow member comes back, and the barrier
    opens: one epoch, every pod the same, one recovery charged (guarantee 6)."""
    first = leaders("leader-1")
    policy = {**FAST, names.BARRIER_TIMEOUT: "30s"}  # the least accepted
    gang = Gang(kube, namespace, f"train-{uuid.uuid4().hex[:4]}", 3, policy, leases=leases)
    gang.create()
    agents = [start_member(start_agent, kube, gang, i, tmp_path) for i in range(3)]
    gang.wait_state("epoch 1 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 1)
    uids = gang.uids()
    agents[2].proc.send_signal(signal.SIGKILL)  # member 2 is slow to come back
    agents[2].proc.wait(10)
    gang.fail_trainer(0)
    state = gang.wait_state("epoch 2 recovering", lambda s: s.get("epoch") == 2)
    for i in range(3):
        gang.restart_in_place(i)
    for a in agents[:2]:
        a.wait_log(r"reported epoch 2, checkpoint steps .*\(on the channel\)")
    first.kill()
    deadline = parse_time(state["recovery"]["deadline"])
    assert deadline is not None
    wait_for("the barrier deadline passed", lambda: time.time() > deadline + 1, 60, 0.5)

    leaders("leader-2")
    agents.append(start_member(start_agent, kube, gang, 2, tmp_path))
    state = gang.wait_state("epoch 2 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 2)
    assert state["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 0}
    assert [h["epoch"] for h in state["history"]] == [2]
    assert gang.uids() == uids, "no pod recreated"


def test_agents_that_cannot_reach_the_channel_report_on_their_pods(  # noqa: PLR0917
    kube: Clients,
    namespace: str,
    control_plane: ControlPlane,
    start_agent: StartAgent,
    leases: LeaseKeeper,
    tmp_path: Path,
) -> None:
    # advertised where nothing listens (a NetworkPolicy, a firewall: the channel is unreachable)
    ctl = controller(
        control_plane,
        tmp_path,
        "unreachable",
        JSI_REPORT_ADVERTISE="127.0.0.2",
        JSI_REPORT_LISTEN="127.0.0.1:0",
    )
    try:
        gang = Gang(kube, namespace, f"train-{uuid.uuid4().hex[:4]}", 2, dict(FAST), leases=leases)
        gang.create()
        agents = [start_member(start_agent, kube, gang, i, tmp_path) for i in range(2)]
        gang.wait_state("epoch 1 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 1)
        gang.fail_trainer(1)
        gang.wait_state("epoch 2 recovering", lambda s: s.get("epoch") == 2)
        for i in range(2):
            gang.restart_in_place(i)
        gang.wait_state("epoch 2 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 2)
        assert pod_reports(gang) == {0: "2", 1: "2"}
        for a in agents:
            assert "writing reports on the pod (trying the channel again" in a.text()
            a.wait_barrier(200, "epoch 2")
        # not silent: the status counts them, an Event names the channel and the members
        gang.wait_state("both counted on their pods", lambda s: s["members"].get("onPod") == 2)
        said = [m for r, m in gang.events() if r == "ReportChannelUnreachable"]
        assert any("workers/1/0" in m and "https://127.0.0.2:" in m for m in said), said
    finally:
        ctl.stop()


# --- one member's hostile reports ------------------------------------------------------------

# Every kind of malformed number an epoch or step may be sent as (the decoder refuses each).
MALFORMED_NUMBERS = [
    "", " ", "-1", "+1", "1.0", "1e3", "0x1", "01", " 1", "1 ", "1_0", "9" * 30,
    "\u0661", "\uff11", "1\x00", "\x00", '{"epoch": 1}', "[1]", "null", "true", "1\n",
]  # fmt: skip


def hostile_reports(epoch: int) -> list[dict[str, str]]:
    """What one member's token is used to send while its gang waits at ``epoch``'s barrier:
    malformed values of every kind, step lists of 60-110 KB, and reports the decoder accepts
    that are not this member's report of ``epoch`` (ahead of the gang, of an older epoch, of no
    epoch, an exit or a hang ahead)."""
    reports: list[dict[str, str]] = []
    for raw in MALFORMED_NUMBERS:
        reports.append({names.REPORT_EPOCH: raw, names.REPORT_STEPS: "100"})
        reports.append({names.REPORT_EPOCH: str(epoch), names.REPORT_STEPS: f"100,{raw}"})
    for size in (60_000, 110_000):
        steps = ",".join(str(n) for n in range(size // 7))[:size]
        reports.append({names.REPORT_EPOCH: str(epoch), names.REPORT_STEPS: steps})
    reports += [
        {names.REPORT_EPOCH: str(epoch + 1), names.REPORT_STEPS: "100"},
        {names.REPORT_EPOCH: str(epoch + 1_000_000)},
        {names.REPORT_EPOCH: str(epoch), names.REPORT_EXITED: str(epoch + 1)},
        {names.REPORT_HUNG: str(epoch + 5)},
        {names.REPORT_EPOCH: str(epoch - 1), names.REPORT_STEPS: "100"},
        {names.REPORT_STEPS: "100"},
        {},
    ]
    return reports


def raw_exchange(url: str, data: bytes) -> bytes:
    """Send ``data`` on a TLS connection to the channel; what came back before it closed (or
    went quiet for 2 s)."""
    parts = urlsplit(url)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    received = b""
    with (
        socket.create_connection((parts.hostname, parts.port or 443), timeout=2) as raw,
        ctx.wrap_socket(raw) as tls,
    ):
        try:
            tls.sendall(data)
            while chunk := tls.recv(65536):
                received += chunk
        except (TimeoutError, OSError):
            pass
    return received


def abusive_http(url: str, token: str) -> list[bytes]:
    """Requests no agent sends: another method, another path, no length, chunked, a 17 KB
    head, no token. The first line of each answer (b"": closed without one)."""
    path, host = urlsplit(url).path, urlsplit(url).netloc
    body = b'{"namespace": "x"}'
    auth = f"Authorization: Bearer {token}\r\n".encode()
    head = f"Host: {host}\r\nContent-Type: application/json\r\n".encode()
    requests = [
        b"GET " + path.encode() + b" HTTP/1.1\r\n" + head + auth + b"\r\n",
        b"POST /elsewhere HTTP/1.1\r\n" + head + auth + b"Content-Length: 18\r\n\r\n" + body,
        b"POST " + path.encode() + b" HTTP/1.1\r\n" + head + auth + b"\r\n" + body,
        b"POST " + path.encode() + b" HTTP/1.1\r\n" + head + auth
        + b"Transfer-Encoding: chunked\r\n\r\n12\r\n" + body + b"\r\n0\r\n\r\n",
        b"POST " + path.encode() + b" HTTP/1.1\r\n" + head + auth
        + b"X-Pad: " + b"a" * 17_000 + b"\r\nContent-Length: 18\r\n\r\n" + body,
        b"POST " + path.encode() + b" HTTP/1.1\r\n" + head + b"Content-Length: 18\r\n\r\n" + body,
    ]  # fmt: skip
    return [raw_exchange(url, r).split(b"\r\n", 1)[0] for r in requests]


def test_a_members_hostile_reports_never_hold_its_gangs_barrier(
    kube: Clients,
    namespace: str,
    leaders: StartLeader,
    leases: LeaseKeeper,
    tmp_path: Path,
) -> None:
    """Members 0 and 2 report epoch 1 over the channel; member 1's token is used to send
    malformed reports, reports of other epochs (one ahead of the gang: the decoder takes it)
    and abusive HTTP; then member 1's valid report of epoch 1. The barrier opens. Member 2's
    node then goes silent: its pod is replaced, member 1's token is used the same way again,
    and the replacement's and the others' reports of epoch 2 open the next barrier. (Before
    the fix a report ahead of the gang was kept as the member's newest: every later valid
    report was answered 200 and dropped, and the gang never opened a barrier again.)"""
    leaders("leader-1")
    gang = Gang(kube, namespace, f"train-{uuid.uuid4().hex[:4]}", 3, dict(FAST), leases=leases)
    gang.create()
    state = gang.wait_state("the channel named", lambda s: parse_endpoint(s.get("reportEndpoint")))
    endpoint = parse_endpoint(state["reportEndpoint"])
    assert endpoint is not None

    def channel(i: int) -> tuple[ReportChannel, str]:
        pod = gang.pod(i)
        token = report_token(kube, namespace, pod)
        path = tmp_path / f"token-{i}-{uuid.uuid4().hex[:4]}"
        path.write_text(token)
        meta = pod.metadata
        return ReportChannel(namespace, gang.name, meta.name, meta.uid, path), token

    def send(ch: ReportChannel, report: dict[str, str]) -> str:
        try:
            ch.post(endpoint, request(ch, report))
        except ChannelError as e:
            return str(e)
        return "accepted"

    def attack(ch: ReportChannel, token: str, epoch: int) -> None:
        answers = [send(ch, r) for r in hostile_reports(epoch)]
        assert all(a != "accepted" for a in answers[: 2 * len(MALFORMED_NUMBERS) + 2]), answers
        assert sum("HTTP 413" in a for a in answers) >= 2, "the step lists are too large"
        ahead = answers[2 * len(MALFORMED_NUMBERS) + 2]
        assert "HTTP 409" in ahead, ahead
        assert f"beyond the gang's {epoch}" in ahead
        assert all(not line.endswith(b" 200 OK") for line in abusive_http(endpoint.url, token))

    channels = [channel(i) for i in range(3)]
    good = {names.REPORT_STEPS: "100"}
    for i in (0, 2):
        assert send(channels[i][0], {names.REPORT_EPOCH: "1", **good}) == "accepted"
    attack(*channels[1], 1)
    assert send(channels[1][0], {names.REPORT_EPOCH: "1", **good}) == "accepted"
    gang.wait_state("epoch 1 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 1, 20)

    # Member 2's node goes silent: its pod is replaced (as the Job controller would).
    tracked = {"metadata": {"finalizers": [names.JOB_TRACKING_FINALIZER]}}
    kube.core.patch_namespaced_pod(gang.pods[2], namespace, tracked)
    assert gang.leases is not None
    gang.leases.dead.add(gang.node(2))
    set_node_ready(kube, gang.node(2), "Unknown", since=-30)
    renew_lease(kube, gang.node(2), offset=-60)
    state = gang.wait_state("epoch 2", lambda s: s.get("epoch") == 2)
    assert state["recovery"]["causes"] == {"workers/2/0": "NodeUnhealthy"}
    old = gang.pods[2]
    wait_for("the silent node's pod deleted", lambda: old not in pod_names(gang), 30, 0.2)
    gang.make_pod(2, node=gang.node(0))
    for i in range(3):
        gang.restart_in_place(i)
    replacement = channel(2)
    attack(*channels[1], 2)
    assert send(replacement[0], {names.REPORT_EPOCH: "2", **good}) == "accepted"
    assert send(channels[0][0], {names.REPORT_EPOCH: "2", **good}) == "accepted"
    assert send(channels[1][0], {names.REPORT_EPOCH: "2", **good}) == "accepted"
    state = gang.wait_state(
        "epoch 2 open", lambda s: s.get("barrierOpen") and s.get("epoch") == 2, 20
    )
    assert state["budgets"] == {"inPlaceUsed": 1, "recreateUsed": 1}
    for ch, _ in (*channels, replacement):
        ch.close()


def pod_names(gang: Gang) -> set[str]:
    pods = gang.kube.core.list_namespaced_pod(
        gang.namespace, label_selector=f"{names.JOBSET_NAME_LABEL}={gang.name}"
    )
    return {p.metadata.name for p in pods.items}
