"""How soon an agent the leader refuses is surfaced: ``python -m bench.channel_fallback``.

The real controller process (``jobset-inplace run``) on the integration control plane (a real
etcd and kube-apiserver and nothing else: the JobSet, its Jobs and pods, the kubelets' node
Leases and the pods' in-place restarts are written as their controllers would,
testbed/gangsim.py) serves its report channel with room for one connection fewer than the gang
has members (``JSI_REPORT_LIMITS=max_connections=3``: a leader without memory for one more).
A gang of 4: members 0-2 report over the channel with their pod-bound tokens and the agent's
own client, each keeping its connection open (as an agent does). Each repetition: member 0's
trainer fails (a new epoch), every pod restarts in place, then member 3's agent reports the new
epoch with the agent's own :class:`~jobset_inplace.agent.runner.Reporter` (a new agent process:
no channel failure remembered): the leader, full, refuses its connection and the reporter
writes the report on its pod. Measured from that call, each by this process's watches:

* ``fallback_s``: the report is on the pod (the reporter returned ``"pod"``);
* ``counted_s``: the GangState's ``status.members.onPod`` is 1 (the status a dashboard, the
  plugin and the alert read);
* ``event_s``: the ``ReportChannelUnreachable`` Warning Event naming member 3 is posted.

Members 0-2 then report over the channel and the barrier opens: the next repetition starts from
a running gang. The issue's goal: surfaced within 2 s. The figures are this machine's (2 cores
shared by etcd, the apiserver, the controller and this process)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import watch

from bench import provenance
from jobset_inplace import names
from jobset_inplace.agent.channel import ReportChannel
from jobset_inplace.agent.config import Config
from jobset_inplace.agent.kubeapi import KubeApi
from jobset_inplace.agent.log import Log
from jobset_inplace.agent.runner import Reporter
from jobset_inplace.core.policy import INPLACE_BUDGET_RANGE
from jobset_inplace.protocol.gangstate import Endpoint, parse_endpoint
from jobset_inplace.protocol.report import AgentReport
from testbed.controlplane import ControlPlane, start_control_plane
from testbed.gangsim import CRD, CRD_NAME, Controller, Gang, LeaseKeeper
from testbed.kube import Clients, clients, pod_token, temporary_namespace

MEMBERS = 4
REFUSED = MEMBERS - 1  # member 3: the leader has room for the others' connections only
LIMITS = f"max_connections={MEMBERS - 1}"
GOAL_S = 2.0
WAIT_S = 30.0  # for any one thing to be seen before the run gives up


class Seen:
    """What this process's watches saw, with the monotonic time it arrived."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.states: list[tuple[float, dict[str, Any]]] = []
        self.events: list[tuple[float, str, str]] = []  # (when, reason, message)

    def add_state(self, state: dict[str, Any]) -> None:
        with self.lock:
            self.states.append((time.monotonic(), state))
            self.lock.notify_all()

    def add_event(self, reason: str, message: str) -> None:
        with self.lock:
            self.events.append((time.monotonic(), reason, message))
            self.lock.notify_all()

    def first(self, since: float, found: Callable[[], float | None]) -> float:
        """The time of the first record from ``since`` on that ``found`` finds (waits)."""
        deadline = time.monotonic() + WAIT_S
        with self.lock:
            while (at := found()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"not seen within {WAIT_S:.0f} s")
                self.lock.wait(left)
        return at - since

    def state_where(self, since: float, pred: Callable[[dict[str, Any]], bool]) -> float:
        return self.first(
            since, lambda: next((t for t, s in self.states if t >= since and pred(s)), None)
        )

    def event_where(self, since: float, reason: str, text: str) -> float:
        return self.first(
            since,
            lambda: next(
                (t for t, r, m in self.events if t >= since and r == reason and text in m), None
            ),
        )


def _watch(kube: Clients, ns: str, gang: str, seen: Seen, stop: threading.Event) -> None:
    """The GangState's and the gang's Events' changes, as they arrive (a watch that ends is
    started again: what it lists first is seen again, later than it happened, never earlier;
    one the control plane's stop breaks ends quietly)."""

    def states() -> Iterator[None]:
        for e in watch.Watch().stream(
            kube.custom.list_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            ns,
            names.GANGSTATE_PLURAL,
            field_selector=f"metadata.name={gang}",
            timeout_seconds=60,
        ):
            seen.add_state((e["object"] or {}).get("status") or {})
            yield

    def events() -> Iterator[None]:
        for e in watch.Watch().stream(
            kube.core.list_namespaced_event,
            ns,
            field_selector=f"involvedObject.name={gang}",
            timeout_seconds=60,
        ):
            seen.add_event(e["object"].reason or "", e["object"].message or "")
            yield

    def keep(stream: Callable[[], Iterator[None]]) -> None:
        while not stop.is_set():
            try:
                for _ in stream():
                    if stop.is_set():
                        return
            except Exception:  # (the apiserver going away at the end; else: again)
                if stop.wait(0.2):
                    return

    for stream in (states, events):
        threading.Thread(target=keep, args=(stream,), daemon=True).start()


def report(epoch: int) -> AgentReport:
    """A member's report of ``epoch``: a newer checkpoint each epoch (the gang progresses:
    the stop rule, core/no_progress.py, has nothing to stop)."""
    return AgentReport(reported_epoch=epoch, reported_steps=(100 * epoch,))


class Members:
    """The gang's agents as this run plays them: members 0-2 on the channel, each with its
    own kept-alive connection; member 3 with a new real Reporter each time."""

    def __init__(self, cp: ControlPlane, kube: Clients, gang: Gang, tmp: Path) -> None:
        self.cp, self.kube, self.gang, self.tmp = cp, kube, gang, tmp
        self.channels: dict[int, ReportChannel] = {}
        self.tokens: dict[int, Path] = {}
        self.agent_log = Log(None)

    def token(self, i: int) -> Path:
        if i not in self.tokens:
            pod = self.gang.pod(i).metadata
            path = self.tmp / f"token-{i}-{uuid.uuid4().hex[:4]}"
            path.write_text(
                pod_token(
                    self.kube.core,
                    self.gang.namespace,
                    service_account="default",
                    pod=pod.name,
                    uid=pod.uid,
                    audience=names.REPORT_TOKEN_AUDIENCE,
                    seconds=names.REPORT_TOKEN_SECONDS,
                )
            )
            self.tokens[i] = path
        return self.tokens[i]

    def over_channel(self, i: int, endpoint: Endpoint, epoch: int) -> None:
        if i not in self.channels:
            pod = self.gang.pod(i).metadata
            self.channels[i] = ReportChannel(
                self.gang.namespace, self.gang.name, pod.name, pod.uid, self.token(i)
            )
        self.channels[i].send(endpoint, report(epoch))

    def refused_agent(self, endpoint: Endpoint, epoch: int) -> str:
        """Member 3's report by a new agent process's Reporter: where it went."""
        pod = self.gang.pod(REFUSED).metadata
        cfg = Config(
            pod_name=pod.name, namespace=self.gang.namespace, gangstate=self.gang.name,
            state_dir=self.tmp, local_dir=None, persistent_dir=None, restart_exit_code=88,
            probe_port=1, server=self.cp.server, token_file=self.tmp / "api-token",
            ca_file=self.cp.workdir / "pki" / "apiserver.crt", pod_uid=pod.uid,
            report_token_file=self.token(REFUSED),
        )  # fmt: skip
        reporter = Reporter(cfg, self.agent_log)
        reporter.endpoint = endpoint
        channel = reporter.channel_for()
        kube = KubeApi(cfg.server, cfg.token_file, cfg.ca_file)
        try:
            return reporter.report(report(epoch), fresh=True, channel=channel, kube=kube)
        finally:
            if channel is not None:
                channel.close()

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


def _diagnose(ctl: Controller, gang: Gang, seen: Seen) -> None:
    """What a failed run leaves to read: the controller's log, the last statuses seen."""
    print(f"--- the controller's log, last lines:\n{ctl.tail(80)}", file=sys.stderr)
    for _, st in seen.states[-3:]:
        keep = ("phase", "epoch", "barrierOpen", "members", "recovery", "reason", "message")
        print(f"--- a status seen: { {k: st.get(k) for k in keep} }", file=sys.stderr)


def _counted(epoch: int, status: dict[str, Any]) -> bool:
    """``status`` counts the refused member's report of ``epoch`` as on its pod."""
    return bool(status.get("epoch") == epoch and (status.get("members") or {}).get("onPod") == 1)


def run(reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"members": MEMBERS, "limits": LIMITS, "reps": []}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jsi-fallback-")))
        print("starting the control plane ...", file=sys.stderr, flush=True)
        cp = start_control_plane()
        stack.callback(cp.stop)
        kube = clients(cp.kubeconfig)
        cp.kubectl().apply_files([CRD], server_side=True)
        cp.kubectl().wait_crds_established([CRD_NAME])
        (tmp / "api-token").write_text(cp.token + "\n")
        ctl = Controller(
            cp.kubeconfig,
            tmp / "controller.log",
            env={
                "JSI_REPORT_ADVERTISE": "127.0.0.1",
                "JSI_REPORT_LISTEN": "127.0.0.1:0",
                "JSI_REPORT_LIMITS": LIMITS,
            },
        )
        ctl.start()
        stack.callback(ctl.stop)
        leases = LeaseKeeper(kube)
        leases.start()
        stack.callback(leases.stop)
        ns = stack.enter_context(temporary_namespace(kube, "bench-fallback", default_sa=True))
        fast = {  # (the largest in-place budget: a repetition is a failure)
            names.NODE_UNHEALTHY_AFTER: "5s",
            names.BARRIER_TIMEOUT: "60s",
            names.INPLACE_BUDGET: str(INPLACE_BUDGET_RANGE[1]),
        }
        gang = Gang(kube, ns, "train", MEMBERS, fast, leases=leases)
        gang.create()
        seen, stop = Seen(), threading.Event()
        stack.callback(stop.set)
        _watch(kube, ns, gang.name, seen, stop)
        state = gang.wait_state(
            "the channel named", lambda s: parse_endpoint(s.get("reportEndpoint"))
        )
        endpoint = parse_endpoint(state["reportEndpoint"])
        assert endpoint is not None
        members = Members(cp, kube, gang, tmp)
        stack.callback(members.close)
        for i in range(MEMBERS):  # epoch 1: everyone over the channel but the refused one
            if i != REFUSED:
                members.over_channel(i, endpoint, 1)
        gang.report(REFUSED, 1, "100")  # (the refused member's first report: on its pod)
        gang.wait_state(
            "epoch 1 open", lambda s: bool(s.get("barrierOpen")) and s.get("epoch") == 1
        )
        stack.callback(lambda: _diagnose(ctl, gang, seen) if sys.exc_info()[0] else None)
        for rep in range(reps):
            epoch = rep + 2
            gang.fail_trainer(rep % REFUSED)  # members 0-2 in turn (member-repeat-limit)
            gang.wait_state(f"epoch {epoch}", lambda s, e=epoch: s.get("epoch") == e)
            for i in range(MEMBERS):
                gang.restart_in_place(i)
            called = time.monotonic()
            where = members.refused_agent(endpoint, epoch)
            fallback = time.monotonic() - called
            counted = seen.state_where(called, partial(_counted, epoch))
            event = seen.event_where(called, "ReportChannelUnreachable", f"epoch {epoch}:")
            for i in range(MEMBERS):
                if i != REFUSED:
                    members.over_channel(i, endpoint, epoch)
            gang.wait_state(
                f"epoch {epoch} open",
                lambda s, e=epoch: bool(s.get("barrierOpen")) and s.get("epoch") == e,
            )
            m = {"where": where, "fallback_s": fallback, "counted_s": counted, "event_s": event}
            out["reps"].append(m)
            print(
                f"rep {rep + 1}: went to the {where} in {fallback * 1000:.0f} ms; counted in the "
                f"status after {counted:.2f} s, the Event after {event:.2f} s",
                file=sys.stderr,
                flush=True,
            )
        refusals = [line for line in ctl.tail(400).splitlines() if "connection refused" in line]
        out["controller_refusals_logged"] = refusals[-3:]
    return out


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, float]:
        values = sorted(r[key] for r in reps)
        return {
            "median": statistics.median(values),
            "max": values[-1],
            "min": values[0],
        }

    surfaced = [max(r["counted_s"], r["event_s"]) for r in reps]
    return {
        "n": len(reps),
        "on_pod": sum(r["where"] == "pod" for r in reps),
        "fallback_s": stats("fallback_s"),
        "counted_s": stats("counted_s"),
        "event_s": stats("event_s"),
        "surfaced_max_s": max(surfaced),
        "goal_met": all(s <= GOAL_S for s in surfaced) and all(r["where"] == "pod" for r in reps),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=20, help="refused reports measured")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args()
    if args.reps < 1:
        p.error(f"--reps: at least 1, got {args.reps}")
    provenance.refuse_dirty(args.allow_dirty or not args.out)
    origin = provenance.provenance("bench.channel_fallback", sys.argv[1:])
    result = run(args.reps)
    result["summary"] = s = summary(result["reps"])
    result.update(origin)
    result["when"] = provenance.when()
    result["kubernetes"] = provenance.CONTROL_PLANE
    provenance.write(result, args.out)
    print(
        f"\ncommit {origin['commit']}: {s['n']} refused reports, {s['on_pod']} on the pod; "
        f"fallback {s['fallback_s']['median'] * 1000:.0f} ms (max "
        f"{s['fallback_s']['max'] * 1000:.0f}); counted in the status "
        f"{s['counted_s']['median']:.2f} s "
        f"(max {s['counted_s']['max']:.2f}); Event {s['event_s']['median']:.2f} s (max "
        f"{s['event_s']['max']:.2f}); surfaced within {GOAL_S:g} s: "
        f"{'met' if s['goal_met'] else 'NOT met'} (the largest {s['surfaced_max_s']:.2f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
