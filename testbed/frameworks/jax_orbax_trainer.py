"""A distributed trainer written only against JAX and Orbax (no jobset-inplace import): the
real-framework case of docs/integrations.md.

Every JobSet member is one JAX process (``jax.distributed``: member 0's JobSet name is the
coordinator, found through cluster DNS); each step computes a gradient on the member's own data
shard and averages it across processes with a real collective (``pmean`` over every process's
CPU device, gloo over TCP between the pods). Orbax's ``CheckpointManager`` saves every
``SAVE_EVERY`` steps into one shared directory and, at start, the trainer resumes from
``latest_step()``: the only resume logic it has, as a user's trainer would. It logs its steps
and losses (``step S loss L``) and, after a resume, ``resumed at step S loss L`` (the loss of
the restored parameters, recomputed).

Environment: ``JAX_COORDINATOR`` (host:port of process 0), ``JAX_NUM_PROCESSES``,
``JAX_PROCESS_ID``, ``CHECKPOINT_DIR``, ``STEPS`` (default 400), ``SAVE_EVERY`` (default 10),
``STEP_SECONDS`` (default 0.1, a pause per step so that a test can kill it mid-training).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")


def log(msg: str) -> None:
    print(f"[process {jax.process_index()}] {msg}", flush=True)


def main() -> int:
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
        initialization_timeout=120,
    )
    steps = int(os.environ.get("STEPS", "400"))
    save_every = int(os.environ.get("SAVE_EVERY", "10"))
    pause = float(os.environ.get("STEP_SECONDS", "0.1"))
    n = jax.process_count()

    # Linear regression y = x . w_true: each process holds its own shard of the data.
    rng = np.random.default_rng(1234 + jax.process_index())
    w_true = np.arange(1.0, 9.0, dtype=np.float32)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = x @ w_true

    def loss_fn(w: jax.Array) -> jax.Array:
        return jnp.mean((x @ w - y) ** 2)

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    # The mean over every process's device: a cross-process collective each step.
    average = jax.pmap(lambda v: jax.lax.pmean(v, "p"), axis_name="p")

    def global_loss_and_grad(w: jax.Array) -> tuple[float, jax.Array]:
        loss, grad = grad_fn(w)
        both = jnp.concatenate([grad, loss[None]])[None]  # this process's one local device
        mean = np.asarray(average(both))[0]
        return float(mean[-1]), jnp.asarray(mean[:-1])

    manager = ocp.CheckpointManager(
        os.environ["CHECKPOINT_DIR"],
        options=ocp.CheckpointManagerOptions(max_to_keep=50, save_interval_steps=save_every),
    )
    start = manager.latest_step()
    w = jnp.zeros(8, dtype=jnp.float32)
    if start is None:
        start = 0
        log(f"started {n} processes, no checkpoint: from step 0")
    else:
        # (the parameters as a NumPy array: every process holds them whole)
        restored = manager.restore(
            start, args=ocp.args.StandardRestore({"w": np.zeros(8, np.float32)})
        )
        w = jnp.asarray(restored["w"])
        loss, _ = global_loss_and_grad(w)
        log(f"resumed at step {start} loss {loss:.6e}")
    for step in range(start + 1, steps + 1):
        loss, grad = global_loss_and_grad(w)
        w = w - 0.05 * grad
        # ``loss`` is that of the parameters before this step, i.e. after step - 1.
        log(f"step {step} loss {loss:.6e}")
        manager.save(step, args=ocp.args.StandardSave({"w": np.asarray(w)}))
        time.sleep(pause)
    manager.wait_until_finished()
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
