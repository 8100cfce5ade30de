"""The one "404 Not Found means absent" helper for code on the ``kubernetes`` client: the
controller's adapters, the kubectl plugin and the test infrastructure. (Not for the decision
core, which never imports kubernetes, nor the agent, which has its own standard-library
client.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

__all__ = ["or_none"]

T = TypeVar("T")


# Callable[..., T] rather than a ParamSpec: mypy rejects a ParamSpec call with unpacked
# arguments (or_none(api.get, *where, name)) when the callee is the untyped client.
def or_none(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T | None:
    """``call(*args, **kwargs)``, or None when the API answers 404 (the object is not there,
    or is gone already); every other error is raised."""
    try:
        return call(*args, **kwargs)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
