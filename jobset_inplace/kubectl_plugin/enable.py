"""``enable``: the offline transform of JobSet YAML (pure: text in, text out)."""

from __future__ import annotations

import difflib
from typing import Any

import yaml

from jobset_inplace import names
from jobset_inplace.core.transform import (
    DEFAULT_AGENT_IMAGE,
    AgentSettings,
    TransformError,
    transform,
)
from jobset_inplace.kubectl_plugin.render import yaml_all

JOBSET_API_GROUP = "jobset.x-k8s.io"


class InputError(ValueError):
    """The input is not YAML with at least one JobSet."""


def _is_jobset(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == "JobSet"
        and str(doc.get("apiVersion", "")).startswith(f"{JOBSET_API_GROUP}/")
    )


def enable_docs(docs: list[Any], image: str) -> list[Any]:
    """Every JobSet opted in (``enabled: "true"`` added if absent) and transformed; other
    documents unchanged. Raises :class:`InputError`, :class:`TransformError` or
    :class:`~jobset_inplace.core.policy.PolicyError`."""
    if not any(_is_jobset(d) for d in docs):
        raise InputError(f"no JobSet (apiVersion {JOBSET_API_GROUP}/*, kind JobSet) in the input")
    out = []
    for d in docs:
        if not _is_jobset(d):
            out.append(d)
            continue
        name = (d.get("metadata") or {}).get("name") or "?"
        opted = {**d, "metadata": dict(d.get("metadata") or {})}
        annotations = dict(opted["metadata"].get("annotations") or {})
        annotations.setdefault(names.ENABLED, "true")
        opted["metadata"]["annotations"] = annotations
        try:
            out.append(transform(opted, AgentSettings(image=image)))
        except TransformError as e:
            raise TransformError(f"JobSet {name}: {e}") from None
    return out


def enable_text(text: str, image: str = DEFAULT_AGENT_IMAGE, *, source: str = "-") -> str:
    """The transformed YAML of ``text``."""
    return yaml_all(enable_docs(_load(text, source), image))


def enable_diff(text: str, image: str = DEFAULT_AGENT_IMAGE, *, source: str = "-") -> str:
    """A unified diff between ``text`` and its transform, both in the same YAML formatting (so
    the diff shows only what the transform changes). Empty when nothing changes."""
    docs = _load(text, source)
    before = yaml_all(docs).splitlines(keepends=True)
    after = yaml_all(enable_docs(docs, image)).splitlines(keepends=True)
    label = "stdin" if source == "-" else source
    return "".join(
        difflib.unified_diff(before, after, f"{label} (original)", f"{label} (jobset-inplace)")
    )


def _load(text: str, source: str) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InputError(f"{'stdin' if source == '-' else source} is not valid YAML: {e}") from e
