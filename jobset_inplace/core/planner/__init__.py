"""The recovery planner: a pure function from a :class:`~..model.Snapshot` (one JobSet's
pods, their nodes, the persisted gang status, the time) to a :class:`~..model.Plan` (the next
status, the actions, when to look again). No I/O: the controller's adapters build snapshots
and carry out plans; tests drive it directly.

What is failing and since when is :mod:`..detection`'s; the state machine's phases and edges
are a table (:mod:`..statemachine`). A pass is one object built up by phase: :mod:`.base` (the
pass's state and the moves every state makes; every phase change goes through its ``go``,
which refuses an edge the table does not allow), :mod:`.running` and :mod:`.recovering` (each
phase's edges, one method each; :mod:`.planned_moves`, :mod:`.barrier` and :mod:`.hot_spares`
their parts), :mod:`.filters` (which failures a pass acts on) and :mod:`.planning` (the whole
pass, and the JobSet-level edges). Besides the gang's plan: :func:`plan_node` (the unhealthy
taint comes off a node that is back) and :func:`refuse_policy` (a JobSet whose annotations do
not parse).
"""

from jobset_inplace.core.planner.barrier import (
    STEP_RECHECK_LIMIT,
    STEP_RECHECK_S,
    common_resume_step,
    disputed_steps,
)
from jobset_inplace.core.planner.base import ESCALATION_RECHECK_S
from jobset_inplace.core.planner.planning import jobset_edge, plan, plan_node, refuse_policy
from jobset_inplace.core.planner.recovering import REPORT_AGAIN_S

__all__ = [
    "ESCALATION_RECHECK_S",
    "REPORT_AGAIN_S",
    "STEP_RECHECK_LIMIT",
    "STEP_RECHECK_S",
    "common_resume_step",
    "disputed_steps",
    "jobset_edge",
    "plan",
    "plan_node",
    "refuse_policy",
]
