"""An apiserver outage must not make the controller replace healthy pods (nothing deleted on a
guess). A control plane of its own (the test stops and restarts its kube-apiserver), the
controller as a real subprocess, kubelets' Lease renewals simulated by :mod:`gangsim`.

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
from testbed.kube import Clients, clients, temporary_namespace, wait_for

from .gangsim import CRD, Controller, Gang, LeaseKeeper

pytestmark = pytest.mark.integration

OUTAGE_S = 30.0  # longer than 10 s + node-unhealthy-after (15 s by default)
KUBELET_BACKOFF_S = 8.0  # the kubelets renew this long after the apiserver is back


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    cp = start_control_plane()
    cp.kubectl().apply_files([CRD], server_side=True)
    cp.kubectl().wait_crds_established([f"{names.GANGSTATE_PLURAL}.{names.GROUP}"])
    yield cp
    cp.stop()


def test_an_apiserver_outage_replaces_no_pod(
    plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kube: Clients = clients(plane.kubeconfig)
    keeper = LeaseKeeper(kube, interval=2.0)
    keeper.start()
    ctl = Controller(plane.kubeconfig, tmp_path_factory.mktemp("outage") / "controller.log")
    ctl.start()
    try:
        with temporary_namespace(kube, "outage", default_sa=True) as ns:
            g = Gang(kube, ns, f"train-{uuid.uuid4().hex[:4]}", 4, leases=keeper)
            g.create()
            g.wait_state("created with epoch 1", lambda s: s.get("epoch") == 1)
            g.report_all(1)
            g.wait_state("barrier open at epoch 1", lambda s: s.get("barrierOpen") is True)
            uids = g.uids()

            keeper.paused = True
            plane.stop_apiserver()
            time.sleep(OUTAGE_S)  # the outage itself: what is measured is what follows it
            plane.start_apiserver()
            time.sleep(KUBELET_BACKOFF_S)  # kubelets still backing off: Leases as old as the outage
            keeper.paused = False

            # Positive control: the controller is back and planning this gang. A member's
            # report withdrawn must show in the status (the count of reported members drops).
            wait_for(
                "Leases renewed after the outage",
                lambda: all(
                    time.time() - lease.spec.renew_time.timestamp() < 5
                    for lease in kube.coordination.list_namespaced_lease(
                        names.NODE_LEASE_NAMESPACE
                    ).items
                    if lease.metadata.name in keeper.nodes
                ),
                30,
            )
            report = g.withdraw_report(0)
            g.wait_state("the controller plans again", lambda s: s["members"]["reported"] == 3)
            g.restore_report(0, report)
            st = g.wait_state("all reported again", lambda s: s["members"]["reported"] == 4)

            assert (st["epoch"], st["phase"], st["barrierOpen"]) == (1, "Running", True)
            assert g.uids() == uids, "no pod replaced"
            tainted = [
                n.metadata.name
                for n in kube.core.list_node().items
                if any(t.key == names.UNHEALTHY_TAINT for t in n.spec.taints or [])
            ]
            assert tainted == []
            assert "RecoveryStarted" not in [r for r, _ in g.events()]
    finally:
        ctl.stop()
        keeper.stop()
