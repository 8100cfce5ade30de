"""An apiserver outage must not make the controller replace healthy pods (nothing deleted on a
guess). A control plane of its own (the test stops and restarts its kube-apiserver), the
controller as a real subprocess, kubelets' Lease renewals simulated by :mod:`testbed.gangsim`.

After an outage longer than a Lease's staleness threshold (10 s renew interval +
``node-unhealthy-after``), every Lease is as old as the outage, and the kubelets, in their retry
backoff, renew a few seconds after the apiserver is back. A controller that measured silence
from the last renewal would taint every node and force-delete every pod."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from jobset_inplace import names
from testbed.controlplane import ControlPlane, start_control_plane
from testbed.gangsim import CRD, Controller, Gang, LeaseKeeper
from testbed.kube import Clients, clients, temporary_namespace

pytestmark = pytest.mark.integration

# Outages of several lengths, all longer than a Lease renew interval (10 s): what used to make
# every Lease look as old as the outage.
OUTAGES_S = (15.0, 30.0, 60.0)
# Two kubelets still in their retry backoff this long after the apiserver is back: their Leases
# are then older than the staleness threshold (10 s + node-unhealthy-after, 15 s by default)
# counted from their last renewal before the outage, but not counted from the outage's end.
LATE_KUBELETS_S = 12.0
MEMBERS = 6  # 2 silent of 6: no disruption; only the observation window spares them


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    cp = start_control_plane()
    cp.kubectl().apply_files([CRD], server_side=True)
    cp.kubectl().wait_crds_established([f"{names.GANGSTATE_PLURAL}.{names.GROUP}"])
    yield cp
    cp.stop()


@pytest.mark.parametrize("outage_s", OUTAGES_S)
def test_an_apiserver_outage_replaces_no_pod(
    plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory, outage_s: float
) -> None:
    kube: Clients = clients(plane.kubeconfig)
    keeper = LeaseKeeper(kube, interval=2.0)
    keeper.start()
    ctl = Controller(plane.kubeconfig, tmp_path_factory.mktemp("outage") / "controller.log")
    ctl.start()
    try:
        with temporary_namespace(kube, "outage", default_sa=True) as ns:
            g = Gang(kube, ns, f"train-{uuid.uuid4().hex[:4]}", MEMBERS, leases=keeper)
            g.create()
            g.wait_state("created with epoch 1", lambda s: s.get("epoch") == 1)
            g.report_all(1)
            g.wait_state("barrier open at epoch 1", lambda s: s.get("barrierOpen") is True)
            uids = g.uids()

            keeper.paused = True
            plane.stop_apiserver()
            time.sleep(outage_s)  # the outage itself: what is measured is what follows it
            plane.start_apiserver()
            # Most kubelets renew at once; two are still backing off.
            late = {g.node(0), g.node(1)}
            keeper.dead |= late
            keeper.paused = False
            time.sleep(LATE_KUBELETS_S)  # the fault's timing: their backoff goes on

            # While they are still silent, the controller plans this gang (a member's report
            # withdrawn must show in the status): a pass that counted their silence from their
            # last renewal would replace their pods now.
            report = g.withdraw_report(2)
            fewer = MEMBERS - 1
            g.wait_state("the controller plans again", lambda s: s["members"]["reported"] == fewer)
            g.restore_report(2, report)
            st = g.wait_state("all reported again", lambda s: s["members"]["reported"] == MEMBERS)
            keeper.dead -= late

            assert (st["epoch"], st["phase"], st["barrierOpen"]) == (1, "Running", True)
            assert g.uids() == uids, "no pod replaced"
            # This gang's nodes only: the plane is the module's, and the other outage lengths'
            # gangs (whose nodes stay) must not fail this one.
            tainted = [
                node
                for node in (g.node(i) for i in range(MEMBERS))
                if any(
                    t.key == names.UNHEALTHY_TAINT
                    for t in kube.core.read_node(node).spec.taints or []
                )
            ]
            assert tainted == []
            assert "RecoveryStarted" not in [r for r, _ in g.events()]
    finally:
        ctl.stop()
        keeper.stop()
