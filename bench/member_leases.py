"""The alternative the report channel is measured against (path ``leases``): each agent writes
its report on a small API object of its own, a ``coordination.k8s.io`` Lease named after its
pod, and the leader watches those Leases instead of serving a channel.

Bench-only. The simulated agents write the Leases (bench/fleet.py, with the real agent's
``Reporter`` pointed at its Lease instead of its pod), and ``python -m bench.member_leases run``
is the product's controller with one more watch, whose reports take the channel's way into the
cache (``ClusterCache.set_report``, the same epoch-completion hint). Not hardened: anyone who
may write Leases in a namespace could report for any of its members (the channel binds each
report to its pod's token); it exists to be measured (docs/architecture.md, "Why a channel,
and not one small API object per member"), not to be run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes import client

from jobset_inplace import names
from jobset_inplace.controller import metrics
from jobset_inplace.controller.cache import ClusterCache, EpochReport, GangKey
from jobset_inplace.controller.main import main as controller_main
from jobset_inplace.controller.operator import plan_all
from jobset_inplace.controller.reconciler import Reconciler
from jobset_inplace.protocol.report import AgentReport, decode_report
from jobset_inplace.runtime.watches import RawWatch, WatchEvent

MEMBER_LABEL = "bench.jobset-inplace.dev/member-uid"  # on a member's Lease: its pod's UID

log = logging.getLogger(__name__)


def lease_path(namespace: str, pod: str = "") -> str:
    """The API path of ``namespace``'s Leases, or of the member Lease of ``pod``."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{path}/{pod}" if pod else path


def member_lease(gang: str, pod: str, uid: str) -> dict[str, Any]:
    """The Lease a member's agent creates when it starts (no report yet), owned by its pod so
    that it goes with it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": pod,
            "labels": {names.JOBSET_NAME_LABEL: gang, MEMBER_LABEL: uid},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}],
        },
        "spec": {"holderIdentity": pod},
    }


@dataclass(frozen=True)
class LeaseReport:
    key: GangKey
    uid: str  # the member pod's
    report: AgentReport


def lease_report(lease: Mapping[str, Any]) -> LeaseReport | None:
    """The report a member Lease holds (its annotations, as an agent writes them on its pod);
    None: not a member Lease, no report yet, or a malformed one (logged)."""
    meta = lease["metadata"]
    labels = meta.get("labels") or {}
    gang, uid = labels.get(names.JOBSET_NAME_LABEL), labels.get(MEMBER_LABEL)
    annotations = meta.get("annotations") or {}
    values = {k: v for k in names.CHANNEL_REPORT_KEYS if (v := annotations.get(k)) is not None}
    if not gang or not uid or not values:
        return None
    report, error = decode_report(values)
    if report is None:
        log.warning("Lease %s/%s: %s", meta.get("namespace"), meta.get("name"), error)
        return None
    return LeaseReport((meta["namespace"], gang), uid, report)


def keep(cache: ClusterCache, reports: Iterable[LeaseReport | None]) -> dict[GangKey, bool]:
    """Put reports into the cache as the channel does; per gang reported on, whether one of
    them completed its epoch (the channel's hint: plan now)."""
    gangs: dict[GangKey, bool] = {}
    for rep in reports:
        if rep is not None and cache.set_report(rep.key, rep.uid, rep.report) is None:
            complete = cache.epoch_report(rep.key, rep.uid) is EpochReport.LAST
            gangs[rep.key] = gangs.get(rep.key, False) or complete
    return gangs


def report_events(r: Reconciler, events: list[WatchEvent[LeaseReport | None]]) -> None:
    for key, complete in keep(r.cache, (rep for kind, rep in events if kind != "DELETED")).items():
        r.poke(key, urgent=complete)


def replace_reports(cache: ClusterCache, reports: list[LeaseReport | None]) -> None:
    """A complete list: at the prime (before any pass; nothing to schedule yet) or a relist
    (a pass for every gang follows)."""
    keep(cache, reports)


def member_lease_watch(r: Reconciler) -> RawWatch[LeaseReport | None]:
    coordination = client.CoordinationV1Api(client.ApiClient())
    return RawWatch(
        "member report Leases",
        partial(coordination.list_lease_for_all_namespaces, label_selector=MEMBER_LABEL),
        decode=lease_report,
        replace=partial(replace_reports, r.cache),
        on_events=partial(report_events, r),
        on_relist=partial(plan_all, r),
        metrics=metrics.METRICS,
    )


if __name__ == "__main__":
    sys.exit(controller_main(sys.argv[1:], extra_watches=(member_lease_watch,)))
