"""The agent's I/O loop: read and watch the GangState, report, open the barrier, or exit with
the restart exit code. Decisions are `jobset_inplace.agent.logic`'s."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobset_inplace import launcher, names
from jobset_inplace.backoff import Backoff, Retries
from jobset_inplace.protocol.envelope import ProgressNote
from jobset_inplace.protocol.gangstate import Endpoint, GangView, MalformedStatus
from jobset_inplace.protocol.gangstate import parse_gangstate as parse
from jobset_inplace.protocol.report import EMPTY, AgentReport, encode_report
from jobset_inplace.trainer import ResumeInfo, clear_resume, write_resume
from jobset_inplace.trainer.checkpoints import select_steps
from jobset_inplace.trainer.layouts import Layout
from jobset_inplace.trainer.progress import (
    clear_progress,
    encode_busy,
    encode_span,
    read_progress,
    span_of,
)
from jobset_inplace.trainer.stop import StopAt, clear_stop, write_stop

from .channel import ChannelError, ReportChannel
from .config import Config
from .hang import HangWatch
from .kubeapi import ApiError, KubeApi, TransportErrors
from .log import Log
from .logic import (
    AgentLogic,
    LauncherState,
    Open,
    Report,
    Restart,
    Standby,
    Wait,
    failed_exit,
    trainers_stopped,
)
from .probe import BarrierState
from .steptime import BusyWindows

__all__ = ["Agent", "Reporter", "TrainerMonitor", "process_age"]

# Errors after which the agent re-reads the GangState (after a backoff) and decides again.
_RETRY_ERRORS = (ApiError, ValueError, *TransportErrors)

WATCH_SECONDS = (120, 180)  # server-side watch timeout, random in this range (spreads load)
# Process scope: how long past the stop grace the launchers may take to confirm a stop before
# the agent falls back to restarting the whole pod.
STOP_SLACK_S = 5.0
# A trainer's exit or hang that cannot be reported for this long restarts the whole pod instead
# (the kubelet's own signals then reach the controller): a gang never waits unseen.
EXIT_REPORT_DEADLINE_S = 10.0
# How often the monitor reads the progress records: a few small files (one per trainer), ~0.1 ms
# a read; a quarter second keeps the read a small share of the shortest hang-timeout
# (core/policy.py HANG_TIMEOUT_RANGE_S).
PROGRESS_READ_SECONDS = 0.25
# The progress notes to the leader go at most this often, and once the pace is known no
# sooner than their reach (the records are read faster for hang detection).
PROGRESS_NOTE_MIN_S = 1.0
# After the report channel failed, reports go on the pod for this long (jittered; doubling with
# each failure in a row, from 1 s to 60 s), or until the status names another leader's channel:
# a channel refused once is tried again soon, one that stays down costs a timeout a minute.
CHANNEL_RETRY = Backoff(1.0, 60.0)
# A failed action (a report, an open) or GangState read is tried again after this (jittered).
ACTION_RETRY = Backoff(0.2, 10.0)


def process_age() -> float | None:
    """Seconds since this process started (per the kernel), or None if unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _ActionFailed(Exception):
    """An I/O action (report, open) failed; retried after a backoff."""


class _WatchEnded(Exception):
    """The server ended a watch early (a proxy cutting connections?): back off, re-read."""


class _Relist(Exception):
    """The watch cannot continue from its resourceVersion: read the object again."""


# Every key a new epoch's report on the pod sets or removes (a report over the channel leaves the
# straggler windows alone: they carry their epoch).
_POD_REPORT_KEYS = (
    names.REPORT_EPOCH,
    names.REPORT_STEPS,
    names.REPORT_LATE,
    names.REPORT_EXITED,
    names.REPORT_HUNG,
    names.REPORT_BUSY,
    names.REPORT_NEWEST_STEP,
    names.REPORT_BUSY_EPOCH,
    names.REPORT_PROGRESS_STEP,
    names.REPORT_PROGRESS_SPAN,
    names.REPORT_PROGRESS_NOW,
    names.REPORT_PARKED,
    names.REPORT_RECHECKED,
)


class Reporter:
    """What this agent reported in its epoch (its record, an AgentReport) and where:
    over the report channel to the leader the GangState names, or on its pod when there is no
    channel or it fails. Shared by the agent loop and the trainer monitor (each with its own
    connections); a lock keeps the record and the sends in order."""

    def __init__(self, cfg: Config, log: Log) -> None:
        self.cfg, self.log = cfg, log
        self.pod = f"/api/v1/namespaces/{cfg.namespace}/pods/{cfg.pod_name}"
        self.lock = threading.Lock()
        self.record = EMPTY
        self.sent_to: Endpoint | None = None  # the channel the record reached (None: the pod)
        self.endpoint: Endpoint | None = None  # the newest status's channel
        self.status_seen = False  # a status was read: `endpoint` is its (None: none named)
        self.failed: tuple[Endpoint, float] | None = None  # a channel that failed, and until when
        self.channel_retries = Retries(CHANNEL_RETRY, jitter=True)  # its failures in a row
        self.on_pod = False  # the last report written on the pod is still there

    def channel_for(self) -> ReportChannel | None:
        """A connection of this thread's own to the channel (None: not configured)."""
        cfg = self.cfg
        if cfg.pod_uid is None or cfg.report_token_file is None:
            return None
        return ReportChannel(
            cfg.namespace,
            cfg.gangstate,
            cfg.pod_name,
            cfg.pod_uid,
            cfg.report_token_file,
            on_front_failed=lambda why: self.log.repeat("front", "WARN", why),
        )

    def report(
        self,
        update: AgentReport,
        *,
        fresh: bool,
        channel: ReportChannel | None,
        kube: KubeApi,
    ) -> str:
        """Report ``update``: a new epoch's report (``fresh``: replaces the record) or an
        addition to it (a trainer's exit or hang). Returns where it went ("channel" or "pod");
        raises what the pod write raises."""
        with self.lock:
            record = update if fresh else self.record.merged(update)
            return self._deliver(record, fresh=fresh, channel=channel, kube=kube)

    def resend(self, epoch: int, channel: ReportChannel | None, kube: KubeApi) -> str | None:
        """Send the record again if it went over the channel and the status now names another
        leader (a new leader knows nothing of it) while its epoch is current; else None. (The
        same leader naming other fronts knows it already.)"""
        with self.lock:
            endpoint, sent_to = self.endpoint, self.sent_to
            if sent_to is None or (endpoint is not None and endpoint.same_leader(sent_to)):
                return None
            if self.record.reported_epoch != epoch:
                return None
            return self._deliver(self.record, fresh=True, channel=channel, kube=kube)

    def _deliver(
        self,
        record: AgentReport,
        *,
        fresh: bool,
        channel: ReportChannel | None,
        kube: KubeApi,
    ) -> str:
        endpoint, failed = self.endpoint, self.failed
        if failed is not None and failed[0] != endpoint:
            self.channel_retries.succeeded()  # a new leader: its channel starts afresh
        if failed is not None and (failed[0] != endpoint or time.monotonic() > failed[1]):
            failed = self.failed = None
        if channel is not None and endpoint is not None and failed is None:
            try:
                channel.send(endpoint, record)
            except ChannelError as e:
                # a channel that does not answer would cost every report its timeout
                pause = self.channel_retries.failed()
                self.failed = (endpoint, time.monotonic() + pause)
                self.log.repeat(
                    "channel",
                    "WARN",
                    f"report channel: {e}; writing reports on the pod (trying the channel "
                    f"again in {pause:.1f} s or with a new leader)",
                )
            else:
                self.channel_retries.succeeded()
                self.log.clear("channel")
                self.record, self.sent_to = record, endpoint
                self._clear_pod(kube)
                return "channel"
        encoded = encode_report(record)
        values: dict[str, str | None] = {k: encoded.get(k) for k in _POD_REPORT_KEYS}
        if not fresh:
            # The record, not only the update: the epoch's report may have gone over the
            # channel, and an exit alone on the pod would rank below it (AgentReport.order).
            # Nothing is removed: what the pod holds of its epoch stays.
            values = dict(encoded)
        kube.merge_patch(self.pod, {"metadata": {"annotations": values}})
        self.record, self.sent_to, self.on_pod = record, None, True
        return "pod"

    def _clear_pod(self, kube: KubeApi) -> None:
        """After a report on the pod (the channel had failed), the next one over the channel
        removes it: the pod keeps no stale trace (the controller would take the newer anyway).
        Retried with the next report if it fails."""
        if not self.on_pod:
            return
        annotations = dict.fromkeys(names.CHANNEL_REPORT_KEYS)
        try:
            kube.merge_patch(self.pod, {"metadata": {"annotations": annotations}})
        except (ApiError, *TransportErrors) as e:
            self.log.warning(f"cannot remove the report written on the pod: {e}")
            return
        self.on_pod = False


class Agent:
    def __init__(
        self,
        cfg: Config,
        kube: KubeApi,
        barrier: BarrierState,
        log: Log,
        *,
        started: float,
    ) -> None:
        self.cfg = cfg
        self.kube = kube
        self.barrier = barrier
        self.log = log
        self.logic = AgentLogic(cfg.position)
        self.retries = Retries(ACTION_RETRY, jitter=True)
        self.reporter = Reporter(cfg, log)
        self.channel = self.reporter.channel_for()
        self._started = started  # time.monotonic() when the entry module began
        self._collection = KubeApi.gangstates_path(
            names.GROUP, names.VERSION, cfg.namespace, names.GANGSTATE_PLURAL
        )
        self._object = f"{self._collection}/{cfg.gangstate}"
        self._what = f"GangState {cfg.gang}"
        self.first_report_latency: float | None = None
        self._open_reason = ""
        self._logged_wait = ""
        # The epoch whose trainers may run, and when its barrier opened (monotonic; read by the
        # monitor thread: one tuple, replaced whole).
        self.running: tuple[int, float] | None = None
        # The status's planned stop (epoch, step or None), read by the monitor thread
        self.planned: tuple[int, int | None] | None = None

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Run until an epoch change requires a restart; return the restart exit code."""
        rv: str | None = None
        relist = True
        while True:
            try:
                if relist:
                    rv = self._read()
                    relist = False
                rv = self._watch(rv)
            except _Relist as e:
                self.log.info(f"{e}; reading the {self._what} again")
                relist = True
            except (_ActionFailed, _WatchEnded, *_RETRY_ERRORS) as e:
                self._waiting(f"{_describe(e)}; retrying")
                self.log.repeat(
                    "retry",
                    "WARN",
                    f"{_describe(e)}; retrying with backoff (up to {ACTION_RETRY.cap:.0f} s)",
                )
                relist = True
                time.sleep(self.retries.failed())
            except _RestartRequested as r:
                return r.code

    def _read(self) -> str | None:
        """GET the GangState and act on it; its resourceVersion (None if it does not exist)."""
        try:
            obj = self.kube.get(self._object)
        except ApiError as e:
            if e.status != 404:
                raise
            self._waiting(f"{self._what} not found")
            self.log.repeat(
                "gangstate",
                "WARN",
                f"{self._what} not found: waiting for the controller to create it",
            )
            return None
        self._observe(obj)
        return _resource_version(obj)

    def _watch(self, rv: str | None) -> str | None:
        """Watch from `rv` until the server ends the watch; the last resourceVersion seen."""
        seconds = random.randint(*WATCH_SECONDS)
        began, events = time.monotonic(), 0
        for event in self.kube.watch(self._collection, self.cfg.gangstate, rv, seconds):
            events += 1
            kind, obj = event.get("type"), event.get("object")
            if kind == "ERROR":
                status = obj if isinstance(obj, dict) else {}
                code = status.get("code")
                message = str(status.get("message") or status.get("reason") or "")
                if code == 410:  # Gone: rv too old (compacted)
                    raise _Relist(f"watch of the {self._what} expired ({message})")
                raise ApiError(int(code) if isinstance(code, int) else 500, "WatchError", message)
            self.retries.succeeded()  # the watch works
            self.log.clear("retry")
            rv = _resource_version(obj) or rv
            if kind in ("ADDED", "MODIFIED"):
                self._observe(obj)
            elif kind == "DELETED":
                self._waiting(f"{self._what} deleted")
                self.log.repeat("gangstate", "WARN", f"{self._what} was deleted; waiting")
        if events == 0 and time.monotonic() - began < seconds / 2:
            raise _WatchEnded(f"the watch of the {self._what} ended early without events")
        self.retries.succeeded()
        return rv

    # --- decisions and actions ------------------------------------------------------------

    def _observe(self, obj: Any) -> None:
        try:
            view = parse(obj)
        except MalformedStatus as e:
            self._waiting(f"malformed {self._what}: {e}")
            self.log.repeat(
                "gangstate", "WARN", f"ignoring malformed {self._what}: {e}; waiting for a fix"
            )
            return
        if view is None:
            self._waiting(f"{self._what} has no status epoch yet")
            self.log.repeat("gangstate", "INFO", f"{self._what} has no status epoch yet: waiting")
            return
        self.log.clear("gangstate")
        self.reporter.endpoint, self.reporter.status_seen = view.endpoint, True
        try:
            where = self.reporter.resend(view.epoch, self.channel, self.kube)
        except _RETRY_ERRORS as e:
            raise _ActionFailed(f"cannot report again for the new leader: {_describe(e)}") from e
        if where is not None:
            self.log.info(f"a new leader: report of epoch {view.epoch} sent again (on the {where})")
        self._handle(view)

    def _handle(self, view: GangView) -> None:
        self.planned = view.planned_stop
        for _ in range(4):  # report, then open, then wait: at most three actions per view
            action = self.logic.step(view)
            if isinstance(action, Report):
                self._report(action)
            elif isinstance(action, Open):
                self._open(action)
            elif isinstance(action, Standby):
                self._waiting(
                    f"hot spare: epoch {action.epoch} open, this pod holds no slot; standing by",
                    log=True,
                )
                return
            elif isinstance(action, Restart):
                self._restart(action)
            else:
                assert isinstance(action, Wait)
                self._waiting(self._open_reason if self.logic.opened else action.reason, log=True)
                return
        raise AssertionError(f"no decision settled for {view}")

    def _report(self, action: Report) -> None:
        cfg = self.cfg
        scan = cfg.layout.steps
        try:
            steps = select_steps(
                scan(cfg.local_dir) if cfg.local_dir else (),
                scan(cfg.persistent_dir) if cfg.persistent_dir else (),
            )
        except (OSError, ValueError) as e:
            raise _ActionFailed(f"cannot scan the checkpoint tiers: {e}") from e
        # how far this pod's trainers got in the epoch before: their progress records stay on
        # the state volume until this epoch's barrier opens (_open clears them)
        records = read_progress(cfg.state_dir)
        report = AgentReport(
            reported_epoch=action.epoch,
            reported_steps=tuple(sorted(set(steps), reverse=True)),
            progress_step=max((p.step for p in records.values()), default=None),
            progress_span=span_of(records),
            # reported into an open barrier: this agent (re)started unseen, and waits
            late_for_epoch=None if action.barrier_closed else action.epoch,
            rechecked_epoch=action.epoch if action.recheck else None,
        )
        try:
            where = self.reporter.report(report, fresh=True, channel=self.channel, kube=self.kube)
        except _RETRY_ERRORS as e:
            raise _ActionFailed(f"cannot report on pod {cfg.pod_name}: {_describe(e)}") from e
        previous = self.logic.epoch
        again = previous == action.epoch and self.logic.reported
        self.logic.reported_epoch(
            action.epoch, action.barrier_closed, steps, rechecked=action.recheck
        )
        listed = ",".join(map(str, steps)) or "none"
        if again:
            self.log.info(
                f"looked at the checkpoint steps of epoch {action.epoch} again (the controller "
                f"asked: another member reported a step this report lacked): [{listed}] (on "
                f"the {where})"
            )
        elif previous is None:
            age = process_age()
            latency = age if age is not None else time.monotonic() - self._started
            self.first_report_latency = latency
            since = "process start" if age is not None else "agent start"
            self.log.info(
                f"reported epoch {action.epoch}, checkpoint steps [{listed}]: "
                f"{latency:.3f} s after {since} (on the {where})"
            )
        elif previous != action.epoch:
            self.log.info(
                f"adopted epoch {action.epoch} in place (was {previous}; this agent's barrier "
                f"had not opened), reported checkpoint steps [{listed}] (on the {where})"
            )
        else:
            self.log.info(
                f"reported epoch {action.epoch}, checkpoint steps [{listed}] (on the {where})"
            )

    def _open(self, action: Open) -> None:
        cfg = self.cfg
        step = action.resume_step
        roots = [r for r in (cfg.local_dir, cfg.persistent_dir) if r is not None]
        layout = cfg.layout
        try:
            if step is not None and not any(step in layout.steps(r) for r in roots):
                self.log.warning(
                    f"resume step {step} is not complete in this pod's tiers "
                    f"({', '.join(map(str, roots)) or 'none configured'}); opening anyway"
                )
            retired = sorted(
                {s for r in roots for s in layout.prepare_resume(r, step, action.epoch)},
                reverse=True,
            )
            clear_progress(cfg.state_dir)  # an epoch's progress records are its trainers' own
            clear_stop(cfg.state_dir)  # and a planned stop is one epoch's
            write_resume(ResumeInfo(action.epoch, step, cfg.gang, action.env), cfg.state_dir)
        except (OSError, ValueError) as e:
            raise _ActionFailed(f"cannot prepare the resume of epoch {action.epoch}: {e}") from e
        self.logic.opened_barrier(action.epoch, action.slot)
        self.running = (action.epoch, time.monotonic())
        where = "from scratch" if step is None else f"from step {step}"
        if action.slot is not None:
            where += f", as slot {action.slot}"
        self._open_reason = f"open: epoch {action.epoch}, resume {where}"
        self.barrier.set(True, self._open_reason)
        done = "retired" if layout.kind is Layout.JOBSET_INPLACE else "set aside"
        also = f"; {done} newer steps [{','.join(map(str, retired))}]" if retired else ""
        self.log.info(
            f"barrier of epoch {action.epoch} open: trainer may start, resume {where} "
            f"({Path(cfg.state_dir, 'resume.json')}){also}"
        )

    def running_slot(self) -> str | None:
        """Hot spares: the slot this pod's trainer runs as (a member's name), or None."""
        logic, position = self.logic, self.cfg.position
        if position is None or not logic.opened or logic.slot is None:
            return None
        return position.name(logic.slot)

    def _restart(self, action: Restart) -> None:
        try:
            clear_resume(self.cfg.state_dir)  # process scope: the launchers' stop signal
        except OSError as e:
            self.log.warning(f"cannot remove resume.json: {e}")
        self.running = None
        self.barrier.set(False, f"restarting: epoch {action.old_epoch} -> {action.new_epoch}")
        if self.cfg.process_scope and self._stop_trainers(action):
            # as a new agent would: report the new epoch and wait
            self.logic = AgentLogic(self.cfg.position)
            self._open_reason = ""
            return
        self.log.info(
            f"gang moved from epoch {action.old_epoch} to {action.new_epoch} while this pod's "
            f"trainer ran: exiting with {self.cfg.restart_exit_code} to restart all containers"
        )
        raise _RestartRequested(self.cfg.restart_exit_code)

    def _stop_trainers(self, action: Restart) -> bool:
        """Process scope: wait until no launcher runs a trainer (resume.json is gone, which
        stops them); False if they do not confirm in time (then the pod restarts)."""
        began = time.monotonic()
        deadline = began + self.cfg.stop_grace + STOP_SLACK_S
        while True:
            states = launcher_states(self.cfg)
            if trainers_stopped(states):
                self.log.info(
                    f"gang moved from epoch {action.old_epoch} to {action.new_epoch}: trainers "
                    f"stopped in {time.monotonic() - began:.3f} s, joining epoch "
                    f"{action.new_epoch} in place"
                )
                return True
            if time.monotonic() > deadline:
                running = sorted(n for n, st in states.items() if st and st[0] == "running")
                self.log.warning(
                    f"the launchers of {', '.join(running)} did not stop their trainers within "
                    f"{self.cfg.stop_grace + STOP_SLACK_S:g} s: restarting the whole pod"
                )
                return False
            time.sleep(launcher.POLL_SECONDS)

    def _waiting(self, reason: str, *, log: bool = False) -> None:
        """Set the probe's answer; with `log`, log `reason` if it is a new decision."""
        if self.logic.opened and not reason.startswith("open"):
            reason = f"open: epoch {self.logic.epoch} (now: {reason})"
        if log and reason != self._logged_wait:
            self._logged_wait = reason
            if not self.logic.opened:  # opening was logged already
                self.log.info(reason)
        self.barrier.set(self.logic.opened, reason)


def launcher_states(cfg: Config) -> dict[str, LauncherState]:
    return {c: launcher.read_state(launcher.state_file(cfg.state_dir, c)) for c in cfg.launched}


class TrainerMonitor:
    """Reports on the pod what the kubelet cannot see of the running epoch's trainers, once per
    epoch each: a trainer process that exited non-zero (process scope: its launcher keeps the
    container up; ``exited-in-epoch``) and a hung trainer (hang detection on: `HangWatch`;
    ``hung-in-epoch``); and, once per window, the busy time per step that straggler detection
    compares (`BusyWindows`; ``busy-ms-per-step``). A daemon thread with its own API
    connection, polling the launchers' state files and the progress records. If a report (not
    the advisory busy windows) keeps failing for
    ``EXIT_REPORT_DEADLINE_S``, it ends the process with the restart exit code: the pod
    restarts (RestartAllContainers) and the kubelet's signals reach the controller."""

    def __init__(
        self,
        agent: Agent,
        kube: KubeApi,
        *,
        exit_process: Callable[[int], None] = os._exit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.agent, self.kube = agent, kube
        self.channel = agent.reporter.channel_for()
        self.exit_process, self.clock = exit_process, clock
        cfg = agent.cfg
        self.hang = HangWatch(cfg.hang) if cfg.hang.enabled else None
        self.busy = BusyWindows(cfg.busy_window, cfg.busy_windows) if cfg.busy_window else None
        self.busy_pending: tuple[int, tuple[int, ...]] | None = None  # (epoch, history) to write
        self.watched: int | None = None  # the epoch whose progress is being watched
        self.next_read = 0.0
        self.reported: dict[str, int] = {}  # what (exited, hung, ...) -> its last epoch
        self.stop_written: tuple[int, int] | None = None  # the planned stop passed on
        self.noted: tuple[int, float] = (-1, 0.0)  # the epoch noted to the leader, next note at
        self.failing_since: float | None = None
        self.thread = threading.Thread(target=self._run, name="trainer-monitor", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        retries = Retries(ACTION_RETRY, jitter=True)
        while True:
            time.sleep(launcher.POLL_SECONDS if self.agent.cfg.process_scope else 0.2)
            if not self.attempt():
                time.sleep(retries.failed())
            else:
                retries.succeeded()

    def attempt(self) -> bool:
        """One look, and the fallback; False if a report failed."""
        try:
            self.check()
        except _RETRY_ERRORS as e:
            now = self.clock()
            if self.failing_since is None:
                self.failing_since = now
            if now - self.failing_since < EXIT_REPORT_DEADLINE_S:
                self.agent.log.warning(f"cannot report on the trainer: {_describe(e)}")
                return False
            code = self.agent.cfg.restart_exit_code
            self.agent.log.error(
                f"cannot report on the trainer for {EXIT_REPORT_DEADLINE_S:g} s "
                f"({_describe(e)}): exiting with {code} to restart the whole pod"
            )
            self.exit_process(code)
            return False
        self.failing_since = None
        return True

    def check(self) -> bool:
        """One look; True if it reported something."""
        running = self.agent.running
        if running is None:
            return False
        epoch, opened_at = running
        cfg = self.agent.cfg
        states = launcher_states(cfg) if cfg.process_scope else {}
        failed = failed_exit(states, epoch)
        if failed is not None:
            container, code = failed
            what = f"trainer {container} exited {code}"
            return self._report(AgentReport(exited_in_epoch=epoch), "exited", epoch, what)
        planned = self.agent.planned
        if planned is not None and planned[0] == epoch and self._planned_stop(epoch, planned[1]):
            return True
        self._note_progress(epoch)
        return self._watch_progress(epoch, opened_at, states)

    def _note_progress(self, epoch: int) -> None:
        """Tell the leader how far the trainers are in the running epoch, over the channel
        only (``names.REPORT_PROGRESS_NOTE``): first once their pace is known, then each time
        the note's reach has about doubled, at most every ``PROGRESS_NOTE_S`` (so the newest
        note spans at least half of the training so far, up to that bound: the pace the
        account takes from it). Advisory: a note not taken waits for the next one; without a
        channel none is sent (no API write)."""
        endpoint, now = self.agent.reporter.endpoint, self.clock()
        if self.noted[0] != epoch:
            self.noted = (epoch, now)
        if self.channel is None or endpoint is None or now < self.noted[1]:
            return
        span = span_of(read_progress(self.agent.cfg.state_dir))
        if span is None or span.last_step <= span.first_step:  # no pace yet: look again
            self.noted = (epoch, now + PROGRESS_NOTE_MIN_S)
            return
        reach = span.last_at - span.first_at
        self.noted = (epoch, now + min(names.PROGRESS_NOTE_S, max(PROGRESS_NOTE_MIN_S, reach)))
        try:
            self.channel.send(endpoint, ProgressNote(epoch, span))
        except ChannelError as e:
            self.agent.log.repeat("note", "WARN", f"progress note not taken: {e}")
            return
        self.agent.log.clear("note")

    def _watch_progress(
        self, epoch: int, opened_at: float, states: dict[str, LauncherState]
    ) -> bool:
        """Hang and straggler detection's look at the progress records (every
        ``PROGRESS_READ_SECONDS``)."""
        cfg = self.agent.cfg
        now = self.clock()
        if (self.hang is None and self.busy is None) or now < self.next_read:
            return False
        self.next_read = now + PROGRESS_READ_SECONDS
        if self.watched != epoch:
            self.watched = epoch
            if self.hang is not None:
                self.hang.opened(epoch, opened_at)
            if self.busy is not None:
                self.busy.opened()
        if cfg.process_scope and trainers_stopped(states):
            return False  # no trainer runs (it finished, or is being stopped): none can hang
        records = read_progress(cfg.state_dir)
        if self.hang is not None:
            hung = self.hang.observe(now, records)
            addition = AgentReport(hung_in_epoch=epoch)
            if hung is not None and self._report(addition, "hung", epoch, hung.reason):
                return True
        if self.busy is not None:
            history = self.busy.observe(now, records)
            if history is not None:
                self.busy_pending = (epoch, history)
            self._publish_busy()
        return False

    def _publish_busy(self) -> None:
        """Write the busy windows on the pod; a failure is retried at the next read (the
        straggler signal is advisory: it never restarts the pod)."""
        if self.busy_pending is None:
            return
        epoch, history = self.busy_pending
        running = self.agent.running
        if running is None or running[0] != epoch:
            self.busy_pending = None  # the epoch is over: its report removed the annotation
            return
        cfg = self.agent.cfg
        value = encode_busy(history)
        newest = self._newest_step()
        annotations = {
            names.REPORT_BUSY: value,
            names.REPORT_NEWEST_STEP: newest,
            names.REPORT_BUSY_EPOCH: str(epoch),
        }
        patch = {"metadata": {"annotations": annotations}}
        try:
            self.kube.merge_patch(f"/api/v1/namespaces/{cfg.namespace}/pods/{cfg.pod_name}", patch)
        except _RETRY_ERRORS as e:
            self.agent.log.warning(f"cannot publish busy time per step: {_describe(e)}")
            return
        self.busy_pending = None
        self.agent.log.info(
            f"busy ms per step, newest window first: {value}; newest checkpoint: {newest}"
        )

    def _newest_step(self) -> str | None:
        """The newest complete checkpoint step a replacement of this pod could load: its
        persistent tier's, or its local tier's without one (None: none, or unreadable: the
        controller then does not wait for a checkpoint to replace a straggler)."""
        cfg = self.agent.cfg
        root = cfg.persistent_dir or cfg.local_dir
        try:
            steps = cfg.layout.steps(root) if root is not None else set()
        except (OSError, ValueError):
            return None
        return str(max(steps)) if steps else None

    def _planned_stop(self, epoch: int, step: int | None) -> bool:
        """A planned stop of this epoch: tell how far the trainers are (once), then pass the
        step the controller chose on to them (``stop.json``) and say when all of them parked
        at it. True if it reported something."""
        cfg = self.agent.cfg
        records = read_progress(cfg.state_dir)
        if step is None:
            span = span_of(records)
            now = "no progress records" if span is None else encode_span(span)
            return self._report(
                AgentReport(progress_now=(epoch, span)),
                "progress-now",
                epoch,
                f"planned stop asked; trainers at [{now}]",
            )
        if self.stop_written != (epoch, step):
            write_stop(StopAt(epoch, step), cfg.state_dir)
            self.stop_written = (epoch, step)
            self.agent.log.info(f"planned stop: trainers stop at step {step} of epoch {epoch}")
        if records and all(r.parked for r in records.values()):
            return self._report(
                AgentReport(parked_in_epoch=epoch),
                "parked",
                epoch,
                f"trainers parked at step {max(r.step for r in records.values())}",
            )
        return False

    def _report(self, addition: AgentReport, kind: str, epoch: int, what: str) -> bool:
        """Add ``addition`` to the epoch's report, once per ``kind`` and epoch."""
        if self.reported.get(kind) == epoch:
            return False
        reporter = self.agent.reporter
        where = reporter.report(addition, fresh=False, channel=self.channel, kube=self.kube)
        self.reported[kind] = epoch
        self.agent.log.info(f"{what} in epoch {epoch}: reported (on the {where})")
        return True


class _RestartRequested(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"restart with exit code {code}")
        self.code = code


def _resource_version(obj: Any) -> str | None:
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            rv = meta.get("resourceVersion")
            if isinstance(rv, str) and rv:
                return rv
    return None


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiError):
        hint = ""
        if e.status in (401, 403):
            hint = " (check the agent's ServiceAccount token and RBAC)"
        return f"API error {e}{hint}"
    if isinstance(e, _ActionFailed | _WatchEnded):
        return str(e)
    return f"{type(e).__name__}: {e}"
