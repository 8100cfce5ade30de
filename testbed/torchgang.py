"""The PyTorch gang as users run it (testbed/frameworks/torch_dcp_trainer.py under ``torchrun``,
DDP over gloo, DCP checkpoints in torchtitan's layout in one shared directory), shared by its
e2e test and the real-node benchmark: its JobSet, its trainer ConfigMap, how to find and kill a
worker process, and how to read its ranks' logs."""

from __future__ import annotations

import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from jobset_inplace import names
from jobset_inplace.launcher import LAUNCHER_FILE
from jobset_inplace.prestart import FORKER_NAME, HELD, STAND_IN_NAME
from testbed import images
from testbed.cluster import REAL_NODE_LABEL
from testbed.demo import log_time, python_in_trainer
from testbed.kube import Clients
from testbed.workloads import shared_checkpoint_gang

MEMBERS = 2
WORKERS = 2  # torchrun's workers per pod (the linear model's)
RANKS = MEMBERS * WORKERS
TRAINER = "torch_dcp_trainer.py"
CONFIG_MAP = "torch-trainer"
MASTER_PORT = 29500
# (found anywhere in a line: the ranks of a pod share its stdout, and a line may hold two)
LINE = re.compile(r"\[rank (\d+)\] (?:step (\d+)|resumed at step (\d+)) loss (\d\.\d+e[+-]\d+)")
# The trainer's worker processes in a container, one pid per line: each started by torchrun
# for TRAINER (not torchrun, whose own command line names TRAINER too), or, with
# prestart-imports, forked by torchrun's worker forker (its command line is torchrun's: a child
# of the forker), not the forker nor the stand-ins (jobset_inplace/prestart.py names them),
# nor the launcher (its command line ends with the trainer's where no torchrun comes between).
WORKER_PIDS = f"""
import os
def argv(p):
    return open(f"/proc/{{p}}/cmdline", "rb").read().split(b"\\0")
def info(p):
    comm = open(f"/proc/{{p}}/comm").read().strip()
    ppid = int(open(f"/proc/{{p}}/stat").read().rpartition(")")[2].split()[1])
    return argv(p), comm, ppid
procs = {{}}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        procs[int(p)] = info(p)
    except (OSError, ValueError, IndexError):
        continue
TDR = b"torch.distributed.run"
for p, (args, comm, ppid) in procs.items():
    launcher = any(a.endswith(b"/{LAUNCHER_FILE}") for a in args)
    ours = launcher or comm in ("{FORKER_NAME}", "{STAND_IN_NAME}")
    if ours or not any(a.endswith(b"{TRAINER}") for a in args):
        continue
    parent = procs.get(ppid)
    if TDR not in args or (parent is not None and parent[1] == "{FORKER_NAME}"):
        print(p)
"""


@dataclass(frozen=True)
class Model:
    """What the gang's trainer trains (its ``MODEL``), with how many workers per pod, and how
    far every rank trains before a benchmark's crash."""

    name: str
    workers: int  # torchrun's workers per pod
    trained_step: int  # every rank past this step before a crash (checkpoints before it)
    env: dict[str, str] = field(default_factory=dict)  # the trainer's environment for it

    @property
    def ranks(self) -> int:
        return MEMBERS * self.workers


# The tests' model: 8 parameters, 4 ranks, a checkpoint every 10 steps.
LINEAR = Model("linear", WORKERS, trained_step=40)
# A real-size model (testbed/frameworks/torch_dcp_trainer.py ``transformer``: 110 M parameters,
# AdamW, 1.3 GB checkpoints), one worker per pod as with one accelerator per node: 2 ranks
# on this 2-core machine; a checkpoint every 5 steps, no pause between steps.
TRANSFORMER = Model(
    "transformer",
    1,
    trained_step=12,
    env={"MODEL": "transformer", "SAVE_EVERY": "5", "STEP_SECONDS": "0"},
)
MODELS = {m.name: m for m in (LINEAR, TRANSFORMER)}

# torchrun --max-restarts: its workers' process group on a store of their own each round, not
# on the rendezvous's store that torchrun shares with them by default. With the shared store
# (PyTorch 2.15), a worker's failure has the two torchruns restart a different number of times
# (the one whose worker failed, and the other on the failure of its own workers' collectives),
# and the next round's workers meet the keys of an earlier round there: in 2 of 2 runs of a
# SIGKILLed worker (4 ranks, 2 torchruns, this machine) every rank still waited in gloo's
# connectFullMesh or DDP's first collective 150 s later, the two torchruns at restart counts 6
# and 7; with this set, 4 of 4 came back in 11-14 s. (pytorch/pytorch#135712 is the same class.)
TORCHRUN_OWN_STORES = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# What the trainer imports: its pre-import list with prestart-imports.
PRESTART_IMPORTS = "torch,torch.distributed.checkpoint"
STAND_INS = f"""
import os
print(sum(open(f"/proc/{{p}}/comm").read().strip() == "{STAND_IN_NAME}"
          for p in filter(str.isdigit, os.listdir("/proc"))))
"""


def with_prestart(js: dict[str, Any]) -> dict[str, Any]:
    """The PyTorch gang ``js`` in the process scope with its imports pre-started."""
    annotations = js["metadata"]["annotations"]
    annotations[names.RESTART_SCOPE] = "process"
    annotations[names.PRESTART_IMPORTS] = PRESTART_IMPORTS
    return js


# The trainer's warm standby (prestart-warm): one trainer process per member (no torchrun:
# jobset-inplace refuses it there), its identity in the environment torchrun would have given,
# jobset_inplace's trainer library (jobset_inplace.trainer.standby) mounted from this checkout.
LIBRARY_MOUNT = "/opt/jobset-inplace"
WARM_HELD = re.compile(r"warm: held at step (\d+)")


def with_warm(js: dict[str, Any], name: str) -> dict[str, Any]:
    """The PyTorch gang ``js`` (one worker per member) with a warm standby: each member runs
    ``python3 -u`` the trainer with ``WARM=1``, rank from its job index, member 0 the
    rendezvous host."""
    with_prestart(js)
    js["metadata"]["annotations"][names.PRESTART_WARM] = "true"
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    trainer["command"] = ["python3", "-u", f"/trainer/{TRAINER}"]
    env = {e["name"]: e for e in trainer["env"]}
    env["RANK"] = {**env.pop("NODE_RANK"), "name": "RANK"}
    for k, v in {
        "WORLD_SIZE": str(MEMBERS), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": master(name), "MASTER_PORT": str(MASTER_PORT), "WARM": "1",
        "PYTHONPATH": f"{env['PYTHONPATH']['value']}:{LIBRARY_MOUNT}",
    }.items():  # fmt: skip
        env[k] = {"name": k, "value": v}
    trainer["env"] = list(env.values())
    trainer["volumeMounts"].append(
        {"name": "jobset-inplace", "mountPath": f"{LIBRARY_MOUNT}/jobset_inplace", "readOnly": True}
    )
    package = Path(names.__file__).resolve().parent
    pod["volumes"].append(
        {"name": "jobset-inplace", "hostPath": {"path": str(package), "type": "Directory"}}
    )
    return js


def warm_held(trainer_log: str) -> bool:
    """A trainer container's log says its warm standby holds a checkpoint step."""
    return WARM_HELD.search(trainer_log) is not None


def released_pid(trainer_log: str) -> int | None:
    """The pid of the trainer process the launcher last started or released: the running
    epoch's (a warm standby has the same command line)."""
    found = re.findall(r"released pre-started pid (\d+)|: started .* \(pid (\d+),", trainer_log)
    return int(found[-1][0] or found[-1][1]) if found else None


def standby_held(trainer_log: str) -> bool:
    """A trainer container's log says its standby for the *next* epoch has done its imports
    and waits (the hook's second such line: the first was the running epoch's own)."""
    return trainer_log.count(HELD) >= 2


def stand_ins(kubectl: list[str], pod: str) -> int:
    """How many forked workers' stand-ins run in ``pod``'s trainer container."""
    done = python_in_trainer(kubectl, pod, STAND_INS)
    done.check_returncode()
    return int(done.stdout)


def master(name: str) -> str:
    """JobSet ``name``'s hostname of member 0 (its headless Service): torchrun's static
    rendezvous point."""
    return f"{name}-workers-0-0.{name}"


def torch_jobset(
    shared: Path,
    site: Path,
    *,
    name: str = "gang",
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    model: Model = LINEAR,
    hot_spares: int = 0,
) -> dict[str, Any]:
    """JobSet ``name``: ``MEMBERS`` one-pod members on the real nodes, each running ``torchrun``
    with ``model``'s workers, checkpoints in ``shared`` (a host directory), PyTorch from
    ``site`` (:func:`testbed.images.torch_site`) mounted read-only. Opted in with layout
    ``torch-dcp``; ``env``: more of the trainer's environment.

    ``max_restarts`` 0: a static rendezvous at member 0, and a worker's failure ends torchrun
    (the gang's failure signal). Above 0: torchrun's own recovery, ``--max-restarts`` with its
    c10d rendezvous hosted by member 0's torchrun (``is_host``: its JobSet hostname is not
    the name its pod resolves itself by), so that on any worker's failure every torchrun
    restarts all its local workers, in place. Its workers then make a store of their own in each
    round (``TORCHRUN_OWN_STORES``), as a user of this PyTorch must for those restarts to work.

    ``hot_spares`` above 0 (static rendezvous only): that many spare pods
    (``jobset-inplace.dev/hot-spares``), and torchrun with neither ``--node-rank`` nor
    ``--master-addr``: the launcher gives each epoch's torchrun the slot its pod holds
    (``PET_NODE_RANK``) and slot 0's pod (``PET_MASTER_ADDR``), as a user's spares need
    (examples/pytorch-dcp-hot-spares.yaml).
    """
    if hot_spares and max_restarts:
        raise ValueError("hot spares need torchrun's static rendezvous (max_restarts=0)")
    index = f"metadata.labels['{names.JOB_INDEX_LABEL}']"
    run = ["python3", "-m", "torch.distributed.run"]
    options = [f"--nnodes={MEMBERS}", f"--nproc-per-node={model.workers}"]
    script = [f"--max-restarts={max_restarts}", f"/trainer/{TRAINER}"]
    if max_restarts:  # is_host=1 on member 0 only: a shell decides (one template for both)
        options += [
            "--rdzv-backend=c10d", f"--rdzv-endpoint={master(name)}:{MASTER_PORT}",
            f"--rdzv-id={name}", f"--max-restarts={max_restarts}",
        ]  # fmt: skip
        host = '[ "$NODE_RANK" = 0 ] && h=1 || h=0; exec "$0" "$@" --rdzv-conf=is_host=$h '
        run, script = ["sh", "-c", host + f"/trainer/{TRAINER}", *run], []
        env = {TORCHRUN_OWN_STORES: "1"} | (env or {})
    elif hot_spares:
        options += [f"--master-port={MASTER_PORT}"]
    else:
        options += [
            "--node-rank=$(NODE_RANK)", f"--master-addr={master(name)}",
            f"--master-port={MASTER_PORT}",
        ]  # fmt: skip
    torchrun = [*run, *options, *script]
    rank_from_label = {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}}
    extra = [{"name": k, "value": v} for k, v in (model.env | (env or {})).items()]
    trainer = {
        "name": "trainer",
        "image": images.NODE_IMAGE,
        "imagePullPolicy": "Never",
        "command": torchrun,
        "env": [
            *([] if hot_spares else [rank_from_label]),
            {"name": "CHECKPOINT_DIR", "value": "/ckpt"},
            {"name": "STEPS", "value": "100000"},
            {"name": "OMP_NUM_THREADS", "value": "1"},
            {"name": "PYTHONPATH", "value": "/opt/torch"},
            *extra,
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [
            {"name": "shared", "mountPath": "/ckpt"},
            {"name": "torch", "mountPath": "/opt/torch", "readOnly": True},
            {"name": "trainer", "mountPath": "/trainer", "readOnly": True},
        ],
    }
    js = shared_checkpoint_gang(
        "torch-dcp",
        trainer,
        MEMBERS,
        name=name,
        shared=shared,
        node_selector={REAL_NODE_LABEL: "true"},
        volumes=[
            {"name": "torch", "hostPath": {"path": str(site), "type": "Directory"}},
            {"name": "trainer", "configMap": {"name": CONFIG_MAP}},
        ],
    )
    if hot_spares:
        js["metadata"]["annotations"][names.HOT_SPARES] = str(hot_spares)
    return js


def create_trainer_config_map(kube: Clients, namespace: str) -> None:
    """The trainer's script as ConfigMap ``CONFIG_MAP`` in ``namespace`` (replaced if there)."""
    body = {"metadata": {"name": CONFIG_MAP}, "data": {TRAINER: images.TORCH_TRAINER.read_text()}}
    try:
        kube.core.create_namespaced_config_map(namespace, body)
    except ApiException as e:  # 409: there from an earlier run
        if e.status != 409:
            raise
        kube.core.replace_namespaced_config_map(CONFIG_MAP, namespace, body)


def worker_pids(kubectl: list[str], pod: str) -> set[int]:
    """The pids of the trainer's worker processes in ``pod``'s trainer container (not
    torchrun's own)."""
    done = python_in_trainer(kubectl, pod, WORKER_PIDS)
    done.check_returncode()
    return {int(p) for p in done.stdout.split()}


def kill_worker(kubectl: list[str], pod: str, pid: int, at: float | None = None) -> None:
    """SIGKILL worker ``pid`` in ``pod``'s trainer container, at wall time ``at`` (seconds since
    the epoch; None: now)."""
    wait = "" if at is None else f"time.sleep(max(0.0, {at:.3f} - time.time())); "
    kill = f"import os, signal, time; {wait}os.kill({pid}, signal.SIGKILL)"
    done = python_in_trainer(kubectl, pod, kill)
    # 137: this exec was SIGKILLed with its container, which the worker's death ended (a
    # trainer container that exits with its worker, as upstream's main-container mode's)
    if done.returncode not in (0, 137):
        raise RuntimeError(f"{pod}: killing worker {pid} failed: {done.stderr.strip()[-500:]}")


@dataclass
class RankRuns:
    """One rank's runs (a new one starts at each ``resumed at`` line): ``step -> loss``."""

    runs: list[dict[int, float]] = field(default_factory=lambda: [{}])
    resumed_at: list[int] = field(default_factory=list)  # each resume's step, in order


def rank_runs(logs: str) -> dict[int, RankRuns]:
    """Per rank, its runs as its log lines tell them."""
    out: dict[int, RankRuns] = {}
    for m in LINE.finditer(logs):
        rank, step, resumed, loss = m.groups()
        mine = out.setdefault(int(rank), RankRuns())
        if resumed is not None:
            mine.runs.append({})
            mine.resumed_at.append(int(resumed))
        else:
            mine.runs[-1][int(step)] = float(loss)
    return out


# --- where a recovery's time went, from the ranks' own log lines ------------------------------

RANK_LINE = re.compile(
    r"\[rank (\d+)\] (process started|imported torch|process group ready|model built"
    r"|resumed at step (\d+)|step (\d+) loss)"
)
_RANK_MILESTONE = {
    "process started": "started",
    "imported torch": "imported",
    "process group ready": "group_ready",
    "model built": "built",
}


@dataclass
class RankResume:
    """One rank's way back after the crash, as its log lines tell it (wall times)."""

    started: float | None = None
    imported: float | None = None
    group_ready: float | None = None
    built: float | None = None  # the model, DDP's wrapper and the optimizer
    restored: float | None = None
    resume_step: int | None = None
    first_step: float | None = None


def rank_resumes(lines: list[tuple[float, str]], after: float) -> dict[int, RankResume]:
    """Per rank, the milestones of its first run that resumed after ``after``: the start-up
    lines of that run (the latest before its resume: a start that failed and was retried
    counts from the retry) and its first step after the resume."""
    out: dict[int, RankResume] = {}
    for t, line in lines:
        if t <= after:
            continue
        for m in RANK_LINE.finditer(line):
            rank = int(m.group(1))
            r = out.setdefault(rank, RankResume())
            if r.first_step is not None:
                continue  # that rank is back; later lines are training
            what = m.group(2)
            if what in _RANK_MILESTONE:
                if r.restored is None:
                    setattr(r, _RANK_MILESTONE[what], t)
            elif m.group(3) is not None:
                if r.restored is None:
                    r.restored, r.resume_step = t, int(m.group(3))
            elif r.restored is not None:
                r.first_step = t
    return out


def last_step_before(lines: list[tuple[float, str]], crash: float) -> int | None:
    """The newest step any rank had logged before ``crash``."""
    steps = [
        int(m.group(4))
        for t, line in lines
        if t <= crash
        for m in RANK_LINE.finditer(line)
        if m.group(4) is not None
    ]
    return max(steps, default=None)


class LogFollower:
    """``kubectl logs -f --timestamps`` of one container from now until it ends or is stopped:
    lines written just before a crash are kept even if the container is then restarted or its
    pod deleted."""

    def __init__(self, kubectl: list[str], pod: str, container: str) -> None:
        cmd = [*kubectl, "logs", "-f", "--timestamps", "--since=60s", pod, "-c", container]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            stamp, _, line = raw.decode(errors="replace").rstrip("\n").partition(" ")
            try:
                self.lines.append((log_time(stamp), line))
            except ValueError:
                continue

    def stop(self) -> list[tuple[float, str]]:
        self.proc.terminate()
        self.proc.wait(10)
        self._thread.join(10)
        return list(self.lines)


def newest_steps(lines: list[tuple[float, str]], after: float = 0.0) -> dict[int, int]:
    """Each rank's newest step logged after ``after``."""
    steps: dict[int, int] = {}
    for t, line in lines:
        if t > after:
            for m in RANK_LINE.finditer(line):
                if m.group(4) is not None:
                    steps[int(m.group(1))] = int(m.group(4))
    return steps
