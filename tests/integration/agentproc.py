"""Agent processes for integration tests: ``python -m jobset_inplace.agent`` against the real
API server with its own state, checkpoint tiers and probe port (no kubelet: the pod objects
only carry what the agent and the test write). The fixtures are conftest.py's."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobset_inplace.trainer import ResumeInfo, read_resume, staged_checkpoint
from testbed.kube import wait_for

WAIT = 15.0  # bound of every wait for something the agent does within ~a second
POLL = 0.01


@dataclass
class AgentProc:
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    state_dir: Path
    local: Path
    persistent: Path
    token_file: Path
    started: float = field(default_factory=time.monotonic)

    def barrier(self) -> tuple[int, str]:
        """(HTTP status, body) of GET /barrier; (0, error) while nothing listens."""
        return self.get("/barrier")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            return 0, str(e)

    def wait_barrier(self, status: int, contains: str = "") -> str:
        def check() -> str | None:
            code, body = self.barrier()
            return body if code == status and contains in body else None

        return wait_for(f"/barrier {status} {contains!r}; log:\n{self.text()}", check, WAIT, POLL)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, pattern: str, count: int = 1) -> str:
        return wait_for(
            f"agent log line {pattern!r} x{count}; log:\n{self.text()}",
            lambda: self.text() if len(re.findall(pattern, self.text())) >= count else None,
            WAIT,
            POLL,
        )

    def wait_exit(self, timeout: float = WAIT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"agent still running after {timeout}s; log:\n{self.text()}"
            ) from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def own_latency(self) -> float:
        m = re.search(r"reported epoch \d+, checkpoint steps \[[^]]*\]: ([0-9.]+) s", self.text())
        assert m, self.text()
        return float(m.group(1))

    def resume(self) -> ResumeInfo | None:
        return read_resume(self.state_dir)


StartAgent = Callable[..., AgentProc]


def checkpoints(root: Path, complete: list[int], partial: tuple[int, ...] = ()) -> None:
    for step in complete:
        with staged_checkpoint(root, step, durable=False) as d:
            (d / "weights").write_text(f"step {step}\n")
    for step in partial:
        (root / f"step-{step}").mkdir(parents=True)
