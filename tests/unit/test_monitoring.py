"""The shipped monitoring (manifests/components/prometheus: alerts and Grafana dashboard)
names only series the controller exports, so neither can drift from jobset_inplace.controller
.metrics unnoticed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from jobset_inplace.controller.cache import ClusterCache
from jobset_inplace.controller.metrics import GangCollector, Metrics
from testbed.versions import REPO_ROOT

MONITORING = REPO_ROOT / "manifests" / "components" / "prometheus"
SERIES = re.compile(r"\bjobset_inplace_[a-z_]+\b")


def families() -> list[Metric]:
    """Every metric family the controller exposes (the gang gauges included)."""
    registry = CollectorRegistry()
    Metrics(registry)
    registry.register(GangCollector(ClusterCache()))
    return list(registry.collect())


def exported() -> set[str]:
    """Every series name the controller can expose (histograms' _bucket/_sum/_count,
    counters' _total included)."""
    suffixes = {
        "counter": ["_total", "_created"],
        "histogram": ["_bucket", "_sum", "_count", "_created"],
    }
    return {f.name + s for f in families() for s in ["", *suffixes.get(f.type, [])]}


def alert_expressions() -> list[str]:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


@pytest.mark.parametrize("source", [alert_expressions, dashboard_expressions])
def test_monitoring_names_only_exported_series(source: Callable[[], list[str]]) -> None:
    expressions = source()
    assert expressions, "expressions found"
    used = {n for e in expressions for n in SERIES.findall(e)}
    assert used, "series named"
    assert not used - exported(), f"not exported: {sorted(used - exported())}"


def test_the_dashboard_covers_every_exported_family() -> None:
    used = {n for e in dashboard_expressions() for n in SERIES.findall(e)}
    # a family's name is its series' name without _total (counters) or _bucket/_sum/_count
    shown = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    missing = {f.name for f in families()} - shown
    assert not missing, f"families without a panel: {sorted(missing)}"
