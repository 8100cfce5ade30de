"""Manifests the suites create: small JobSets whose pods land on kwok nodes (or, on another
cluster, where ``JSI_E2E_NODE_SELECTOR`` says, running ``JSI_E2E_IMAGE``)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from jobset_inplace import names

KWOK_NODE_SELECTOR = {"type": "kwok"}


def e2e_node_selector() -> dict[str, str]:
    """Where e2e pods go: kwok nodes on the local cluster; ``JSI_E2E_NODE_SELECTOR``
    (``key=value[,key=value]``) on other clusters."""
    raw = os.environ.get("JSI_E2E_NODE_SELECTOR")
    if not raw:
        return dict(KWOK_NODE_SELECTOR)
    pairs = [p.partition("=") for p in raw.split(",") if p]
    bad = [k for k, sep, _ in pairs if not sep or not k]
    if bad:
        raise ValueError(f"JSI_E2E_NODE_SELECTOR must be key=value[,key=value], got {raw!r}")
    return {k: v for k, _, v in pairs}


# A container image for the default pod where pods really run (another cluster's nodes): any
# image with `sleep`, present on its nodes (testbed/kind/run.sh names its trainer image).
E2E_IMAGE_ENV = "JSI_E2E_IMAGE"


def default_container() -> dict[str, Any]:
    """The default member container: on kwok nodes a placeholder nothing runs; with
    ``JSI_E2E_IMAGE`` set, that image sleeping until the member is stopped."""
    image = os.environ.get(E2E_IMAGE_ENV)
    placement: dict[str, Any] = (
        {"image": image, "command": ["sleep", "infinity"]}
        if image
        else {"image": "trainer:local", "command": ["python3", "train.py"]}
    )
    return {
        "name": "trainer",
        **placement,
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }


def whole_node_trainer(cpu: str) -> dict[str, Any]:
    """Pod-spec fields for a trainer that takes a whole kwok node (32 CPUs each): with ``cpu``
    above half of that, one member per node, as for a worker using all of a node's devices."""
    return {
        "containers": [
            {
                "name": "trainer",
                "image": "trainer:sim",
                "command": ["python3", "train.py"],
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}},
            }
        ]
    }


def jobset(
    name: str,
    replicated_jobs: list[tuple[str, int, int]],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    pod: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A JobSet; ``replicated_jobs`` is ``[(name, replicas, pods_per_job)]``. ``pod`` entries
    replace or add pod-spec fields (e.g. ``containers``, ``volumes``, ``affinity``)."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": node_selector or e2e_node_selector(),
        "containers": [default_container()],
    } | (pod or {})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": rj,
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": pods,
                            "completions": pods,
                            "template": {"spec": copy.deepcopy(pod_spec)},
                        }
                    },
                }
                for rj, replicas, pods in replicated_jobs
            ],
        },
    }


def _pods_by_node(jobset_name: str) -> dict[str, Any]:
    return {
        "labelSelector": {"matchLabels": {names.JOBSET_NAME_LABEL: jobset_name}},
        "topologyKey": "kubernetes.io/hostname",
    }


def one_per_node(jobset_name: str) -> dict[str, Any]:
    """Pod affinity that puts each pod of JobSet ``jobset_name`` on a node of its own (so that
    its members talk across nodes)."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [_pods_by_node(jobset_name)]
        }
    }


def on_one_node(jobset_name: str) -> dict[str, Any]:
    """Pod affinity that puts every pod of JobSet ``jobset_name`` on the node of the first (a
    pod that matches its own term may go first): on a cluster whose nodes share no host
    directory (kind), the one where the gang's hostPath directories are one."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [_pods_by_node(jobset_name)]
        }
    }


def spread_over_nodes(jobset_name: str) -> dict[str, Any]:
    """Pod affinity that puts each pod of JobSet ``jobset_name`` on a node of its own where
    one is free, and beside another where none is (a drained node's replacement)."""
    apart = {"weight": 100, "podAffinityTerm": _pods_by_node(jobset_name)}
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [apart]}}


def shared_checkpoint_gang(
    layout: str,
    trainer: dict[str, Any],
    members: int,
    *,
    name: str = "gang",
    shared: Path,
    node_selector: dict[str, str],
    volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """JobSet ``name`` of a real framework's trainer: ``members`` one-pod members, one per
    node, opted in with checkpoint layout ``layout`` in one directory every member shares
    (``shared`` on this host, volume ``shared``, the trainer mounting it at /ckpt: the real
    nodes share this host as nodes share a network filesystem), and ``volumes`` besides."""
    return jobset(
        name,
        [("workers", members, 1)],
        annotations={
            names.ENABLED: "true",
            names.CHECKPOINT_LAYOUT: layout,
            names.CHECKPOINT_DIRS: "persistent=/ckpt",
        },
        node_selector=node_selector,
        pod={
            "terminationGracePeriodSeconds": 2,
            "volumes": [
                {"name": "shared", "hostPath": {"path": str(shared), "type": "DirectoryOrCreate"}},
                *(volumes or []),
            ],
            "containers": [trainer],
            "affinity": one_per_node(name),
        },
    )
