"""The jobset-inplace agent: a sidecar in every worker pod of an opted-in JobSet.

It reports the pod's epoch and checkpoint steps (to the leader's report channel, or on its pod
when the channel fails: :mod:`jobset_inplace.protocol`), holds the gang barrier (its
``/barrier`` startupProbe keeps the trainer container from starting), tells the trainer which
step to resume from (``$JSI_STATE_DIR/resume.json``), and restarts the trainer in place when the
gang moves to a new epoch: with ``JSI_RESTART_SCOPE=process`` (the default,
``names.DEFAULT_RESTART_SCOPE``) the launcher in each main container stops and starts the
trainer processes, no container restarts; with ``pod`` the agent exits with the restart exit
code and the pod's ``RestartAllContainers`` rule restarts every container.

Start-up is on the critical path of every in-place restart, so everything the agent imports is
standard library (no Kubernetes client, no YAML: an import contract). Run it as
``jobset-inplace-agent`` or ``python -m jobset_inplace.agent``.

Configuration: the environment the webhook writes (``core/transform.py``; every variable is a
``names.ENV_*`` constant, read by :mod:`.config`), the pod's own name and namespace (downward
API), the service-account token and CA. A bad configuration is one log line naming the variable
and exit code 2, never the restart code. SIGTERM/SIGINT exit 0.

Protocol (decisions in :mod:`.logic`):

1. Start: remove ``resume.json``; GET the GangState; adopt ``status.epoch``; report (the epoch,
   the checkpoint steps of both tiers, the newest step the trainers' progress records of the
   epoch before hold, and whether the barrier was already open: it restarted after the gang had
   resumed, and the controller recovers the gang for it). Then watch the GangState
   (``fieldSelector=metadata.name``), re-established from the last resourceVersion when the
   server ends it, re-read after errors with exponential backoff (0.2 s doubling to 10 s,
   jittered): with a broken watch this degrades to a periodic GET.
2. Barrier: the agent opens (retires the steps newer than ``status.resumeStep`` in both tiers,
   writes ``resume.json`` atomically, then ``/barrier`` answers 200) iff ``status.barrierOpen``
   for its epoch *and* it took part: it reported that epoch after seeing the barrier closed, or
   saw it closed while its report stood. An agent that finds its epoch's barrier already open
   was not counted (e.g. a pod restarted after the barrier opened, before the controller
   reacted): it waits for the next epoch.
3. Epoch change (``status.epoch`` differs from the agent's): before its barrier opened, the
   agent adopts the new epoch in place (re-scan, re-report); after, it restarts the trainer in
   its scope. A *lower* epoch is treated the same way: the GangState is the single source of
   truth, and a pod running an epoch the controller does not know is out of step.
4. GangState missing, without a status epoch yet, deleted, unreadable or malformed: one log line
   (repeats muted for a minute), keep waiting and retrying; no report, never a restart.

RBAC the agent needs (least privilege, guarantee 9): ``get`` and ``watch`` on
``gangstates.jobset-inplace.dev`` with ``resourceNames: [<jobset>]`` (a watch with a
``metadata.name`` field selector is authorised against resourceNames), and ``patch`` on
``pods`` (its own only, and only its annotations: a ValidatingAdmissionPolicy).
"""
