"""Fine-tuning with the Hugging Face Trainer as users write it (no jobset-inplace import):
examples/hf-trainer.yaml's ``/app/finetune.py`` in the ``pytorch-examples`` image.

Run by ``torchrun`` (one process per pod in the example), its arguments are the Trainer's own
(``HfArgumentParser(TrainingArguments)``: ``--output_dir``, ``--save_steps``,
``--save_on_each_node``, ...) plus this script's :class:`ScriptArguments`. It trains a small
BERT classifier (built from a config: nothing is downloaded) on a synthetic dataset that a
model can learn (the label is whether the first token is in the lower half of the
vocabulary), and resumes as the Trainer's documentation says to: from
``get_last_checkpoint(output_dir)``, the newest ``checkpoint-<step>/``. That is the only resume
logic it has; jobset-inplace's ``hf-trainer`` layout makes that newest checkpoint the gang's
step (docs/integrations.md).

It logs, one line each: ``resumed at step S`` or ``no checkpoint: training from step 0``, then
``step S loss L`` (every ``--logging_steps``) and ``step S: checkpoint saved``, each prefixed
with ``[rank R]`` (torchrun's ``RANK``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

RANK = os.environ.get("RANK", "?")  # torchrun's


def log(msg: str) -> None:
    sys.stdout.write(f"[rank {RANK}] {msg}\n")
    sys.stdout.flush()


@dataclass
class ScriptArguments:
    examples: int = field(default=200_000, metadata={"help": "size of the synthetic dataset"})
    seq_len: int = field(default=32, metadata={"help": "tokens per example"})
    vocab: int = field(default=1000, metadata={"help": "vocabulary size"})
    step_seconds: float = field(
        default=0.1, metadata={"help": "a pause after each step (so a demo can kill mid-run)"}
    )


class SyntheticTexts(torch.utils.data.Dataset[dict[str, Any]]):  # type: ignore[misc]
    """Example ``i``: tokens drawn from seed ``i``; label 1 where the first token is in the
    lower half of the vocabulary."""

    def __init__(self, size: int, seq_len: int, vocab: int) -> None:
        self.size, self.seq_len, self.vocab = size, seq_len, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = torch.randint(
            1, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(i)
        )
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": int(ids[0] < self.vocab // 2),
        }


class Progress(TrainerCallback):  # type: ignore[misc]
    """The script's log lines, and the pause after each step."""

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            log(f"step {state.global_step} loss {logs['loss']:.6f}")

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        log(f"step {state.global_step}: checkpoint saved")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        time.sleep(self.step_seconds)


def main() -> None:
    if not torch.cuda.is_available():
        # accelerate makes a CPU-only gang distributed (gloo) only when told it is on CPU
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    script, args = HfArgumentParser(
        (ScriptArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if last is None:
        log("no checkpoint: training from step 0")
    else:
        log(f"resumed at step {int(last.rsplit('-', 1)[1])}")
    set_seed(args.seed)
    config = BertConfig(
        vocab_size=script.vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=script.seq_len,
        num_labels=2,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=args,
        train_dataset=SyntheticTexts(script.examples, script.seq_len, script.vocab),
        callbacks=[Progress(script.step_seconds)],
    )
    trainer.train(resume_from_checkpoint=last)
    if torch.distributed.is_initialized():
        # without this, gloo's threads can abort the exiting process ("terminate called without
        # an active exception": SIGABRT), a failure at the very end of a finished run
        torch.distributed.destroy_process_group()
    log("training done")


if __name__ == "__main__":
    main()
