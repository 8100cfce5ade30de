"""``enable``: the offline transform of JobSet YAML (pure: text in, text out), through the
webhook's own admission code (``core/admission.py``): the same refusals, the same warnings,
the same result as a live create."""

from __future__ import annotations

import difflib
from typing import Any

import yaml

from jobset_inplace import names
from jobset_inplace.core.admission import validate, warnings
from jobset_inplace.core.policy import is_enabled
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


def enable_docs(docs: list[Any], image: str) -> tuple[list[Any], list[str]]:
    """Every JobSet opted in (``enabled: "true"`` added if absent) and, as the webhook would
    on its create, checked, then transformed; other documents unchanged. A JobSet that says
    ``enabled: "false"`` is left as it is (the webhook would not touch it). Returns the
    documents and what the webhook would warn about. Raises :class:`InputError`, or
    :class:`TransformError` with the webhook's refusal."""
    if not any(_is_jobset(d) for d in docs):
        raise InputError(f"no JobSet (apiVersion {JOBSET_API_GROUP}/*, kind JobSet) in the input")
    out, said = [], []
    for d in docs:
        if not _is_jobset(d):
            out.append(d)
            continue
        name = (d.get("metadata") or {}).get("name") or "?"
        opted = {**d, "metadata": dict(d.get("metadata") or {})}
        annotations = dict(opted["metadata"].get("annotations") or {})
        annotations.setdefault(names.ENABLED, "true")
        opted["metadata"]["annotations"] = annotations
        allowed, refusal = validate(opted)
        if not allowed:
            raise TransformError(f"JobSet {name}: {refusal}")
        if not is_enabled(annotations):
            said.append(f'JobSet {name}: {names.ENABLED} is not "true": left as it is')
            out.append(d)
            continue
        said += [f"JobSet {name}: {w}" for w in warnings(opted)]
        out.append(transform(opted, AgentSettings(image=image)))
    return out, said


def enable_text(
    text: str, image: str = DEFAULT_AGENT_IMAGE, *, source: str = "-"
) -> tuple[str, list[str]]:
    """The transformed YAML of ``text``, and the webhook's warnings."""
    docs, said = enable_docs(_load(text, source), image)
    return yaml_all(docs), said


def enable_diff(
    text: str, image: str = DEFAULT_AGENT_IMAGE, *, source: str = "-"
) -> tuple[str, list[str]]:
    """A unified diff between ``text`` and its transform, both in the same YAML formatting (so
    the diff shows only what the transform changes; empty when nothing changes), and the
    webhook's warnings."""
    docs = _load(text, source)
    before = yaml_all(docs).splitlines(keepends=True)
    enabled, said = enable_docs(docs, image)
    after = yaml_all(enabled).splitlines(keepends=True)
    label = "stdin" if source == "-" else source
    diff = difflib.unified_diff(before, after, f"{label} (original)", f"{label} (jobset-inplace)")
    return "".join(diff), said


def _load(text: str, source: str) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InputError(f"{'stdin' if source == '-' else source} is not valid YAML: {e}") from e
