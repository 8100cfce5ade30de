"""A real Prometheus server (built from its Go module, testbed/build-binaries.sh prometheus) for
the monitoring tests: it discovers and scrapes the controller with the shipped scrape job
(manifests/components/prometheus/scrape-job.yaml), evaluates the shipped alert rules
(prometheusrule.yaml) and answers PromQL through its HTTP API."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .processes import free_port, start, stop
from .versions import REPO_ROOT, ensure_binaries

MONITORING = REPO_ROOT / "manifests" / "components" / "prometheus"
SCRAPE_JOB = MONITORING / "scrape-job.yaml"
RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"


def rule_groups() -> dict[str, Any]:
    """The shipped PrometheusRule's spec: a Prometheus rule file (``groups:``)."""
    spec: dict[str, Any] = yaml.safe_load(RULE.read_text())["spec"]
    return spec


def dashboard_panels() -> list[dict[str, Any]]:
    """The shipped Grafana dashboard's panels."""
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return panels


def expand(expr: str, variables: dict[str, str], rate_interval: str) -> str:
    """A dashboard query with its variables set as Grafana sets them (``$__rate_interval``
    too); ValueError naming the query if one is left unset."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${name}", value)
    if "$" in expr:
        raise ValueError(f"a variable is left unset in {expr!r} (set: {sorted(variables)})")
    return expr


def config(kubeconfig: Path, rules: Path, interval: str) -> dict[str, Any]:
    """A Prometheus configuration with the shipped scrape job, run from outside the cluster (it
    reaches the apiserver through ``kubeconfig``; pod IPs are routable from this host), scraping
    and evaluating every ``interval``."""
    job: dict[str, Any] = yaml.safe_load(SCRAPE_JOB.read_text())
    for sd in job["kubernetes_sd_configs"]:
        sd["kubeconfig_file"] = str(kubeconfig)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": [job],
    }


class PrometheusError(RuntimeError):
    pass


@dataclass(frozen=True)
class Prometheus:
    url: str
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/``path``: its ``data``; PrometheusError with the server's error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector (or a scalar as one sample without labels), now."""
        return self.query_at(promql, None)

    def query_at(self, promql: str, at: float | None) -> list[dict[str, Any]]:
        """An instant query's vector at ``at`` (Unix seconds; None: now)."""
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        """A range query's matrix: series with their ``values`` ([time, "value"], ...)."""
        data = self.api(
            "query_range", query=promql, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, promql: str) -> float | None:
        """The single sample of an instant query, None when it has none."""
        result = self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{promql}: {len(result)} series, one expected")
        return float(result[0]["value"][1])

    def active_targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return targets

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing now, as Prometheus would send it (labels, annotations)."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its evaluation health and last error."""
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]


@contextmanager
def running(kubeconfig: Path, work: Path, interval: str = "1s") -> Iterator[Prometheus]:
    """Prometheus serving on 127.0.0.1 until the context ends, its TSDB and log under ``work``."""
    binary = ensure_binaries("prometheus").prometheus
    work.mkdir(parents=True, exist_ok=True)
    rules = work / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups()))
    cfg = work / "prometheus.yaml"
    cfg.write_text(yaml.safe_dump(config(kubeconfig, rules, interval), sort_keys=False))
    port = free_port()
    log = work / "prometheus.log"
    proc = start(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log,
    )
    server = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(server, proc.poll, 60)
        yield server
    finally:
        stop(proc)


def _wait_ready(server: Prometheus, exited: Callable[[], int | None], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited() is not None:
            raise PrometheusError(f"prometheus exited; its log ({server.log}):\n{_tail(server)}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise PrometheusError(f"prometheus not ready in {timeout:.0f}s; its log:\n{_tail(server)}")


def _tail(server: Prometheus, lines: int = 30) -> str:
    return "\n".join(server.log.read_text(errors="replace").splitlines()[-lines:])
