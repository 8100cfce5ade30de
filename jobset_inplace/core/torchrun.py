"""What a container's command says about ``torchrun`` (PyTorch's elastic launcher), as pure
functions over its argv: whether it restarts failed workers by itself.

``torchrun --max-restarts N`` (N > 0) restarts every local worker after a worker fails, without
the container exiting: the launcher (process scope) and the kubelet (pod scope) never see the
failure, so the gang is not recovered together and resumes from no agreed step. With the
default (0) a worker failure ends ``torchrun`` non-zero, which is the failure signal."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})
# how torchrun is started: its console script, or the modules behind it
MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
MAX_RESTARTS_FLAGS = ("--max-restarts", "--max_restarts")
MAX_RESTARTS_ENV = "PET_MAX_RESTARTS"  # torchrun reads every option from PET_<NAME> too
# torchrun's options that take no value (torch/distributed/run.py, ``check_env``); every other
# option takes one, and the first argument that is neither is the training script.
FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)


def _basename(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


def _torchrun_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``torchrun`` (or ``python -m torch.distributed.run``) in one
    command, or None if it does not start torchrun."""
    for i, arg in enumerate(argv):
        if _basename(arg) == "torchrun":
            return list(argv[i + 1 :])
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in MODULES:
            return list(argv[i + 2 :])
    return None


def _commands(argv: Sequence[str]) -> list[list[str]]:
    """The command itself, and each command of a ``sh -c "..."`` script it runs."""
    out = [list(argv)]
    if len(argv) >= 3 and _basename(argv[0]) in SHELLS and argv[1] in ("-c", "-ec", "-ce"):
        try:
            words = shlex.split(argv[2], comments=True)
        except ValueError:  # unbalanced quotes: the shell will say so
            return out
        command: list[str] = []
        for word in [*words, ";"]:
            if word in (";", "&&", "||", "|", "&"):
                out.append(command)
                command = []
            else:
                command.append(word)
    return out


def _option(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value torchrun's ``args`` give the option ``names`` (the last one wins, as in
    argparse), scanning its options only: not the training script's own arguments."""
    value, i = None, 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        if not flag.startswith("-") or flag == "--":
            break  # the training script: what follows are its own arguments
        if flag in FLAGS or eq:
            value = inline if flag in names and eq else value
            i += 1
            continue
        if flag in names:
            value = args[i + 1] if i + 1 < len(args) else ""
        i += 2
    return value


def max_restarts(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """The ``--max-restarts`` a container's command (``argv``, with its ``env``) gives
    ``torchrun`` (its default 0 when neither sets it); None when it starts no torchrun or the
    value is not a number."""
    found: int | None = None
    for command in _commands(argv):
        args = _torchrun_args(command)
        if args is None:
            continue
        value = _option(args, MAX_RESTARTS_FLAGS)
        if value is None:
            value = env.get(MAX_RESTARTS_ENV, "0")
        try:
            restarts = int(value)
        except ValueError:
            continue
        found = max(found or 0, restarts)
    return found


# torchrun's options that fix a node's identity or where rank 0 is (torch/distributed/run.py),
# and the rendezvous that ranks nodes by their addresses (dynamic_rendezvous.py sorts the
# participants): none can serve a gang whose spares take members' ranks (docs/design/hot-spares.md).
IDENTITY_OPTIONS = (
    ("--node-rank", "--node_rank"),
    ("--master-addr", "--master_addr"),
    ("--rdzv-endpoint", "--rdzv_endpoint"),
)
RDZV_BACKEND_FLAGS = ("--rdzv-backend", "--rdzv_backend")


def identity_options(argv: Sequence[str]) -> str | None:
    """The first torchrun option of a container's command (``argv``) that fixes its node's
    rank or rendezvous host, or a rendezvous backend other than ``static`` (as ``--option
    value``); None when it starts no torchrun or sets none of them."""
    for command in _commands(argv):
        args = _torchrun_args(command)
        if args is None:
            continue
        for flags in IDENTITY_OPTIONS:
            value = _option(args, flags)
            if value is not None:
                return f"{flags[0]} {value}"
        backend = _option(args, RDZV_BACKEND_FLAGS)
        if backend not in (None, "static"):
            return f"{RDZV_BACKEND_FLAGS[0]} {backend}"
    return None
