"""CPU profiles during a measured recovery: where the bound's CPU goes.

* kube-apiserver serves Go's pprof (``--profiling``, on by default) to cluster admins; a
  profile is taken over the first seconds of a recovery (the restart phase, the apiserver's
  busiest) and summarised with ``go tool pprof`` into shares of the sampled CPU by what the
  code does.
* The controller and the benchmark's simulated fleet (Python) are sampled by ``py-spy`` over
  the same seconds and summarised into the functions with the most samples, on their own and
  with what they call.
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Self

# What the apiserver's CPU goes to: ``go tool pprof -focus`` regexes over the call stacks,
# mostly the request handlers' subtrees (a sample can count in two rows: managedFields runs
# inside PATCH and PUT).
CATEGORIES = {
    "PATCH requests (decode, patch, admission, managedFields, etcd write)": (
        r"handlers\.\(\*patcher\)|handlers\.PatchResource"
    ),
    "managedFields bookkeeping (inside PATCH and PUT)": (
        r"managedfields/internal\.\(\*FieldManager\)\.Update"
    ),
    "PUT requests (Leases, Job/JobSet status, EndpointSlices)": r"handlers\.UpdateResource",
    "POST requests (Events, pods, bindings)": r"handlers\.CreateResource",
    "DELETE requests": r"handlers\.DeleteResource|handlers\.DeleteCollection",
    "GET requests": r"cacher\.\(\*CacheDelegator\)\.Get$",
    "watch: encoding and sending events": r"WatchServer|watchEncoder|watchEmbeddedEncoder",
    "watch: cache dispatch to watchers": (
        r"cacher\.\(\*Cacher\)\.dispatch|cacher\.\(\*cacheWatcher\)"
    ),
    "garbage collection": r"runtime\.gcBgMarkWorker",
    "TLS": r"crypto/tls",
}
_SHARE = re.compile(r"Showing nodes accounting for [^,]+, ([\d.]+)% of ([\d.]+m?s) total")


class _Profile:
    """A profiler command run on a thread, its output in ``path``; ``result`` waits for it and
    summarises the file."""

    def __init__(self, cmd: list[str], path: Path) -> None:
        self.path = path
        self.error = ""
        self._cmd = cmd
        self._thread = threading.Thread(target=self._take, daemon=True, name=type(self).__name__)

    def start(self) -> Self:
        self._thread.start()
        return self

    def _run(self) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self._cmd, capture_output=True, check=False)

    def _take(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            done = self._run()
        except OSError as e:  # the profiler is not installed
            self.error = f"{self._cmd[0]}: {e}"
            return
        if done.returncode:
            why = done.stderr.decode(errors="replace").strip()[-300:]
            self.error = why or f"{self._cmd[0]}: exit status {done.returncode}"

    def _summary(self) -> dict[str, object]:
        raise NotImplementedError

    def result(self, timeout: float) -> dict[str, object]:
        """Wait for the profile and summarise it."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return {"error": "profile not finished"}
        if self.error:
            return {"error": self.error}
        return {"file": self.path.name, **self._summary()}


class ApiserverProfile(_Profile):
    """``seconds`` of kube-apiserver CPU profile (Go pprof, through ``kubectl get --raw``)."""

    def __init__(self, kubectl: list[str], seconds: float, path: Path) -> None:
        url = f"/debug/pprof/profile?seconds={max(1, round(seconds))}"
        super().__init__([*kubectl, "get", "--raw", url], path)

    def _run(self) -> subprocess.CompletedProcess[bytes]:
        with self.path.open("wb") as out:
            return subprocess.run(self._cmd, stdout=out, stderr=subprocess.PIPE, check=False)

    def _summary(self) -> dict[str, object]:
        return summarise(self.path)


def _pprof(path: Path, *args: str) -> str:
    return subprocess.run(
        ["go", "tool", "pprof", "-top", *args, str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def summarise(path: Path) -> dict[str, object]:
    """Share of the sampled CPU per category (percent), and the top functions by cumulative
    time."""
    total = ""
    shares: dict[str, float] = {}
    for name, regex in CATEGORIES.items():
        out = _pprof(path, "-nodecount=1000000", "-nodefraction=0", f"-focus={regex}")
        m = _SHARE.search(out)
        shares[name] = float(m.group(1)) if m else 0.0
        total = m.group(2) if m else total
    top = [
        line.strip()
        for line in _pprof(path, "-cum", "-nodecount=40").splitlines()
        if re.match(r"\s*[\d.]+m?s\s", line)
    ]
    return {"sampled": total, "share_pct": shares, "top_cum": top}


class PySpyProfile(_Profile):
    """``seconds`` of ``py-spy`` samples of Python process ``pid`` (raw stacks; py-spy comes with
    ``pip install -e '.[bench]'``). Samples of threads that wait (py-spy's idle detection) are
    left out, so the samples are where the process spends CPU, not wall time. ``native``: the
    C frames too (the event loop's sockets, TLS, JSON), at the cost of pausing the process per
    sample (py-spy cannot read native stacks without). ``cpu``: py-spy runs on that CPU only
    (the sampled process's own core: py-spy elsewhere, on a core the process's peers keep
    busy, is descheduled exactly while they send it work, and misses that work).
    :meth:`stop` ends it early."""

    RATE_HZ = 100

    def __init__(
        self,
        pid: int,
        seconds: float,
        path: Path,
        *,
        native: bool = False,
        rate: int = RATE_HZ,
        cpu: int | None = None,
    ) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        cmd = [] if cpu is None else ["taskset", "-c", str(cpu)]
        cmd += [spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))]
        # --nonblocking: the process is not paused per sample
        cmd += ["--rate", str(rate), "--format", "raw"]
        cmd += ["--native"] if native else ["--nonblocking"]
        super().__init__([*cmd, "--output", str(path)], path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = threading.Event()

    def _run(self) -> subprocess.CompletedProcess[bytes]:
        self._proc = proc = subprocess.Popen(
            self._cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._started.set()
        out, err = proc.communicate()
        return subprocess.CompletedProcess(self._cmd, proc.returncode, out, err)

    def stop(self) -> None:
        """End the sampling now (SIGINT: py-spy writes what it has)."""
        self._started.wait(10)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)

    def _summary(self) -> dict[str, object]:
        return summarise_stacks(self.path)


# Frames of a thread that waits, not runs: with native frames py-spy cannot tell idle threads
# (it samples them all), so a stack through one of these is left out of a CPU profile. A
# socket read's leaf (read, recv) counts as waiting too: the watch threads block there.
WAITING_FRAMES = re.compile(
    r"(^|;)(epoll_wait|epoll_pwait|select_epoll_poll_impl|select_poll_poll_impl|poll|"
    r"PyThread_acquire_lock_timed|"
    r"_queue_SimpleQueue_get_impl|pthread_cond_(timed)?wait|sem_(clock|timed)?wait) \("
    r"|;(read|recv|__libc_recv|__libc_read) \([^;]*$"
)


def summarise_stacks(
    path: Path | Sequence[Path], top: int = 30, *, waiting_out: bool = False
) -> dict[str, object]:
    """py-spy's raw (collapsed) stacks, of one file or several together: the functions with
    the most samples on their own ("self") and with their callees ("inclusive"), as percent
    of all samples. ``waiting_out``: samples of waiting threads (:data:`WAITING_FRAMES`) left
    out (native profiles), how many in ``waiting``."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = waiting = 0
    paths = [path] if isinstance(path, Path) else list(path)
    lines = [line for p in paths if p.exists() for line in p.read_text().splitlines()]
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        if waiting_out and WAITING_FRAMES.search(stack):
            waiting += n
            continue
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def shares(counter: collections.Counter[str]) -> list[str]:
        return [f"{100 * n / total:5.1f}% {f}" for f, n in counter.most_common(top)]

    return {
        "samples": total,
        **({"waiting": waiting} if waiting_out else {}),
        "self": shares(own) if total else [],
        "inclusive": shares(inclusive) if total else [],
    }
