"""The leader's recovery loop without a cluster, for quick before/after figures of its CPU per
member: ``python -m bench.leader_loop``.

This process runs the leader's real parts on one core (``--leader-core``): its
:class:`~jobset_inplace.controller.report_server.ReportServer` (TLS, llhttp, its limits, the
real :class:`~jobset_inplace.runtime.report_tokens.TokenVerifier` with this bench's keys, as in
:mod:`bench.channel_attacks`), the :class:`~jobset_inplace.controller.cache.ClusterCache` with one
gang of ``--members`` pods, and the :class:`~jobset_inplace.controller.reconciler.Reconciler`
(planning passes, their scheduling, GangMembers rows) whose executor writes nothing (the status
is encoded, not sent). A client process on the other core holds a kept-alive TLS connection per
member, each from its pod's own loopback address. A recovery: one member's trainer exit is
reported, the planner starts a recovery (a new epoch), then every member reports the new epoch
at once, until the barrier opens. Per recovery: the leader process's CPU (user + system) per
member, its planning passes, and the garbage collector's CPU (``gc.callbacks``).

What it leaves out, against ``python -m bench --leader-core`` (the figures to publish): the
watches (pods, Leases, GangStates), the API calls, the apiserver and the agents' own work. It
is for comparing two versions of the leader's code in minutes (``--compare DIR``: a checkout
of the other version's ``jobset_inplace``, run alternately with this one's by this bench), not
for absolute figures. Where the version's controller freezes its heap once its cache is
primed (``runtime.process.freeze_heap``), this bench does so after the warm-up too.

``--floor`` runs, alternately with the leader, the channel's floor: the same HTTP server
(:class:`~jobset_inplace.runtime.report_http.HttpServer`: TLS, llhttp, its limits) answering
every request with a constant 200, with nothing behind it (no token, no decode, no cache, no
planning), the same agents sending the same requests. What the leader spends per member above
it is its own work; the floor is what any design that takes one report per member over TLS in
this process pays (on loopback it includes the receiving side's TCP work, which a real network
would put on the agent's host).

``--in-process`` runs, alternately with the leader, the same leader with no transport at all:
the same requests (each member's token and body) handed to
:meth:`~jobset_inplace.controller.report_server.ReportServer.handle` in this process, ``--batch``
of them per event-loop turn, each answer encoded as the server would send it. What it spends
per member is the leader's own work (the token's memo, the envelope, the decode, the cache, the
answer's encoding, the planning passes): what a leader that is handed its reports already
taken off the wire (by another process, a front, a relay) would still spend, and so the floor
of any such design in this interpreter. ``--no-transport`` runs this version and
``--compare``'s both that way: their own work per member, compared. ``--batched`` runs,
alternately with the leader, the same leader behind a report front
(docs/design/report-fronts.md): the same reports handed to it as a front's batches of
``--batch`` (:mod:`jobset_inplace.protocol.front_link`), each decoded, taken and answered in one
event-loop turn: what the leader itself would spend per member behind fronts, less the link's
transport (one TLS record each way per batch). ``--fronts`` runs, alternately with the
leader, the same leader behind a real report front
(:class:`~jobset_inplace.controller.report_front.ReportFront`, in a process of its own on the
agents' core): the agents' requests over TLS to the front, the front's batches over its link
(TLS) to the leader: what the leader spends per member behind fronts, the link included.

Each member's pod is on a node of its own whose Lease is renewed before each recovery, as on
a cluster (every pass looks at every member's node); ``--no-nodes`` leaves the pods without
nodes, as this bench did before 2026-12-07 (its figures of before are of that)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import resource
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

import uvloop

from bench import provenance
from bench.channel_attack import GANG, NAMESPACE, member_pod, request
from bench.channel_attack import _cache as gang_cache
from bench.channel_attacks import BenchCluster, BenchKeysVerifier
from bench.stats import ratio_of_medians
from jobset_inplace import names
from jobset_inplace.controller import operator  # noqa: F401 (the controller's imports: its heap)
from jobset_inplace.controller.cache import ClusterCache
from jobset_inplace.controller.metrics import METRICS
from jobset_inplace.controller.reconciler import Reconciler
from jobset_inplace.controller.report_server import MAX_BODY, ReportServer
from jobset_inplace.core.gangstate import status_to_dict
from jobset_inplace.core.model import GangStatus, NodeView
from jobset_inplace.core.policy import Policy
from jobset_inplace.core.statemachine import Phase
from jobset_inplace.protocol.envelope import Sender, encode_request, parse_request
from jobset_inplace.protocol.report import AgentReport
from jobset_inplace.runtime import process
from jobset_inplace.runtime.report_http import Answer, HttpServer, Request
from jobset_inplace.runtime.report_tls import serving_context

CONNECTING = 100  # the agents' connections made at once (bench.leader_loop's warm-up)
GC_CPU = [0.0, 0.0]  # CPU in collections so far; when the current one started


def _address(i: int) -> str:
    """Member ``i``'s pod address (a loopback address of its own: the server's limits are per
    address, and it knows its members' addresses)."""
    return f"127.1.{i // 250}.{i % 250 + 1}"


def _on_nodes(cache: ClusterCache) -> None:
    """Each member's pod on a Ready node of its own, its Lease renewed now, as on a cluster:
    every pass then looks at every member's node (the gang's pods have none otherwise)."""
    gang = cache.gangs[NAMESPACE, GANG]
    for uid, view in gang.on_pod.items():
        node = f"node-{uid}"
        cache.upsert_node(NodeView(node, ready="True"))
        gang.on_pod[uid] = dataclasses.replace(view, node=node)
    gang.merged_for = None  # every member's view made again, with its node
    renew_leases(cache)


def renew_leases(cache: ClusterCache) -> None:
    """Every node's Lease renewed now, as kubelets renew theirs every 10 s (an older one
    makes its node unhealthy after the policy's node-unhealthy-after)."""
    now = time.time()
    for name in cache.nodes:
        cache.set_lease(name, now)


def _collecting(phase: str, _info: dict[str, Any]) -> None:
    if phase == "start":
        GC_CPU[1] = time.process_time()
    else:
        GC_CPU[0] += time.process_time() - GC_CPU[1]


# --- the agents (client process) ----------------------------------------------------------


# A front's batch holds at most this many reports (protocol.front_link.BATCH_MAX; not imported:
# --compare runs versions that have no such module)
BATCH_MAX = 256
# The report front's pod (--fronts): the leader takes batches from its token only.
FRONT_POD = "front-0"


def _is_front(who: Any) -> bool:
    return bool(who.pod == FRONT_POD)


def agents(port: int, members: int, core: int | None) -> None:
    """Hold a connection per member; on ``EPOCH exit:I`` member I reports its trainer's exit,
    on ``EPOCH all`` every member reports that epoch at once; one JSON line back per command."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    tokens = json.loads(sys.stdin.readline())
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

    async def main() -> None:
        # Each agent connects with its first report, as agents do (a connection that sends
        # nothing counts against the server's budget before authentication), at most
        # CONNECTING at a time (a gang's agents do not all start in the same millisecond).
        conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        connecting = asyncio.Semaphore(CONNECTING)
        loop = asyncio.get_running_loop()
        print("ready", flush=True)

        async def report(i: int, message: AgentReport) -> str:
            if i not in conns:
                async with connecting:
                    local = (_address(i), 0)
                    conns[i] = await asyncio.open_connection(
                        "127.0.0.1", port, ssl=ctx, local_addr=local
                    )
                    return await exchange(i, message)
            return await exchange(i, message)

        async def exchange(i: int, message: AgentReport) -> str:
            reader, writer = conns[i]
            body = encode_request(Sender(NAMESPACE, GANG, *member_pod(i)), message)
            writer.write(request(tokens[i], body))
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            answer = await reader.readexactly(length)
            return "" if head.startswith(b"HTTP/1.1 200") else (head + answer).decode()

        while line := await loop.run_in_executor(None, sys.stdin.readline):
            epoch, what = int(line.split()[0]), line.split()[1]
            if what.startswith("exit:"):
                refused = [await report(int(what[5:]), AgentReport(exited_in_epoch=epoch))]
            else:
                steps = (epoch * 100, epoch * 100 - 100)
                message = AgentReport(reported_epoch=epoch, reported_steps=steps)
                refused = await asyncio.gather(*(report(i, message) for i in range(members)))
            print(json.dumps([r for r in refused if r][:3]), flush=True)

    uvloop.run(main())


# --- the leader (this process) ------------------------------------------------------------


class _Writes:
    """The executor: the status encoded as for the API, nothing sent."""

    def write_status(self, namespace: str, name: str, status: Any) -> None:
        json.dumps(status_to_dict(status))

    def write_members(self, jobset: Any, rows: Any, now: float) -> None:
        pass

    def run(self, jobset: Any, actions: Any) -> list[Any]:
        return []

    def run_node(self, actions: Any) -> None:
        pass

    def lease_renewals(self, nodes: list[str]) -> dict[str, float | None]:
        return {}


Send = Callable[[int, str], Awaitable[None]]


def front(core: int | None) -> None:
    """``--fronts``: a report front in a process of its own (on the agents' core), sending
    the leader batches over its link: the link's port and pin, the cluster's keys and the
    front's token in (one JSON line), the front's port out; it serves until its input ends."""
    # (here, not above: --compare runs versions that have no fronts)
    from jobset_inplace.controller.report_front import ReportFront  # noqa: PLC0415
    from jobset_inplace.core.report_fronts import Link  # noqa: PLC0415

    if core is not None:
        os.sched_setaffinity(0, {core})
    given = json.loads(sys.stdin.readline())

    async def main() -> None:
        link_port, pin = given["link"]
        served = ReportFront(
            BenchKeysVerifier(given["keys"]),
            ("127.0.0.1", 0),
            Link("127.0.0.1", link_port, pin),
            lambda: str(given["front_token"]),
            member=lambda _address: True,  # (every source here is a member's address)
        )
        await served.start()
        print(served.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await served.stop()

    uvloop.run(main())


def _helper(
    args: argparse.Namespace, given: object, *argv: str
) -> tuple[subprocess.Popen[str], IO[str], IO[str]]:
    """A helper process of this bench (``argv``: its role) on the agents' core, ``given``
    its first line in (JSON): it, its input and its output."""
    client_core = None if args.leader_core is None else 1 - args.leader_core
    proc = subprocess.Popen(
        _command(
            Path(names.__file__).parent.parent,
            *argv,
            *("--members", str(args.members)),
            *([] if client_core is None else ["--leader-core", str(client_core)]),
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(json.dumps(given) + "\n")
    proc.stdin.flush()
    return proc, proc.stdin, proc.stdout


async def _start_front(
    args: argparse.Namespace, given: dict[str, Any]
) -> tuple[subprocess.Popen[str], int]:
    """The front's process (:func:`front`) and the port it serves agents on."""
    proc, _, stdout = _helper(args, given, "--front")
    line = await asyncio.get_running_loop().run_in_executor(None, stdout.readline)
    if not line.strip().isdigit():
        raise SystemExit("the front's process did not start")
    return proc, int(line)


async def _start_agents(
    args: argparse.Namespace, port: int, tokens: list[str]
) -> tuple[subprocess.Popen[str], Send]:
    """The agents' process, ready, and how to tell it what to send (``EPOCH exit:I`` or
    ``EPOCH all``: returns once every answer came, raises SystemExit on a refusal)."""
    proc, stdin, stdout = _helper(args, tokens, "--agents", str(port))
    loop = asyncio.get_running_loop()
    if (await loop.run_in_executor(None, stdout.readline)).strip() != "ready":
        raise SystemExit("the agents' process did not start")

    async def send(epoch: int, what: str) -> None:
        stdin.write(f"{epoch} {what}\n")
        stdin.flush()
        refused = json.loads(await loop.run_in_executor(None, stdout.readline))
        if refused:
            raise SystemExit(f"reports refused: {refused}")

    return proc, send


def _stop_agents(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()


def floor(args: argparse.Namespace) -> list[dict[str, float]]:
    """The channel's floor (``--floor``): the recoveries' figures with the report server's
    HTTP layer answering a constant 200 and doing nothing else (this process)."""
    if args.leader_core is not None:
        os.sched_setaffinity(0, {args.leader_core})
    n, cluster = args.members, BenchCluster()
    tokens = [cluster.token(*member_pod(i)) for i in range(n)]
    addresses = {_address(i) for i in range(n)}
    results: list[dict[str, float]] = []

    def accept(request: Request) -> Answer:
        # bound to an identity as an accepted report is (the limit per identity applies)
        return Answer(200, {"accepted": True, "holds": None}, identity=request.authorization)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ctx, _ = serving_context()
        http = HttpServer(
            accept,
            names.REPORT_PATH.encode(),
            MAX_BODY,
            loop.time,
            tls=ctx,
            member=addresses.__contains__,
        )
        server = await loop.create_server(http.connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proc, send = await _start_agents(args, port, tokens)
        await send(1, "all")  # every connection made (the leader's steady state)
        freeze = getattr(process, "freeze_heap", None)
        if freeze is not None:
            freeze("bench")
        gc.callbacks.append(_collecting)
        for rep in range(args.recoveries):
            epoch = rep + 2
            await asyncio.sleep(0.5)
            GC_CPU[0] = 0.0
            cpu, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            await send(epoch - 1, f"exit:{(rep * 37 + 1) % n}")
            await send(epoch, "all")
            results.append(_figures(cpu, n, 0, wall))
            per = results[-1]["us_per_member"]
            print(f"  floor {rep + 1}: {per:.0f} us per member", file=sys.stderr)
        gc.callbacks.remove(_collecting)
        _stop_agents(proc)
        server.close()
        for c in list(http.connections):
            c.close()
        await server.wait_closed()

    uvloop.run(main())
    return results


def _planning_cpu() -> float:
    """The CPU the reconciler's passes spent in ``plan()`` so far in this process (the sum of
    its ``jobset_inplace_planning_cpu_seconds``)."""
    for metric in METRICS.planning.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                return float(sample.value)
    return 0.0


def _figures(cpu: Any, n: int, passes: int, wall: float) -> dict[str, float]:
    """One recovery's figures: this process's CPU since ``cpu`` (a getrusage)."""
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - cpu.ru_utime, after.ru_stime - cpu.ru_stime
    used = user + system
    return {
        "cpu_s": used,
        "user_s": user,
        "system_s": system,
        "us_per_member": used / n * 1e6,
        "gc_cpu_s": GC_CPU[0],
        "passes": passes,
        "barrier_s": time.monotonic() - wall,
    }


class _Handed:
    """``--in-process``: how reports reach the leader with no transport (``EPOCH exit:I`` or
    ``EPOCH all``, as the agents' process takes them): each request handed to the server's
    handler, ``batch`` per event-loop turn, each answer encoded as the HTTP layer would. The
    requests are made by :meth:`prepare`, before the recovery is measured (the agents' work,
    not the leader's)."""

    def __init__(self, server: ReportServer, tokens: list[str], batch: int) -> None:
        self.server, self.tokens, self.batch = server, tokens, batch
        self.requests: dict[tuple[int, str], list[Request]] = {}

    def prepare(self, epoch: int, exiting: int) -> None:
        """The requests of a recovery from ``epoch``: member ``exiting``'s trainer exit, then
        every member's report of the next epoch."""
        self.requests.clear()
        self.requests[epoch, f"exit:{exiting}"] = [
            self._request(exiting, AgentReport(exited_in_epoch=epoch))
        ]
        self.requests[epoch + 1, "all"] = self.reports(epoch + 1)

    def reports(self, epoch: int) -> list[Request]:
        steps = (epoch * 100, epoch * 100 - 100)
        message = AgentReport(reported_epoch=epoch, reported_steps=steps)
        return [self._request(i, message) for i in range(len(self.tokens))]

    def _request(self, i: int, message: AgentReport) -> Request:
        body = encode_request(Sender(NAMESPACE, GANG, *member_pod(i)), message)
        return Request(f"Bearer {self.tokens[i]}", body, True)

    async def __call__(self, epoch: int, what: str) -> None:
        requests = self.requests.get((epoch, what))
        if requests is None:  # not prepared: the warm-up's
            requests = self.reports(epoch)
        refused = []
        for start in range(0, len(requests), self.batch):
            for each in requests[start : start + self.batch]:
                answer = self.server.handle(each)
                if not isinstance(answer, Answer):
                    answer = await answer
                json.dumps(answer.payload).encode()  # what the HTTP layer sends back
                if answer.status != 200:
                    refused.append(f"{answer.status} {answer.payload}")
            await asyncio.sleep(0)  # the next batch in the loop's next turn
        if refused:
            raise SystemExit(f"reports refused: {refused[:3]}")


class _Batched(_Handed):
    """``--batched``: how reports reach a leader behind a report front
    (docs/design/report-fronts.md): the same reports, ``batch`` of them per front batch (the
    front's encoding done before the recovery is measured, with the requests), each batch
    decoded, taken (:meth:`ReportServer.take_batch`) and answered by the leader in one
    event-loop turn. Left out: the link's transport (a TLS record each way per batch)."""

    def __init__(self, server: ReportServer, tokens: list[str], batch: int) -> None:
        super().__init__(server, tokens, batch)
        self.batches: dict[tuple[int, str], list[bytes]] = {}

    def prepare(self, epoch: int, exiting: int) -> None:
        super().prepare(epoch, exiting)
        self.batches = {what: self._batches(rs) for what, rs in self.requests.items()}

    def _batches(self, requests: list[Request]) -> list[bytes]:
        from jobset_inplace.protocol.front_link import encode_batch  # noqa: PLC0415 (as above)

        entries = [parse_request(r.body) for r in requests]
        return [
            encode_batch(entries[i : i + self.batch]) for i in range(0, len(entries), self.batch)
        ]

    async def __call__(self, epoch: int, what: str) -> None:
        batches = self.batches.get((epoch, what))
        if batches is None:  # not prepared: the warm-up's
            batches = self._batches(self.reports(epoch))
        from jobset_inplace.protocol.front_link import (  # noqa: PLC0415 (as above)
            decode_batch,
            encode_answers,
        )

        refused = []
        for body in batches:
            batch = decode_batch(body)  # (before fronts said hello: a list of entries)
            answers = self.server.take_batch(getattr(batch, "entries", cast(Any, batch)))
            json.dumps(encode_answers(answers)).encode()  # what the link sends back
            refused += [f"{status} {payload}" for status, payload in answers if status != 200]
            await asyncio.sleep(0)  # the next batch in the loop's next turn
        if refused:
            raise SystemExit(f"reports refused: {refused[:3]}")


def leader(args: argparse.Namespace) -> list[dict[str, float]]:
    """The recoveries' figures, each a dict (this process: the leader; ``--in-process``: its
    reports handed to it with no transport)."""
    if args.leader_core is not None:
        os.sched_setaffinity(0, {args.leader_core})

    n, cluster = args.members, BenchCluster()
    tokens = [cluster.token(*member_pod(i)) for i in range(n)]
    cache = gang_cache(n, {i: _address(i) for i in range(n)})
    if args.nodes:
        _on_nodes(cache)
    gang = cache.gangs[NAMESPACE, GANG]
    gang.policy = Policy(inplace_budget=1 << 30)  # recovered in place as often as asked
    results: list[dict[str, float]] = []

    async def main() -> None:
        r = Reconciler(cache, _Writes())  # type: ignore[arg-type]
        # (the link only where asked: versions before it take no such argument)
        link: dict[str, Any] = (
            {"link": ("127.0.0.1", 0), "fronts": _is_front} if args.fronts_run else {}
        )
        server = ReportServer(
            cache, r.poke, BenchKeysVerifier(cluster.keys()), ("127.0.0.1", 0), "127.0.0.1", **link
        )
        cache.report_endpoint = endpoint = await server.start()
        cache.reports_since = time.time() - 10
        gang.status = GangStatus(
            phase=Phase.RUNNING,
            epoch=1,
            barrier_open=True,
            resume_step=100,
            report_endpoint=endpoint,
        )
        port = int(endpoint.url.rsplit(":", 1)[1].split("/")[0])
        proc: subprocess.Popen[str] | None = None
        front_proc: subprocess.Popen[str] | None = None
        handed = (
            _Batched(server, tokens, args.batch)
            if args.batched_run
            else _Handed(server, tokens, args.batch)
            if args.in_process_run
            else None
        )
        if handed is not None:
            send: Send = handed
        elif args.fronts_run:
            given = {
                "link": [server.link_port, endpoint.cert_sha256],
                "keys": cluster.keys(),
                "front_token": cluster.token(FRONT_POD, "uid-front"),
            }
            front_proc, front_port = await _start_front(args, given)
            proc, send = await _start_agents(args, front_port, tokens)
        else:
            proc, send = await _start_agents(args, port, tokens)

        def at_epoch(epoch: int, *, opened: bool) -> bool:
            status = gang.status
            return status is not None and status.epoch == epoch and status.barrier_open >= opened

        async def until(done: Callable[[], bool], what: str) -> None:
            for _ in range(6000):  # 30 s
                if done():
                    return
                await asyncio.sleep(0.005)
            raise SystemExit(f"{what}: not within 30 s ({gang.status})")

        await send(1, "all")  # every token verified once (a leader's steady state)
        await until(lambda: gang.status is not None and gang.status.reported == n, "warm-up")
        freeze = getattr(process, "freeze_heap", None)  # (versions before it had none)
        if freeze is not None:
            freeze("bench")
        gc.callbacks.append(_collecting)
        for rep in range(args.recoveries):
            assert gang.status is not None
            epoch, exiting = gang.status.epoch, (rep * 37 + 1) % n  # another member each time
            if handed is not None:
                handed.prepare(epoch, exiting)
            if args.nodes:
                renew_leases(cache)  # the kubelets' renewals, outside the measured recovery
            await asyncio.sleep(0.5)
            GC_CPU[0], passes, planned = 0.0, r.passes, _planning_cpu()
            batches = getattr(server, "batches", 0)  # (a front's, over the link)
            cpu, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            await send(epoch, f"exit:{exiting}")
            await until(partial(at_epoch, epoch + 1, opened=False), "recovery")
            await send(epoch + 1, "all")
            await until(partial(at_epoch, epoch + 1, opened=True), "barrier")
            results.append(_figures(cpu, n, r.passes - passes, wall))
            results[-1]["planning_cpu_s"] = _planning_cpu() - planned
            if args.fronts_run:
                results[-1]["link_batches"] = server.batches - batches
            print(
                f"  recovery {rep + 1}: {results[-1]['us_per_member']:.0f} us per member, "
                f"gc {GC_CPU[0] * 1000:.0f} ms, {r.passes - passes} passes, planning "
                f"{results[-1]['planning_cpu_s'] * 1000:.0f} ms",
                file=sys.stderr,
            )
        gc.callbacks.remove(_collecting)
        if proc is not None:
            _stop_agents(proc)
        if front_proc is not None:
            _stop_agents(front_proc)
        await server.stop()

    uvloop.run(main())
    return results


def _command(root: Path, *argv: str) -> list[str]:
    """This file run in a new process against ``root``'s ``jobset_inplace`` (and its
    ``bench`` helpers: token making and request framing, which older versions have too)."""
    here = str(Path(__file__).resolve())
    code = (
        f"import runpy, sys; sys.path.insert(0, {str(root)!r}); "
        f"sys.argv = [{here!r}, *{list(argv)!r}]; runpy.run_path({here!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", code]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.leader_loop", description=__doc__)
    p.add_argument("--members", type=int, default=2000)
    p.add_argument("--recoveries", type=int, default=10, help="per run")
    p.add_argument(
        "--nodes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each member on a node of its own with its Lease, as on a cluster (the planner "
        "looks at each member's node in every pass); --no-nodes: pods with no node, as this "
        "bench had before 2026-12-07",
    )
    p.add_argument("--runs", type=int, default=1, help="of each version, alternated")
    p.add_argument("--leader-core", type=int, default=1, help="the agents get the other core")
    p.add_argument("--compare", type=Path, help="a checkout of another version: run it too")
    p.add_argument(
        "--no-transport",
        action="store_true",
        help="this version and --compare's both with their reports handed to them as "
        "--in-process does (no agents' process, no TLS): their own work alone, compared",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="run the channel's floor too: its HTTP server answering a constant 200, nothing "
        "behind it",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the leader with no transport too: each request handed to its handler in "
        "its own process, --batch per event-loop turn",
    )
    p.add_argument(
        "--batched",
        action="store_true",
        help="run the leader behind a report front too: the same reports handed to it as a "
        "front's batches of --batch, one per event-loop turn (no transport)",
    )
    p.add_argument(
        "--fronts",
        action="store_true",
        help="run the leader behind a real report front too: the agents report to a front in "
        "their own process, which sends the leader batches over its link (TLS)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=64,
        help="--in-process: requests per event-loop turn; --batched: reports per batch",
    )
    p.add_argument("--out", type=Path, help="write the figures here (JSON)")
    p.add_argument("--agents", type=int, help=argparse.SUPPRESS)  # the client process: a port
    p.add_argument("--leader", action="store_true", help=argparse.SUPPRESS)  # one run, JSON out
    p.add_argument("--floor-run", action="store_true", help=argparse.SUPPRESS)  # the floor's
    p.add_argument("--in-process-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batched-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fronts-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--front", action="store_true", help=argparse.SUPPRESS)  # the front's
    args = p.parse_args(argv)
    if args.members < 4 or args.members > 60000:
        p.error("--members: 4..60000 (a loopback address each)")
    if args.batch < 1:
        p.error(f"--batch: a count of requests >= 1, got {args.batch}")
    if args.no_transport and (args.floor or args.in_process or args.batched or args.fronts):
        p.error("--no-transport: every version runs without a transport already")
    if args.batched and args.batch > BATCH_MAX:
        p.error(f"--batch: at most {BATCH_MAX} (a front's batch), got {args.batch}")
    if args.agents is not None:
        agents(args.agents, args.members, args.leader_core)
        return 0
    if args.front:
        front(args.leader_core)
        return 0
    if args.leader:
        print(json.dumps(floor(args) if args.floor_run else leader(args)))
        return 0
    # what is measured, read before the runs: the tree may change while they go on
    origin = provenance.provenance("bench.leader_loop", sys.argv[1:] if argv is None else argv)
    here = Path(__file__).resolve().parent.parent
    versions = {"this": here} | ({"compare": args.compare.resolve()} if args.compare else {})
    versions |= {"floor": here} if args.floor else {}
    versions |= {"in-process": here} if args.in_process else {}
    versions |= {"batched": here} if args.batched else {}
    versions |= {"fronts": here} if args.fronts else {}
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in versions}
    for run in range(args.runs):
        for version, root in versions.items():
            print(f"run {run + 1}/{args.runs}: {version} ({root})", file=sys.stderr)
            cmd = _command(
                root,
                *("--leader", "--members", str(args.members), "--recoveries"),
                *(str(args.recoveries), "--leader-core", str(args.leader_core)),
                "--nodes" if args.nodes else "--no-nodes",
                *(["--floor-run"] if version == "floor" else []),
                *(
                    ["--in-process-run", "--batch", str(args.batch)]
                    if version == "in-process" or (args.no_transport and version != "floor")
                    else []
                ),
                *(["--batched-run", "--batch", str(args.batch)] if version == "batched" else []),
                *(["--fronts-run"] if version == "fronts" else []),
            )
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            runs[version] += json.loads(out.stdout)
    lines = []
    for version, recs in runs.items():
        per = [r["us_per_member"] for r in recs]
        gc_ms = [r["gc_cpu_s"] * 1000 for r in recs]
        # (runs stored before user and system were split have neither)
        system = [r["system_s"] / r["cpu_s"] for r in recs if "system_s" in r and r["cpu_s"]]
        split = f", {statistics.median(system):.0%} of it system" if system else ""
        # (runs stored before it was recorded have no planning CPU)
        plan_ms = [r["planning_cpu_s"] * 1000 for r in recs if "planning_cpu_s" in r]
        planning = f" ({statistics.median(plan_ms):.0f} ms of them in plan())" if plan_ms else ""
        lines.append(
            f"{version}: {statistics.median(per):.0f} us per member per recovery (median of "
            f"{len(per)}; {min(per):.0f}-{max(per):.0f}){split}, gc "
            f"{statistics.median(gc_ms):.0f} ms per recovery, "
            f"{statistics.median(r['passes'] for r in recs):g} passes{planning}"
        )
    for other in ("compare", "floor", "in-process", "batched", "fronts"):
        if other not in runs:
            continue
        r = ratio_of_medians(
            [x["us_per_member"] for x in runs["this"]],
            [x["us_per_member"] for x in runs[other]],
        )
        lines.append(
            f"this / {other}: {r.ratio:.2f}x (95 % {r.low:.2f}-{r.high:.2f}, n = {r.n_a}, {r.n_b})"
        )
        mine, theirs = (
            [x["planning_cpu_s"] for x in runs[v] if "planning_cpu_s" in x] for v in ("this", other)
        )
        if mine and theirs and all(v > 0 for v in theirs):  # (the floor plans nothing)
            q = ratio_of_medians(mine, theirs)
            lines.append(
                f"this / {other}, plan() alone: {q.ratio:.2f}x (95 % {q.low:.2f}-{q.high:.2f}, "
                f"n = {q.n_a}, {q.n_b})"
            )
    print("\n".join(lines))
    if args.out:
        doc = origin
        if args.compare:
            doc["compare_commit"] = subprocess.run(
                ["git", "-C", str(args.compare), "rev-parse", "--short", "HEAD"],
                stdout=subprocess.PIPE,
                text=True,
                check=False,
            ).stdout.strip()
        doc |= {"members": args.members, "runs": runs, "summary": lines}
        provenance.write(doc, str(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
