"""``kubectl jobset-inplace``: inspect and operate jobset-inplace gangs.

Subcommands: list, status, history, restart, enable, doctor, version. Run ``kubectl jobset-inplace
COMMAND --help`` for each; exit codes are listed in docs/kubectl-plugin.md."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NoReturn

import urllib3

from jobset_inplace import __version__, names
from jobset_inplace.apierrors import or_none
from jobset_inplace.core.policy import PolicyError, is_enabled, parse_duration
from jobset_inplace.core.transform import DEFAULT_AGENT_IMAGE, TransformError
from jobset_inplace.times import format_time

from . import doctor as doctor_mod
from . import enable as enable_mod
from . import render
from .cluster import ApiException, Cluster, ClusterConfigError, api_error_message, connect
from .exitcodes import ExitCode

PROG = "kubectl jobset-inplace"


class CommandError(Exception):
    """A failure with the message to print and the exit code to return."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def _add_cluster_flags(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """The cluster flags, accepted before the subcommand and after it (as with kubectl). After
    it they default to SUPPRESS so that they do not overwrite a value given before it."""
    default = None if top else argparse.SUPPRESS
    g = p.add_argument_group("cluster (as kubectl)")
    g.add_argument(
        "--kubeconfig",
        default=default,
        help="path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    g.add_argument(
        "--context", default=default, help="kubeconfig context (default: the current one)"
    )
    g.add_argument(
        "-n",
        "--namespace",
        default=default,
        help="namespace (default: the context's namespace, else 'default')",
    )
    g.add_argument(
        "--request-timeout",
        default=default,
        metavar="DURATION",
        help="how long to wait for each API request: 0 (no limit, the default), seconds, "
        "or a duration such as 5s or 1m",
    )


EPILOG = "exit codes: " + ", ".join(f"{int(c)} {c.name}" for c in ExitCode)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, description="Inspect and operate jobset-inplace gangs.", epilog=EPILOG
    )
    _add_cluster_flags(parser, top=True)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    p = sub.add_parser(
        "list",
        help="every gang of the namespace (-A: of every namespace), one line each",
        epilog=(
            "examples:\n  kubectl jobset-inplace list -n team-a\n"
            "  kubectl jobset-inplace list -A -o yaml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="list the gangs of every namespace"
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], help="output format")
    _add_cluster_flags(p)

    p = sub.add_parser(
        "status",
        help="gang status of a JobSet (GangState + pods + nodes)",
        epilog=(
            "examples:\n  kubectl jobset-inplace status train -n team-a -o wide\n"
            "  kubectl jobset-inplace status train -n team-a -w   # again on every change"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME", help="JobSet name (its GangState has the same name)")
    p.add_argument("-o", "--output", choices=["yaml", "json", "wide"], help="output format")
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="after the status, print it again whenever it changes (read every --interval) "
        "until interrupted",
    )
    p.add_argument(
        "--interval",
        default="2s",
        metavar="DURATION",
        help="with --watch: how often to read (default: 2s)",
    )
    _add_cluster_flags(p)

    p = sub.add_parser(
        "history",
        help="past recoveries of a JobSet, newest last",
        epilog="example:\n  kubectl jobset-inplace history train -n team-a -o yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("-o", "--output", choices=["yaml", "json"], help="output format")
    _add_cluster_flags(p)

    p = sub.add_parser(
        "restart",
        help="ask for a manual in-place restart of the whole gang",
        epilog=(
            "examples:\n  kubectl jobset-inplace restart train -n team-a\n"
            "  kubectl jobset-inplace restart train -n team-a --yes   # no question (scripts)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    _add_cluster_flags(p)

    p = sub.add_parser(
        "enable",
        help="transform a JobSet manifest for hybrid recovery (offline)",
        epilog=(
            "examples:\n  kubectl jobset-inplace enable -f jobset.yaml | kubectl apply -f -\n"
            "  kubectl jobset-inplace enable -f jobset.yaml --diff"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="JobSet YAML, or - for stdin"
    )
    p.add_argument("--diff", action="store_true", help="print a unified diff instead")
    p.add_argument(
        "--image",
        default=DEFAULT_AGENT_IMAGE,
        help=f"agent image (default: {DEFAULT_AGENT_IMAGE})",
    )

    p = sub.add_parser(
        "version",
        help="the plugin's version and the controller's (warns when they differ)",
        epilog="examples:\n  kubectl jobset-inplace version -o yaml\n"
        "  kubectl jobset-inplace version --client",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--client", action="store_true", help="the plugin's version only (no cluster needed)"
    )
    p.add_argument(
        "--controller-namespace",
        default=names.INSTALL_NAMESPACE,
        help=f"where the controller runs (default: {names.INSTALL_NAMESPACE})",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], help="output format")
    _add_cluster_flags(p)

    p = sub.add_parser(
        "doctor",
        help="check that the cluster can run jobset-inplace, and the install in -n",
        epilog=(
            "examples:\n  kubectl jobset-inplace doctor -n team-a\n"
            "  kubectl jobset-inplace doctor -n team-a --barrier-timeout 10m -o json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--barrier-timeout",
        default="5m",
        help="barrier timeout to compare Kueue's recoveryTimeout with (default: 5m)",
    )
    p.add_argument(
        "--controller-namespace",
        default=names.INSTALL_NAMESPACE,
        help=f"where the controller runs (default: {names.INSTALL_NAMESPACE})",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], help="output format")
    _add_cluster_flags(p)
    return parser


# --- commands ------------------------------------------------------------------------------------
def _get_gangstate(c: Cluster, name: str) -> dict[str, Any]:
    gs = or_none(c.gangstate, name)
    if gs is None:
        raise CommandError(
            f"GangState {name} not found in namespace {c.namespace}: is the JobSet opted in "
            f"({names.ENABLED}=true) and the controller running? "
            "(if the GangState CRD itself is missing: kubectl jobset-inplace doctor)",
            ExitCode.NOT_FOUND,
        )
    return gs


def cmd_status(
    c: Cluster,
    args: argparse.Namespace,
    out: IO[str],
    sleep: Callable[[float], None] = time.sleep,
) -> ExitCode:
    interval = _duration("--interval", args.interval)
    if not args.watch:
        out.write(_status_text(c, args))
        return ExitCode.OK
    if interval <= 0:
        raise CommandError("--interval: give a duration above 0, such as 2s", ExitCode.USAGE)
    shown = ""
    try:
        while True:
            text = _status_text(c, args)
            if text != shown:
                if shown:
                    out.write(f"\n--- {format_time(None, micro=False)}\n")
                out.write(text)
                out.flush()
                shown = text
            sleep(interval)
    except KeyboardInterrupt:
        return ExitCode.OK


def _status_text(c: Cluster, args: argparse.Namespace) -> str:
    gs = _get_gangstate(c, args.name)
    js = or_none(c.jobset, args.name)
    pods = c.jobset_pods(args.name)
    names = sorted({str(n) for p in pods if (n := (p.get("spec") or {}).get("nodeName"))})
    nodes: dict[str, dict[str, Any] | None] | None = {}
    try:
        nodes = {n: c.node(n) for n in names}
    except ApiException as e:
        if e.status != 403:
            raise
        nodes = None  # not allowed to read nodes: say so rather than guess
    members = None
    try:
        members = or_none(c.gangmembers, args.name)
    except ApiException as e:
        if e.status != 403:
            raise  # not allowed to read it: the members' reports on their pods only
    doc = render.status_document(gs, js, pods, nodes, time.time(), members=members)
    if args.output in ("json", "yaml"):
        return render.dump(doc, args.output)
    return render.render_status(doc, wide=args.output == "wide")


def _duration(flag: str, value: str) -> float:
    """A duration flag as kubectl takes one: ``0``, seconds, or ``5s``, ``1m``, ``1h30m``."""
    if value.isdigit():
        return float(value)
    try:
        return parse_duration(flag, value)
    except PolicyError as e:
        raise CommandError(str(e), ExitCode.USAGE) from None


def cmd_list(c: Cluster, args: argparse.Namespace, out: IO[str]) -> ExitCode:
    doc = render.list_document(c.gangstates(all_namespaces=args.all_namespaces), time.time())
    if args.output:
        out.write(render.dump(doc, args.output))
    else:
        out.write(render.render_list(doc, all_namespaces=args.all_namespaces))
    return ExitCode.OK


def cmd_history(c: Cluster, args: argparse.Namespace, out: IO[str]) -> ExitCode:
    doc = render.history_document(_get_gangstate(c, args.name))
    if args.output:
        out.write(render.dump(doc, args.output))
    else:
        out.write(render.render_history(doc))
    return ExitCode.OK


def restart_value(now: dt.datetime | None = None) -> str:
    """A fresh, unique request value: the UTC time to the microsecond."""
    return format_time(None if now is None else now.timestamp())


def confirm(question: str, stdin: IO[str], err: IO[str]) -> bool:
    """Ask on a TTY; refuse (raise) when stdin is not one."""
    if not stdin.isatty():
        raise CommandError(
            "refusing to restart without confirmation: stdin is not a terminal; "
            "pass --yes to confirm non-interactively",
            ExitCode.USAGE,
        )
    err.write(f"{question} [y/N] ")
    err.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


def cmd_restart(
    c: Cluster, args: argparse.Namespace, out: IO[str], stdin: IO[str], err: IO[str]
) -> ExitCode:
    js = or_none(c.jobset, args.name)
    if js is None:
        raise CommandError(
            f"JobSet {args.name} not found in namespace {c.namespace}", ExitCode.NOT_FOUND
        )
    annotations = (js.get("metadata") or {}).get("annotations") or {}
    if not is_enabled(annotations):
        raise CommandError(
            f"JobSet {c.namespace}/{args.name} has not opted in to jobset-inplace: set the "
            f'annotation {names.ENABLED}: "true" (see kubectl jobset-inplace enable)'
        )
    question = (
        f"Restart every member of JobSet {c.namespace}/{args.name} in place "
        "(new epoch, all trainers resume from the newest common checkpoint)?"
    )
    if not args.yes and not confirm(question, stdin, err):
        raise CommandError("restart not confirmed; nothing changed", ExitCode.USAGE)
    value = restart_value()
    c.annotate_jobset(args.name, {names.RESTART_REQUEST: value})
    out.write(
        f"jobset.jobset.x-k8s.io/{args.name} restart requested ({names.RESTART_REQUEST}={value})\n"
        f"follow it with: kubectl jobset-inplace status {args.name} -n {c.namespace}\n"
    )
    return ExitCode.OK


def cmd_enable(args: argparse.Namespace, out: IO[str], err: IO[str], stdin: IO[str]) -> ExitCode:
    source = args.filename
    try:
        text = stdin.read() if source == "-" else Path(source).read_text()
    except OSError as e:
        raise CommandError(f"cannot read {source}: {e.strerror or e}") from None
    render = enable_mod.enable_diff if args.diff else enable_mod.enable_text
    try:
        written, said = render(text, args.image, source=source)
    except (TransformError, PolicyError, enable_mod.InputError) as e:
        raise CommandError(f"cannot enable {source}: {e}") from None
    for warning in said:  # as kubectl prints the webhook's warnings on a create
        err.write(f"Warning: {warning}\n")
    out.write(written)
    return ExitCode.OK


def cmd_version_client(args: argparse.Namespace, out: IO[str]) -> ExitCode:
    doc = {"plugin": __version__}
    out.write(render.dump(doc, args.output) if args.output else f"plugin:     {__version__}\n")
    return ExitCode.OK


def cmd_version(c: Cluster, args: argparse.Namespace, out: IO[str], err: IO[str]) -> ExitCode:
    where = f"{args.controller_namespace}/{names.CONTROLLER_NAME}"
    try:
        deployment = c.deployment(args.controller_namespace, names.CONTROLLER_NAME)
    except ApiException as e:
        raise CommandError(f"cannot read Deployment {where}: {api_error_message(e)}") from None
    doc = render.version_document(__version__, deployment, where)
    if args.output:
        out.write(render.dump(doc, args.output))
    else:
        out.write(render.render_version(doc))
    if doc["skew"]:
        err.write(f"warning: {doc['skew']}\n")
    return ExitCode.OK


def cmd_doctor(c: Cluster, args: argparse.Namespace, out: IO[str]) -> ExitCode:
    try:
        barrier = parse_duration("--barrier-timeout", args.barrier_timeout)
    except PolicyError as e:
        raise CommandError(str(e), ExitCode.USAGE) from None
    c.server_version()  # unreachable cluster: exit NO_CLUSTER rather than a page of FAILs
    checks = doctor_mod.run_checks(c, barrier, args.controller_namespace)
    if args.output:
        out.write(render.dump(doctor_mod.checks_document(checks), args.output))
    else:
        out.write(doctor_mod.render_checks(checks))
    return ExitCode.FAILED if doctor_mod.failed(checks) else ExitCode.OK


def main(
    argv: list[str] | None = None,
    *,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    stdin: IO[str] | None = None,
    connector: Callable[[str | None, str | None, str | None], Cluster] = connect,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    out, err, inp = stdout or sys.stdout, stderr or sys.stderr, stdin or sys.stdin
    args = build_parser().parse_args(argv)
    try:
        offline = {"enable": lambda: cmd_enable(args, out, err, inp)}
        if args.command == "version" and args.client:
            offline["version"] = lambda: cmd_version_client(args, out)
        if args.command in offline:
            return int(offline[args.command]())
        timeout = _duration("--request-timeout", args.request_timeout or "0")
        try:
            c = connector(args.kubeconfig, args.context, args.namespace)
        except ClusterConfigError as e:
            if args.command == "version":  # the plugin's own, before the cluster's error
                cmd_version_client(args, out)
            raise CommandError(str(e), ExitCode.NO_CLUSTER) from None
        if timeout > 0:
            c.set_request_timeout(timeout)
        commands: dict[str, Callable[[], ExitCode]] = {
            "list": lambda: cmd_list(c, args, out),
            "status": lambda: cmd_status(c, args, out, sleep),
            "history": lambda: cmd_history(c, args, out),
            "restart": lambda: cmd_restart(c, args, out, inp, err),
            "doctor": lambda: cmd_doctor(c, args, out),
            "version": lambda: cmd_version(c, args, out, err),
        }
        return int(commands[args.command]())
    except CommandError as e:
        err.write(f"error: {e}\n")
        return int(e.code)
    except render.MalformedStatus as e:
        err.write(f"error: {e}\n")
        return int(ExitCode.FAILED)
    except ApiException as e:
        err.write(f"error: the API server answered {api_error_message(e)}\n")
        return int(ExitCode.FAILED)
    except (OSError, urllib3.exceptions.HTTPError) as e:  # connection refused, DNS, TLS
        if _timed_out(e):
            err.write(
                f"error: the API server did not answer within --request-timeout "
                f"{args.request_timeout}: {e}\n"
            )
        else:
            err.write(f"error: cannot reach the cluster: {e}; check --kubeconfig/--context\n")
        return int(ExitCode.NO_CLUSTER)


def _timed_out(e: BaseException) -> bool:
    reason = getattr(e, "reason", None)  # MaxRetryError wraps a connect timeout
    return isinstance(e, urllib3.exceptions.TimeoutError) or isinstance(
        reason, urllib3.exceptions.TimeoutError
    )
