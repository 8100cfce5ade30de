"""Agents for gang members on kwok nodes, which run no containers: a thread writes exactly the
report an agent writes (its epoch and checkpoint steps) on every live member pod whose report
is behind the GangState's epoch. For small e2e gangs; the benchmark's fleet (bench/fleet.py)
runs the agent's own decision code at scale."""

from __future__ import annotations

import threading

from kubernetes.client.exceptions import ApiException

from jobset_inplace import names

from .kube import Clients


class SimulatedAgents(threading.Thread):
    def __init__(self, kube: Clients, namespace: str, gang: str, steps: str = "100") -> None:
        super().__init__(daemon=True)
        self.kube, self.namespace, self.gang, self.steps = kube, namespace, gang, steps
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.3):
            try:
                self._round()
            except ApiException:
                continue

    def stop(self) -> None:
        self.halt.set()
        self.join(5)

    def _round(self) -> None:
        obj = self.kube.custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.GANGSTATE_PLURAL, self.gang
        )
        epoch = str((obj.get("status") or {}).get("epoch", ""))
        if not epoch:
            return
        for pod in self.kube.core.list_namespaced_pod(
            self.namespace, label_selector=f"{names.JOBSET_NAME_LABEL}={self.gang}"
        ).items:
            ann = pod.metadata.annotations or {}
            live = pod.status.phase == "Running" and not pod.metadata.deletion_timestamp
            if live and ann.get(names.REPORT_EPOCH) != epoch:
                self.kube.core.patch_namespaced_pod(
                    pod.metadata.name,
                    self.namespace,
                    {
                        "metadata": {
                            "annotations": {
                                names.REPORT_EPOCH: epoch,
                                names.REPORT_STEPS: self.steps,
                            }
                        }
                    },
                )
