"""Every shipped manifest parses strictly: kubectl refuses a YAML mapping key given twice (PyYAML
keeps the last one silently) and Grafana keeps only one panel per id, so both are checked here,
before a cluster sees them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.versions import REPO_ROOT

MANIFESTS = REPO_ROOT / "manifests"


class StrictLoader(yaml.SafeLoader):
    """SafeLoader refusing a key given twice in one mapping."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"mapping key {key!r} given twice", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"keys given twice: {twice}")
    return dict(pairs)


def test_strict_loader_refuses_a_key_given_twice() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="'a' given twice"):
        yaml.load("a: 1\nb: 2\na: 3\n", Loader=StrictLoader)


@pytest.mark.parametrize(
    "path", sorted(MANIFESTS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(MANIFESTS))
)
def test_yaml_manifest_has_no_key_given_twice(path: Path) -> None:
    docs = list(yaml.load_all(path.read_text(), Loader=StrictLoader))
    assert any(docs), "not empty"


@pytest.mark.parametrize(
    "path", sorted(MANIFESTS.rglob("*.json")), ids=lambda p: str(p.relative_to(MANIFESTS))
)
def test_json_manifest_has_no_key_given_twice(path: Path) -> None:
    assert json.loads(path.read_text(), object_pairs_hook=_no_duplicates)


def test_dashboard_panel_ids_are_unique() -> None:
    path = MANIFESTS / "components" / "prometheus" / "grafana-dashboard.json"
    ids = [p["id"] for p in json.loads(path.read_text())["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids given twice: {sorted(ids)}"
