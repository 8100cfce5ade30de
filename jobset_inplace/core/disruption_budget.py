"""The PodDisruptionBudget that holds a drain's evictions of an opted-in gang's pods until the
gang has stopped at one step (planned moves: :mod:`.planned_moves`), decided.

One budget per opted-in JobSet with ``planned-moves`` on (the default), named after it, owned
by it (garbage-collected with it), selecting its pods by JobSet name, with an integer
``minAvailable`` of every member: the disruption controller allows no voluntary disruption of
a Ready member, so ``kubectl drain`` retries its evictions (every 5 s, by default forever)
while the controller moves the member itself (it deletes the pod: no budget applies to that;
the drain then sees the pod gone and completes). An integer ``minAvailable`` is the only form
the disruption controller accepts for Job-owned pods (a percentage or ``maxUnavailable`` needs
a scale subresource, which Jobs lack: every eviction would then be refused).
``unhealthyPodEvictionPolicy: AlwaysAllow``: a member that is not Ready (restarting, broken) is
evicted at once, as without the budget, so a drain never waits on a member that cannot stop at
a step; Pending pods are never held either.

A budget of that name the controller did not make (no ``managed-by`` label) is left alone and
reported. Kubernetes refuses every eviction of a pod that more than one budget selects: a gang
whose pods the user's own budget selects should opt out (``planned-moves: "false"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.agent_access import MANAGED_BY, MANAGED_BY_LABEL
from jobset_inplace.core.decode import positions
from jobset_inplace.core.gangstate import jobset_owner
from jobset_inplace.core.policy import Policy, is_managed

POLICY_API = "policy/v1"
BUDGET_SUFFIX = "-jobset-inplace"


def budget_name(jobset_name: str) -> str:
    return f"{jobset_name}{BUDGET_SUFFIX}"


def desired_budget(jobset: Mapping[str, Any], policy: Policy | None) -> dict[str, Any] | None:
    """The budget ``jobset`` should have (None: none: not opted in, planned moves off, its
    annotations do not parse, or no member)."""
    if policy is None or not policy.planned_moves or not is_managed(jobset):
        return None
    # every pod of the gang, hot spares too: a drain then waits for the planner, which moves a
    # member at a checkpoint and replaces a spare at once (core/planner/hot_spares.py)
    members = len(positions(dict(jobset)))
    if members == 0:
        return None
    meta = jobset.get("metadata") or {}
    name = str(meta.get("name"))
    return {
        "apiVersion": POLICY_API,
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": budget_name(name),
            "namespace": meta.get("namespace"),
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [jobset_owner(jobset)],
        },
        "spec": {
            "minAvailable": members,
            "selector": {"matchLabels": {names.JOBSET_NAME_LABEL: name}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


@dataclass(frozen=True)
class BudgetWrite:
    """``create`` the body, ``patch`` its spec, or ``delete`` the budget."""

    verb: str
    body: dict[str, Any] | None = None


def plan_budget(
    desired: dict[str, Any] | None, current: Mapping[str, Any] | None
) -> tuple[BudgetWrite | None, str | None]:
    """What to write (None: nothing) and a conflict to report (None: none)."""
    ours = current is not None and (
        ((current.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
    )
    if current is not None and not ours:
        if desired is None:
            return None, None
        name = desired["metadata"]["name"]
        return None, (
            f"PodDisruptionBudget {name} exists and was not made by jobset-inplace: left alone "
            "(planned moves may find their evictions not held, or every eviction refused if it "
            'selects the same pods; set planned-moves: "false" or remove it)'
        )
    if desired is None:
        return (BudgetWrite("delete"), None) if ours else (None, None)
    if current is None:
        return BudgetWrite("create", desired), None
    have = current.get("spec") or {}
    want = desired["spec"]
    if all(have.get(k) == v for k, v in want.items()):
        return None, None
    return BudgetWrite("patch", {"spec": want}), None
