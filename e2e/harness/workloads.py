"""Manifests the suites create: small JobSets whose pods land on kwok nodes."""

from __future__ import annotations

from typing import Any

KWOK_NODE_SELECTOR = {"type": "kwok"}


def jobset(
    name: str,
    replicated_jobs: list[tuple[str, int, int]],
    *,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A JobSet; ``replicated_jobs`` is ``[(name, replicas, pods_per_job)]``."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": rj,
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": pods,
                            "completions": pods,
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "nodeSelector": node_selector or KWOK_NODE_SELECTOR,
                                    "containers": [
                                        {
                                            "name": "trainer",
                                            "image": "trainer:local",
                                            "resources": {
                                                "requests": {"cpu": "100m", "memory": "64Mi"}
                                            },
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
                for rj, replicas, pods in replicated_jobs
            ],
        },
    }
