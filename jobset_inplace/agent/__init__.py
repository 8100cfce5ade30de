"""The jobset-inplace agent: a sidecar in every worker pod of an opted-in JobSet.

It reports the pod's epoch and checkpoint steps (pod annotations), holds the gang barrier (its
``/barrier`` startupProbe keeps the trainer container from starting), tells the trainer which
step to resume from (``$JSI_STATE_DIR/resume.json``) and exits with the restart exit code when
the gang moves to a new epoch while this pod's trainer runs, so that the pod's
``RestartAllContainers`` rule restarts every container in place.

Start-up is on the critical path of every in-place restart, so everything the agent imports is
standard library (no Kubernetes client, no YAML). Run it as ``jobset-inplace-agent`` or
``python -m jobset_inplace.agent``.

Configuration (environment):

=============================== ===============================================================
``POD_NAME``, ``POD_NAMESPACE`` this pod (downward API); the agent patches only this pod
``JSI_GANGSTATE``               the GangState to follow (the JobSet's name)
``JSI_STATE_DIR``               shared with the trainer; default ``/var/run/jobset-inplace``
``JSI_CHECKPOINT_LOCAL_DIR``    local checkpoint tier (unset: none)
``JSI_CHECKPOINT_PERSISTENT_DIR`` persistent checkpoint tier (unset: none)
``JSI_RESTART_EXIT_CODE``       default 88; 3..255 (1: agent crash, 2: bad configuration)
``JSI_PROBE_PORT``              default 8187: ``GET /barrier`` (200 open, 503 closed + why),
                                ``GET /healthz``
``JSI_API_SERVER``              default ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``
``JSI_TOKEN_FILE``, ``JSI_CA_FILE`` default: the pod's service-account token and CA; an empty
                                ``JSI_TOKEN_FILE`` sends no token
=============================== ===============================================================

A bad configuration is one log line naming the variable and exit code 2, never the restart
code. SIGTERM/SIGINT exit 0.

Protocol (decisions in `jobset_inplace.agent.logic`):

1. Start: remove ``resume.json``; GET the GangState; adopt ``status.epoch``; merge-patch the
   own pod's annotations ``jobset-inplace.dev/epoch`` and ``jobset-inplace.dev/checkpoint-steps``
   (and ``progress-step``, the newest step the trainers' progress records of the epoch before hold),
   and ``jobset-inplace.dev/late-for-epoch`` when the barrier was already open (it restarted
   after the gang had resumed; the controller recovers the gang for it), removed by its next
   report into a closed barrier (nothing else, no other object). Then watch the GangState
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
   agent adopts the new epoch in place (re-scan, re-report); after, it exits with the restart
   exit code. A *lower* epoch is treated the same way: the GangState is the single source of
   truth, and a pod running an epoch the controller does not know is out of step.
4. GangState missing, without a status epoch yet, deleted, unreadable or malformed: one log line
   (repeats muted for a minute), keep waiting and retrying; no report, never the restart code.

RBAC the agent needs (least privilege, guarantee 9): ``get`` and ``watch`` on
``gangstates.jobset-inplace.dev`` with ``resourceNames: [<jobset>]`` (a watch with a
``metadata.name`` field selector is authorised against resourceNames), and ``patch`` on
``pods`` (restricting it to the own pod's two annotations needs a ValidatingAdmissionPolicy).
"""
