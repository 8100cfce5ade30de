"""A distributed PyTorch trainer as users run it (no jobset-inplace import): started by
``torchrun`` (several workers per pod), ``DistributedDataParallel`` over gloo, checkpoints with
``torch.distributed.checkpoint`` (DCP) in torchtitan's layout, one shared directory.

Each worker computes a gradient of a linear regression on its own data shard; DDP averages the
gradients across every worker of every pod (gloo over TCP between the pods). Every
``SAVE_EVERY`` steps all workers save ``step-<S>`` with DCP (the coordinator writes
``.metadata`` last); at start they load the newest ``step-<S>`` that has ``.metadata``, as
torchtitan's checkpointer does: the only resume logic it has. It logs its steps and losses
(``step S loss L``) and, after a resume, ``resumed at step S loss L`` (the loss of the
restored parameters, recomputed over every worker); and where its start-up went, as a
training script's own logs say it: ``process started`` (before its imports), ``imported
torch``, ``process group ready``.

Environment: torchrun's (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), ``CHECKPOINT_DIR``,
``STEPS`` (default 400), ``SAVE_EVERY`` (default 10), ``STEP_SECONDS`` (default 0.1, a pause per
step so that a test can kill a worker mid-training).

Like a training loop in any language (docs/trainer-contract.md, "Hang detection: progress"),
local rank 0 writes the pod's progress record after each step where ``JSI_STATE_DIR`` is set.

Faults a user's trainer meets, for the crash tests: a worker that finds the file
``fault-rank-<RANK>`` in ``CHECKPOINT_DIR`` at a step removes it, logs ``fault: <kind>`` and
has that fault: ``segv`` (a segmentation fault in native code), ``abort`` (SIGABRT, as NCCL's
watchdog ends a process), ``exception`` (an uncaught Python exception), ``oom`` (allocates
until its container's memory limit has the kernel kill it), ``hang`` (stops taking part: the
other ranks wait in their next collective).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

RANK = os.environ.get("RANK", "?")  # torchrun's


def log(msg: str) -> None:
    # one write per line: the pod's workers share its stdout
    sys.stdout.write(f"[rank {RANK}] {msg}\n")
    sys.stdout.flush()


log("process started")

import torch  # noqa: E402 (after the first log line: the import's time is measured)
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

log("imported torch")

STEP_DIR = re.compile(r"step-(\d+)")
FAULTS = ("segv", "abort", "exception", "oom", "hang")


def fault(root: Path) -> None:
    """Have the fault this worker was told to have, if any (see the module's docstring)."""
    path = root / f"fault-rank-{RANK}"
    try:
        kind = path.read_text().strip()
        path.unlink()
    except FileNotFoundError:
        return
    log(f"fault: {kind}")
    if kind == "segv":
        import ctypes  # noqa: PLC0415

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif kind == "abort":
        os.abort()
    elif kind == "exception":
        raise RuntimeError("an uncaught exception in the training loop")
    elif kind == "oom":
        held = []
        while True:  # each chunk written, so resident: until the cgroup's OOM kill
            held.append(b"\x01" * (64 << 20))
    elif kind == "hang":
        while True:
            time.sleep(60)
    else:
        raise ValueError(f"fault-rank-{RANK}: {kind!r} is not one of {FAULTS}")


def report_progress(step: int) -> None:
    """The pod's progress record (local rank 0 only), as the trainer contract writes it."""
    state = os.environ.get("JSI_STATE_DIR")
    if not state or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    name = os.environ.get("JSI_CONTAINER_NAME", "trainer")
    path = Path(state) / f"progress-{name}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"step": step, "at": time.time()}))
    os.replace(tmp, path)


def newest_step(root: Path) -> int | None:
    """The newest complete checkpoint (``step-<S>`` holding ``.metadata``), as torchtitan's
    ``_find_load_step``; None: none."""
    steps = [
        int(m.group(1))
        for p in (root.iterdir() if root.is_dir() else ())
        if (m := STEP_DIR.fullmatch(p.name)) and (p / ".metadata").exists()
    ]
    return max(steps, default=None)


def main() -> int:
    dist.init_process_group("gloo")
    log("process group ready")
    torch.manual_seed(0)
    steps = int(os.environ.get("STEPS", "400"))
    save_every = int(os.environ.get("SAVE_EVERY", "10"))
    pause = float(os.environ.get("STEP_SECONDS", "0.1"))
    root = Path(os.environ["CHECKPOINT_DIR"])
    world = int(dist.get_world_size())

    # y = x . w_true on this worker's own shard
    gen = torch.Generator().manual_seed(1234 + dist.get_rank())
    x = torch.randn(256, 8, generator=gen)
    y = x @ torch.arange(1.0, 9.0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1, bias=False))
    with torch.no_grad():
        model.module.weight.zero_()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def global_loss() -> float:
        with torch.no_grad():
            loss = torch.mean((model.module(x).squeeze(1) - y) ** 2)
        dist.all_reduce(loss)
        return float(loss) / world

    start = newest_step(root)
    if start is None:
        start = 0
        log(f"started {world} workers, no checkpoint: from step 0")
    else:
        state = {"model": model.module.state_dict()}
        dcp.load(state, checkpoint_id=str(root / f"step-{start}"))
        model.module.load_state_dict(state["model"])
        log(f"resumed at step {start} loss {global_loss():.6e}")
    for step in range(start + 1, steps + 1):
        optimizer.zero_grad()
        loss = torch.mean((model(x).squeeze(1) - y) ** 2)
        loss.backward()  # DDP: the gradient averaged over every worker
        optimizer.step()
        # the loss of the parameters before this step (after step - 1), over every worker
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        log(f"step {step} loss {float(mean) / world:.6e}")
        if step % save_every == 0:
            dcp.save({"model": model.module.state_dict()}, checkpoint_id=str(root / f"step-{step}"))
        report_progress(step)
        fault(root)
        time.sleep(pause)
    log("done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
