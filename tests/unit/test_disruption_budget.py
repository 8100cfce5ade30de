"""The PodDisruptionBudget of an opted-in gang (core/disruption_budget.py): what it should be,
and what to write to get there."""

from __future__ import annotations

import copy
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.agent_access import MANAGED_BY, MANAGED_BY_LABEL
from jobset_inplace.core.disruption_budget import BudgetWrite, desired_budget, plan_budget
from jobset_inplace.core.policy import Policy
from testbed import workloads


def jobset(**annotations: str) -> dict[str, Any]:
    js = workloads.jobset(
        "train", [("workers", 3, 1), ("driver", 1, 1)], annotations={names.ENABLED: "true"}
    )
    js["metadata"].update(namespace="ml", uid="uid-train")
    js["metadata"]["annotations"].update(annotations)
    return js


def test_every_member_must_stay_available_and_unready_ones_may_go() -> None:
    want = desired_budget(jobset(), Policy())
    assert want is not None
    assert want["metadata"]["name"] == "train-jobset-inplace"
    assert want["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    [owner] = want["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("JobSet", "train", "uid-train")
    assert want["spec"] == {
        "minAvailable": 4,  # an integer: the only form Job-owned pods allow
        "selector": {"matchLabels": {names.JOBSET_NAME_LABEL: "train"}},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    assert desired_budget(jobset(), Policy(planned_moves=False)) is None, "opted out"
    assert desired_budget(jobset(), None) is None, "annotations that do not parse"
    off = jobset()
    off["metadata"]["annotations"][names.ENABLED] = "false"
    assert desired_budget(off, Policy()) is None, "not opted in"


def test_what_to_write() -> None:
    want = desired_budget(jobset(), Policy())
    assert want is not None
    assert plan_budget(want, None) == (BudgetWrite("create", want), None)
    assert plan_budget(want, want) == (None, None)
    grown = copy.deepcopy(want)
    grown["spec"]["minAvailable"] = 8
    assert plan_budget(grown, want) == (BudgetWrite("patch", {"spec": grown["spec"]}), None)
    assert plan_budget(None, want) == (BudgetWrite("delete"), None), "opted out: ours goes"
    theirs = copy.deepcopy(want)
    theirs["metadata"]["labels"] = {}
    write, conflict = plan_budget(want, theirs)
    assert write is None
    assert conflict is not None
    assert "not made by jobset-inplace: left alone" in conflict
    assert plan_budget(None, theirs) == (None, None), "never deleted when not ours"
    assert plan_budget(None, None) == (None, None)
