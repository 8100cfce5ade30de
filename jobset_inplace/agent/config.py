"""The agent's configuration, read from the environment (the downward API in real pods)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jobset_inplace.launcher import DEFAULT_STOP_GRACE, ENV_STOP_GRACE
from jobset_inplace.names import (
    DEFAULT_PROBE_PORT,
    DEFAULT_RESTART_EXIT_CODE,
    DEFAULT_RESTART_SCOPE,
    ENV_API_SERVER,
    ENV_CA_FILE,
    ENV_CHECKPOINT_LAYOUT,
    ENV_CHECKPOINT_STEP_PATTERN,
    ENV_GANGSTATE,
    ENV_HANG_TIMEOUT,
    ENV_JOB_INDEX,
    ENV_LAUNCHED_CONTAINERS,
    ENV_PEER_DOMAIN,
    ENV_PROBE_PORT,
    ENV_REPLICATED_JOB,
    ENV_REPORT_TOKEN_FILE,
    ENV_RESTART_EXIT_CODE,
    ENV_RESTART_SCOPE,
    ENV_SLOTS,
    ENV_STARTUP_TIMEOUT,
    ENV_STRAGGLER_WINDOW,
    ENV_STRAGGLER_WINDOWS,
    ENV_TOKEN_FILE,
    RestartScope,
)
from jobset_inplace.trainer import resolve_state_dir, tier_roots
from jobset_inplace.trainer.checkpoints import MAX_STEP, parse_canonical_int
from jobset_inplace.trainer.layouts import CheckpointLayout, checkpoint_layout

from .hang import HangRule
from .logic import Position

__all__ = [
    "DEFAULT_PROBE_PORT",
    "EXIT_CONFIG",
    "EXIT_CRASH",
    "SA_DIR",
    "Config",
    "ConfigError",
    "load_config",
    "position_from_env",
]

EXIT_CRASH = 1  # an unexpected error in the agent (Python's own code for an uncaught one)
EXIT_CONFIG = 2  # bad configuration: never the restart exit code
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ConfigError(ValueError):
    """A configuration problem; the message names the variable."""


@dataclass(frozen=True)
class Config:
    pod_name: str
    namespace: str
    gangstate: str
    state_dir: Path
    local_dir: Path | None
    persistent_dir: Path | None
    restart_exit_code: int
    probe_port: int
    server: str  # https://host:port (or http:// for a simulation)
    token_file: Path | None  # None: send no token
    ca_file: Path | None  # None: system trust store (https) or plain http
    # "process": trainers run under launchers (these main containers') that the agent stops
    # and starts per epoch; "pod": the agent exits with the restart code (RestartAllContainers).
    restart_scope: RestartScope = DEFAULT_RESTART_SCOPE
    launched: tuple[str, ...] = ()
    stop_grace: float = DEFAULT_STOP_GRACE
    hang: HangRule = field(default_factory=HangRule)
    # Straggler detection: the window (seconds; None: off) and how many windows to publish.
    busy_window: float | None = None
    busy_windows: int = 3
    # The checkpoint layout of both tiers (the trainer contract's unless the JobSet names one).
    layout: CheckpointLayout = field(default_factory=lambda: checkpoint_layout("jobset-inplace"))
    # The report channel: this pod's UID and its token for the channel's audience (either None:
    # reports are written on the pod, as by agents injected before the channel existed).
    pod_uid: str | None = None
    report_token_file: Path | None = None
    # Hot spares (None: the gang has none in this pod's replicatedJob): where this pod stands
    position: Position | None = None

    @property
    def channel(self) -> bool:
        return self.pod_uid is not None and self.report_token_file is not None

    @property
    def process_scope(self) -> bool:
        return self.restart_scope == RestartScope.PROCESS

    @property
    def gang(self) -> str:
        return f"{self.namespace}/{self.gangstate}"


def _name(env: Mapping[str, str], var: str, pattern: re.Pattern[str], limit: int) -> str:
    value = env.get(var, "")
    if not value:
        raise ConfigError(f"{var} is not set (it should come from the downward API)")
    if len(value) > limit or pattern.fullmatch(value) is None:
        raise ConfigError(
            f"{var}={value!r} is not a valid Kubernetes name (lower-case DNS name, "
            f"at most {limit} characters)"
        )
    return value


def _int(
    env: Mapping[str, str], var: str, default: int, *, low: int, high: int, why: str = ""
) -> int:
    raw = env.get(var, "")
    if raw == "":
        return default
    # Canonical decimal only, as everywhere (not " 88", "+88", "088", "8_8", full-width digits).
    value = parse_canonical_int(raw, high)
    if value is None or value < low:
        raise ConfigError(
            f"{var} must be an integer {low}..{high}{why} in plain decimal digits, got {raw[:40]!r}"
        )
    return value


def _server(env: Mapping[str, str]) -> str:
    explicit = env.get(ENV_API_SERVER, "")
    if explicit:
        if not explicit.startswith(("https://", "http://")):
            raise ConfigError(f"{ENV_API_SERVER} must start with https:// or http://: {explicit!r}")
        return explicit.rstrip("/")
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set (not running in a pod?); "
            f"set {ENV_API_SERVER} to reach the API server"
        )
    if parse_canonical_int(port, 65535) in (None, 0):
        raise ConfigError(f"KUBERNETES_SERVICE_PORT must be a port 1..65535, got {port[:40]!r}")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"https://{host}:{port}"


def _readable_file(env: Mapping[str, str], var: str, default: Path) -> Path | None:
    """`var`'s file (default `default`); an explicitly empty `var` means none."""
    if var in env and env[var] == "":
        return None
    path = Path(env.get(var) or default)
    if not path.is_file():
        where = f"{var}={path}" if env.get(var) else f"{path} (default; set {var} to override)"
        raise ConfigError(f"{where}: no such file")
    return path


def _scope(env: Mapping[str, str]) -> tuple[RestartScope, tuple[str, ...], float]:
    raw_scope = env.get(ENV_RESTART_SCOPE, "") or DEFAULT_RESTART_SCOPE
    try:
        scope = RestartScope(raw_scope)
    except ValueError:
        accepted = " or ".join(RestartScope)
        raise ConfigError(
            f"{ENV_RESTART_SCOPE} must be {accepted}, got {raw_scope[:40]!r}"
        ) from None
    raw = env.get(ENV_LAUNCHED_CONTAINERS, "")
    launched = tuple(n for n in raw.split(",") if n)
    if scope is RestartScope.PROCESS and not launched:
        raise ConfigError(
            f"{ENV_LAUNCHED_CONTAINERS} must list the main containers (process scope, the "
            f"default where {ENV_RESTART_SCOPE} is not set)"
        )
    for n in launched:
        if len(n) > 63 or _DNS_LABEL.fullmatch(n) is None:
            raise ConfigError(f"{ENV_LAUNCHED_CONTAINERS}: {n[:70]!r} is not a container name")
    grace_raw = env.get(ENV_STOP_GRACE, "")
    try:
        grace = float(grace_raw) if grace_raw else DEFAULT_STOP_GRACE
    except ValueError:
        grace = -1.0
    if not 0 <= grace <= 3600:
        raise ConfigError(f"{ENV_STOP_GRACE} must be 0..3600 seconds, got {grace_raw[:40]!r}")
    return scope, launched, grace


MAX_HANG_TIMEOUT_S = 7 * 24 * 3600.0


def _seconds(env: Mapping[str, str], var: str) -> float | None:
    """A positive number of seconds (None: unset, the feature is off)."""
    raw = env.get(var, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_HANG_TIMEOUT_S:  # also refuses nan
        raise ConfigError(
            f"{var} must be seconds, more than 0 and at most {MAX_HANG_TIMEOUT_S:g}, "
            f"got {raw[:40]!r}"
        )
    return value


def _layout(env: Mapping[str, str]) -> CheckpointLayout:
    try:
        return checkpoint_layout(
            env.get(ENV_CHECKPOINT_LAYOUT) or "jobset-inplace",
            env.get(ENV_CHECKPOINT_STEP_PATTERN) or None,
        )
    except ValueError as e:
        raise ConfigError(f"{ENV_CHECKPOINT_LAYOUT}/{ENV_CHECKPOINT_STEP_PATTERN}: {e}") from None


def position_from_env(env: Mapping[str, str], gangstate: str) -> Position | None:
    """This pod's place among the hot spares' slots (None: no spares here), from the
    variables the webhook gives the agent; raises `ConfigError` naming a bad one."""
    if not env.get(ENV_SLOTS):
        return None
    members = _int(env, ENV_SLOTS, 0, low=1, high=MAX_STEP)
    if not env.get(ENV_JOB_INDEX):
        raise ConfigError(f"{ENV_JOB_INDEX} is not set (it should come from the downward API)")
    return Position(
        jobset=gangstate,
        replicated_job=_name(env, ENV_REPLICATED_JOB, _DNS_LABEL, 63),
        members=members,
        job_index=_int(env, ENV_JOB_INDEX, -1, low=0, high=MAX_STEP),
        domain=_name(env, ENV_PEER_DOMAIN, _DNS_SUBDOMAIN, 253),
    )


def load_config(env: Mapping[str, str]) -> Config:
    """The configuration in `env`; raises `ConfigError` naming the first bad variable."""
    pod = _name(env, "POD_NAME", _DNS_SUBDOMAIN, 253)
    namespace = _name(env, "POD_NAMESPACE", _DNS_LABEL, 63)
    gangstate = _name(env, ENV_GANGSTATE, _DNS_SUBDOMAIN, 253)
    restart = _int(
        env,
        ENV_RESTART_EXIT_CODE,
        DEFAULT_RESTART_EXIT_CODE,
        low=3,
        high=255,
        why=f" (0 is success, {EXIT_CRASH} an agent crash, {EXIT_CONFIG} a configuration error)",
    )
    port = _int(env, ENV_PROBE_PORT, DEFAULT_PROBE_PORT, low=1, high=65535)
    scope, launched, grace = _scope(env)
    server = _server(env)
    token = _readable_file(env, ENV_TOKEN_FILE, SA_DIR / "token")
    local, persistent = tier_roots(env)
    ca: Path | None = None
    if server.startswith("https://"):
        ca = _readable_file(env, ENV_CA_FILE, SA_DIR / "ca.crt")
    return Config(
        pod_name=pod,
        namespace=namespace,
        gangstate=gangstate,
        state_dir=resolve_state_dir(env),
        local_dir=local,
        persistent_dir=persistent,
        restart_exit_code=restart,
        probe_port=port,
        server=server,
        token_file=token,
        ca_file=ca,
        restart_scope=scope,
        launched=launched,
        stop_grace=grace,
        hang=HangRule(_seconds(env, ENV_HANG_TIMEOUT), _seconds(env, ENV_STARTUP_TIMEOUT)),
        busy_window=_seconds(env, ENV_STRAGGLER_WINDOW),
        busy_windows=_int(env, ENV_STRAGGLER_WINDOWS, 3, low=1, high=20),
        layout=_layout(env),
        pod_uid=env.get("POD_UID") or None,
        report_token_file=(
            _readable_file(env, ENV_REPORT_TOKEN_FILE, Path())
            if env.get(ENV_REPORT_TOKEN_FILE)
            else None
        ),
        position=position_from_env(env, gangstate),
    )
