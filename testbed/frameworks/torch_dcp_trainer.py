"""A distributed PyTorch trainer as users run it (no jobset-inplace import): started by
``torchrun`` (several workers per pod), ``DistributedDataParallel`` over gloo, checkpoints with
``torch.distributed.checkpoint`` (DCP) in torchtitan's layout, one shared directory.

``MODEL`` picks what is trained. ``linear`` (the default: 8 parameters, for the tests): each
worker computes a gradient of a linear regression on its own data shard, SGD. ``transformer``: a
decoder-only transformer as a user's (``MODEL_DIM`` 768, ``MODEL_LAYERS`` 12, ``MODEL_HEADS`` 12,
``VOCAB`` 32000, tied embedding: 110 M parameters at the defaults), next-token loss on a batch
of ``BATCH`` x ``SEQ_LEN`` (1 x 64) tokens drawn from each step's and rank's seed, AdamW; its
checkpoint holds the model and AdamW's two moments (1.3 GB at the defaults), so that building
the model and restoring it sit on a restart's critical path as they do for users. Either way
DDP averages the gradients across every worker of every pod (gloo over TCP between the pods).

Every ``SAVE_EVERY`` steps all workers save ``step-<S>`` with DCP (the model's and the
optimizer's state, ``torch.distributed.checkpoint.state_dict``; the coordinator writes
``.metadata`` last); at start they load the newest ``step-<S>`` that has ``.metadata``, as
torchtitan's checkpointer does: the only resume logic it has. It logs its steps and losses
(``step S loss L``) and, after a resume, ``resumed at step S loss L`` (the loss of the
restored parameters, recomputed over every worker); and where its start-up went, as a
training script's own logs say it: ``process started`` (before its imports), ``imported
torch``, ``process group ready``, ``model built`` (the model, DDP's wrapper and the optimizer).

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

import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def rank() -> str:
    """This worker's rank (torchrun's; a warm standby has it once released)."""
    return os.environ.get("RANK", "?")


def log(msg: str) -> None:
    # one write per line: the pod's workers share its stdout
    sys.stdout.write(f"[rank {rank()}] {msg}\n")
    sys.stdout.flush()


log("process started")

import torch  # noqa: E402 (after the first log line: the import's time is measured)
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

log("imported torch")

STEP_DIR = re.compile(r"step-(\d+)")
FAULTS = ("segv", "abort", "exception", "oom", "hang")


def fault(root: Path) -> None:
    """Have the fault this worker was told to have, if any (see the module's docstring)."""
    path = root / f"fault-rank-{rank()}"
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
        raise ValueError(f"fault-rank-{rank()}: {kind!r} is not one of {FAULTS}")


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


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


class Regression(torch.nn.Module):  # type: ignore[misc]  # (torch: Any to mypy here)
    """``MODEL=linear``: y = x . w_true on this worker's own shard (8 parameters)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1, bias=False)
        torch.nn.init.zeros_(self.linear.weight)
        self.set_rank(rank)

    def set_rank(self, rank: int) -> None:
        """This worker's shard (a warm standby learns its rank only at its word)."""
        gen = torch.Generator().manual_seed(1234 + rank)
        self.x = torch.randn(256, 8, generator=gen)
        self.y = self.x @ torch.arange(1.0, 9.0)

    def loss(self, model: torch.nn.Module, step: int) -> torch.Tensor:
        return torch.mean((model(self.x).squeeze(1) - self.y) ** 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Transformer(torch.nn.Module):  # type: ignore[misc]
    """``MODEL=transformer``: a decoder-only transformer (pre-norm blocks, causal attention,
    the output projection tied to the token embedding)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        dim, layers = env_int("MODEL_DIM", 768), env_int("MODEL_LAYERS", 12)
        self.vocab, self.seq, self.batch = (
            env_int("VOCAB", 32000),
            env_int("SEQ_LEN", 64),
            env_int("BATCH", 1),
        )
        self.embed = torch.nn.Embedding(self.vocab, dim)
        self.position = torch.nn.Parameter(torch.zeros(self.seq, dim))
        block = torch.nn.TransformerEncoderLayer(
            dim, env_int("MODEL_HEADS", 12), 4 * dim, dropout=0.0, batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)
        self.mask = torch.nn.Transformer.generate_square_subsequent_mask(self.seq)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # as GPT-2's (logits near 0)

    def set_rank(self, rank: int) -> None:
        """This worker's batches (a warm standby learns its rank only at its word)."""
        self.rank = rank

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position
        h = self.norm(self.blocks(h, mask=self.mask, is_causal=True))
        return h @ self.embed.weight.T

    def loss(self, model: torch.nn.Module, step: int) -> torch.Tensor:
        """Next-token loss on the batch of ``step`` (the same batch after a resume)."""
        gen = torch.Generator().manual_seed(step * 1_000_003 + self.rank)
        tokens = torch.randint(self.vocab, (self.batch, self.seq + 1), generator=gen)
        logits = model(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, self.vocab), tokens[:, 1:].reshape(-1)
        )


class NoKeeper:
    """Without ``KEEP_STEP``: the trainer as users write it, nothing kept on a failure."""

    def __enter__(self) -> NoKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @contextlib.contextmanager
    def update(self, step: int) -> Iterator[None]:
        yield

    def saved(self, step: int) -> None:
        return None


def step_keeper(
    net: torch.nn.Module, optimizer: torch.optim.Optimizer, root: Path, start: int
) -> Any:
    """``KEEP_STEP=1``: the step a failure interrupts is kept (jobset_inplace.trainer.keep,
    the few lines docs/trainer-contract.md shows): this worker saves its whole state (DDP:
    every worker holds all of it) alone, without a collective, as ``step-<S>``; the first
    worker to finish publishes it."""
    if os.environ.get("KEEP_STEP") != "1":
        return NoKeeper()
    from jobset_inplace.trainer.keep import StepKeeper, publish_dir  # noqa: PLC0415

    def save(step: int) -> None:
        target = root / f"step-{step}"
        if (target / ".metadata").exists():
            return
        model_state, optim_state = get_state_dict(net, optimizer)
        finished = root / f".kept-{step}-rank-{rank()}"  # no "step-": no layout reads it
        shutil.rmtree(finished, ignore_errors=True)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(finished),
                 no_dist=True)  # fmt: skip
        published = publish_dir(finished, target)
        log(f"kept step {step}" + ("" if published else " (another worker's was there first)"))

    return StepKeeper(save, step=start)


MODELS: dict[str, type[Regression] | type[Transformer]] = {
    "linear": Regression,
    "transformer": Transformer,
}


def build(kind: str, rank: int) -> tuple[Regression | Transformer, torch.optim.Optimizer]:
    """The model (seeded: every rank's alike, as DDP's first broadcast would make them) and
    its optimizer."""
    torch.manual_seed(0)
    net: Regression | Transformer = MODELS[kind](rank)
    if kind == "linear":
        return net, torch.optim.SGD(net.parameters(), lr=0.05)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-4)


def restore(
    net: torch.nn.Module, optimizer: torch.optim.Optimizer, root: Path, step: int, **kw: Any
) -> None:
    """Load ``step-<step>`` into the model and optimizer (``no_dist=True``: without a process
    group, as a warm standby loads)."""
    model_state, optim_state = get_state_dict(net, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(root / f"step-{step}"), **kw)
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def warm_start(
    kind: str, root: Path
) -> tuple[Regression | Transformer, torch.optim.Optimizer, int | None, dict[str, Any]]:
    """``WARM=1`` (jobset-inplace's ``prestart-warm``, docs/trainer-contract.md): the model
    built and the newest checkpoint loaded before the epoch's word, by
    ``jobset_inplace.trainer.standby.wait``; (model, optimizer, the resume step, DDP's
    arguments). The process group only after the word."""
    from jobset_inplace.trainer import standby  # noqa: PLC0415

    held: dict[str, Any] = {}

    def load(step: int | None) -> None:
        if step is None:  # from scratch: undo a speculative load
            held["net"], held["optim"] = build(kind, 0)
        else:
            restore(held["net"], held["optim"], root, step, no_dist=True)

    held["net"], held["optim"] = build(kind, 0)
    run = standby.wait(
        load, lambda: newest_step(root), marker=lambda s: root / f"step-{s}" / ".metadata"
    )
    log(f"released: resume step {run.resume_step}, loaded {run.loaded_step}, warm {run.warm}")
    held["net"].set_rank(int(os.environ["RANK"]))
    return held["net"], held["optim"], run.resume_step, standby.ddp_kwargs(run)


def main() -> int:
    kind = os.environ.get("MODEL", "linear")
    if kind not in MODELS:
        raise ValueError(f"MODEL: {kind!r} is not one of {sorted(MODELS)}")
    steps = int(os.environ.get("STEPS", "400"))
    save_every = int(os.environ.get("SAVE_EVERY", "10"))
    pause = float(os.environ.get("STEP_SECONDS", "0.1"))
    root = Path(os.environ["CHECKPOINT_DIR"])
    warm = os.environ.get("WARM") == "1"
    if warm:
        net, optimizer, start, ddp_kwargs = warm_start(kind, root)
    dist.init_process_group("gloo")
    log("process group ready")
    world = int(dist.get_world_size())
    if not warm:
        net, optimizer = build(kind, dist.get_rank())
        start, ddp_kwargs = newest_step(root), {}
    model = DistributedDataParallel(net, **ddp_kwargs)
    count = sum(p.numel() for p in net.parameters())
    log(f"model built: {kind}, {count} parameters")

    def global_loss(step: int) -> float:
        with torch.no_grad():
            loss = net.loss(net, step)
        dist.all_reduce(loss)
        return float(loss) / world

    if start is None:
        start = 0
        log(f"started {world} workers, no checkpoint: from step 0")
    else:
        if not warm:
            restore(net, optimizer, root, start)
        # the loss of the restored parameters on the next step's batch: the loss that step
        # logged before the crash
        log(f"resumed at step {start} loss {global_loss(start + 1):.6e}")
    keeper = step_keeper(net, optimizer, root, start)
    with keeper:
        for step in range(start + 1, steps + 1):
            optimizer.zero_grad()
            loss = net.loss(model, step)
            loss.backward()  # DDP: the gradient averaged over every worker
            with keeper.update(step):
                optimizer.step()
            # the loss of the parameters before this step (after step - 1), over every worker
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            log(f"step {step} loss {float(mean) / world:.6e}")
            if step % save_every == 0:
                model_state, optim_state = get_state_dict(net, optimizer)
                state = {"model": model_state, "optim": optim_state}
                dcp.save(state, checkpoint_id=str(root / f"step-{step}"))
                keeper.saved(step)
            report_progress(step)
            fault(root)
            time.sleep(pause)
    log("done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
