"""``make bench``: hybrid recovery vs JobSet's InPlaceRestart vs stock JobSet at scale on the
local cluster.

    python -m bench --sizes 1000,5000 --reps 3 --node-death-sizes 1000

Writes ``docs/bench/results.json`` (machine-readable, every repetition) and PNG plots next to
it; prints a summary. See docs/benchmarks.md for the method and what is simulated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

from jobset_inplace import names
from jobset_inplace.core.transform import AGENT_CONTAINER
from jobset_inplace.times import format_time
from testbed.cluster import KWOK_NODE_LEASE_SECONDS, LocalCluster
from testbed.controller import ControllerProcess, prepare
from testbed.demo import run_demo
from testbed.kube import clients, create_unless_exists, pod_token, wait_for
from testbed.versions import binaries, versions

from . import provenance, report, upstream
from .arguments import counts
from .fleet import FLEET_WORKERS
from .scenarios import (
    DEFAULT_PATHS,
    FLEET_SA,
    IN_PLACE_PATHS,
    JSI_PATHS,
    NODE_DEATHS,
    PATHS,
    POD_SCOPE_PATH,
    Bench,
    ProcessMeter,
    jsi_settings,
    log,
    node_unhealthy_after,
    within_default_budgets,
)

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "bench"
NAMESPACE = "bench"
SPARE_NODES = 8  # room for replacements when a node dies


def _sizes(raw: str) -> list[int]:
    """Gang sizes (:func:`.arguments.counts`), or ``none``."""
    return [] if raw == "none" else counts(2, "gang sizes (or none)")(raw)


def share(total: int, rounds: int, rnd: int) -> int:
    """Round ``rnd``'s share of ``total`` repetitions (the first rounds take the remainder)."""
    return total // rounds + (1 if rnd < total % rounds else 0)


def gang_over_default_budgets(args: argparse.Namespace) -> str | None:
    """Why one of the run's jobset-inplace gangs would see more failures than the default
    budgets allow (None: none would). A gang lives one round: its share of the repetitions,
    the profiled and the leader-sampled ones, then (last round) its node deaths, each an
    in-place recovery of the gang and a pod recreated."""
    deaths = max((len(NODE_DEATHS[p]) for p in args.paths if p in JSI_PATHS), default=0)
    deaths *= bool(args.node_death_sizes) * args.node_deaths
    extra = int(args.apiserver_profile > 0) + args.leader_profile_reps
    return within_default_budgets(share(args.reps, args.rounds, 0) + extra + deaths, deaths)


def merge_block(row: dict[str, Any], path: str, block: dict[str, Any], rnd: int) -> None:
    """Add one round's block of ``path`` to its size's ``row``: the repetitions and node deaths
    (each marked with its round) in one list each, every block's own set-up in ``blocks``."""
    for m in (*block["worker_failure"], *block["node_death"]):
        m["round"] = rnd
    runs = ("worker_failure", "node_death")
    setup = {k: v for k, v in block.items() if k not in runs} | {"round": rnd}
    if path not in row:
        row[path] = {"size": block["size"], "worker_failure": [], "node_death": [], "blocks": []}
    for key in runs:
        row[path][key] += block[key]
    if "profiled" in block:
        row[path]["profiled"] = block.pop("profiled")
        setup.pop("profiled", None)
    row[path]["blocks"].append(setup)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=[1000, 5000],
        help="gang sizes (pods), or none (only the agent start-up on the real node)",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions per size (hybrid, upstream)")
    p.add_argument(
        "--stock-reps",
        type=int,
        default=2,
        help="repetitions per size of the stock path (minutes each at thousands of pods)",
    )
    p.add_argument(
        "--node-death-sizes",
        type=_sizes,
        default=[1000],
        help="sizes at which a node is killed, or none (the stock path takes minutes)",
    )
    p.add_argument(
        "--node-deaths",
        type=int,
        default=1,
        metavar="N",
        help="node deaths of each kind (path and remediation) at those sizes, the kinds taking "
        "turns; a kind that did not recover within --node-cap is not run again (default 1)",
    )
    p.add_argument(
        "--pods-per-job",
        type=int,
        default=10,
        help="pods per Job of the gang's replicatedJob (completions = parallelism)",
    )
    p.add_argument(
        "--restart-delay",
        type=float,
        default=2.0,
        help="simulated kubelet in-place restart time, seconds (stated in the report)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="the paths take turns: each size's repetitions are split into this many rounds, "
        "every path one block per round on a gang of its own, the paths' order rotated (the "
        "machine's drift over a run is shared by every path); node deaths in the last round",
    )
    p.add_argument("--stock-cap", type=float, default=900.0, help="cap for a stock recovery, s")
    p.add_argument("--node-cap", type=float, default=480.0, help="cap for a node-death run, s")
    p.add_argument("--setup-timeout", type=float, default=1200.0, help="cap for gang set-up, s")
    p.add_argument(
        "--node-lease",
        type=int,
        default=KWOK_NODE_LEASE_SECONDS,
        metavar="SECONDS",
        help="the simulated kubelets' node Lease duration, renewed every quarter of it, and "
        "kube-controller-manager's grace period scaled with it (default "
        f"{KWOK_NODE_LEASE_SECONDS}, the kubelet's): longer for thousands of nodes, whose "
        "renewals kwok cannot keep up with on 2 cores (late ones make nodes NotReady, where no "
        "pod is placed); the cluster is made with it (one made with another is refused); not "
        "with node deaths, whose detection it would slow",
    )
    p.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"which recovery paths to run, comma-separated: {','.join(DEFAULT_PATHS)} (the "
        f"default) or some of {','.join(PATHS)} (ratios need hybrid and another); upstream is "
        "JobSet's InPlaceRestart (its controller gate on for that path only, its agents "
        "simulated); leases is jobset-inplace with its agents' reports on member Leases "
        "instead of the report channel (bench/member_leases.py; the controller then runs with "
        "that watch for every path); hybrid-pod is jobset-inplace in the pod scope beside hybrid "
        "in --scope's, both scopes in one run",
    )
    p.add_argument(
        "--verbose-controller",
        action="store_true",
        help="run the controller with -v (every planning pass logged; costs it some CPU)",
    )
    p.add_argument(
        "--apiserver-profile",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="kube-apiserver CPU profile over the first SECONDS of the first recovery of each "
        "path and size (files next to the results; 0: none)",
    )
    p.add_argument(
        "--apiserver-profile-paths",
        default=",".join(DEFAULT_PATHS),
        help="which paths get the extra profiled recovery (a stock one at 5000 pods takes ~14 "
        f"min): {','.join(PATHS)} or some of them",
    )
    p.add_argument(
        "--protocol-only",
        action="store_true",
        help="the simulated kubelet writes only the failed pod's status: the hybrid recovery's "
        "time without the other members' kubelet status writes (hybrid and leases paths only)",
    )
    p.add_argument(
        "--scope",
        choices=("process", "pod"),
        default="process",
        help="the hybrid gangs' restart scope, which the simulated fleet models (default: "
        "process, the product's default; pod: a simulated kubelet RestartAllContainers and a "
        "new agent process per member)",
    )
    p.add_argument(
        "--agent-reports",
        choices=("channel", "pod"),
        default="channel",
        help="how the hybrid fleet's agents report: over the leader's report channel (the "
        "product; falls back to pod annotations on failure) or as pod annotations only (the "
        "protocol before the channel, for comparison)",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="an idle window of each jobset-inplace gang before its failures: the leader's "
        "CPU while nothing fails (node Leases, watches), subtracted from each recovery's in "
        "the leader's cost per member (default 0: none)",
    )
    p.add_argument(
        "--leader-profile-reps",
        type=int,
        default=0,
        metavar="N",
        help="after the measured worker failures of a jobset-inplace path, N more with the "
        "leader sampled by py-spy from the failure to the barrier's last member (native "
        "frames; files leader-PATH-SIZE-REP.txt next to the results; default 0)",
    )
    p.add_argument(
        "--leader-profile-python",
        action="store_true",
        help="sample those recoveries' Python frames only, without pausing the leader "
        "(py-spy --nonblocking): C time counts to the Python line that called it, and the "
        "recoveries are not stretched, so the shares are those of a measured one",
    )
    p.add_argument(
        "--leader-core",
        type=int,
        metavar="CPU",
        help="pin jobset-inplace's controller to this CPU and every other process that takes "
        "part (the simulated fleet, apiserver, etcd, kwok, JobSet, ...) to the others, at each "
        "measured window, so the leader's figures do not depend on the fleet's (default: none)",
    )
    p.add_argument(
        "--front",
        action="store_true",
        help="run jobset-inplace's controller as two replicas with leader election: the "
        "leader, and a standby serving as report front (docs/design/report-fronts.md), which "
        "the agents send their reports to; with --leader-core the front shares the other "
        "cores with the fleet (default: one replica, no election)",
    )
    p.add_argument(
        "--defaults",
        action="store_true",
        help="jobset-inplace's gangs with the product's defaults (only the restart scope set "
        "where --scope is not the default); refused where a gang would see more failures than "
        "the default budgets allow (without it: budgets at their maximum and a 20m barrier "
        "timeout, so that every repetition is one in-place recovery; the results say which)",
    )
    p.add_argument(
        "--fleet-workers",
        type=int,
        default=FLEET_WORKERS,
        metavar="N",
        help="threads of the simulated agents and kubelets (default %(default)s); each "
        "failure records how many were busy at once and how long a task waited for one",
    )
    p.add_argument("--skip-agent-start", action="store_true", help="skip the real-node part")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    p.add_argument("--label", default="", help="a name for this run in the results")
    p.add_argument("--allow-dirty", action="store_true", help=provenance.ALLOW_DIRTY_HELP)
    args = p.parse_args(argv)
    if args.reps < 1 or args.stock_reps < 1:
        p.error("--reps and --stock-reps must be >= 1")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.fleet_workers < 1:
        p.error(f"--fleet-workers must be >= 1, got {args.fleet_workers}")
    if args.pods_per_job < 1:
        p.error("--pods-per-job must be >= 1")
    if args.node_deaths < 1:
        p.error(f"--node-deaths must be >= 1, got {args.node_deaths}")
    if args.node_lease < KWOK_NODE_LEASE_SECONDS:
        p.error(f"--node-lease must be >= {KWOK_NODE_LEASE_SECONDS}, got {args.node_lease}")
    if args.node_lease != KWOK_NODE_LEASE_SECONDS and (
        deaths := sorted(set(args.sizes) & set(args.node_death_sizes))
    ):
        p.error(
            f"--node-lease {args.node_lease}: node deaths at {deaths} would be detected "
            f"{args.node_lease / KWOK_NODE_LEASE_SECONDS:g}x later than with the kubelet's "
            "Lease; use --node-death-sizes none"
        )
    default_after = node_unhealthy_after(0, defaults=True)
    if args.node_lease != KWOK_NODE_LEASE_SECONDS and (
        watched := [
            s for s in args.sizes if node_unhealthy_after(s, args.defaults) == default_after
        ]
    ):
        p.error(
            f"--node-lease {args.node_lease}: at sizes {watched} node-unhealthy-after is "
            f"{default_after} (the product's default), and the simulated nodes' Leases of "
            f"{args.node_lease}s are renewed less often than a kubelet's every 10s: they would "
            "read as dead nodes (pods recreated, not restarted in place); run those sizes "
            "without --node-lease"
        )
    args.paths = set(args.paths.split(","))
    if args.protocol_only:
        args.paths &= set(JSI_PATHS)
        args.paths = args.paths or {"hybrid"}
    args.apiserver_profile_paths = set(args.apiserver_profile_paths.split(","))
    if not args.apiserver_profile_paths <= set(PATHS):
        p.error(f"--apiserver-profile-paths must be some of {','.join(PATHS)}")
    if not args.paths or not args.paths <= set(PATHS):
        p.error(f"--paths must be some of {','.join(PATHS)}, got {','.join(sorted(args.paths))}")
    if POD_SCOPE_PATH in args.paths and args.scope == "pod":
        p.error(
            f"--paths {POD_SCOPE_PATH} is the pod scope beside hybrid in --scope's: with --scope "
            f"pod both would be the pod scope (use --scope process, the default)"
        )
    if args.defaults and (why := gang_over_default_budgets(args)):
        p.error(f"--defaults: {why}; use fewer --reps or more --rounds")
    cpus = sorted(os.sched_getaffinity(0))
    if args.leader_core is not None and (args.leader_core not in cpus or len(cpus) < 2):
        p.error(
            f"--leader-core must be one of this process's CPUs {cpus} and leave another for the "
            f"rest, got {args.leader_core}"
        )
    return args


def apply(cluster: LocalCluster, namespace: str, objs: list[dict[str, Any]]) -> None:
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    subprocess.run(
        [*kubectl, "apply", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}).encode(),
        check=True,
        capture_output=True,
    )


def fleet_token(cluster: LocalCluster, namespace: str) -> Path:
    """A ServiceAccount token for the simulated agents: get/watch GangStates (ours) and
    JobSets (upstream's), patch pods and their status (the simulated kubelet writes pod
    status), create and patch Leases (path leases: member Leases)."""
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": FLEET_SA}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": FLEET_SA},
            "rules": [
                {
                    "apiGroups": [names.GROUP],
                    "resources": [names.GANGSTATE_PLURAL],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["jobset.x-k8s.io"],
                    "resources": ["jobsets"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["patch"]},
                # path leases: each agent creates its member Lease and writes its reports there
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["create", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": FLEET_SA},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FLEET_SA},
            "subjects": [{"kind": "ServiceAccount", "name": FLEET_SA, "namespace": namespace}],
        },
    ]
    apply(cluster, namespace, objs)
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    token = subprocess.run(
        [*kubectl, "create", "token", FLEET_SA, "--duration", "6h"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    path = cluster.state_dir / "bench-fleet.token"
    path.write_text(token)
    return path


def prepare_kwok_bench(
    cluster: LocalCluster, log_name: str, **controller: Any
) -> tuple[Path, ControllerProcess]:
    """The benchmark's namespace on ``cluster`` (the agents' rights, the simulated fleet's
    token, upstream's ServiceAccount) and jobset-inplace's controller running, logging to
    ``log_name`` (``controller``: more of :class:`.ControllerProcess`'s arguments)."""
    prepare(clients(cluster.kubeconfig), cluster.kubeconfig, NAMESPACE)
    token = fleet_token(cluster, NAMESPACE)
    apply(cluster, NAMESPACE, upstream.rbac(NAMESPACE))  # the upstream pods' ServiceAccount
    return token, ControllerProcess(cluster, cluster.logs_dir / log_name, **controller)


FRONT_TOKEN_S = 12 * 3600  # the front's token for the channel's audience: the whole run


def fronted(identity: str, cluster: LocalCluster) -> dict[str, Any]:
    """A replica's arguments (:class:`.ControllerProcess`) with leader election as
    ``identity`` and report fronts on: the leader takes batches on a link of its own from
    pods of the install namespace's ``default`` ServiceAccount (the front's pod below)."""
    return {
        "leader_identity": identity,
        "env": {
            "POD_NAMESPACE": names.INSTALL_NAMESPACE,
            names.ENV_SERVICE_ACCOUNT: "default",
            names.ENV_REPORT_LINK_LISTEN: f"{cluster.pod_reachable_address}:0",
        },
    }


def start_front(cluster: LocalCluster, verbose: bool) -> ControllerProcess:
    """``--front``: a second replica, standby while the first leads, serving as report front
    with a token for the channel's audience bound to a pod object of its own (as the kubelet
    projects it into the controller's pod); returns once the leader names it."""
    kube = clients(cluster.kubeconfig)
    wait_for("the leader's election", lambda: lease_holder(kube) == "bench-leader", 120, 0.5)
    create_unless_exists(  # (an earlier run's on a cluster kept up: the same identity)
        kube.core.create_namespaced_pod,
        names.INSTALL_NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bench-front"},
            # never scheduled: it only carries the front's identity
            "spec": {"containers": [{"name": "front", "image": "front"}], "nodeName": "none"},
        },
    )
    pod = kube.core.read_namespaced_pod("bench-front", names.INSTALL_NAMESPACE)
    path = cluster.state_dir / "bench-front.token"
    path.write_text(
        pod_token(
            kube.core,
            names.INSTALL_NAMESPACE,
            service_account="default",
            pod=pod.metadata.name,
            uid=pod.metadata.uid,
            audience=names.REPORT_TOKEN_AUDIENCE,
            seconds=FRONT_TOKEN_S,
        )
    )
    leader_log = cluster.logs_dir / "controller-bench.log"
    since = leader_log.stat().st_size  # (a log appended to run after run)
    settings = fronted("bench-front", cluster)
    settings["env"][names.ENV_REPORT_TOKEN_FILE] = str(path)
    front = ControllerProcess(
        cluster,
        cluster.logs_dir / "controller-bench-front.log",
        verbose=verbose,
        install_webhook=False,
        **settings,
    )

    def named() -> bool:
        with leader_log.open("rb") as f:
            f.seek(since)
            return b"says hello" in f.read()

    wait_for("the leader to name the front", named, 60, 0.5)
    return front


def lease_holder(kube: Any) -> str:
    try:
        lease = kube.coordination.read_namespaced_lease(
            names.CONTROLLER_NAME, names.INSTALL_NAMESPACE
        )
    except Exception:
        return ""
    return str(lease.spec.holder_identity or "")


def gates_for(cluster: LocalCluster, path: str) -> AbstractContextManager[None]:
    """While a path's gang runs: upstream's needs the JobSet controller with its
    InPlaceRestart gate on (and back to the defaults after); the others, nothing."""
    if path == "upstream":
        return cluster.jobset_feature_gates(upstream.GATES)
    return contextlib.nullcontext()


def run_header(run: provenance.Run) -> dict[str, Any]:
    """What a kwok benchmark's results say first: its origin, start and versions."""
    v = versions()
    return {
        **run.origin,
        "started": format_time(run.started, micro=False),
        "versions": {
            "kubernetes": v.kubernetes,
            "jobset": v.jobset,
            "kueue": v.kueue,
            "kwok": v.kwok,
        },
    }


def bench_on(
    cluster: LocalCluster,
    ctl: ControllerProcess,
    token: Path,
    leader_core: int | None = None,
    front_pid: int | None = None,
    **settings: Any,
) -> Bench:
    """The scenarios on ``cluster``, the controller ``ctl`` metered (on a core of its own:
    ``leader_core``), the fleet's API calls with ``token`` (:func:`fleet_token`);
    ``settings``: the rest of :class:`.Bench`."""
    kube = clients(cluster.kubeconfig)
    return Bench(
        kube=kube,
        namespace=NAMESPACE,
        server=kube.api.configuration.host,
        ca_file=Path(kube.api.configuration.ssl_ca_cert),
        token_file=token,
        meter=ProcessMeter(
            ctl.proc.pid,
            partial(apiserver_metrics, cluster),
            leader_core,
            partial(controller_metrics, ctl.metrics_url) if ctl.metrics_url else None,
            front_pid,
        ),
        kubectl=[str(binaries().kubectl), "--kubeconfig", str(cluster.kubeconfig)],
        **settings,
    )


def controller_metrics(url: str) -> str:
    """The controller's /metrics text (its planning passes and their CPU)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def apiserver_metrics(cluster: LocalCluster) -> str:
    kubectl = [str(binaries().kubectl), "--kubeconfig", str(cluster.kubeconfig)]
    return subprocess.run(
        [*kubectl, "get", "--raw", "/metrics"], check=True, capture_output=True, text=True
    ).stdout


def agent_start(cluster: LocalCluster, cycles: int) -> dict[str, Any]:
    """Agent process start -> epoch reported, on real containers of the real nodes: the
    demo gang (real kubelet, real agent) through ``cycles`` in-place recoveries; each agent
    logs its latency (process start per the kernel -> report accepted)."""
    kube = clients(cluster.kubeconfig)
    samples: list[float] = []
    for i in range(cycles):
        name = f"agent-start-{i}"
        run_demo(cluster.kubeconfig, name=name, namespace="bench-agent")
        kubectl = [
            str(binaries().kubectl),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-n",
            "bench-agent",
        ]
        pods = kube.core.list_namespaced_pod(
            "bench-agent", label_selector=f"{names.JOBSET_NAME_LABEL}={name}"
        ).items
        for p in pods:
            # the agent process the in-place restart started (the restart path's start-up);
            # a pod's first agent also waits for the controller to initialise the GangState
            restarted = any(
                s.name == AGENT_CONTAINER and s.restart_count >= 1
                for s in p.status.init_container_statuses or []
            )
            if not restarted:
                continue
            out = subprocess.run(
                [*kubectl, "logs", p.metadata.name, "-c", AGENT_CONTAINER],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            samples += report.agent_latencies(out)
        kube.custom.delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "bench-agent", "jobsets", name
        )
    wait_for(
        "agent-start pods gone",
        lambda: not kube.core.list_namespaced_pod("bench-agent").items,
        180,
        1,
    )
    return {"samples_s": samples, "cycles": cycles}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    report.require_plots("python -m bench")  # not after an hour of measuring
    # what was measured, read now: the tree may change while the cluster comes up
    run = provenance.begin("bench", argv, args.allow_dirty)
    # SIGTERM unwinds like Ctrl-C: the controller stops, the JobSet controller's gates return
    # to their defaults
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    cluster = LocalCluster(os.environ.get("JSI_CLUSTER_NAME", "jsi"))
    # Few nodes at first when the agent's start-up is measured (an otherwise idle cluster).
    first = args.sizes[0] if args.sizes and args.skip_agent_start else 0
    cluster.up(nodes=first + SPARE_NODES, real_nodes=1, node_lease_s=args.node_lease)
    token, ctl = prepare_kwok_bench(
        cluster,
        "controller-bench.log",
        verbose=args.verbose_controller,
        module="bench.member_leases" if "leases" in args.paths else None,
        metrics=True,
        **(fronted("bench-leader", cluster) if args.front else {}),
    )
    front = start_front(cluster, args.verbose_controller) if args.front else None
    results: dict[str, Any] = {
        "label": args.label,
        **run_header(run),
        "settings": {
            "restart_delay_s": args.restart_delay,
            "pods_per_job": args.pods_per_job,
            "kwok_nodes": "gang size + 8 (scaled before each size)",
            "node_lease_s": args.node_lease,
            "node_unhealthy_after": {
                str(s): node_unhealthy_after(s, args.defaults) for s in args.sizes
            },
            # what jobset-inplace's gangs carried besides their opt-in where it is not the
            # default, per size ({}: the defaults)
            "defaults": args.defaults,
            "jsi_annotations": {
                str(s): jsi_settings(s, args.scope, args.defaults) for s in args.sizes
            },
            "stock_cap_s": args.stock_cap,
            "node_cap_s": args.node_cap,
            "node_deaths_per_kind": args.node_deaths,
            "reps": args.reps,
            "stock_reps": args.stock_reps,
            "rounds": args.rounds,
            "kubelet_status_writes": "failed pod only" if args.protocol_only else "every pod",
            "agent_reports": args.agent_reports,
            "restart_scope": args.scope,
            "paths": sorted(args.paths),
            "leader_core": args.leader_core,
            "report_front": args.front,
            "idle_s": args.idle,
            "leader_profile_reps": args.leader_profile_reps,
            "leader_profile_python": args.leader_profile_python,
            "fleet_workers": args.fleet_workers,
        },
        "sizes": {},
    }
    try:
        bench = bench_on(
            cluster,
            ctl,
            token,
            leader_core=args.leader_core,
            restart_delay=args.restart_delay,
            pods_per_job=args.pods_per_job,
            setup_timeout=args.setup_timeout,
            stock_cap=args.stock_cap,
            node_cap=args.node_cap,
            profile_s=args.apiserver_profile,
            profile_paths=args.apiserver_profile_paths,
            profile_dir=args.out,
            kubelet_writes=not args.protocol_only,
            scope=args.scope,
            defaults=args.defaults,
            fleet_workers=args.fleet_workers,
            channel=args.agent_reports == "channel",
            idle_s=args.idle,
            leader_profile_reps=args.leader_profile_reps,
            leader_profile_python=args.leader_profile_python,
            front_pid=None if front is None else front.proc.pid,
        )
        bench.clean()
        if not args.skip_agent_start:
            log("=== agent start-up on the real node (idle cluster: no gang, few kwok nodes)")
            results["agent_start"] = agent_start(cluster, 3)
        for size in args.sizes:
            cluster.scale_nodes(size + SPARE_NODES)  # one pod per node, a few spare
            row: dict[str, Any] = {}
            results["sizes"][str(size)] = row
            paths = [p for p in (*IN_PLACE_PATHS, "stock") if p in args.paths]
            for rnd in range(args.rounds):
                last = rnd == args.rounds - 1
                for path in paths[rnd % len(paths) :] + paths[: rnd % len(paths)]:
                    total = args.stock_reps if path == "stock" else args.reps
                    reps = share(total, args.rounds, rnd)
                    deaths = (
                        NODE_DEATHS[path] * args.node_deaths
                        if last and size in args.node_death_sizes
                        else ()
                    )
                    if not reps and not deaths:
                        continue
                    log(
                        f"=== gang of {size} pods: {path}, round {rnd + 1} of {args.rounds} "
                        f"({reps} reps{f', {len(deaths)} node deaths' if deaths else ''})"
                    )
                    if path == "stock":
                        block = bench.stock(size, reps, deaths, profile=rnd == 0)
                    else:
                        with gates_for(cluster, path):
                            block = bench.in_place(path, size, reps, deaths, profile=rnd == 0)
                    merge_block(row, path, block, rnd)
                    report.write(args.out, results)  # keep what was measured so far
        results["controller_rss_end_mib"] = round(bench.meter.rss_mib(), 1)
    finally:
        if front is not None:
            front.stop()
        ctl.stop()
    results["duration_s"] = round(time.time() - run.started, 1)
    results["machine"].update(run.steal())
    written = report.write(args.out, results)
    print(report.text(results))
    log("written: " + ", ".join(str(f) for f in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
