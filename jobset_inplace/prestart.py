"""The pre-started trainer's hook: a ``sitecustomize`` that does a trainer's fixed start-up
costs before its epoch (process restart scope, with ``jobset-inplace.dev/prestart-imports``).

The launcher (:mod:`jobset_inplace.launcher`) keeps the next epoch's command started and held
(a standby) while the running one trains, with this file's directory first on
``PYTHONPATH``. In every Python process of that command this hook runs before the process's
own code, and:

1. runs the image's own ``sitecustomize``, if it has one (this hook takes its name);
2. imports the modules of ``JSI_PRESTART_IMPORTS`` (``torch,numpy``): the interpreter's start
   and those imports are done before the epoch is;
3. refuses to hold a CUDA context (an import that initialised CUDA would keep a device context
   beside the running epoch's): exits ``EXIT_CUDA`` and the launcher starts the epoch cold;
4. waits for the launcher's word: a shared ``flock`` on ``$JSI_PRESTART_GO.lock``, which the
   launcher holds exclusively until the next epoch's barrier opens; then reads the epoch and
   the step to resume from ``$JSI_PRESTART_GO`` (written before the lock is released) into
   ``JSI_EPOCH`` and ``JSI_RESUME_STEP``, as a cold start gets them, and returns: the
   command's entry point runs.

So ``python3 train.py`` starts training the moment the barrier opens, its imports done. A
``torchrun`` command waits the same way (its rendezvous binds ports the running epoch holds).
Its workers are new processes it starts after the word (``python -u train.py`` each, in a
session of its own), so the held ``torchrun`` also forks a **worker forker** once its imports
are done: a process with those modules imported that serves a Unix socket beside the word. A
worker of the released ``torchrun`` (its direct child, a script or ``-m`` module with no
interpreter option but ``-u``/``-B``/``-q``) does not import anything itself: its hook hands
the forker its arguments, environment, working directory and standard streams, the forker
forks a process that takes them on and runs the worker's entry point, and the worker's own
process stays as its stand-in for ``torchrun``: it passes signals on and exits as the forked
one did (a SIGKILL of the stand-in kills the forked one too). Anything else, a forker that
cannot be reached or one that refuses starts cold; once a request may have reached the forker,
nothing that goes wrong lets the stand-in run the trainer itself (it ends, exit 1). A held
process whose hook fails exits (``EXIT_HOOK_FAILED``) rather than run before its word.

**Warm** (``JSI_PRESTART_WARM=1``: ``jobset-inplace.dev/prestart-warm``, never for a
launcher such as ``torchrun``): step 4 is the script's. After its imports the hook returns at
once, and the script builds its model and loads the newest checkpoint before its word, in
:func:`jobset_inplace.trainer.standby.wait`, which waits on the same word and lets the script
go with the epoch's step (docs/design/warm-standby.md). Until the word the hook withholds the
variables a process group needs (``WITHHELD``: an ``env://`` ``init_process_group`` fails
rather than reach the running epoch's store) and makes CUDA's start,
``torch.distributed.init_process_group`` and a backward pass raise wherever torch's modules
hold them (a device context or a process group must not exist beside the running epoch's, and
nothing trains before its epoch: ``GUARDS``); :func:`release` gives the variables back and the
guards call through. Launchers that start the trainer's processes themselves are held as
without warm (``WARM_REFUSED``).

What a pre-import cannot do: a module that reads the epoch, the step, the checkpoint or a
per-worker variable (``RANK``, ``LOCAL_RANK``, ...) *at import time* reads them before they
are known (import it in the script instead); the waiting processes hold their memory (the
forked workers share the forker's pages until written). A forked worker's pid is not the one
``torchrun`` started (that is its stand-in), and ``ps`` shows it with ``torchrun``'s command line.

Standard library only, Python 3.8 compatible, imports nothing of ``jobset_inplace``: it runs
on the trainer's interpreter from the state volume.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import signal
import sys
import time
from typing import TYPE_CHECKING, BinaryIO, NoReturn

if TYPE_CHECKING:
    import socket

ENV_IMPORTS = "JSI_PRESTART_IMPORTS"
ENV_GO = "JSI_PRESTART_GO"  # the word's file; its lock is this path + ".lock"
ENV_EPOCH = "JSI_EPOCH"  # (the launcher's names, for the trainer)
ENV_RESUME_STEP = "JSI_RESUME_STEP"
HOOK_DIR = "prestart"  # under the state directory: this file as sitecustomize.py
# torchrun's console script: a command may start with it (it is a Python script).
PYTHON_SCRIPTS = ("torchrun",)
PYTHON = re.compile(r"python[0-9.]*")
SKIPS_HOOK = "EIS"  # -E and -I ignore PYTHONPATH; -S imports no site, so no sitecustomize
EXIT_CUDA = 86  # an import initialised CUDA: refused (the launcher starts cold)
EXIT_NO_WORD = 87  # the lock was released without a word: the launcher is gone
EXIT_HOOK_FAILED = 88  # the hook failed in a held process (the launcher starts the epoch cold)
# A worker's stand-in that cannot tell how its forked worker ended (the forker may have
# started it: this process must not run the trainer too); torchrun sees a failed worker.
EXIT_STAND_IN_FAILED = 1
# The worker forker of a released torchrun, for its workers: "PID:SOCKET" (PID: torchrun's).
ENV_FORKER = "JSI_PRESTART_FORKER"
FORKER_SUFFIX = ".sock"  # the forker's socket: the word's path + this
LAUNCHES_WORKERS = ("torchrun", "torch.distributed.run")  # script name or module
WORKER_FLAGS = "uBq"  # interpreter options a forked worker can still honour after its start
MAX_REQUEST = 4 << 20  # bytes: a worker's arguments and environment
# How often the forker also looks at getppid(): only a fallback (torchrun's end closes the pipe
# it watches); a forker left running meanwhile is killed with the epoch's tree by the launcher.
PARENT_POLL_SECONDS = 60.0
# what ``ps -e`` (the process's comm) calls the forker and a forked worker's stand-in
FORKER_NAME, STAND_IN_NAME = "jsi-forker", "jsi-stand-in"
HELD = "waiting for an epoch"  # the hook's log line once its imports are done
# Warm: the script's standby.wait holds it (prestart-warm); "1" to have it.
ENV_WARM = "JSI_PRESTART_WARM"
WARM_HELD = "warm: the script holds"  # the hook's log line for a warm standby
# Withheld from a warm standby until its word: what a process group is made from.
WITHHELD = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "JSI_SLOT",
)
# The name the hook is also known by in sys.modules (its own is sitecustomize, which an
# image's may shadow): jobset_inplace.trainer.standby finds it there.
MODULE = "jobset_inplace_prestart_hook"
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what the forker ignores
# what a worker's stand-in passes on to it (torchrun stops workers with SIGTERM, then SIGKILL)
PASSED_ON = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def _log(message: str) -> None:
    t = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
    sys.stderr.write(f"{stamp} jobset-inplace prestart[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


def python_argv(argv: list[str]) -> tuple[str, str, str]:
    """(short flags, kind, name) of an interpreter's arguments (``sys.orig_argv``: the
    interpreter, its options, then ``-m MOD``, ``-c CODE`` or a script; short options may be
    clustered, as in ``-um torch.distributed.run``). kind: "module" (name: the module),
    "script" (name: its path) or "code" (``-c``, stdin)."""
    flags, kind, name, _ = entry_point(argv)
    return flags, kind, name


def entry_point(argv: list[str]) -> tuple[str, str, str, list[str]]:
    """:func:`python_argv`, and the arguments after the entry point (its ``sys.argv[1:]``)."""
    flags = ""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-":
            return (flags, "code", "", argv[i + 1 :])
        if not arg.startswith("-"):
            return (flags, "script", arg, argv[i + 1 :])
        if arg.startswith("--"):  # --check-hash-based-pycs takes a value
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for j, flag in enumerate(arg[1:], start=1):
            rest = arg[j + 1 :]
            if flag == "m" and rest:
                return (flags, "module", rest, argv[i + 1 :])
            if flag == "m":
                return (flags, "module", argv[i + 1] if i + 1 < len(argv) else "", argv[i + 2 :])
            if flag == "c":
                return (flags, "code", "", [])
            if flag in "WX":  # a value: the rest of this argument, or the next one
                i += 0 if rest else 1
                break
            flags += flag
        i += 1
    return (flags, "code", "", [])  # stdin or the interactive prompt


def refusal(command: list[str]) -> str | None:
    """Why ``command`` cannot be pre-started (None: it can). The hook must run before any of
    the command's own code: the command must start Python itself (not a shell, which would run
    its other commands before the barrier), reading ``PYTHONPATH`` and ``site``."""
    name = os.path.basename(command[0]) if command else ""
    if name in PYTHON_SCRIPTS:
        return None
    if not PYTHON.fullmatch(name):
        return (
            f"it starts {name!r}, not Python: the command must be python3 ..., python3 -m ... "
            "or torchrun ... (a shell or another program would run before the barrier)"
        )
    skipped = sorted(set(python_argv(command)[0]) & set(SKIPS_HOOK))
    if skipped:
        return (
            f"python -{''.join(skipped)} ignores PYTHONPATH or site (the pre-start hook would "
            "not run): drop that option"
        )
    return None


def _image_sitecustomize() -> None:
    """The image's own sitecustomize, which this file's name hides, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    check = getattr(cuda, "is_initialized", None)
    return bool(check()) if callable(check) else False


def wait_for_word(go: str) -> tuple[str, str, dict[str, str]] | None:
    """Block until the launcher releases the lock; (epoch, resume step, the epoch's
    environment) from its word (None: released without one)."""
    import fcntl  # noqa: PLC0415  (Linux only, as the launcher)

    with open(go + ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
        try:
            with open(go, encoding="utf-8") as f:
                word = json.load(f)
        except (OSError, ValueError):
            return None
    if not isinstance(word, dict):
        return None
    step = word.get("resumeStep")
    env = word.get("env")
    env = env if isinstance(env, dict) else {}
    return (
        str(word.get("epoch", "")),
        "" if step is None else str(step),
        {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)},
    )


# --- the worker forker: a held torchrun's, for the workers it starts once released ----------


# Launchers that start the trainer's processes themselves (after a rendezvous of their own): a
# warm standby must be the trainer's own process. Console scripts and modules.
WARM_REFUSED = (
    *LAUNCHES_WORKERS,
    "torch.distributed.launch",
    "accelerate",
    "accelerate.commands.launch",
    "accelerate.commands.accelerate_cli",
    "deepspeed",
    "deepspeed.launcher.runner",
)


def warm_refusal(command: list[str]) -> str | None:
    """Why ``command`` (a container's command and args, or an interpreter's ``sys.orig_argv``)
    cannot be a warm standby (None: it can): a launcher that starts the trainer's processes
    after its own rendezvous, or code the hook cannot tell (``-c``, standard input)."""
    if not command:  # sys.orig_argv is Python 3.10's
        return "the interpreter's command line is unknown before Python 3.10: use 3.10 or newer"
    program = os.path.basename(command[0])
    if program in WARM_REFUSED:
        name, kind = program, "script"
    else:
        _, kind, name = python_argv(command)
    if kind == "code":
        return "python -c or standard input: run the trainer as a script or -m module"
    if (os.path.basename(name) if kind == "script" else name) in WARM_REFUSED:
        return (
            f"{name} starts the trainer's processes after its own rendezvous, so none can hold "
            "a model before its epoch: run the trainer as python3 train.py, one a container"
        )
    return None


def launches_workers(argv: list[str]) -> bool:
    """Whether this interpreter's command (``sys.orig_argv``) is ``torchrun``."""
    _, kind, name = python_argv(argv)
    return (kind == "module" and name in LAUNCHES_WORKERS) or (
        kind == "script" and os.path.basename(name) in LAUNCHES_WORKERS
    )


def forkable(argv: list[str]) -> bool:
    """Whether a forked process can run this command as the interpreter would: a script or
    ``-m`` module, no interpreter option but WORKER_FLAGS."""
    flags, kind, _, _ = entry_point(argv)
    return kind in ("script", "module") and set(flags) <= set(WORKER_FLAGS)


def start_forker(path: str) -> str | None:
    """Fork the worker forker (this process, its imports done and none of its own code run):
    it serves ``path`` until this process ends. The socket's path, or None (workers cold)."""
    import socket  # noqa: PLC0415  (only a held torchrun needs it)

    if not hasattr(socket, "send_fds"):  # Python < 3.9
        return None
    if len(path.encode()) > 100:  # sun_path holds 108 bytes
        _log(f"no worker forker: its socket path {path!r} is too long; workers start cold")
        return None
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mask = os.umask(0o077)
        try:
            server.bind(path)
        finally:
            os.umask(mask)
        server.listen(64)
    except OSError as e:
        _log(f"no worker forker ({e}); workers start cold")
        return None
    _flush()
    parent = os.getpid()
    # This process holds the pipe's write end until it ends (not inherited across exec): the
    # forker sees its end at once, not at its next look at getppid().
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid:
        server.close()
        os.close(alive_r)
        _log(f"worker forker (pid {pid}) serves {path}")
        return path
    os.close(alive_w)
    code = 0
    _name(FORKER_NAME)
    try:
        Forker(server, parent, alive_r).serve()
    except BaseException as e:  # the forker must never go on to torchrun's code
        _log(f"worker forker: {type(e).__name__}: {e}")
        code = 1
    _flush()
    os._exit(code)


class Forker:
    """Forks one process per worker request, which becomes that worker; tells the worker's
    stand-in its pid, later its wait status; kills a worker whose stand-in is gone (SIGKILLed).
    Ends, killing its workers, once the process that started it has: ``parent_alive``, the
    read end of a pipe only that process writes to, reads end of file."""

    def __init__(self, server: socket.socket, parent: int, parent_alive: int) -> None:
        import selectors  # noqa: PLC0415

        self.server, self.parent, self.parent_alive = server, parent, parent_alive
        self.parent_ended = False
        self.workers: dict[int, socket.socket] = {}  # pid -> its stand-in's connection
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_w)
        # A stop of the epoch signals torchrun's group, the forker's too: torchrun passes it
        # on to its workers (through their stand-ins), so the forker stays until they are
        # gone and torchrun has ended (then its loop ends), or is killed with the epoch's tree.
        for stop in STOPS:
            signal.signal(stop, signal.SIG_IGN)
        self.selector.register(server, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.selector.register(parent_alive, selectors.EVENT_READ, None)

    def serve(self) -> None:
        # getppid() too: a child torchrun forked without exec may hold the pipe open
        while not self.parent_ended and os.getppid() == self.parent:
            for key, _ in self.selector.select(timeout=PARENT_POLL_SECONDS):
                if key.fileobj is self.server:
                    self._accept()
                elif key.fileobj == self.parent_alive:
                    self.parent_ended = os.read(self.parent_alive, 1) == b""
                elif key.fileobj == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 512):
                            pass
                elif self.workers.get(key.data) is key.fileobj:  # readable: its stand-in ended
                    _kill(key.data)
            self._reap()
        for pid in list(self.workers):  # torchrun is gone: so are its workers
            _kill(pid)

    def _accept(self) -> None:
        import selectors  # noqa: PLC0415
        import socket  # noqa: PLC0415
        import struct  # noqa: PLC0415

        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        try:
            conn.settimeout(5.0)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            uid = struct.unpack("3i", creds)[1]
            if uid != os.getuid():
                raise ValueError(f"asked by uid {uid}, not {os.getuid()}")
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            try:
                size = struct.unpack("!I", _read_exactly(conn, 4))[0]
                if size > MAX_REQUEST:
                    raise ValueError(f"a request of {size} bytes (at most {MAX_REQUEST})")
                request = json.loads(_read_exactly(conn, size))
                argv = [str(a) for a in request["argv"]]
                env = {str(k): str(v) for k, v in dict(request["env"]).items()}
                cwd = str(request["cwd"])
                if len(fds) != 3 or not forkable(argv):
                    raise ValueError(f"not a worker this forker can start: {argv}")
                _flush()
                pid = os.fork()
                if pid == 0:
                    conn.close()  # the stand-in must see the forker's end close with it
                    self._become(argv, env, cwd, fds)  # never returns
            finally:
                for fd in fds:
                    os.close(fd)
        except (OSError, ValueError, KeyError, TypeError) as e:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": str(e)}).encode() + b"\n")
            conn.close()
            return
        self.workers[pid] = conn
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the stand-in is gone already
            _kill(pid)
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.workers.pop(pid, None)
            if conn is None:
                continue
            self.selector.unregister(conn)
            conn.setblocking(True)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            conn.close()

    def _become(self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> None:
        """In the forked process: take on the worker's streams, directory and environment,
        run its entry point, exit as it does."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            # as the interpreter starts a worker, and every signal the stand-in passes on at its
            # default: they could be inherited ignored (a shell's `cmd &` ignores SIGINT and
            # SIGQUIT for what it starts), and the worker would outlive a signal that ended
            # its stand-in
            for default in (signal.SIGCHLD, *STOPS, *PASSED_ON):
                signal.signal(default, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            self.server.close()
            for conn in self.workers.values():
                conn.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            os.close(self.parent_alive)
            os.setsid()  # as torchrun starts a worker: a session of its own
            _name(os.path.basename(sys.executable)[:15])  # as an interpreter started for it
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            code = run_entry_point(argv)
        except BaseException:
            import traceback  # noqa: PLC0415

            traceback.print_exc()
        finally:
            _flush()
            os._exit(code)


def _kill(pid: int) -> None:
    """SIGKILL a forked worker and its session's group (it may have started processes)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _name(name: str) -> None:
    """This process's name (``/proc/self/comm``), so that ``ps`` tells what it is."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w", encoding="ascii") as f:
        f.write(name)


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ValueError("the request ended early")
        data += chunk
    return data


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _stdio(unbuffered: bool) -> None:
    """Standard streams over fds 0-2 as the interpreter makes them (``-u``: unbuffered)."""
    import io  # noqa: PLC0415

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "wb", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=getattr(old, "encoding", None),
            errors=getattr(old, "errors", None),
            line_buffering=not unbuffered and (fd == 2 or raw.isatty()),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)))
    sys.stdin = stdin
    sys.__stdin__ = stdin  # type: ignore[misc]


def run_entry_point(argv: list[str]) -> int:
    """Run a worker's script or module as ``__main__``, then end as the interpreter would (its
    non-daemon threads joined, ``atexit`` functions run); the exit code. The forker was forked
    while ``site`` ran, before the interpreter put the script's directory on ``sys.path``."""
    import atexit  # noqa: PLC0415
    import runpy  # noqa: PLC0415

    flags, kind, name, rest = entry_point(argv)
    _stdio("u" in flags)
    if "B" in flags:
        sys.dont_write_bytecode = True
    sys.orig_argv = argv
    sys.argv = [name, *rest]  # run_module puts the module's path first
    code = 0
    try:
        if kind == "module":
            sys.path.insert(0, os.getcwd())
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.realpath(name)))
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        code = _exit_code_of(e.code)
    except KeyboardInterrupt:
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the interpreter ends by the signal
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    shutdown = getattr(sys.modules.get("threading"), "_shutdown", None)
    if callable(shutdown):
        shutdown()
    atexit._run_exitfuncs()
    return code


def _exit_code_of(value: object) -> int:
    """``sys.exit(value)``'s exit code, as the interpreter gives it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    sys.stderr.write(f"{value}\n")
    return 1


def run_forked(forker: str) -> None:
    """In a new process of a released ``torchrun``: if it is a worker the forker can start,
    have the forker start it and stand in for it until it ends (never returns); else return
    (the process starts cold).

    Once its request may have reached the forker, this process never returns, whatever goes
    wrong: it would otherwise run the trainer itself, cold, beside the forked worker, as a
    worker of an epoch that may already have failed. Only a plain refusal (the forker answered
    that it started nothing) lets it start cold."""
    pid_text, _, path = forker.partition(":")
    argv = list(getattr(sys, "orig_argv", []))
    if not pid_text.isdigit() or int(pid_text) != os.getppid() or not forkable(argv):
        return  # not a worker of torchrun's (a process of a worker's, or another command)
    import socket  # noqa: PLC0415

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as e:
        _log(f"the worker forker cannot be reached ({e}): starting cold")
        conn.close()
        return
    worker: int | None = None
    try:
        worker, replies = _hand_off(conn, argv)
        if worker is None:
            conn.close()
            return  # refused: nothing was started
        _stand_in(worker, replies)
    except BaseException as e:  # anything: this process must not go on
        _log(f"stand-in: {type(e).__name__}: {e}; ending (the forker kills the worker)")
        if worker is not None:
            _kill(worker)
    _flush()
    os._exit(EXIT_STAND_IN_FAILED)


def _hand_off(conn: socket.socket, argv: list[str]) -> tuple[int | None, BinaryIO]:
    """Send the forker this worker's request; (the forked worker's pid, the replies), or
    (None, _) when the forker refused it. Raises when the answer cannot be read: the forker
    may have started the worker, so the caller must not start one too."""
    import socket  # noqa: PLC0415
    import struct  # noqa: PLC0415

    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [b"w"], [0, 1, 2])
    conn.sendall(struct.pack("!I", len(request)) + request)
    replies = conn.makefile("rb")
    answer = json.loads(replies.readline() or b"null")
    if not isinstance(answer, dict):
        raise ValueError(f"the worker forker answered {answer!r}")
    worker = answer.get("pid")
    if isinstance(worker, int) and worker > 0:
        return worker, replies
    if "error" in answer:
        _log(f"the worker forker refused ({answer['error']}): starting cold")
        return None, replies
    raise ValueError(f"the worker forker answered {answer!r}")


def _stand_in(worker: int, replies: BinaryIO) -> NoReturn:
    """Stand in for the forked ``worker`` for ``torchrun``: pass its stop signals on, wait for
    its wait status, end as it did."""
    _name(STAND_IN_NAME)

    def pass_on(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signum)

    for passed in PASSED_ON:
        signal.signal(passed, pass_on)
    try:
        reply = json.loads(replies.readline() or b"{}")
    except (OSError, ValueError):
        reply = None
    status = reply.get("status") if isinstance(reply, dict) else None
    if not isinstance(status, int):
        _log(f"the worker forker ended before worker {worker} did: killing it")
        _kill(worker)
        _flush()
        os._exit(1)
    end_as(status)


def end_as(status: int) -> NoReturn:
    """End this process as a process with wait ``status`` ended: by the same signal (torchrun
    reads it), else with the same exit code."""
    _flush()
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set: it is default
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):  # the worker dumped its own core
            import resource  # noqa: PLC0415

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # (a signal whose default is not to end a process)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


# --- the warm standby: the script holds itself (jobset_inplace.trainer.standby) ------------


class WarmHold:
    """A warm standby's state until its word: the word's path (None: not a warm standby) and
    what was withheld."""

    def __init__(self) -> None:
        self.go: str | None = None
        self.withheld: dict[str, str] = {}
        self.released = False
        self.set_nvml_check = False  # the hook set PYTORCH_NVML_BASED_CUDA_CHECK (undone)


_warm = WarmHold()


def warm_held() -> bool:
    """Whether this process is a warm standby not yet released."""
    return _warm.go is not None and not _warm.released


def word_given() -> bool:
    """Whether the word came (the launcher released the lock): a try that never blocks."""
    import fcntl  # noqa: PLC0415

    assert _warm.go is not None
    with open(_warm.go + ".lock", "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


def warm_hold(go: str) -> None:
    """Make this process a warm standby: withhold WITHHELD, guard the device, the process
    group and training; the script's standby.wait holds it until the word."""
    _warm.withheld = {k: os.environ.pop(k) for k in WITHHELD if k in os.environ}
    _warm.go = go
    # the word's path is this process's alone: a Python process it starts before the word
    # (a helper, a data loader's worker) starts as any would, not as another standby
    os.environ.pop(ENV_GO, None)
    # torch.cuda.is_available() asks NVML, not cuInit, before the word (torch/cuda/__init__.py)
    if "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        _warm.set_nvml_check = True
    sys.modules[MODULE] = sys.modules[__name__]
    guard_torch()


GUARDED = "_jobset_inplace_guarded"  # the attribute that marks a guard (not functools' own)
# What a warm standby must not do before its word, as (module prefix, function, what it is):
# every module under the prefix that holds the function (``from . import _lazy_init``
# copies it into torch.cuda.random, torch.cuda.memory, ...) gets the guard.
GUARDS = (
    ("torch.cuda", "_lazy_init", "CUDA"),
    ("torch.distributed", "init_process_group", "a process group"),
    ("torch.autograd", "backward", "training (a backward pass)"),
)


def _refuse_until_word(what: str, original: object) -> object:
    def guarded(*args: object, **kwargs: object) -> object:
        if warm_held():
            raise RuntimeError(
                f"{what} before this warm standby's epoch (jobset-inplace prestart-warm): only "
                "after jobset_inplace.trainer.standby.wait() returns"
            )
        return original(*args, **kwargs)  # type: ignore[operator]

    setattr(guarded, GUARDED, original)
    return guarded


def guard_torch() -> None:
    """Until the word, CUDA's start, init_process_group and a backward pass raise, wherever a
    torch module holds them (once torch is imported; a later call guards what was imported
    since). After the word the guards call through."""
    if "torch" in sys.modules and "torch.distributed" not in sys.modules:  # (torch imports it)
        with contextlib.suppress(ImportError):
            importlib.import_module("torch.distributed")
    for prefix, name, what in GUARDS:
        home = sys.modules.get(prefix)
        original = getattr(home, name, None)
        if not callable(original):
            continue
        original = getattr(original, GUARDED, original)
        guarded = None
        for module_name, module in list(sys.modules.items()):
            if module is None or not (
                module_name == prefix or module_name.startswith(prefix + ".")
            ):
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    guarded = guarded or _refuse_until_word(what, original)
                    setattr(module, attr, guarded)


def torch_started() -> str | None:
    """What this standby started that it must not have (a CUDA context, a process group);
    None: neither."""
    if _cuda_initialised():
        return "CUDA"
    dist = sys.modules.get("torch.distributed")
    check = getattr(dist, "is_initialized", None)
    if callable(check) and check():
        return "a process group"
    return None


def release() -> tuple[str, str]:
    """Wait for the word, then give the epoch's environment back (the withheld variables, the
    word's, ``JSI_EPOCH``, ``JSI_RESUME_STEP``); (epoch, resume step). Exits when the lock is
    released without a word (the launcher is gone)."""
    assert _warm.go is not None
    word = wait_for_word(_warm.go)
    if word is None:
        _log("released without a word (the launcher is gone): exiting")
        _flush()
        os._exit(EXIT_NO_WORD)
    os.environ.update(_warm.withheld)
    if _warm.set_nvml_check:
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    os.environ.update(word[2])
    os.environ[ENV_EPOCH], os.environ[ENV_RESUME_STEP] = word[0], word[1]
    os.environ.pop(ENV_GO, None)
    _warm.released = True
    _log(f"epoch {word[0]}: go (resume step {word[1] or 'none'}; warm)")
    return word[0], word[1]


def run() -> None:
    go = os.environ.get(ENV_GO)
    forker = os.environ.pop(ENV_FORKER, "")  # the worker's own children start as any would
    if forker and not go:
        run_forked(forker)  # returns only if this process is to start cold
    if not go:
        _image_sitecustomize()
        return  # started cold (or the word was given before this process began): nothing to do
    try:
        hold(go)
    except BaseException as e:  # a held process must never run the trainer unreleased
        _log(f"the pre-start hook failed: {type(e).__name__}: {e}; exiting (the epoch starts cold)")
        _flush()
        os._exit(EXIT_HOOK_FAILED)


def hold(go: str) -> None:
    """A pre-started process: its imports, then wait for the word (returns once released with
    one; exits otherwise)."""
    try:
        _image_sitecustomize()
    except Exception:  # as ``site`` does for it: say so, go on
        import traceback  # noqa: PLC0415

        sys.stderr.write("Error in the image's sitecustomize:\n")
        traceback.print_exc()
    began = time.monotonic()
    names = [n.strip() for n in os.environ.get(ENV_IMPORTS, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the trainer's own import will say it again, in its epoch
            _log(f"import {name} failed: {type(e).__name__}: {e}")
    if _cuda_initialised():
        _log("an import initialised CUDA: a device context must not wait beside the running epoch")
        os._exit(EXIT_CUDA)
    orig = getattr(sys, "orig_argv", [])  # Python 3.10+
    if os.environ.get(ENV_WARM) == "1":
        why = warm_refusal(orig)
        if why is None:
            warm_hold(go)
            _log(f"imported {','.join(names)} in {time.monotonic() - began:.2f} s; {WARM_HELD}")
            return
        _log(f"not a warm standby ({why}): held before the script")
    _log(f"imported {','.join(names)} in {time.monotonic() - began:.2f} s; {HELD}")
    socket_path = start_forker(go + FORKER_SUFFIX) if launches_workers(orig) else None
    word = wait_for_word(go)
    if word is None:
        _log("released without a word (the launcher is gone): exiting")
        os._exit(EXIT_NO_WORD)
    os.environ.update(word[2])  # (a hot spare's slot: before the command's own code reads it)
    os.environ[ENV_EPOCH], os.environ[ENV_RESUME_STEP] = word[0], word[1]
    del os.environ[ENV_GO]  # the trainer's own children start as any child would
    if socket_path is not None:
        os.environ[ENV_FORKER] = f"{os.getpid()}:{socket_path}"
    _log(f"epoch {word[0]}: go (resume step {word[1] or 'none'})")


if __name__ == "sitecustomize":
    run()
