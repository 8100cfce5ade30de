"""The pre-started trainer's hook: a ``sitecustomize`` that does a trainer's fixed start-up
costs before its epoch (process restart scope, with ``jobset-inplace.dev/prestart-imports``).

The launcher (:mod:`jobset_inplace.launcher`) keeps the next epoch's command started and held
(a standby) while the running one trains, with this file's directory first on
``PYTHONPATH``. In every Python process of that command this hook runs before the process's
own code, and:

1. runs the image's own ``sitecustomize``, if it has one (this hook takes its name);
2. imports the modules of ``JSI_PRESTART_IMPORTS`` (``torch,numpy``): the interpreter's start
   and those imports are done before the epoch is;
3. refuses to hold a CUDA context (an import that initialised CUDA would keep a device context
   beside the running epoch's): exits ``EXIT_CUDA`` and the launcher starts the epoch cold;
4. waits for the launcher's word: a shared ``flock`` on ``$JSI_PRESTART_GO.lock``, which the
   launcher holds exclusively until the next epoch's barrier opens; then reads the epoch and
   the step to resume from ``$JSI_PRESTART_GO`` (written before the lock is released) into
   ``JSI_EPOCH`` and ``JSI_RESUME_STEP``, as a cold start gets them, and returns: the
   command's entry point runs.

So ``python3 train.py`` starts training the moment the barrier opens, its imports done. A
``torchrun`` command waits the same way (its rendezvous binds ports the running epoch holds),
so its own start and imports are done, but its workers start after the word, as cold ones
(they are new processes it starts). What a pre-import cannot do: a module that reads the
epoch, the step or the checkpoint *at import time* reads them before they are known (import
it in the script instead); the waiting processes hold their memory.

Standard library only, Python 3.8 compatible, imports nothing of ``jobset_inplace``: it runs
on the trainer's interpreter from the state volume.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time

ENV_IMPORTS = "JSI_PRESTART_IMPORTS"
ENV_GO = "JSI_PRESTART_GO"  # the word's file; its lock is this path + ".lock"
ENV_EPOCH = "JSI_EPOCH"  # (the launcher's names, for the trainer)
ENV_RESUME_STEP = "JSI_RESUME_STEP"
HOOK_DIR = "prestart"  # under the state directory: this file as sitecustomize.py
# torchrun's console script: a command may start with it (it is a Python script).
PYTHON_SCRIPTS = ("torchrun",)
PYTHON = re.compile(r"python[0-9.]*")
SKIPS_HOOK = "EIS"  # -E and -I ignore PYTHONPATH; -S imports no site, so no sitecustomize
EXIT_CUDA = 86  # an import initialised CUDA: refused (the launcher starts cold)
EXIT_NO_WORD = 87  # the lock was released without a word: the launcher is gone


def _log(message: str) -> None:
    t = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
    sys.stderr.write(f"{stamp} jobset-inplace prestart[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


def python_argv(argv: list[str]) -> tuple[str, str, str]:
    """(short flags, kind, name) of an interpreter's arguments (``sys.orig_argv``: the
    interpreter, its options, then ``-m MOD``, ``-c CODE`` or a script; short options may be
    clustered, as in ``-um torch.distributed.run``). kind: "module" (name: the module),
    "script" (name: its path) or "code" (``-c``, stdin)."""
    flags = ""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-" or not arg.startswith("-"):
            return (flags, "script", arg) if arg != "-" else (flags, "code", "")
        if arg.startswith("--"):  # --check-hash-based-pycs takes a value
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for j, flag in enumerate(arg[1:], start=1):
            rest = arg[j + 1 :]
            if flag == "m":
                return (flags, "module", rest or (argv[i + 1] if i + 1 < len(argv) else ""))
            if flag == "c":
                return (flags, "code", "")
            if flag in "WX":  # a value: the rest of this argument, or the next one
                i += 0 if rest else 1
                break
            flags += flag
        i += 1
    return (flags, "code", "")  # stdin or the interactive prompt


def refusal(command: list[str]) -> str | None:
    """Why ``command`` cannot be pre-started (None: it can). The hook must run before any of
    the command's own code: the command must start Python itself (not a shell, which would run
    its other commands before the barrier), reading ``PYTHONPATH`` and ``site``."""
    name = os.path.basename(command[0]) if command else ""
    if name in PYTHON_SCRIPTS:
        return None
    if not PYTHON.fullmatch(name):
        return (
            f"it starts {name!r}, not Python: the command must be python3 ..., python3 -m ... "
            "or torchrun ... (a shell or another program would run before the barrier)"
        )
    skipped = sorted(set(python_argv(command)[0]) & set(SKIPS_HOOK))
    if skipped:
        return (
            f"python -{''.join(skipped)} ignores PYTHONPATH or site (the pre-start hook would "
            "not run): drop that option"
        )
    return None


def _image_sitecustomize() -> None:
    """The image's own sitecustomize, which this file's name hides, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    check = getattr(cuda, "is_initialized", None)
    return bool(check()) if callable(check) else False


def wait_for_word(go: str) -> tuple[str, str] | None:
    """Block until the launcher releases the lock; (epoch, resume step) from its word (None:
    released without one)."""
    import fcntl  # noqa: PLC0415  (Linux only, as the launcher)

    with open(go + ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
        try:
            with open(go, encoding="utf-8") as f:
                word = json.load(f)
        except (OSError, ValueError):
            return None
    if not isinstance(word, dict):
        return None
    step = word.get("resumeStep")
    return str(word.get("epoch", "")), "" if step is None else str(step)


def run() -> None:
    go = os.environ.get(ENV_GO)
    _image_sitecustomize()
    if not go:
        return  # started cold (or the word was given before this process began): nothing to do
    began = time.monotonic()
    names = [n.strip() for n in os.environ.get(ENV_IMPORTS, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the trainer's own import will say it again, in its epoch
            _log(f"import {name} failed: {type(e).__name__}: {e}")
    if _cuda_initialised():
        _log("an import initialised CUDA: a device context must not wait beside the running epoch")
        os._exit(EXIT_CUDA)
    _log(f"imported {','.join(names)} in {time.monotonic() - began:.2f} s; waiting for an epoch")
    word = wait_for_word(go)
    if word is None:
        _log("released without a word (the launcher is gone): exiting")
        os._exit(EXIT_NO_WORD)
    os.environ[ENV_EPOCH], os.environ[ENV_RESUME_STEP] = word
    del os.environ[ENV_GO]  # the trainer's own children start as any child would
    _log(f"epoch {word[0]}: go (resume step {word[1] or 'none'})")


if __name__ == "sitecustomize":
    run()
