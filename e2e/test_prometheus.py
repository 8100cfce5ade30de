"""Monitoring checked by a real Prometheus (built from its Go module): it discovers both in-cluster
controller replicas with the shipped scrape job (manifests/components/prometheus/scrape-job.yaml),
evaluates the shipped alert rules on their real series, and answers every dashboard panel's
query. A gang with an in-place budget of 1 recovers once (its budget is then used up: an alert
naming the gang's own namespace) and escalates on its second failure (an alert on the first
escalation of that reason the controller ever counted); no other alert fires meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobset_inplace import names
from testbed.controller import gang_state, member_pods
from testbed.demo import inject_failure, training_gang
from testbed.install import Installation
from testbed.kube import Clients, wait_for
from testbed.prometheus import Prometheus, dashboard_panels, expand, running

pytestmark = pytest.mark.e2e

# Grafana's $__rate_interval for a 15 s scrape is 1 m; the test's 1 s scrape makes any window work.
RATE_INTERVAL = "1m"


def scraped_pods(prom: Prometheus) -> list[str]:
    return sorted(t["labels"].get("pod", "") for t in prom.active_targets() if t["health"] == "up")


def firing(prom: Prometheus, alert: str, **labels: str) -> dict[str, Any] | None:
    wanted = {"alertname": alert, **labels}
    for a in prom.alerts():
        if a["state"] == "firing" and all(a["labels"].get(k) == v for k, v in wanted.items()):
            return a
    return None


def panel_queries(namespace: str, jobset: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every dashboard panel, its variables set to one gang (names of
    namespaces and JobSets hold no regular-expression metacharacters)."""
    variables = {"namespace": namespace, "jobset": jobset}
    return [
        (panel["title"], expand(target["expr"], variables, RATE_INTERVAL))
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


def test_prometheus_scrapes_the_controller_alerts_and_answers_the_dashboard(
    cluster_kubeconfig: Path,
    controller: Installation,
    kube: Clients,
    namespace: str,
    tmp_path: Path,
) -> None:
    _, standbys = controller.wait_settled(2)
    replicas = sorted(p["metadata"]["name"] for p in controller.pods())
    with running(cluster_kubeconfig, tmp_path / "prometheus") as prom:
        wait_for("both replicas discovered and scraped", lambda: scraped_pods(prom) == replicas, 60)
        print(f"\nPrometheus {prom.url} scrapes {replicas}")
        assert prom.value("sum(jobset_inplace_leader)") == 1, "one replica leads"

        training_gang(
            kube,
            cluster_kubeconfig,
            namespace,
            "gang",
            2,
            annotations={names.INPLACE_BUDGET: "1"},
        )
        gang = {"namespace": namespace, "jobset": "gang"}
        inject_failure(
            cluster_kubeconfig, namespace, member_pods(kube, namespace, "gang")["1"].metadata.name
        )
        wait_for(
            "barrier of epoch 2",
            lambda: (
                (s := gang_state(kube, namespace, "gang")).get("epoch") == 2 and s["barrierOpen"]
            ),
            120,
        )
        # the gang's budget is used up: the alert names the gang by its own namespace (the
        # scrape job honours the series' labels; the controller's namespace would be wrong)
        exhausted = wait_for(
            "JobsetInplaceBudgetExhausted firing for the gang",
            lambda: firing(prom, "JobsetInplaceBudgetExhausted", **gang),
            30,
        )
        assert exhausted["labels"] == {
            "alertname": "JobsetInplaceBudgetExhausted",
            **gang,
            "budget": "in_place",
            "severity": "warning",
        }
        assert (
            exhausted["annotations"]["summary"] == f"{namespace}/gang has no in_place budget left"
        )
        assert (
            prom.value(
                f'jobset_inplace_gang_restart_budget_remaining{{namespace="{namespace}",'
                'jobset="gang",budget="in_place"}'
            )
            == 0
        )

        # the second failure escalates: the first escalation of its reason still alerts
        inject_failure(
            cluster_kubeconfig, namespace, member_pods(kube, namespace, "gang")["0"].metadata.name
        )
        escalated = wait_for(
            "JobsetInplaceEscalations firing",
            lambda: firing(prom, "JobsetInplaceEscalations", reason="InPlaceBudgetExhausted"),
            120,
        )
        print(f"alert: {escalated['labels']} {escalated['annotations']['summary']}")

        # every rule evaluates on the real series; nothing else alerts
        rules = prom.rules()
        broken = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
        assert not broken, f"rules that do not evaluate: {broken}"
        expected = {"JobsetInplaceBudgetExhausted", "JobsetInplaceEscalations"}
        others = {
            a["labels"]["alertname"]
            for a in prom.alerts()
            if a["state"] == "firing" and a["labels"]["alertname"] not in expected
        }
        assert not others, f"alerts firing on a healthy controller: {others}"
        print(f"{len(rules)} rules evaluated, firing: {sorted(expected)}")

        # every dashboard panel's query runs; the gang's panels and the recovery's show data
        empty = []
        for title, expr in panel_queries(namespace, "gang"):
            if not prom.query(expr):
                empty.append(title)
        assert prom.value("sum(jobset_inplace_leader)") == 1
        must_show = {
            "Leader replicas",
            "Escalations (24h)",
            "Recoveries ended per hour, by outcome",
            "Restart budget remaining",
            "Goodput, by gang",
            "Members restarted, by mode",
        }
        assert not must_show & set(empty), f"panels without data: {sorted(must_show & set(empty))}"
        print(f"dashboard: {len(panel_queries(namespace, 'gang'))} queries ran; empty: {empty}")
        for standby in standbys:
            assert prom.value(f'jobset_inplace_leader{{pod="{standby}"}}') == 0, standby
