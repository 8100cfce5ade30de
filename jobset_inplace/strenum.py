"""``StrEnum`` on every Python the kubectl plugin runs on (3.9 and later: its own distribution,
docs/kubectl-plugin.md): the standard library's from 3.11, the same behaviour before (members
are ``str``; ``str()`` and ``format()`` give the value). The controller and the agent need 3.11
and get the standard library's."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):  # noqa: UP036 (the plugin supports 3.9: its own distribution)
    from enum import StrEnum
else:

    class StrEnum(str, Enum):  # noqa: UP042 (3.9 and 3.10 have no enum.StrEnum)
        """Members that are their values, as ``enum.StrEnum`` (3.11)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


__all__ = ["StrEnum"]
