"""Steps lost per failure with the interrupted step kept (``python -m bench.keep_step``).

A gang of real PyTorch workers (testbed/frameworks/torch_dcp_trainer.py: DDP over gloo, DCP
checkpoints every ``--save-every`` steps in one shared directory) runs as two members: two
``torchrun`` processes with a static rendezvous, one worker each, as in two pods. Kubernetes is
not part of this measurement (the trainer's side is; e2e/test_framework_torch.py runs the same
trainer under the controller). Failures in turn, each in a random worker after a random number
of steps: SIGKILL from outside at a random moment within a step (the OOM killer's), SIGSEGV,
SIGABRT (NCCL's watchdog), an uncaught exception, a hang (the worker stops taking part; 3 s
later the gang is stopped as the launcher stops it: SIGTERM, SIGKILL after a 1 s grace). The
failed worker's torchrun ends, the other worker's next collective fails and its torchrun ends
too (after a hang: the stop ends both); the gang is then started again, as a
recovery does, and resumes from the newest complete checkpoint (torchtitan's rule, which the
agent's resume step also follows for this layout).

Each failure is injected twice, into two gangs with their own directories, alike but for
``KEEP_STEP``: ``kept`` (the trainer keeps the step a failure interrupts:
jobset_inplace.trainer.keep) and ``periodic`` (the trainer as users write it: every recovery,
``torchrun --max-restarts``' too, resumes from the last periodic checkpoint).

Steps lost = the newest step any worker logged before the failure - the step the gang resumed
at (negative: a step was kept whose log line the failure cut off). Each resumed state is
checked: the loss it logs (``resumed at step R loss L``: its parameters on step R + 1's batch)
must equal, to 1e-5, what an uninterrupted run logged for step R + 1; a state of another step
would not. A gang's directory starts afresh every ``--chain`` failures. Results:
``bench/results/keep-step.json`` with the commit and the machine (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import provenance
from testbed import images
from testbed.cluster import log

OUT = Path("bench/results/keep-step.json")
KINDS = ("sigkill", "segv", "abort", "exception", "hang")
# A hang: the hung worker stops taking part, the other waits in its collective (gloo's timeout:
# 30 min). The recovery stands in for hang detection: it stops the gang this long after the
# hang began, as the launcher does (SIGTERM to torchrun and its workers, SIGKILL after the
# stop grace).
HANG_DETECTED_S = 3.0
STOP_GRACE_S = 1.0  # the launcher's default (trainer-stop-grace)
MODES = ("kept", "periodic")
SETTINGS = ("save_every", "step_seconds", "max_steps", "chain", "seed", "kinds")
WORKERS = 2  # members (one torchrun, one worker each)
START_TIMEOUT_S = 120.0
END_TIMEOUT_S = 60.0
LOSS_RTOL = 1e-5
STEP_LINE = re.compile(r"\[rank (\d+)\] step (\d+) loss (\S+)")
RESUMED_LINE = re.compile(r"\[rank \d+\] resumed at step (\d+) loss (\S+)")
FRESH_LINE = re.compile(r"\[rank \d+\] started \d+ workers, no checkpoint")
KEPT_LINE = re.compile(r"\[rank (\d+)\] kept step (\d+)")
STEP_DIR = re.compile(r"step-(\d+)")


@dataclass
class Trial:
    mode: str
    kind: str
    rank: int  # the failed worker
    resumed: int  # the step this start resumed at
    newest: int  # the newest step any worker logged before the failure
    resume_next: int  # the step the next start resumes at
    steps_lost: int
    kept_by: list[int] = field(default_factory=list)  # workers that logged "kept step"
    loss_ok: bool | None = None  # the next start's resumed loss against the uninterrupted run
    ended_s: float = 0.0  # failure -> both torchruns ended


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def newest_checkpoint(root: Path) -> int:
    steps = [
        int(m.group(1))
        for p in root.iterdir()
        if (m := STEP_DIR.fullmatch(p.name)) and (p / ".metadata").exists()
    ]
    return max(steps, default=0)


class Gang:
    """Two torchruns over ``root``, their output in ``logs`` (one file each per start)."""

    def __init__(self, root: Path, logs: Path, site: Path, *, keep: bool, args: Any) -> None:
        self.root, self.logs, self.site, self.keep, self.args = root, logs, site, keep, args
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        self.starts = 0

    def start(self, steps: int = 100_000) -> None:
        self.starts += 1
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": f"{self.site}:{Path.cwd()}",
            "CHECKPOINT_DIR": str(self.root),
            "STEPS": str(steps),
            "SAVE_EVERY": str(self.args.save_every),
            "STEP_SECONDS": str(self.args.step_seconds),
            "OMP_NUM_THREADS": "1",
            "KEEP_STEP": "1" if self.keep else "0",
        }
        self.procs, self.outs = [], []
        for node in range(WORKERS):
            out = self.logs / f"{self.root.name}-{self.starts}-node{node}.log"
            cmd = [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={WORKERS}",
                f"--node-rank={node}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                f"--master-port={port}", "--max-restarts=0", str(images.TORCH_TRAINER),
            ]  # fmt: skip
            with out.open("wb") as f:
                self.procs.append(
                    subprocess.Popen(
                        cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                )
            self.outs.append(out)

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.outs)

    def newest_logged(self) -> int:
        return max((int(m.group(2)) for m in STEP_LINE.finditer(self.text())), default=-1)

    def resumed(self) -> tuple[int, float | None] | None:
        """The step this start resumed at and its state's loss (step 0: no checkpoint, no
        loss); None: not said yet."""
        text = self.text()
        if m := RESUMED_LINE.search(text):
            return int(m.group(1)), float(m.group(2))
        return (0, None) if FRESH_LINE.search(text) else None

    def worker_pid(self, node: int) -> int | None:
        """The worker process torchrun started (its child)."""
        pid = self.procs[node].pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def wait_until(self, what: str, ok: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{self.root.name}: {what} not within {timeout:g} s:\n"
                                 + self.text()[-3000:])  # fmt: skip
            if all(p.poll() is not None for p in self.procs) and not ok():
                raise SystemExit(f"{self.root.name}: the gang ended before {what}:\n"
                                 + self.text()[-3000:])  # fmt: skip
            time.sleep(0.05)

    def ended(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop_as_the_launcher_does(self) -> None:
        """SIGTERM to each torchrun and its worker, SIGKILL to what is left after the grace."""
        pids = [p.pid for p in self.procs if p.poll() is None]
        pids += [w for node in range(WORKERS) if (w := self.worker_pid(node)) is not None]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def reference_losses(site: Path, work: Path, args: Any) -> dict[int, float]:
    """An uninterrupted run's loss per step (``step S loss L``)."""
    root = work / "reference"
    root.mkdir()
    gang = Gang(root, work, site, keep=False, args=args)
    gang.start(steps=args.reference_steps)
    if not gang.ended(START_TIMEOUT_S + args.reference_steps * args.step_seconds * 4):
        gang.stop()
        raise SystemExit("the uninterrupted run did not end:\n" + gang.text()[-3000:])
    losses = {int(m.group(2)): float(m.group(3)) for m in STEP_LINE.finditer(gang.text())}
    if len(losses) != args.reference_steps:
        raise SystemExit(f"the uninterrupted run logged {len(losses)} steps:\n{gang.text()}")
    return losses


def inject(gang: Gang, kind: str, rank: int, rng: random.Random, step_s: float) -> None:
    if kind == "sigkill":
        time.sleep(rng.uniform(0, step_s))  # anywhere within a step
        pid = gang.worker_pid(rank)
        if pid is None:
            raise SystemExit(f"{gang.root.name}: no worker under torchrun {rank}")
        os.kill(pid, signal.SIGKILL)
    else:  # the trainer's own fault hook: at its next step's end
        (gang.root / f"fault-rank-{rank}").write_text(kind)
    if kind == "hang":
        time.sleep(HANG_DETECTED_S)
        gang.stop_as_the_launcher_does()


def check_resumed(gang: Gang, trial: Trial | None, reference: dict[int, float]) -> None:
    """The start resumed where the last failure left the directory, with that step's state."""
    gang.wait_until("the resumed line", lambda: gang.resumed() is not None, START_TIMEOUT_S)
    step, loss = gang.resumed() or (0, None)
    if trial is None:
        return
    if step != trial.resume_next:
        raise SystemExit(f"resumed at step {step}, the directory's newest is {trial.resume_next}")
    if loss is None:
        return  # from step 0: no state to check
    want = reference.get(step + 1)
    trial.loss_ok = want is not None and abs(loss - want) <= LOSS_RTOL * max(abs(want), 1e-30)
    if not trial.loss_ok:
        log(f"  resumed loss {loss:.6e} at step {step}, uninterrupted: {want}")


def run(args: argparse.Namespace, work: Path, site: Path) -> list[Trial]:
    rng = random.Random(args.seed)
    reference = reference_losses(site, work, args)
    log(f"uninterrupted run: {len(reference)} steps")
    trials: list[Trial] = []
    gangs: dict[str, Gang] = {}
    last: dict[str, Trial | None] = {}
    for i in range(args.failures):
        kind, rank = args.kinds[i % len(args.kinds)], rng.randrange(WORKERS)
        after = rng.randint(3, args.max_steps)
        if i % args.chain == 0:  # fresh directories
            for mode in args.modes:
                if mode in gangs:
                    gangs[mode].start(steps=newest_checkpoint(gangs[mode].root))
                    check_resumed(gangs[mode], last[mode], reference)
                    gangs[mode].ended(END_TIMEOUT_S)
                root = work / f"{mode}-{i}"
                root.mkdir()
                gangs[mode] = Gang(root, work, site, keep=mode == "kept", args=args)
                last[mode] = None
        for mode in args.modes:
            gang = gangs[mode]
            gang.start()
            check_resumed(gang, last[mode], reference)
            resumed = (gang.resumed() or (0, None))[0]
            gang.wait_until(f"step {resumed + after}",
                            lambda g=gang, s=resumed + after: g.newest_logged() >= s,
                            START_TIMEOUT_S)  # fmt: skip
            inject(gang, kind, rank, rng, args.step_seconds)
            failed_at = time.monotonic()
            if not gang.ended(END_TIMEOUT_S):
                gang.stop()
                raise SystemExit(f"{gang.root.name}: the gang did not end after the failure:\n"
                                 + gang.text()[-3000:])  # fmt: skip
            text = gang.text()
            newest, nxt = gang.newest_logged(), newest_checkpoint(gang.root)
            trial = Trial(
                mode, kind, rank, resumed, newest, nxt, newest - nxt,
                sorted({int(m.group(1)) for m in KEPT_LINE.finditer(text)}),
                ended_s=round(time.monotonic() - failed_at, 3),
            )  # fmt: skip
            trials.append(trial)
            last[mode] = trial
            log(f"[{i + 1}/{args.failures}] {mode:8} {kind:9} rank {rank}: newest step {newest}, "
                f"resumes at {nxt}: {trial.steps_lost} lost")  # fmt: skip
    for mode in args.modes:  # the last failures' resumed states
        gangs[mode].start(steps=newest_checkpoint(gangs[mode].root))
        check_resumed(gangs[mode], last[mode], reference)
        gangs[mode].ended(END_TIMEOUT_S)
    return trials


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = math.ceil(len(ordered) * q / 100)
    return ordered[max(0, min(len(ordered) - 1, rank - 1))]


def summary(trials: list[Trial]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [t for t in trials if t.mode == mode]
        if not mine:
            continue  # not measured (--modes)
        lost = [t.steps_lost for t in mine]
        out[mode] = {
            "failures": len(mine),
            "steps_lost_p50": percentile(lost, 50),
            "steps_lost_p99": percentile(lost, 99),
            "steps_lost_max": max(lost),
            "steps_lost_mean": round(statistics.fmean(lost), 2),
            "resumed_state_checked": sum(1 for t in mine if t.loss_ok),
            "resumed_state_wrong": sum(1 for t in mine if t.loss_ok is False),
            "by_kind": {
                k: sorted(t.steps_lost for t in mine if t.kind == k)
                for k in KINDS
                if any(t.kind == k for t in mine)
            },
        }
    return out


def table(s: dict[str, Any]) -> str:
    lines = [f"{'':9} {'failures':>8} {'p50':>4} {'p99':>4} {'max':>4} {'mean':>6}  resumed state"]
    for mode, v in s.items():
        lines.append(
            f"{mode:9} {v['failures']:>8} {v['steps_lost_p50']:>4} {v['steps_lost_p99']:>4} "
            f"{v['steps_lost_max']:>4} {v['steps_lost_mean']:>6}  {v['resumed_state_checked']} "
            f"right, {v['resumed_state_wrong']} wrong"
        )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.keep_step", description=__doc__.split("\n")[0]
    )
    p.add_argument("--failures", type=int, default=52, help="failures per mode (default 52)")
    p.add_argument("--save-every", type=int, default=10, help="periodic checkpoints (10 steps)")
    p.add_argument("--step-seconds", type=float, default=0.1, help="the trainer's pause a step")
    p.add_argument("--max-steps", type=int, default=24, help="steps before a failure: 3..this")
    p.add_argument("--chain", type=int, default=4, help="failures per checkpoint directory")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--modes",
        type=lambda v: v.split(","),
        default=list(MODES),
        help=f"the trainers measured (default {','.join(MODES)})",
    )
    p.add_argument(
        "--kinds",
        type=lambda v: v.split(","),
        default=list(KINDS),
        help=f"failure kinds, in turn (default {','.join(KINDS)})",
    )
    p.add_argument("--out", type=Path, default=OUT, help=f"results JSON (default {OUT})")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args(argv)
    if unknown := sorted(set(args.kinds) - set(KINDS)):
        p.error(f"--kinds: {', '.join(unknown)} not among {', '.join(KINDS)}")
    if not args.modes or (unknown := sorted(set(args.modes) - set(MODES))):
        p.error(f"--modes: one or more of {', '.join(MODES)}")
    if args.failures < 1 or args.chain < 1 or args.max_steps < 3 or args.save_every < 1:
        p.error("--failures and --chain must be >= 1, --max-steps >= 3, --save-every >= 1")
    # the uninterrupted run's steps: every step a directory's chain of failures can reach
    args.reference_steps = args.chain * (args.max_steps + 5) + 10
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run_ = provenance.begin("bench.keep_step", argv, args.allow_dirty)
    site = images.torch_site()
    with tempfile.TemporaryDirectory(prefix="jsi-keep-step-") as tmp:
        work = Path(tmp)
        try:
            trials = run(args, work, site)
        finally:
            if os.environ.get("JSI_KEEP_STEP_LOGS"):
                shutil.copytree(work, os.environ["JSI_KEEP_STEP_LOGS"], dirs_exist_ok=True)
    s = summary(trials)
    print(table(s))
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **run_.origin,
        "kubernetes": "none (two torchruns on one host, no cluster: the trainer's side)",
        "steal": run_.steal(),
        "settings": {k: getattr(args, k) for k in SETTINGS},
        "summary": s,
        "trials": [asdict(t) for t in trials],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    provenance.write(doc, str(args.out))
    log(f"results: {args.out}")
    wrong = sum(v["resumed_state_wrong"] for v in s.values())
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
