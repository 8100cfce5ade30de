"""Hot spares' fence on the real apiserver (docs/design/hot-spares.md, section 5;
docs/guarantees.md, hybrid recovery): the controller (``jobset-inplace run`` with its report
channel), real agents and real launchers running a trainer, one per simulated pod (no kubelet:
gangsim plays it). A holder cut off from the leader (its agent stopped by SIGSTOP: its
heartbeats stop, its pod and node stay up, as in a partition) is frozen by its launcher when
its lease ends, and only then does a spare take its slot; when it comes back it is killed, never
resumed. Checked from the trainers' own records, timed by this machine's monotonic clock
(shared by every process here, as the containers of one node share theirs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobset_inplace import launcher, names
from testbed.controlplane import ControlPlane
from testbed.gangsim import Controller, Gang, LeaseKeeper
from testbed.kube import Clients, wait_for

from .agentproc import AgentProc, StartAgent
from .test_report_channel import CHANNEL, controller, report_token

pytestmark = pytest.mark.integration

FAST = {names.NODE_UNHEALTHY_AFTER: "5s", names.BARRIER_TIMEOUT: "60s"}

# The trainer: a step every 20 ms, each recorded (monotonic time, pod, slot, epoch, step) in a
# file every trainer shares, as checkpoints on a shared volume would be; it writes "checkpoint"
# records every 10 steps.
TRAINER = r"""
import os, sys, time
out = os.environ["RECORDS"]
who = (os.environ["POD"], os.environ.get("JSI_SLOT", "?"), os.environ.get("JSI_EPOCH", "?"))
step = 0
while True:
    step += 1
    kind = "checkpoint" if step % 10 == 0 else "step"
    with open(out, "a") as f:
        f.write("%f %s %s %s %s %d\n" % ((time.monotonic(),) + who + (kind, step)))
    time.sleep(0.02)
"""


def records(path: Path) -> list[tuple[float, str, str, str, str]]:
    """(time, pod, slot, epoch, kind) of every step the trainers made."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        t, pod, slot, epoch, kind, _ = line.split()
        out.append((float(t), pod, slot, epoch, kind))
    return out


SpareGang = tuple[Gang, Path, list[AgentProc]]


@pytest.fixture
def spare_gang(
    kube: Clients,
    namespace: str,
    start_agent: StartAgent,
    leases: LeaseKeeper,
    tmp_path: Path,
) -> Iterator[Callable[[], SpareGang]]:
    """Starts (once the controller runs) two members and a hot spare, each with its agent and
    a launcher running the trainer, training at epoch 1: the gang, the trainers' shared
    records and the agents. Every agent and launcher is stopped afterwards."""
    agents: list[AgentProc] = []
    launchers: list[subprocess.Popen[bytes]] = []

    def start() -> SpareGang:
        return (
            *start_gang(kube, namespace, start_agent, tmp_path, leases, agents, launchers),
            agents,
        )

    yield start
    for agent in agents:
        if agent.alive():
            agent.proc.send_signal(signal.SIGCONT)
    for proc in launchers:
        proc.terminate()
    for proc in launchers:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_gang(  # noqa: PLR0917 (what the fixture holds)
    kube: Clients,
    namespace: str,
    start_agent: StartAgent,
    tmp_path: Path,
    leases: LeaseKeeper,
    agents: list[AgentProc],
    launchers: list[subprocess.Popen[bytes]],
) -> tuple[Gang, Path]:
    """The gang of :func:`spare_gang`, its agents and launchers appended to theirs."""
    g = Gang(
        kube, namespace, f"fence-{uuid.uuid4().hex[:4]}", 3,
        {**FAST, names.HOT_SPARES: "1"}, leases=leases,
    )  # fmt: skip
    g.create()
    g.wait_state("naming the channel", lambda s: bool(s.get("reportEndpoint")))
    trainer, recs = tmp_path / "trainer.py", tmp_path / "records"
    trainer.write_text(TRAINER)
    for i in range(3):
        pod = g.pod(i)
        token = tmp_path / f"report-token-{i}"
        token.write_text(report_token(kube, namespace, pod))
        agent = start_agent(
            g.pods[i],
            g.name,
            POD_UID=pod.metadata.uid,
            JSI_RESTART_SCOPE="process",
            JSI_LAUNCHED_CONTAINERS="trainer",
            **{
                names.ENV_REPORT_TOKEN_FILE: str(token),
                names.ENV_SLOTS: "2",
                names.ENV_REPLICATED_JOB: "workers",
                names.ENV_JOB_INDEX: str(i),
                names.ENV_PEER_DOMAIN: g.name,
            },
        )
        agents.append(agent)
        env = {
            **os.environ,
            "JSI_STATE_DIR": str(agent.state_dir),
            "JSI_CONTAINER_NAME": "trainer",
            launcher.ENV_LEASE: "1",
            "POD": str(i),
            "RECORDS": str(recs),
        }
        with (tmp_path / f"launcher-{i}.log").open("wb") as log:
            launchers.append(
                subprocess.Popen(
                    [sys.executable, launcher.__file__, "--", sys.executable, str(trainer)],
                    env=env,
                    stderr=log,
                    stdout=log,
                )
            )
    g.wait_state("barrier open at epoch 1", lambda s: s.get("barrierOpen") is True)
    wait_for(
        "slots 0 and 1 training",
        lambda: {(p, s) for _, p, s, _, _ in records(recs)} >= {("0", "0"), ("1", "1")},
        15,
    )
    assert all(p != "2" for _, p, _, _, _ in records(recs)), "the spare runs no trainer"
    return g, recs


def spare_trains_as_slot_1(g: Gang, recs: Path) -> float:
    """Wait for epoch 2's barrier and the spare's trainer stepping as slot 1: when its first
    step was recorded."""
    g.wait_state("barrier open at epoch 2", lambda s: s["epoch"] == 2 and s["barrierOpen"])
    wait_for(
        "the spare training as slot 1",
        lambda: any(p == "2" and s == "1" for _, p, s, _, _ in records(recs)),
        15,
    )
    return min(t for t, p, _, _, _ in records(recs) if p == "2")


def test_a_holder_cut_off_from_the_leader_is_frozen_before_a_spare_takes_its_slot(
    control_plane: ControlPlane, spare_gang: Callable[[], SpareGang], tmp_path: Path
) -> None:
    ctl: Controller = controller(control_plane, tmp_path, "leader", **CHANNEL)
    try:
        g, recs, agents = spare_gang()

        # holder 1 is cut off from the leader: its agent stops (so do its heartbeats)
        agents[1].proc.send_signal(signal.SIGSTOP)
        cut = time.monotonic()
        st = g.wait_state("slot 1 on the spare", lambda s: bool(s.get("slots")), 20)
        moved = time.monotonic()
        assert st["slots"] == {"workers/1/0": "workers/2/0"}
        assert st["recovery"]["causes"] == {"workers/1/0": "AgentSilent"}
        stale = [t for t, p, _, _, _ in records(recs) if p == "1"]
        assert max(stale) < cut + names.LEASE_S + 0.5, "frozen once its lease ended"
        assert max(stale) < moved
        log1 = (tmp_path / "launcher-1.log").read_text()
        assert "the agent's lease ended: freezing" in log1

        first = spare_trains_as_slot_1(g, recs)

        # the partition heals: the stale holder's agent learns its slot is gone
        agents[1].proc.send_signal(signal.SIGCONT)
        wait_for(
            "the frozen trainer killed",
            lambda: "stopped frozen" in (tmp_path / "launcher-1.log").read_text(),
            15,
        )
        time.sleep(1.0)  # its agent's heartbeats go on meanwhile: no lease brings it back
        stale = [t for t, p, _, _, _ in records(recs) if p == "1"]
        assert max(stale) < first, "never two pods trained as slot 1"
        writes = [(t, p) for t, p, s, _, k in records(recs) if s == "1" and k == "checkpoint"]
        assert not [t for t, p in writes if p == "1" and t >= moved], "no stale checkpoint"
    finally:
        ctl.stop()


def test_a_holder_silent_since_the_leader_died_goes_to_the_spare_under_the_new_leader(
    control_plane: ControlPlane, spare_gang: Callable[[], SpareGang], tmp_path: Path
) -> None:
    """A node's death that takes the leader with a holder: the new leader never heard that
    holder's agent, yet counts its silence from a lease after its own channel was named (the
    pods running then heartbeated its predecessor), so the slot goes to the spare in seconds,
    not at the node's Lease (kept fresh here: only the agent's silence tells), and only once
    no lease the old leader gave can still be running. (No election here: the timing between
    leaders is unit-tested, tests/unit/test_metrics.py.)"""
    first = controller(control_plane, tmp_path, "leader-1", **CHANNEL)
    second: Controller | None = None
    try:
        g, recs, agents = spare_gang()
        old = str(g.state()["reportEndpoint"]["leader"])
        agents[1].proc.send_signal(signal.SIGSTOP)  # the holder's node and the leader go at once
        first.kill()
        cut = time.monotonic()
        second = controller(control_plane, tmp_path, "leader-2", **CHANNEL)
        wait_for(
            "the new leader naming its channel",
            lambda: (g.state().get("reportEndpoint") or {}).get("leader") not in (None, old),
            30,
            0.2,
        )
        named = time.monotonic()
        st = g.wait_state("slot 1 on the spare", lambda s: bool(s.get("slots")), 20)
        moved = time.monotonic()
        assert st["slots"] == {"workers/1/0": "workers/2/0"}
        assert st["recovery"]["causes"] == {"workers/1/0": "AgentSilent"}
        # presumed heard a lease after the naming, moved the lease and its margin after that
        # (the test sees the naming up to a poll late, hence only the later part is asserted)
        assert moved - named >= names.LEASE_S + names.FENCE_MARGIN_S, "not before the fence"
        stale = [t for t, p, _, _, _ in records(recs) if p == "1"]
        assert max(stale) < cut + names.LEASE_S + 0.5, "frozen once its lease ended"
        first_spare = spare_trains_as_slot_1(g, recs)
        assert max(stale) < first_spare, "never two pods trained as slot 1"
        # holder 0 kept its slot: if its trainer froze while no leader answered, the new
        # leader's renewal thawed it, so it stopped gracefully (it could keep its step), never
        # killed frozen. The renewal lands either before the gang moves on (resumed, then
        # stopped with SIGTERM) or after (thawed to stop); which one is a race between the
        # two leaders' timing, both are the guarantee.
        kept = (tmp_path / "launcher-0.log").read_text()
        assert "stopped frozen" not in kept, kept
        froze = "the agent's lease ended: freezing" in kept
        resumed = "lease renewed: resuming" in kept
        if froze:
            assert resumed or "thawing to stop" in kept, kept
        how = "resumed, then stopped" if resumed else "thawed to stop"
        print(f"\nholder 0 {how if froze else 'never froze'}")
    finally:
        first.stop()
        if second is not None:
            second.stop()
