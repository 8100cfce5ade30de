"""The plugin's exit codes, defined once (also listed in docs/kubectl-plugin.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # The operation failed: invalid input (transform/policy error), a doctor check FAILed, an
    # API error, a JobSet that has not opted in.
    FAILED = 1
    # Bad usage, or a confirmation that was needed and not given (no TTY, or answered no).
    USAGE = 2
    # The JobSet or its GangState does not exist.
    NOT_FOUND = 3
    # No usable kubeconfig / cluster not reachable.
    NO_CLUSTER = 4
