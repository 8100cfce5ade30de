"""Starting, probing and stopping local component processes."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from .versions import real_node_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    cmd: Sequence[str | Path], log: Path, *, detach: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a process with stdout+stderr appended to ``log``.

    ``detach`` puts it in its own session so it outlives the caller (cluster-up)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(c) for c in cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
            env={**os.environ, **(env or {})},
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def runs(pid: int, program: str) -> bool:
    """True while ``pid`` runs ``program`` (its command name, the executable's file name cut to
    15 characters, contains it): a PID that an earlier run recorded may belong to another
    process by now. (Not argv[0]: /proc/PID/cmdline reads empty for a moment after exec, seen
    right after Popen returned.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    comm, _, rest = stat.partition("(")[2].rpartition(")")
    return rest.split()[0] != "Z" and program in comm


def stop_pid(pid: int, timeout: float = 10, *, program: str | None = None) -> None:
    """SIGTERM a detached process group, SIGKILL it if it lingers; with ``program``, only if
    ``pid`` still runs it (:func:`runs`)."""
    if program is not None and not runs(pid, program):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    interval: float = 0.2,
    log: Path | None = None,
) -> None:
    """Poll ``check`` until it is true; on timeout raise with the tail of ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    tail = ""
    if log and log.exists():
        tail = "\n--- last lines of " + str(log) + " ---\n"
        tail += "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s{tail}")


def https_ok(url: str, *, token: str | None = None, cafile: Path | None = None) -> bool:
    """True when ``url`` answers 200 (TLS verified against ``cafile`` when given)."""
    ctx = (
        ssl.create_default_context(cafile=str(cafile))
        if cafile
        else ssl._create_unverified_context()
    )
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def kubelet_plugin_registry(node: str) -> Path:
    """The plugin registration directory of the local cluster's real node ``node``'s kubelet
    (its ``--root-dir``, realnode/kubelet.sh, plus ``plugins_registry``): where device plugins
    and DRA drivers on this host register with that kubelet. (Its device-plugins directory is no
    use: the kubelet compiles that one in, /var/lib/kubelet/device-plugins, shared by every
    kubelet on this host.)"""
    return real_node_dir(node) / "kubelet" / "root" / "plugins_registry"


class NodeDaemons:
    """One host process per node beside the local cluster's real kubelets (a device plugin, a
    DRA driver), for the life of a ``with`` block: started, each waited for until it serves,
    all stopped on exit or when the start fails. Logs: ``workdir/<node>.log``."""

    __test__ = False  # not a pytest class

    def __init__(self, nodes: list[str], workdir: Path) -> None:
        self.nodes, self.workdir = nodes, workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def prepare(self) -> None:
        """Before the processes start (build the binary, create API objects)."""

    def command(self, node: str) -> Sequence[str | Path]:
        raise NotImplementedError

    def wait_serving(self, node: str) -> None:
        raise NotImplementedError

    def log(self, node: str) -> Path:
        return self.workdir / f"{node}.log"

    def __enter__(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.prepare()
            for node in self.nodes:
                self.procs[node] = start(self.command(node), self.log(node))
            for node in self.nodes:
                self.wait_serving(node)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in self.procs.values():
            stop(proc)
        self.procs.clear()
