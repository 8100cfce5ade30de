"""``jobset-inplace-agent`` / ``python -m jobset_inplace.agent``: the sidecar's entry point."""

from __future__ import annotations

import time

_STARTED = time.monotonic()  # first thing: the start->report latency includes our imports

import os  # noqa: E402
import signal  # noqa: E402
import ssl  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402

from jobset_inplace import launcher, names, prestart  # noqa: E402
from jobset_inplace.trainer import clear_resume  # noqa: E402

from .config import EXIT_CONFIG, EXIT_CRASH, Config, ConfigError, load_config  # noqa: E402
from .heartbeat import Heartbeat  # noqa: E402
from .kubeapi import KubeApi  # noqa: E402
from .log import Log  # noqa: E402
from .probe import BarrierState, ProbeServer  # noqa: E402
from .runner import Agent, TrainerMonitor  # noqa: E402


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def install_launcher(cfg: Config) -> None:
    """Process scope: put the launcher, and the pre-start hook it may use, where the main
    containers run them from (before the probe answers /started, so before they start), and
    forget the last pod start's states."""
    hook = cfg.state_dir / launcher.PRESTART_HOOK_DIR
    hook.mkdir(exist_ok=True)
    hook.chmod(0o755)
    for source, target in (
        (launcher.__file__, cfg.state_dir / launcher.LAUNCHER_FILE),
        (prestart.__file__, hook / launcher.PRESTART_HOOK_FILE),
    ):
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(Path(source).read_bytes())
        tmp.chmod(0o644)  # the trainer may run as another user
        tmp.replace(target)
    for c in cfg.launched:
        launcher.state_file(cfg.state_dir, c).unlink(missing_ok=True)


def _prepare(cfg: Config, barrier: BarrierState) -> tuple[KubeApi, ProbeServer]:
    """Everything that can fail because of the configuration; raises ConfigError."""
    try:
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        clear_resume(cfg.state_dir)  # the previous epoch's answer must not reach the trainer
        # nor a lease an agent before this one held (hot spares: it renews its own)
        (cfg.state_dir / launcher.LEASE_FILE).unlink(missing_ok=True)
        if cfg.process_scope:
            install_launcher(cfg)
    except OSError as e:
        raise ConfigError(f"{launcher.ENV_STATE_DIR}={cfg.state_dir}: not usable: {e}") from e
    try:
        kube = KubeApi(cfg.server, cfg.token_file, cfg.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{names.ENV_CA_FILE}={cfg.ca_file}: not a usable CA bundle: {e}") from e
    except ValueError as e:
        raise ConfigError(f"{names.ENV_API_SERVER}: {e}") from e
    try:
        probe = ProbeServer(cfg.probe_port, barrier)
    except OSError as e:
        raise ConfigError(f"{names.ENV_PROBE_PORT}={cfg.probe_port}: cannot listen: {e}") from e
    return kube, probe


def main() -> int:
    log = Log()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        cfg = load_config(os.environ)
        barrier = BarrierState()
        kube, probe = _prepare(cfg, barrier)
    except ConfigError as e:
        log.error(f"configuration error: {e}")
        return EXIT_CONFIG
    except Terminated as t:
        log.info(f"{t} received while starting: exiting")
        return 0
    try:
        probe.start()
        log.info(
            f"agent for pod {cfg.namespace}/{cfg.pod_name}, GangState {cfg.gangstate}, "
            f"API {cfg.server}, probe :{cfg.probe_port}"
        )
        agent = Agent(cfg, kube, barrier, log, started=_STARTED)
        monitor = TrainerMonitor(agent, KubeApi(cfg.server, cfg.token_file, cfg.ca_file))
        monitor.start()
        if cfg.position is not None and monitor.channel is not None:
            # hot spares: a heartbeat and its lease, on the monitor's connection
            Heartbeat(
                monitor.channel,
                lambda: (agent.reporter.status_seen, agent.reporter.endpoint),
                agent.running_slot,
                cfg.state_dir,
                log,
            ).start()
        # No probe shutdown on the way out: it would delay the restart by its poll interval.
        return agent.run()
    except Terminated as t:
        log.info(f"{t} received: exiting")
        return 0
    except Exception as e:
        log.error(f"agent crashed: {type(e).__name__}: {e}")
        traceback.print_exc()
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
