"""Names of jobset-inplace's API surface, defined once: the API group, the gang-state resource,
annotation keys, labels, condition types and exit codes."""

from __future__ import annotations

from typing import Final

from jobset_inplace.strenum import StrEnum

GROUP: Final = "jobset-inplace.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

GANGSTATE_KIND: Final = "GangState"
GANGSTATE_PLURAL: Final = "gangstates"
# what each member reported, for people (core/gangmembers.py); apart from the GangState, which
# every agent watches
GANGMEMBERS_KIND: Final = "GangMembers"
GANGMEMBERS_PLURAL: Final = "gangmembers"

# --- JobSet annotations (the user-facing opt-in and policy; see docs/annotations.md) -----------
PREFIX: Final = f"{GROUP}/"
ENABLED: Final = f"{PREFIX}enabled"
INPLACE_BUDGET: Final = f"{PREFIX}inplace-budget"
RECREATE_BUDGET: Final = f"{PREFIX}recreate-budget"
BARRIER_TIMEOUT: Final = f"{PREFIX}barrier-timeout"
NODE_UNHEALTHY_AFTER: Final = f"{PREFIX}node-unhealthy-after"
UNHEALTHY_TAINTS: Final = f"{PREFIX}unhealthy-node-taints"
UNHEALTHY_CONDITIONS: Final = f"{PREFIX}unhealthy-node-conditions"
FORCE_DELETE: Final = f"{PREFIX}force-delete"
MEMBER_REPEAT_LIMIT: Final = f"{PREFIX}member-repeat-limit"
NO_PROGRESS_LIMIT: Final = f"{PREFIX}no-progress-limit"
NO_COMMON_CHECKPOINT: Final = f"{PREFIX}no-common-checkpoint"
RESTART_EXIT_CODE: Final = f"{PREFIX}restart-exit-code"
CHECKPOINT_DIRS: Final = f"{PREFIX}checkpoint-dirs"
CHECKPOINT_LAYOUT: Final = f"{PREFIX}checkpoint-layout"
CHECKPOINT_STEP_PATTERN: Final = f"{PREFIX}checkpoint-step-pattern"
ESCALATION: Final = f"{PREFIX}escalation"
KUEUE_RECOVERY_TIMEOUT: Final = f"{PREFIX}kueue-recovery-timeout"
TAINT_ON_DEVICE_FAULT: Final = f"{PREFIX}taint-on-device-fault"
RESTART_SCOPE: Final = f"{PREFIX}restart-scope"
TRAINER_STOP_GRACE: Final = f"{PREFIX}trainer-stop-grace"
PRESTART_IMPORTS: Final = f"{PREFIX}prestart-imports"
PRESTART_WARM: Final = f"{PREFIX}prestart-warm"
HANG_TIMEOUT: Final = f"{PREFIX}hang-timeout"
STARTUP_TIMEOUT: Final = f"{PREFIX}startup-timeout"
STRAGGLER_FACTOR: Final = f"{PREFIX}straggler-factor"
STRAGGLER_WINDOWS: Final = f"{PREFIX}straggler-windows"
STRAGGLER_WINDOW: Final = f"{PREFIX}straggler-window"
STRAGGLER_ACTION: Final = f"{PREFIX}straggler-action"
# Planned moves (a member's node cordoned or drained): the gang stops at one step first
PLANNED_MOVES: Final = f"{PREFIX}planned-moves"
PLANNED_MOVE_TIMEOUT: Final = f"{PREFIX}planned-move-timeout"
# Hot spares (docs/design/hot-spares.md): pods of the gang beyond its members, ready to take a
# member's place; which replicatedJob they belong to (default: the only one)
HOT_SPARES: Final = f"{PREFIX}hot-spares"
HOT_SPARES_JOB: Final = f"{PREFIX}hot-spares-job"
# Set by `kubectl jobset-inplace restart`: a new value asks for one manual in-place gang restart.
RESTART_REQUEST: Final = f"{PREFIX}restart-request"

# --- Pod annotations written by the agent (its only write; reports to the controller) ---------
REPORT_EPOCH: Final = f"{PREFIX}epoch"
REPORT_STEPS: Final = f"{PREFIX}checkpoint-steps"
# ... and, when it reported epoch E after E's barrier had opened (a restart the controller may
# not have seen: it waits for the next epoch), E; removed with its next report of a closed barrier.
REPORT_LATE: Final = f"{PREFIX}late-for-epoch"
# ... and (process restart scope) the epoch in which its trainer exited non-zero: the failure
# signal the kubelet cannot see, the container keeps running; removed with its next report.
REPORT_EXITED: Final = f"{PREFIX}exited-in-epoch"
# ... and the epoch in which its trainer made no progress for hang-timeout (or reported no first
# step within startup-timeout): hung, though every process lives; removed with its next report.
REPORT_HUNG: Final = f"{PREFIX}hung-in-epoch"
# ... and (straggler detection on) its trainers' busy milliseconds per step in its last windows
# of the epoch, newest first ("230,228,231"); removed with its next report.
REPORT_BUSY: Final = f"{PREFIX}busy-ms-per-step"
# ... with, in the same write, the newest complete checkpoint step a replacement could load (the
# persistent tier's; straggler-action recreate waits for the gang's next); removed with its next
# report.
REPORT_NEWEST_STEP: Final = f"{PREFIX}newest-checkpoint"
# ... and the epoch those two belong to (an agent on the report channel does not clear them with
# its next report; older windows are then ignored).
REPORT_BUSY_EPOCH: Final = f"{PREFIX}busy-epoch"

# ... and, with its report of a new epoch, the newest step its trainers reported progress for
# in the epoch before (their progress records: jobset_inplace.trainer.report_progress): how far
# training had got, so the controller knows the steps a recovery makes the gang redo.
REPORT_PROGRESS_STEP: Final = f"{PREFIX}progress-step"
# ... and the span of that progress: first and newest step and when (goodput accounting: the
# epoch's pace, when its training began, how much of it a recovery throws away).
REPORT_PROGRESS_SPAN: Final = f"{PREFIX}progress-span"
# A planned stop (GangState status.plannedStop): asked how far its trainers are, an agent
# answers "<epoch>:<progress span so far>" (span empty: no progress records); once its trainers
# stopped at the planned step and parked, it says "<epoch>" under parked-in-epoch.
REPORT_PROGRESS_NOW: Final = f"{PREFIX}progress-now"
REPORT_PARKED: Final = f"{PREFIX}parked-in-epoch"
# A second look at the checkpoint steps (GangState status.stepRecheck: every member of the
# recovering epoch whose report lacks the step named there scans its tiers again): the agent
# reports again, with "<epoch>" under this key. A member whose trainer stopped first reported
# what a shared root held then, before the others' trainers kept their interrupted step.
REPORT_RECHECKED: Final = f"{PREFIX}rechecked-steps"
# Over the report channel only (never on the pod), alone in its request, while an epoch runs:
# "<epoch>:<progress span so far>", first once the trainers' pace is known, then each time its
# reach has about doubled, at most every PROGRESS_NOTE_S. The leader keeps each member's newest
# in memory, so an epoch whose pods all went with their node is accounted like any other
# (goodput: nothing unmeasured by design).
REPORT_PROGRESS_NOTE: Final = f"{PREFIX}progress-note"
PROGRESS_NOTE_S: Final = 30.0

# --- The report channel (docs/architecture.md): agents send the reports above to the leader ---
# What goes over it, as pod annotations do (same keys, same encoding); the straggler windows
# (busy time, newest checkpoint) stay pod annotations.
CHANNEL_REPORT_KEYS: Final = (
    REPORT_EPOCH,
    REPORT_STEPS,
    REPORT_LATE,
    REPORT_EXITED,
    REPORT_HUNG,
    REPORT_PROGRESS_STEP,
    REPORT_PROGRESS_SPAN,
    REPORT_PROGRESS_NOW,
    REPORT_PARKED,
    REPORT_RECHECKED,
)
REPORT_PATH: Final = "/v1/reports"
# Where a report front sends the leader its batches (docs/design/report-fronts.md).
REPORT_LINK_PATH: Final = "/v1/batches"
DEFAULT_REPORT_PORT: Final = 9444
DEFAULT_REPORT_LINK_PORT: Final = 9445
# The leader names its fronts' link on its election Lease (every candidate reads it each retry
# period): the link's URL and its certificate's SHA-256 (the channel's).
LEASE_REPORT_LINK: Final = f"{PREFIX}report-link"
LEASE_REPORT_LINK_PIN: Final = f"{PREFIX}report-link-cert-sha256"
# A projected service-account token for this audience only (the agent's API token is never sent
# to the controller); the leader verifies it offline against the cluster's signing keys (or,
# where it cannot read them, with a TokenReview), cached until the token expires
# (runtime/report_tokens.py).
REPORT_TOKEN_AUDIENCE: Final = "jobset-inplace.dev/reports"
REPORT_TOKEN_SECONDS: Final = 3600
REPORT_TOKEN_DIR: Final = "/var/run/secrets/jobset-inplace.dev/reports"
ENV_REPORT_TOKEN_FILE: Final = "JSI_REPORT_TOKEN_FILE"

# --- Pod condition set by the controller to escalate through JobSet's failure policy ---------
ESCALATION_CONDITION: Final = "JobsetInplaceEscalated"
# ... and on a pod on a dead node that it marks Failed before replacing it
REPLACED_CONDITION: Final = "JobsetInplaceReplaced"

NODE_LEASE_NAMESPACE: Final = "kube-node-lease"
# Where manifests/ install the controller (and where its leader Lease lives by default).
INSTALL_NAMESPACE: Final = "jobset-inplace-system"
# the controller's Deployment, ServiceAccount and leader Lease (manifests/controller/)
CONTROLLER_NAME: Final = "jobset-inplace-controller"

# The ValidatingAdmissionPolicy (and its binding) that lets an agent patch only its own pod's
# jobset-inplace.dev/ annotations (manifests/rbac/agent-vap.yaml; guarantee 9).
AGENT_POLICY: Final = "jobset-inplace-agent-own-pod"
# The one that lets the controller's ServiceAccount patch a pod only to remove its Job tracking
# finalizer (manifests/controller/rbac.yaml; docs/architecture.md, "Replacing a pod").
CONTROLLER_POD_POLICY: Final = "jobset-inplace-controller-pods"

# --- Node taint set on a node the controller found unhealthy (so replacements avoid it) -------
UNHEALTHY_TAINT: Final = f"{PREFIX}unhealthy"
# ... and, with the taint-on-device-fault policy, on a Ready node whose device failed a member.
# Removed by people after the repair (the node itself looks healthy), never by the controller.
DEVICE_UNHEALTHY_TAINT: Final = f"{PREFIX}device-unhealthy"

# --- GangState status fields the agents read: core/gangstate.py writes them,
# protocol/gangstate.py parses them for the agents (standard library only) -----------------
STATUS_PHASE: Final = "phase"
STATUS_EPOCH: Final = "epoch"
STATUS_BARRIER_OPEN: Final = "barrierOpen"
STATUS_RESUME_STEP: Final = "resumeStep"
STATUS_REPORT_ENDPOINT: Final = "reportEndpoint"
STATUS_PLANNED_STOP: Final = "plannedStop"
STATUS_SLOTS: Final = "slots"
STATUS_STEP_RECHECK: Final = "stepRecheck"
# ... and the fields of those that agents read (protocol/gangstate.py parses them, the core's
# writer, core/gangstate.py, writes them): reportEndpoint's
ENDPOINT_URL: Final = "url"
ENDPOINT_CERT_SHA256: Final = "certSHA256"
ENDPOINT_LEADER: Final = "leader"
# ... its report fronts (docs/design/report-fronts.md): a list of {url, certSHA256}
ENDPOINT_FRONTS: Final = "fronts"
# plannedStop's and stepRecheck's: the epoch they are of, the step the gang stops at, the
# steps to look at again
ASK_EPOCH: Final = "epoch"
PLANNED_STOP_STEP: Final = "step"
STEP_RECHECK_STEPS: Final = "steps"

# --- The controller process's environment: its Deployment sets it (manifests/, the chart) ----
# the webhook's port and the directory of its serving certificate (runtime/webhook_server.py)
ENV_WEBHOOK_PORT: Final = "JSI_WEBHOOK_PORT"
ENV_WEBHOOK_CERT_DIR: Final = "JSI_WEBHOOK_CERT_DIR"
# the agent the webhook injects: image, pull policy and secrets, resources, the API server it
# talks to (core/agent_settings.py parses resources and secrets)
ENV_AGENT_IMAGE: Final = "JSI_AGENT_IMAGE"
ENV_AGENT_PULL_POLICY: Final = "JSI_AGENT_IMAGE_PULL_POLICY"
ENV_AGENT_PULL_SECRETS: Final = "JSI_AGENT_IMAGE_PULL_SECRETS"
ENV_AGENT_RESOURCES: Final = "JSI_AGENT_RESOURCES"
ENV_AGENT_API_SERVER: Final = "JSI_AGENT_API_SERVER"
# the report channel's listen address, the address it advertises, its limits
# (controller/report_server.py)
ENV_REPORT_LISTEN: Final = "JSI_REPORT_LISTEN"
ENV_REPORT_ADVERTISE: Final = "JSI_REPORT_ADVERTISE"
ENV_REPORT_LIMITS: Final = "JSI_REPORT_LIMITS"
# where the leader takes report fronts' batches (ADDRESS:PORT; "off": no fronts), and whether a
# standby replica serves as a report front ("off": it does not); the controller's service
# account (fronts are replicas of its own namespace and service account)
ENV_REPORT_LINK_LISTEN: Final = "JSI_REPORT_LINK_LISTEN"
ENV_REPORT_FRONT: Final = "JSI_REPORT_FRONT"
ENV_SERVICE_ACCOUNT: Final = "JSI_SERVICE_ACCOUNT"

# --- The agent's environment: core/transform.py writes it, agent/config.py reads it ------------
ENV_GANGSTATE: Final = "JSI_GANGSTATE"
ENV_API_SERVER: Final = "JSI_API_SERVER"
ENV_TOKEN_FILE: Final = "JSI_TOKEN_FILE"
ENV_CA_FILE: Final = "JSI_CA_FILE"
ENV_PROBE_PORT: Final = "JSI_PROBE_PORT"
ENV_RESTART_EXIT_CODE: Final = "JSI_RESTART_EXIT_CODE"
ENV_RESTART_SCOPE: Final = "JSI_RESTART_SCOPE"
ENV_LAUNCHED_CONTAINERS: Final = "JSI_LAUNCHED_CONTAINERS"


class RestartScope(StrEnum):
    """What a recovery restarts on a member that keeps its pod: the trainer processes (the
    launcher stops and starts them; no container restarts) or every container of the pod
    (``RestartAllContainers``: init containers re-run, a clean container filesystem)."""

    PROCESS = "process"
    POD = "pod"


# The annotation's default, and the agent's where its environment names none.
DEFAULT_RESTART_SCOPE: Final = RestartScope.PROCESS

# The agent's hang detection settings (seconds), set by the transform from the annotations.
ENV_HANG_TIMEOUT: Final = "JSI_HANG_TIMEOUT_SECONDS"
ENV_STARTUP_TIMEOUT: Final = "JSI_STARTUP_TIMEOUT_SECONDS"
# ... and its straggler detection's: the window (seconds) and how many windows it publishes.
ENV_STRAGGLER_WINDOW: Final = "JSI_STRAGGLER_WINDOW_SECONDS"
ENV_STRAGGLER_WINDOWS: Final = "JSI_STRAGGLER_WINDOWS"
# ... and the checkpoint layout it reads and prepares (jobset_inplace.trainer.layouts).
ENV_CHECKPOINT_LAYOUT: Final = "JSI_CHECKPOINT_LAYOUT"
ENV_CHECKPOINT_STEP_PATTERN: Final = "JSI_CHECKPOINT_STEP_PATTERN"

# Hot spares (docs/design/hot-spares.md), on the agent of the spares' replicatedJob: its
# member count (the slots: ranks 0..N-1), the replicatedJob, the pod's job index (its position)
# and the DNS domain of the gang's pods (slot 0's holder is the rendezvous host).
ENV_SLOTS: Final = "JSI_SLOTS"
ENV_REPLICATED_JOB: Final = "JSI_REPLICATED_JOB"
ENV_JOB_INDEX: Final = "JSI_JOB_INDEX"
ENV_PEER_DOMAIN: Final = "JSI_PEER_DOMAIN"
# ... the agents of a gang with hot spares say they are alive over the report channel every
# HEARTBEAT_S (an empty report); an agent holds a lease of LEASE_S from sending one that was
# answered, written for its launchers (launcher.LEASE_FILE: a CLOCK_MONOTONIC value); the
# leader suspects a holder it has not heard from for SILENT_AFTER_S and gives its slot away
# only LEASE_S + FENCE_MARGIN_S after it last heard it (docs/design/hot-spares.md, section 5)
HEARTBEAT_S: Final = 1.0
SILENT_AFTER_S: Final = 2.0
LEASE_S: Final = 3.0
FENCE_MARGIN_S: Final = 1.0
# ... and what the launcher gives a holder's trainer for each epoch: its slot (its rank), and
# torchrun's node rank and rendezvous host (torchrun reads an option it is not given from
# PET_<OPTION>), and JAX's coordinator host.
ENV_SLOT: Final = "JSI_SLOT"
ENV_COORDINATOR: Final = "JSI_COORDINATOR"
ENV_TORCHRUN_NODE_RANK: Final = "PET_NODE_RANK"
ENV_TORCHRUN_MASTER_ADDR: Final = "PET_MASTER_ADDR"

# On every pod the webhook prepares (its agent's): the NetworkPolicy shipped with the controller
# lets only such pods reach the report channel.
AGENT_POD_LABEL: Final = "jobset-inplace.dev/agent"

DEFAULT_RESTART_EXIT_CODE: Final = 88
# The agent's barrier endpoint (its startupProbe) in every member pod.
DEFAULT_PROBE_PORT: Final = 8187

# --- Labels and annotations JobSet and the Job controller put on pods -------------------------
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
# The Job controller counts a pod's failure (status.failed, its pod-failure backoff: 10 s
# doubling per failure, never reset while no pod succeeds) only while the pod holds this
# finalizer; the controller removes it from a pod it replaces (controller/executor.py).
JOB_TRACKING_FINALIZER: Final = "batch.kubernetes.io/job-tracking"

# --- Kueue's configuration in a standard install (waitForPodsReady.recoveryTimeout) ----------
KUEUE_CONFIG_NAMESPACE: Final = "kueue-system"
KUEUE_CONFIG_MAP: Final = "kueue-manager-config"
KUEUE_CONFIG_KEY: Final = "controller_manager_config.yaml"


def member_name(replicated_job: str, job_index: object, completion_index: object) -> str:
    """``<replicatedJob>/<jobIndex>/<completionIndex>``: a member's stable identity across
    pod recreations (with hot spares: a pod's position, and a slot's name)."""
    return f"{replicated_job}/{job_index}/{completion_index}"
