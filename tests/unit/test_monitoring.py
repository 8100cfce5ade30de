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


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section() -> None:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    runbooks = (REPO_ROOT / "docs" / "runbooks.md").read_text()
    sections = {line[3:].strip() for line in runbooks.splitlines() if line.startswith("## ")}
    assert alerts
    for r in alerts:
        name = r["alert"]
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert r["annotations"]["summary"], name
        assert r["annotations"]["description"], name
        assert r["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}", name
        assert name in sections, f"docs/runbooks.md has no section {name}"
        assert f"*{r['labels']['severity']}.*" in runbooks.split(f"## {name}")[1][:200], name
    assert sections == {r["alert"] for r in alerts}, "a section per alert, no other"


def test_the_dashboards_gang_panels_follow_its_namespace_and_jobset_variables() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "namespace", "jobset"]
    per_gang = re.compile(r"\bjobset_inplace_gang_[a-z_]+(\{[^}]*\})?")
    found = [m for e in dashboard_expressions() for m in per_gang.finditer(e)]
    assert found, "per-gang series on the dashboard"
    for m in found:
        assert m.group(1) == '{namespace=~"$namespace", jobset=~"$jobset"}', m.group(0)
