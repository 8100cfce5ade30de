"""The e2e suite's reading of Kueue's Workloads: TAS assignments in v1beta2's compact form,
and the signature of Kueue's stale second pass (kubernetes-sigs/kueue#15658)."""

from __future__ import annotations

from typing import Any

from testbed.kueue import assigned_hosts, replaced_then_evicted


def _wl(hosts: list[str] | None = None, evicted: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": []}
    if hosts is not None:
        roots = [h.removeprefix("node-00000") for h in hosts]
        values = {"individual": {"prefix": "node-00000", "roots": roots}}
        status["admission"] = {
            "podSetAssignments": [
                {
                    "name": "workers",
                    "topologyAssignment": {
                        "levels": ["kubernetes.io/hostname"],
                        "slices": [
                            {
                                "domainCount": len(hosts),
                                "valuesPerLevel": [values],
                                "podCounts": {"universal": 1},
                            }
                        ],
                    },
                }
            ]
        }
    if evicted:
        status["conditions"].append({"type": "Evicted", "status": "True", "reason": evicted})
    return {"status": status}


def test_assigned_hosts_reads_prefix_roots_suffix_and_universal_values() -> None:
    assert assigned_hosts(_wl(["node-000001", "node-000003"])) == {"node-000001", "node-000003"}
    wl = {
        "status": {
            "admission": {
                "podSetAssignments": [
                    {
                        "topologyAssignment": {
                            "slices": [
                                {"valuesPerLevel": [{"universal": "b1"}, {"universal": "n7"}]},
                                {
                                    "valuesPerLevel": [
                                        {},
                                        {"individual": {"roots": ["a", "b"], "suffix": "-x"}},
                                    ]
                                },
                            ]
                        }
                    }
                ]
            }
        }
    }
    assert assigned_hosts(wl) == {"n7", "a-x", "b-x"}
    assert assigned_hosts({"status": {}}) == set()
    assert assigned_hosts({}) == set()


def test_the_race_needs_the_replacement_before_the_first_eviction() -> None:
    dead, spare = "node-000000", "node-000003"
    first = _wl([dead, "node-000001", "node-000002"])
    swapped = _wl(["node-000001", "node-000002", spare])
    evicted = _wl(None, "NodeFailures")
    readmitted = _wl(["node-000001", "node-000002", spare])
    assert replaced_then_evicted([first, swapped, evicted, readmitted], dead, spare)
    # Kueue found no replacement: evicted before any assignment without the dead node
    assert not replaced_then_evicted([first, evicted, readmitted], dead, spare)
    # evicted for another reason after the swap
    assert not replaced_then_evicted([first, swapped, _wl(None, "Preempted")], dead, spare)
    # never evicted
    assert not replaced_then_evicted([first, swapped], dead, spare)
