"""Shell completion through kubectl's own (kubectl 1.26 and later): for ``kubectl
jobset-inplace <TAB>`` kubectl runs the executable ``kubectl_complete-jobset_inplace`` with the
words typed after the plugin's name (the last one being completed, maybe empty) and reads one
completion per line, then a line ``:<directive>`` (cobra's ``ShellCompDirective``).

Subcommands, flags and ``-o`` values come from the plugin's own parser (one definition); gang
names for ``status``/``history``/``restart`` from the GangStates of the namespace the typed
flags select. Completion never fails loudly: an unreachable cluster completes nothing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import IO, Optional

from .cli import build_parser
from .cluster import connect

# cobra's ShellCompDirective values
DEFAULT = 0  # the shell may also complete file names
NO_FILES = 4
GANG_COMMANDS = frozenset({"status", "history", "restart"})

# (Optional: evaluated at import, on Python 3.9 too: jobset_inplace/strenum.py)
GangLister = Callable[[Optional[str], Optional[str], Optional[str]], list[str]]  # noqa: UP045


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def _takes_value(action: argparse.Action | None) -> bool:
    return action is not None and action.nargs != 0


def completions(words: Sequence[str], gangs: GangLister) -> tuple[list[str], int]:
    """What completes the last of ``words`` (the words after ``kubectl jobset-inplace``), and
    the directive."""
    top = build_parser()
    commands = _subparsers(top)
    typed, current = list(words[:-1]), words[-1] if words else ""
    name, flags, positionals = _read(top, commands, typed)
    options = _options(commands[name] if name else top)
    value = _flag_value(options, typed, current)
    if value is not None:
        return value
    if current.startswith("-"):
        return sorted(o for o in options if o.startswith(current)), NO_FILES
    if not name:
        return sorted(c for c in commands if c.startswith(current)), NO_FILES
    if name not in GANG_COMMANDS or positionals:
        return [], NO_FILES

    def flag(*keys: str) -> str | None:
        return next((flags[k] for k in keys if flags.get(k)), None)

    try:
        found = gangs(flag("--kubeconfig"), flag("--context"), flag("-n", "--namespace"))
    except Exception:  # no cluster, no rights: nothing to offer
        found = []
    return sorted(g for g in found if g.startswith(current)), NO_FILES


def _read(
    top: argparse.ArgumentParser,
    commands: dict[str, argparse.ArgumentParser],
    typed: Sequence[str],
) -> tuple[str, dict[str, str], int]:
    """The subcommand typed (``""``: none yet), the flags given with a value, and how many
    positional words follow the subcommand."""
    name, flags, positionals, i = "", dict[str, str](), 0, 0
    while i < len(typed):
        word = typed[i]
        options = _options(commands[name] if name else top)
        key, _, inline = word.partition("=")
        if word.startswith("-") and inline:
            flags[key] = inline
        elif word.startswith("-") and _takes_value(options.get(key)):
            flags[key] = typed[i + 1] if i + 1 < len(typed) else ""
            i += 1
        elif not word.startswith("-") and not name and word in commands:
            name = word
        elif not word.startswith("-"):
            positionals += 1
        i += 1
    return name, flags, positionals


def _flag_value(
    options: dict[str, argparse.Action], typed: Sequence[str], current: str
) -> tuple[list[str], int] | None:
    """Completions of a flag's value (``-o <TAB>``, ``--output=<TAB>``); None: not one."""
    if current.startswith("-") and "=" in current:
        key, _, value = current.partition("=")
        choices = (options[key].choices or []) if key in options else []
        return [f"{key}={c}" for c in choices if str(c).startswith(value)], NO_FILES
    last = typed[-1] if typed else ""
    action = options.get(last) if last.startswith("-") and "=" not in last else None
    if action is None or not _takes_value(action):
        return None
    if action.choices:
        return [str(c) for c in action.choices if str(c).startswith(current)], NO_FILES
    return [], DEFAULT if action.dest == "filename" else NO_FILES


def gang_names(kubeconfig: str | None, context: str | None, namespace: str | None) -> list[str]:
    """The gangs of the selected namespace (their GangStates' names)."""
    cluster = connect(kubeconfig, context, namespace)
    cluster.set_request_timeout(5.0)  # a completion must not hang the shell
    return [str(g["metadata"]["name"]) for g in cluster.gangstates()]


def main(argv: list[str] | None = None, out: IO[str] | None = None) -> int:
    """``kubectl_complete-jobset_inplace WORD...``"""
    found, directive = completions(sys.argv[1:] if argv is None else argv, gang_names)
    stream = out or sys.stdout
    for line in found:
        stream.write(f"{line}\n")
    stream.write(f":{directive}\n")
    return 0
