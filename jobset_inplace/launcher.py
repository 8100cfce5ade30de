"""The trainer launcher of the process restart scope: the entrypoint of every main container.

With ``jobset-inplace.dev/restart-scope: process`` (the default) a recovery restarts the
trainer *process*, not the pod: no container is torn down, no probe period and no container
start sit on the critical path. The transform makes each main container run
``python3 $JSI_STATE_DIR/launcher.py -- <its command>``; the agent copies this file there when
it starts (the trainer image needs only a ``python3``, 3.8 or newer). The launcher runs the
command as a child process, in its own process group, only while the barrier is open for an
epoch it has not run yet, and the agent and the launcher speak through two files in the
shared state directory:

* ``resume.json`` (written by the agent when the barrier of an epoch opens, removed when the gang
  leaves that epoch): present with a new epoch -> start the command; gone or another epoch while
  the command runs -> stop it: SIGTERM to its process group and to every descendant, SIGKILL to
  whatever is left after the stop grace, until none is left.
* ``launcher-<container>.json`` (written by the launcher): ``{"state", "epoch", "code"}`` with
  state ``waiting`` (no child), ``running`` (written before the child starts), ``stopped``
  (stopped for a new epoch) or ``exited`` (the child ended on its own, with ``code``). The agent
  reports a non-zero ``exited`` to the controller (the failure signal) and reports a new epoch
  only once no launcher is ``running``: no trainer of an old epoch runs while the gang agrees
  where to resume.

"Every descendant" includes processes in sessions of their own (``torchrun`` starts each worker
with ``start_new_session=True``) and orphans of the tree (a worker whose parent died, a
daemonized helper): the launcher is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so orphans
are re-parented to it instead of the container's init and stay in its tree (``/proc``'s parent
links). ``stopped`` and ``exited`` are written only once none is left.

A child that exits 0 ends the launcher with 0 (the container completes). If the launcher itself
dies, the container's ``RestartAllContainers`` rule restarts the whole pod, as in the pod scope.

Pre-start (``JSI_PRESTART_IMPORTS`` set: ``jobset-inplace.dev/prestart-imports``): while no
epoch runs, the next epoch's command is already started, with the hook of
:mod:`jobset_inplace.prestart` (``$JSI_STATE_DIR/prestart/sitecustomize.py``) first on its
``PYTHONPATH``: its interpreters start and import those modules, then wait on a lock the
launcher holds (``prestart-<container>.json.lock``). When an epoch's barrier opens the launcher
writes its epoch and resume step to ``prestart-<container>.json`` and releases the lock: the
trainer's entry point runs at once. The state file says ``waiting`` while they wait (no
trainer code has run). A pre-started command that exits before its epoch is logged and not
pre-started again until an epoch has run (no loop): that epoch starts it cold.

Standard library only, Python 3.8 compatible, and imports nothing of ``jobset_inplace``: it
runs alone from the state volume on the trainer's interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

ENV_STATE_DIR = "JSI_STATE_DIR"
ENV_CHECKPOINT_LOCAL_DIR = "JSI_CHECKPOINT_LOCAL_DIR"  # the trainer's checkpoint tiers' roots
ENV_CHECKPOINT_PERSISTENT_DIR = "JSI_CHECKPOINT_PERSISTENT_DIR"
DEFAULT_STATE_DIR = "/var/run/jobset-inplace"
RESUME_FILE = "resume.json"
# Hot spares (docs/design/hot-spares.md, section 5): with ENV_LEASE set, a trainer runs only
# while the agent's lease holds: LEASE_FILE says until when ({"until": CLOCK_MONOTONIC seconds},
# or null: no bound, the leader serves no channel); past it the trainer is frozen (SIGSTOP to
# its whole tree) until the lease is renewed. If its epoch ends meanwhile it is killed, never
# resumed, unless a leader's answer renews the lease within THAW_WAIT_S (the agent renews it
# only when the leader says this pod still holds the slot its trainer runs as; an unbounded
# lease, written where no channel is served, says nothing of the slot): then it is thawed and
# stopped as any other, so it can keep its step (a leader that died froze its gangs' holders).
LEASE_FILE = "lease.json"
THAW_WAIT_S = 2.0  # two of the agent's heartbeats (names.HEARTBEAT_S)
ENV_LEASE = "JSI_LEASE_REQUIRED"
STOP_FILE = "stop.json"  # a planned stop (jobset_inplace.trainer.stop)
LAUNCHER_FILE = "launcher.py"  # where the agent installs this file in the state directory
ENV_CONTAINER = "JSI_CONTAINER_NAME"  # the container's name: its state file's name
ENV_STOP_GRACE = "JSI_STOP_GRACE_SECONDS"
# Set for the child: the epoch it runs in and the step to resume from ("" for scratch).
ENV_EPOCH = "JSI_EPOCH"
ENV_RESUME_STEP = "JSI_RESUME_STEP"
DEFAULT_STOP_GRACE = 1.0
POLL_SECONDS = 0.02
TREE_POLL_SECONDS = 0.02  # how often a stop looks for descendants still there (a /proc scan)
KILL_WAIT_SECONDS = 5.0  # how long SIGKILL is repeated before a survivor is logged
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
# Pre-start: the names of jobset_inplace.prestart (the launcher runs alone; a unit test checks
# that the two agree).
ENV_PRESTART_IMPORTS = "JSI_PRESTART_IMPORTS"
ENV_PRESTART_GO = "JSI_PRESTART_GO"
ENV_PRESTART_WARM = "JSI_PRESTART_WARM"  # "1": the trainer's standby.wait holds it (prestart-warm)
PRESTART_HOOK_DIR = "prestart"
PRESTART_HOOK_FILE = "sitecustomize.py"  # in PRESTART_HOOK_DIR: the hook, by Python's name
PRESTART_FORKER_SUFFIX = ".sock"  # the word's path + this: a held torchrun's worker forker
# The next epoch's command is pre-started this long after the running one started: its imports
# must not compete with the running epoch's own start-up (the recovery's critical path).
PRESTART_AFTER_S = 15.0
ENV_PRESTART_AFTER = "JSI_PRESTART_AFTER_SECONDS"  # (overrides it: 0..3600)

WAITING, RUNNING, STOPPED, EXITED = "waiting", "running", "stopped", "exited"
STATES = (WAITING, RUNNING, STOPPED, EXITED)
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # as a shell reports a command it cannot run


def state_file(state_dir: Path | str, container: str) -> Path:
    return Path(state_dir) / f"launcher-{container}.json"


def read_state(path: Path) -> tuple[str, int | None, int | None] | None:
    """(state, epoch, code) of a launcher state file; None if absent or unreadable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("state") not in STATES:
        return None
    epoch, code = doc.get("epoch"), doc.get("code")
    return (
        doc["state"],
        epoch if isinstance(epoch, int) else None,
        code if isinstance(code, int) else None,
    )


def resume_epoch(state_dir: Path) -> tuple[int, int | None, dict[str, str]] | None:
    """(epoch, resume step, the epoch's environment for the command) of ``resume.json``; None
    while there is none (or it is unreadable: the agent writes it atomically, so that is never
    a state to act on). The environment (``env``: a hot spare's slot, docs/trainer-contract.md)
    is kept only as strings."""
    try:
        doc = json.loads((state_dir / RESUME_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    epoch = doc.get("epoch") if isinstance(doc, dict) else None
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    step = doc.get("resumeStep")
    env = doc.get("env")
    env = env if isinstance(env, dict) else {}
    return (
        epoch,
        step if isinstance(step, int) and not isinstance(step, bool) else None,
        {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)},
    )


def _lease_until(state_dir: Path) -> object:
    """The lease file's ``until`` as written (None: no bound); 0 where there is no lease (no
    file, or one that cannot be read)."""
    try:
        doc = json.loads((state_dir / LEASE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return doc.get("until", 0) if isinstance(doc, dict) else 0


def _bounded_after(until: object, now: float) -> bool:
    return isinstance(until, (int, float)) and not isinstance(until, bool) and now < until


def lease_holds(state_dir: Path, now: float) -> bool:
    """Whether the agent's lease (LEASE_FILE) holds at ``now`` (CLOCK_MONOTONIC): no file, or
    one that cannot be read, is no lease."""
    until = _lease_until(state_dir)
    return until is None or _bounded_after(until, now)


def lease_renewed(state_dir: Path, now: float) -> bool:
    """Whether a leader's answer renewed the lease past ``now``: a bounded lease only (an
    unbounded one says no leader serves a channel, which proves nothing of the slot)."""
    return _bounded_after(_lease_until(state_dir), now)


def write_lease(state_dir: Path, until: float | None) -> None:
    """The agent's side: its lease ends at ``until`` (CLOCK_MONOTONIC; None: no bound)."""
    path = state_dir / LEASE_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"until": until}) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _log(message: str) -> None:
    t = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
    sys.stderr.write(f"{stamp} jobset-inplace launcher: {message}\n")
    sys.stderr.flush()


def become_subreaper() -> bool:
    """Have orphans of the launcher's descendants re-parented to it (Linux 3.4+)."""
    try:
        import ctypes  # noqa: PLC0415  (only here: the launcher starts on the trainer's interpreter)

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int, proc: Path = Path("/proc"), spare: int | None = None) -> list[int]:
    """Live (not zombie) descendants of ``root``, from each process's parent in ``/proc``,
    without ``spare`` and its own descendants (the pre-started command, which a stop of the
    running epoch leaves alone)."""
    children: dict[int, list[int]] = {}
    with os.scandir(proc) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat"), encoding="utf-8") as f:
                    stat = f.read()
            except OSError:  # gone meanwhile
                continue
            fields = stat.rpartition(")")[2].split()  # the name before it may hold anything
            if len(fields) > 1 and fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid != spare:
                found.append(pid)
                todo.append(pid)
    return found


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Launcher:
    def __init__(
        self,
        argv: list[str],
        state_dir: Path,
        container: str,
        grace: float,
        *,
        prestart: bool = False,
        prestart_after: float = PRESTART_AFTER_S,
        lease: bool = False,
    ) -> None:
        self.argv, self.state_dir, self.grace = argv, state_dir, grace
        self.path = state_file(state_dir, container)
        self.child: int | None = None  # pid (and process group) of the running command
        self.code: int | None = None  # its exit code once reaped
        self.terminating = False
        self.prestart = prestart  # pre-start wanted (off after a failed one, until an epoch)
        # The word to a pre-started command: a file and its lock per pre-start, so that
        # releasing one never races with holding the next (flock is not fair).
        self.words = state_dir / f"prestart-{container}"
        self.generation = 0
        self.word: Path | None = None  # the standby's
        self.child_word: Path | None = None  # the running command's, once released
        self.standby: int | None = None  # the next epoch's command, pre-started and held
        self.standby_code: int | None = None  # its exit code, if it ended before its epoch
        self.hold: int | None = None  # the lock's fd while it waits
        self.started_at = 0.0  # when the running command started (monotonic)
        self.prestart_after = prestart_after
        self.lease = lease  # run a trainer only while the agent's lease holds (hot spares)
        self.frozen_at: float | None = None  # when the lease ended under the running command

    def write(self, state: str, epoch: int | None, code: int | None = None) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"state": state, "epoch": epoch, "code": code}) + "\n")
        os.replace(tmp, self.path)

    def reap(self) -> None:
        """Collect every exited child (as PID 1 the launcher inherits orphans too)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.code = _exit_code(status)
            elif pid == self.standby:
                self.standby_code = _exit_code(status)

    def spawn(self, env: dict[str, str]) -> int | OSError:
        try:
            return os.posix_spawnp(self.argv[0], self.argv, env, setsid=True)
        except OSError as e:
            return e

    def start(self, epoch: int, step: int | None, epoch_env: dict[str, str]) -> bool:
        env = {**os.environ, **epoch_env}
        env[ENV_EPOCH], env[ENV_RESUME_STEP] = str(epoch), "" if step is None else str(step)
        self.code = None
        spawned = self.spawn(env)
        if isinstance(spawned, OSError):
            _log(f"epoch {epoch}: cannot start {self.argv[0]!r}: {spawned}")
            self.child, self.code = None, EXIT_NOT_FOUND
            return False
        self.child, self.child_word = spawned, None
        _log(f"epoch {epoch}: started {' '.join(self.argv)} (pid {self.child}, resume step {step})")
        return True

    # --- pre-start -------------------------------------------------------------------------
    def prestart_next(self) -> None:
        """Start the next epoch's command now (the running one, if any, goes on), held by the
        pre-start hook until :meth:`go`."""
        import fcntl  # noqa: PLC0415  (Linux only; the launcher may run elsewhere in tests)

        self.generation += 1
        word = Path(f"{self.words}-{self.generation}.json")
        fd = os.open(f"{word}.lock", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: no one else has it
        hook = self.state_dir / PRESTART_HOOK_DIR
        env = dict(os.environ)
        env[ENV_EPOCH] = env[ENV_RESUME_STEP] = ""
        env[ENV_PRESTART_GO] = str(word)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH")) if p)
        spawned = self.spawn(env)
        if isinstance(spawned, OSError):
            os.close(fd)
            self.forget_word(word)
            _log(f"cannot pre-start {self.argv[0]!r}: {spawned}")
            self.prestart = False  # the epoch will say it again, cold
            return
        self.standby, self.standby_code, self.hold, self.word = spawned, None, fd, word
        _log(f"pre-started {' '.join(self.argv)} (pid {spawned}): held for the next epoch")

    @staticmethod
    def forget_word(word: Path | None) -> None:
        if word is not None:
            for path in (word, Path(f"{word}.lock"), Path(f"{word}{PRESTART_FORKER_SUFFIX}")):
                path.unlink(missing_ok=True)

    def go(self, epoch: int, step: int | None, epoch_env: dict[str, str]) -> None:
        """The word to the pre-started command: its epoch, resume step and environment, then
        the lock; it becomes the running one."""
        assert self.word is not None
        assert self.hold is not None
        tmp = self.word.with_name(f".{self.word.name}.tmp")
        word = {"epoch": epoch, "resumeStep": step, "env": epoch_env}
        tmp.write_text(json.dumps(word) + "\n")
        os.replace(tmp, self.word)
        os.close(self.hold)  # releases the lock: every waiting process goes
        self.child, self.code, self.child_word = self.standby, None, self.word
        self.standby, self.hold, self.word = None, None, None
        _log(f"epoch {epoch}: released pre-started pid {self.child} (resume step {step})")

    def standby_lost(self) -> None:
        """The pre-started command ended before its epoch: clean up after it; no other is
        pre-started until an epoch has started (no loop)."""
        assert self.standby is not None
        with contextlib.suppress(ProcessLookupError):  # held before its own code: no other
            os.killpg(self.standby, signal.SIGKILL)  # session, at most its group
        _log(
            f"the pre-started command exited {self.standby_code} before its epoch: the next "
            "epoch starts it cold (its log above says why)"
        )
        if self.hold is not None:
            os.close(self.hold)
        self.forget_word(self.word)
        self.standby, self.hold, self.word, self.prestart = None, None, None, False

    def end_standby(self) -> None:
        """Stop the pre-started command (the launcher is terminating)."""
        if self.standby is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.standby, signal.SIGKILL)
        for pid in descendants(self.standby):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        while self.standby_code is None:
            self.reap()
            time.sleep(0.005)
        self.forget_word(self.word)
        self.standby, self.word = None, None

    def look_after_standby(self) -> None:
        """Pre-start if wanted, none waits and the running command (if any) started
        PRESTART_AFTER_S ago; clean up after one that ended."""
        self.reap()
        if self.standby is not None and self.standby_code is not None:
            self.standby_lost()
        settled = self.child is None or time.monotonic() - self.started_at >= self.prestart_after
        if self.prestart and self.standby is None and settled and not self.terminating:
            self.prestart_next()

    # --- the running command ---------------------------------------------------------------
    def signal_group(self, signum: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child, signum)

    def signal_tree(self, signum: int) -> list[int]:
        """``signum`` to the child's group and to every descendant but the pre-started
        command's; the descendants found."""
        self.signal_group(signum)
        pids = descendants(os.getpid(), spare=self.standby)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return pids

    def wait_tree(self, timeout: float) -> bool:
        """Reap until the child and every descendant are gone or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        if not self.wait_child(timeout):
            return False
        while True:
            self.reap()
            if not descendants(os.getpid(), spare=self.standby):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(TREE_POLL_SECONDS)

    def kill_tree(self) -> None:
        """SIGKILL until no descendant is left (one in uninterruptible sleep may take a while:
        logged after KILL_WAIT_SECONDS, and waited for)."""
        logged = False
        began = time.monotonic()
        while self.signal_tree(signal.SIGKILL) or (self.code is None and self.child is not None):
            self.reap()
            if not logged and time.monotonic() - began > KILL_WAIT_SECONDS:
                survivors = descendants(os.getpid(), spare=self.standby)
                _log(f"processes survive SIGKILL: {survivors}")
                logged = True
            time.sleep(0.005)
        self.reap()

    def wait_child(self, timeout: float | None) -> bool:
        """Reap until the child has exited or `timeout` passed; whether it exited."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.reap()
            if self.code is not None:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def stop(self) -> None:
        """SIGTERM to the child's group and every descendant, SIGKILL to what is left after
        the grace, until nothing is. A frozen command is killed, never to run again, unless
        the lease is renewed within THAW_WAIT_S (then it is thawed and stopped as any other)."""
        began = time.monotonic()
        if self.frozen_at is not None and not self.thawed_by_renewal():
            self.kill_tree()
            self.frozen_at = None
            _log(f"stopped frozen (exit {self.code}) in {time.monotonic() - began:.3f} s")
            return
        self.signal_tree(signal.SIGTERM)
        if not self.wait_tree(self.grace):
            left = descendants(os.getpid(), spare=self.standby)
            _log(f"still running {self.grace:g} s after SIGTERM (the stop grace): SIGKILL {left}")
            self.kill_tree()
        _log(f"stopped (exit {self.code}) in {time.monotonic() - began:.3f} s")

    def thawed_by_renewal(self) -> bool:
        """Frozen, its epoch ended: wait up to THAW_WAIT_S for the lease to be renewed, which
        proves the leader still counts this pod as the slot's holder; thaw it then, so that its
        stop can be graceful. False when the lease stayed ended."""
        deadline = time.monotonic() + THAW_WAIT_S
        while True:
            now = time.monotonic()
            if lease_renewed(self.state_dir, now):
                assert self.frozen_at is not None
                _log(f"lease renewed after {now - self.frozen_at:.3f} s frozen: thawing to stop")
                self.signal_tree(signal.SIGCONT)
                self.frozen_at = None
                return True
            if now >= deadline:
                return False
            time.sleep(POLL_SECONDS)

    def run(self) -> int:
        ran: int | None = None  # the last epoch the command was started in
        declined: int | None = None  # the last epoch said not to be run (logged once)
        waiting_lease: int | None = None  # the last epoch said to wait for a lease (logged once)
        wanted = self.prestart
        for stale in self.state_dir.glob(f"{self.words.name}-*"):  # a launcher before this one
            stale.unlink(missing_ok=True)
        self.write(WAITING, None)
        while not self.terminating:
            self.look_after_standby()
            resume = resume_epoch(self.state_dir)
            if resume is None or (ran is not None and resume[0] <= ran):
                if resume is not None and resume[0] != declined:
                    declined = resume[0]
                    _log(f"epoch {declined}: not run (the command already ran in epoch {ran})")
                time.sleep(POLL_SECONDS)
                continue
            epoch = resume[0]
            if self.lease and not lease_holds(self.state_dir, time.monotonic()):
                if waiting_lease != epoch:
                    waiting_lease = epoch
                    _log(f"epoch {epoch}: waiting for the agent's lease to start it")
                time.sleep(POLL_SECONDS)
                continue
            # Say "running" before starting, then look again: an agent that withdrew the epoch
            # in between either sees "running" and waits, or the second look sees it gone.
            self.write(RUNNING, epoch)
            if resume_epoch(self.state_dir) != resume:
                self.write(WAITING, ran)
                continue
            ran = epoch
            self.reap()
            if self.standby is not None and self.standby_code is not None:
                self.standby_lost()
            if self.standby is not None:
                self.go(epoch, resume[1], resume[2])
            elif not self.start(epoch, resume[1], resume[2]):
                self.write(EXITED, epoch, self.code)
                continue
            self.started_at = time.monotonic()
            self.prestart = wanted  # a failed pre-start is tried again once an epoch started
            outcome = self.supervise(epoch)
            if outcome is not None:
                self.end_standby()
                return outcome
        self.end_standby()
        return 128 + signal.SIGTERM

    def supervise(self, epoch: int) -> int | None:
        """Until the child ends or the epoch is withdrawn; an exit code ends the launcher.
        Meanwhile the next epoch's command is pre-started (pre-start wanted)."""
        while True:
            self.look_after_standby()
            if self.code is not None:
                self.kill_tree()  # what it left behind (its group, other sessions, orphans)
                code = self.code
                _log(f"epoch {epoch}: exited {code}")
                self.write(EXITED, epoch, code)
                self.child = None
                self.forget_word(self.child_word)
                return 0 if code == 0 else None
            if self.terminating:
                if self.frozen_at is None:
                    self.signal_tree(signal.SIGTERM)
                    self.wait_child(None)
                self.kill_tree()
                return self.code
            resume = resume_epoch(self.state_dir)
            if resume is None or resume[0] != epoch:
                _log(f"epoch {epoch}: the gang moved on: stopping pid {self.child}")
                self.stop()
                self.write(STOPPED, epoch, self.code)
                self.child = None
                self.forget_word(self.child_word)
                return None
            if self.lease:
                self.keep_lease(epoch)
            time.sleep(POLL_SECONDS)

    def keep_lease(self, epoch: int) -> None:
        """Freeze the running command when the agent's lease ends (again each poll while it
        stays ended: what it forks meanwhile is frozen too); thaw it when renewed."""
        now = time.monotonic()
        if not lease_holds(self.state_dir, now):
            if self.frozen_at is None:
                self.frozen_at = now
                _log(f"epoch {epoch}: the agent's lease ended: freezing pid {self.child}")
            self.signal_tree(signal.SIGSTOP)
        elif self.frozen_at is not None:
            # said before the signal, as the freeze is: whoever sees the tree run sees the line
            _log(f"epoch {epoch}: lease renewed: resuming after {now - self.frozen_at:.3f} s")
            self.signal_tree(signal.SIGCONT)
            self.frozen_at = None


def _seconds(name: str, default: float) -> float | None:
    """Environment variable ``name`` as 0..3600 seconds (``default`` when unset; None when
    malformed)."""
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        return None
    return value if 0 <= value <= 3600 else None


def main(args: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        _log("usage: launcher.py -- COMMAND [ARG...]")
        return EXIT_USAGE
    state_dir = Path(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR)
    container = os.environ.get(ENV_CONTAINER, "")
    grace = _seconds(ENV_STOP_GRACE, DEFAULT_STOP_GRACE)
    after = _seconds(ENV_PRESTART_AFTER, PRESTART_AFTER_S)
    if not container or "/" in container or grace is None or after is None:
        _log(
            f"{ENV_CONTAINER} must name the container, {ENV_STOP_GRACE} and "
            f"{ENV_PRESTART_AFTER} be 0..3600 seconds"
        )
        return EXIT_USAGE
    prestart = bool(os.environ.get(ENV_PRESTART_IMPORTS, "").strip())
    if prestart and not (state_dir / PRESTART_HOOK_DIR / PRESTART_HOOK_FILE).is_file():
        _log(f"no pre-start hook in {state_dir / PRESTART_HOOK_DIR}: every epoch starts cold")
        prestart = False
    launcher = Launcher(
        argv,
        state_dir,
        container,
        grace,
        prestart=prestart,
        prestart_after=after,
        lease=bool(os.environ.get(ENV_LEASE)),
    )
    if not become_subreaper():
        _log("not a child subreaper: a stop reaches only what stays in the launcher's tree")

    def terminate(signum: int, frame: object) -> None:
        launcher.terminating = True

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
