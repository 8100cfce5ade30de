"""Crash -> first productive step of a ~350 M-parameter model on one GPU, four ways.

    python bench/gpu/gpu_first_step.py --out /tmp/gpu.json            (on the device machine)
    python bench/gpu/gpu_first_step.py --device cpu --layers 2 --width 256 --out /tmp/cpu.json
                                                                   (a check on CPU, gloo)

For the device machine (one GPU, PyTorch with NCCL, no network; docs/benchmarks.md, "The GPU
path"): standard library and torch only, one file in a directory of its own (run as a script,
its directory comes first on ``sys.path``: nothing there may shadow a standard module), within
8 minutes. One rank (NCCL runs one
rank per GPU), a decoder-only transformer in bf16 with AdamW, a DCP checkpoint of several GB
(parameters and optimizer state) written once at the start. Each way, ``--reps`` times, the
trainer is SIGKILLed after a few steps and the time from the kill to its first productive
step after a restore is measured, with where it went (each process logs wall-clock
milestones: process started, torch imported, CUDA ready, process group ready, model built,
checkpoint restored, first step):

* ``cold``: a new process, as a restarted trainer starts (the process scope without
  pre-start);
* ``prestart``: a process started before the crash that has imported torch and waits (the
  process scope's ``prestart-imports``); with ``--prestart-cuda`` also its CUDA context and
  with ``--prestart-read`` the checkpoint's files read while it waits (each measured as a way
  of its own before it is kept);
* ``warm``: a process started before the crash that has also built the model and AdamW on the
  CPU and loaded the checkpoint into them without a process group (jobset-inplace's
  ``prestart-warm``, docs/design/warm-standby.md); after the word: CUDA, the process group,
  the copy to the device, the first step. ``warm-reload``: the same, with the checkpoint
  loaded again after the word (the gang's step was not the one held);
* ``torchrun``: ``torchrun --standalone --max-restarts`` restarting its worker;
* ``floor``: inside a live process: the process group made again and the checkpoint loaded
  into the model it has (no process start, no import, no CUDA start): the physical limit.

Prints a table and writes the results (with the torch and device versions) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MILESTONES = ("started", "imported", "cuda", "group", "built", "restored", "first_step")
WAYS = (
    "cold",
    "prestart",
    "prestart-cuda",
    "prestart-read",
    "warm",
    "warm-reload",
    "torchrun",
    "floor",
)


# --- the trainer (this file run with --trainer) ------------------------------------------------


def mark(name: str) -> None:
    """A milestone of this process: ``@<name> <wall seconds>`` on stdout."""
    print(f"@{name} {time.time():.6f}", flush=True)


def trainer(args: argparse.Namespace) -> int:
    mark("started")
    go = os.environ.get("JSI_GPU_GO")
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
        get_state_dict,
        set_state_dict,
    )

    mark("imported")
    cuda = args.device == "cuda"
    warm = os.environ.get("JSI_GPU_WARM")  # "1" or "reload": held with the state loaded

    def restore(model: Any, optim: Any, **kw: Any) -> None:
        """The model and the optimizer's moments from the checkpoint (get_state_dict makes
        the optimizer's state first: a new AdamW has none to load into)."""
        model_state, optim_state = get_state_dict(model, optim)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=args.ckpt, **kw)
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )

    if go and warm:  # a warm standby: the model built and loaded on the CPU before the word
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # (as jobset_inplace.trainer.standby holds it)
        model, optim = build(args, "cpu")
        restore(model, optim, no_dist=True)
        held(go)
        torch.set_num_threads(threads)
        if warm == "reload":
            restore(model, optim, no_dist=True)
        device_ready(torch, cuda)
        _group(args, dist, cuda)
        mark("group")
        model.to(args.device)
        optim.load_state_dict(optim.state_dict())  # the moments follow the parameters
        mark("built")
        mark("restored")
        _train(args, model, optim)
        return 0
    if go:  # pre-started: what may be done before the word, then wait for it
        if os.environ.get("JSI_GPU_PRESTART_CUDA") and cuda:
            torch.cuda.init()
            torch.empty(1, device="cuda")
        if os.environ.get("JSI_GPU_PRESTART_READ"):
            for f in sorted(Path(args.ckpt).rglob("*")):
                if f.is_file():
                    with f.open("rb") as fh:
                        while fh.read(64 << 20):
                            pass
        held(go)
    device_ready(torch, cuda)
    _group(args, dist, cuda)
    mark("group")
    model, optim = build(args, args.device)
    mark("built")
    if Path(args.ckpt, ".metadata").exists():
        restore(model, optim)
        mark("restored")
    else:
        step(args, model, optim)  # the optimizer's state exists once a step was taken
        model_state, optim_state = get_state_dict(model, optim)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.ckpt)
        mark("saved")
    n = 0
    while True:
        step(args, model, optim)
        n += 1
        mark("first_step" if n == 1 else "step")
        if args.floor and n == 3:  # the in-process floor: the group and the state again
            began = time.time()
            dist.destroy_process_group()
            dist.init_process_group("nccl" if cuda else "gloo")
            group = time.time()
            restore(model, optim)
            restored = time.time()
            step(args, model, optim)
            print(f"@floor {began:.6f} {group:.6f} {restored:.6f} {time.time():.6f}", flush=True)
            return 0


def held(go: str) -> None:
    """Say it is held, wait for the word, mark the epoch's own start (the time before the word
    is not the crash's)."""
    print("@held", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    mark("started")


def device_ready(torch: Any, cuda: bool) -> None:
    if cuda:
        torch.cuda.set_device(0)
        torch.empty(1, device="cuda")
    mark("cuda")
    print(f"@device {torch.cuda.get_device_name(0) if cuda else 'cpu'}", flush=True)


def _group(args: argparse.Namespace, dist: Any, cuda: bool) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl" if cuda else "gloo")


def _train(args: argparse.Namespace, model: Any, optim: Any) -> None:
    """Steps until killed, the first marked."""
    n = 0
    while True:
        step(args, model, optim)
        n += 1
        mark("first_step" if n == 1 else "step")


def build(args: argparse.Namespace, device: str) -> tuple[Any, Any]:
    """The model (a decoder-sized transformer stack over an embedding) and its AdamW, on
    ``device``."""
    import torch as t  # noqa: PLC0415

    dtype = t.bfloat16 if args.device == "cuda" else t.float32
    layer = t.nn.TransformerEncoderLayer(
        args.width, args.heads, 4 * args.width, batch_first=True, dtype=dtype
    )
    body = t.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
    model = t.nn.Sequential(t.nn.Embedding(args.vocab, args.width, dtype=dtype), body)
    model = model.to(device)
    optim = t.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optim


def step(args: argparse.Namespace, model: Any, optim: Any) -> None:
    """One training step (a synthetic batch: the time is what matters, not the loss)."""
    import torch as t  # noqa: PLC0415

    tokens = t.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    model(tokens).float().pow(2).mean().backward()
    optim.step()
    optim.zero_grad()
    if args.device == "cuda":
        t.cuda.synchronize()


# --- the driver --------------------------------------------------------------------------------


def commit() -> dict[str, Any]:
    """This file's commit and whether tracked files had changes (``None``: no git here)."""
    here = Path(__file__).resolve().parent

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *argv], check=False, cwd=here, capture_output=True, text=True
            )
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no")  # as bench/provenance.py
    return {"commit": head, "dirty": None if changes is None else bool(changes)}


def milestones(lines: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in lines:
        if line.startswith("@") and " " in line:
            name, _, value = line[1:].partition(" ")
            if name in MILESTONES:
                out[name] = float(value.split()[0])  # a later "started" replaces the first
    return out


class Proc:
    """A trainer process whose milestone lines are read as they come."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    def until(self, prefix: str, timeout: float) -> str:
        assert self.p.stdout is not None
        deadline = time.time() + timeout
        for line in self.p.stdout:
            self.lines.append(line.strip())
            if line.startswith(prefix):
                return line.strip()
            if time.time() > deadline:
                raise TimeoutError(f"no {prefix!r} line in {timeout} s: {self.lines[-5:]}")
        code = self.p.wait()
        raise RuntimeError(f"the trainer exited {code} before a {prefix!r} line: {self.lines[-5:]}")

    def kill(self) -> float:
        at = time.time()
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        return at


def base_cmd(args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, __file__, "--trainer", "--device", args.device, "--ckpt", args.ckpt,
        "--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads),
        "--vocab", str(args.vocab), "--seq", str(args.seq), "--batch", str(args.batch),
        "--port", str(args.port),
    ]  # fmt: skip


def one(args: argparse.Namespace, way: str, work: Path) -> dict[str, float]:
    """One crash and recovery of ``way``: each milestone in seconds after the kill."""
    env = dict(os.environ)
    cmd = base_cmd(args)
    if way == "floor":
        p = Proc([*cmd, "--floor"], env)
        line = p.until("@floor", args.timeout)
        p.p.wait()
        began, group, restored, first = map(float, line.split()[1:])
        return {"group": group - began, "restored": restored - began, "first_step": first - began}
    if way == "torchrun":
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        run += ["--nproc-per-node=1", "--max-restarts=1", *cmd[1:]]
        p = Proc(run, env)
        p.until("@first_step", args.timeout)
        p.until("@step", args.timeout)
        pid = p.p.pid  # torchrun's one child: its worker
        worker = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        at = time.time()
        os.kill(worker, signal.SIGKILL)
        p.lines.clear()
        p.until("@first_step", args.timeout)
        p.p.send_signal(signal.SIGTERM)
        p.p.wait()
        return {k: v - at for k, v in milestones(p.lines).items()}
    running = Proc(cmd, env)
    running.until("@step", args.timeout)
    standby = None
    if way.startswith(("prestart", "warm")):
        go = work / f"go-{time.time_ns()}"
        senv = dict(env, JSI_GPU_GO=str(go))
        if way == "prestart-cuda":
            senv["JSI_GPU_PRESTART_CUDA"] = "1"
        if way == "prestart-read":
            senv["JSI_GPU_PRESTART_READ"] = "1"
        if way.startswith("warm"):
            senv["JSI_GPU_WARM"] = "reload" if way == "warm-reload" else "1"
        standby = Proc(cmd, senv)
        standby.until("@held", args.timeout)
    at = running.kill()
    if standby is not None:
        go.touch()
        after = standby
        after.lines.clear()
    else:
        after = Proc(cmd, env)
    after.until("@first_step", args.timeout)
    after.p.kill()
    after.p.wait()
    return {k: v - at for k, v in milestones(after.lines).items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--ckpt", default="", help="the DCP checkpoint's directory (default: a temp)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)  # 24 x 1024: ~300 M + embeddings
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds: start no repetition that the slowest so far would carry past this "
        "(0: every one of --reps); results are written after each repetition either way",
    )
    p.add_argument(
        "--commit",
        default="",
        help="the commit a copy without git was made from (recorded as such, with dirty unknown)",
    )
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=Path("gpu-first-step.json"))
    args = p.parse_args()
    if args.trainer:
        return trainer(args)
    ways = [w for w in args.ways.split(",") if w]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        p.error(f"--ways: unknown {unknown} (accepted: {','.join(WAYS)})")
    origin = commit()  # the checkout as the run starts
    if origin["commit"] is None and args.commit:
        origin = {"commit": args.commit, "dirty": None, "commit_from": "--commit"}
    with tempfile.TemporaryDirectory(prefix="jsi-gpu-") as tmp:
        work = Path(tmp)
        args.ckpt = args.ckpt or str(work / "ckpt")
        began = time.time()
        first = Proc(base_cmd(args), dict(os.environ))  # writes the checkpoint once
        first.until("@step", args.timeout * 3)
        first.p.kill()
        first.p.wait()
        device = next(x.split(" ", 1)[1] for x in first.lines if x.startswith("@device "))
        size = sum(f.stat().st_size for f in Path(args.ckpt).rglob("*") if f.is_file())
        print(f"checkpoint: {size / 2**30:.2f} GiB in {time.time() - began:.1f} s", flush=True)
        runs: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
        slowest = 0.0
        for rep in range(args.reps):
            now = time.time()
            if rep and args.budget and now - began + slowest > args.budget:
                print(f"stopped after {rep} repetitions: --budget {args.budget:.0f} s", flush=True)
                break
            for way in ways:
                runs[way].append(one(args, way, work))
                print(f"rep {rep} {way}: {runs[way][-1]}", flush=True)
            slowest = max(slowest, time.time() - now)
            write(args, origin, device, size, runs)  # kept if a later repetition is cut off
    write(args, origin, device, size, runs, table=True)
    print(f"results: {args.out}")
    return 0


def write(
    args: argparse.Namespace,
    origin: dict[str, Any],
    device: str,
    size: int,
    runs: dict[str, list[dict[str, float]]],
    *,
    table: bool = False,
) -> None:
    """The results so far to ``--out`` (with ``table``, also printed as a table)."""
    import torch  # noqa: PLC0415

    runs = {w: rs for w, rs in runs.items() if rs}
    medians = {
        w: {m: statistics.median(r[m] for r in rs) for m in MILESTONES if all(m in r for r in rs)}
        for w, rs in runs.items()
    }
    if table:
        print("| way | " + " | ".join(MILESTONES[1:]) + " |")
        print("|---|" + "---|" * (len(MILESTONES) - 1))
        for w, med in medians.items():
            cells = [f"{med[m]:.2f}" if m in med else "-" for m in MILESTONES[1:]]
            print(f"| {w} | " + " | ".join(cells) + " |")
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **origin,
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "torch": torch.__version__,
        "device": device,
        "checkpoint_gib": round(size / 2**30, 3),
        "model": {k: getattr(args, k) for k in ("layers", "width", "heads", "vocab", "seq")},
        "runs": runs,
        "medians": medians,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
