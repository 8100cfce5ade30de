#!/usr/bin/env bash
# A Docker engine for kind, from the machine's own Debian sources, started and checked
# (idempotent: with an engine already answering it only checks it).
#
#   bash testbed/kind/engine.sh          # make sure an engine answers (and, if it is ours, runs
#                                        # privileged containers)
#   bash testbed/kind/engine.sh --stop   # stop the engine this script started (by its pid file)
#
# What it does on a machine without an engine (docs/testing.md#kind):
# - installs `docker.io` with apt from the configured sources (no registry host named here);
# - runs `dockerd` itself (no init system needed), with its own configuration file, pid file and
#   log under $JSI_CACHE/kind/engine; the host's /etc/docker is not touched;
# - where the host's capability bounding set lacks capabilities Docker grants a `--privileged`
#   container (kind's nodes are privileged), makes testbed/kind/runc-host-caps dockerd's
#   default runtime (runc without those capabilities; on a host with all of them, plain runc);
# - enables IPv4 forwarding before dockerd starts if it is off, so dockerd leaves the FORWARD
#   chain's policy as it is (it sets it to DROP when it has to enable forwarding itself, which
#   would cut the local cluster's pod traffic); Docker's own chains only match its bridges.
# Then it checks the engine end to end: a privileged container runs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib_tag=engine
# shellcheck source=testbed/kind/lib.sh
source "$here/lib.sh"
dir="$JSI_CACHE/kind/engine"
pidfile="$dir/dockerd.pid"

ours_running() { [[ -s "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

if [[ "${1:-}" == "--stop" ]]; then
  if ours_running; then
    pid="$(cat "$pidfile")"
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && die "dockerd ($pid) still running 30 s after SIGTERM"
    log "dockerd ($pid) stopped"
  else
    log "no dockerd started by this script is running"
  fi
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--stop]" >&2
  exit 2
fi

check() {
  # A privileged container (what kind's nodes are) from the pause image the testbed builds
  # offline (testbed/images.py): it must start and keep running.
  local archive name=jsi-engine-check
  archive="$(pause_archive)"
  docker load -q -i "$archive" >/dev/null
  docker rm -f "$name" >/dev/null 2>&1 || true
  docker run -d --privileged --name "$name" registry.k8s.io/pause:3.10 >/dev/null ||
    die "a privileged container does not start (docker run --privileged): see $dir/dockerd.log"
  local state
  state="$(docker inspect -f '{{.State.Status}}' "$name")"
  docker rm -f "$name" >/dev/null
  [[ "$state" == running ]] || die "the privileged check container is $state, not running"
  log "ok: $(docker version -f 'engine {{.Server.Version}}, API {{.Server.APIVersion}}'); a privileged container runs"
}

if docker info >/dev/null 2>&1; then
  if ours_running; then
    check
  else  # the host's own engine (a CI runner's): used as it is
    log "using the engine that answers: $(docker version -f 'engine {{.Server.Version}}')"
  fi
  exit 0
fi

mkdir -p "$dir"
if ! command -v dockerd >/dev/null; then
  log "installing docker.io from the machine's Debian sources ..."
  began=$SECONDS
  # policy-rc.d: the package's scripts must not start a daemon (this script starts its own).
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  policy=/usr/sbin/policy-rc.d ours=""
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    ours=1
    trap 'rm -f "$policy"' EXIT
  elif "$policy" docker start >/dev/null 2>&1 || [[ $? != 101 ]]; then
    die "$policy lets the package start services: not overriding it; install docker.io by hand"
  fi
  apt-get install -y -qq --no-install-recommends docker.io >"$dir/apt.log" 2>&1 ||
    { tail -20 "$dir/apt.log" >&2; die "apt-get install docker.io failed (log: $dir/apt.log)"; }
  if [[ -n "$ours" ]]; then
    rm -f "$policy"
    trap - EXIT
  fi
  log "installed $(dpkg-query -W -f '${Version}' docker.io) in $((SECONDS - began)) s"
fi

config="$dir/daemon.json"
mapfile -t missing < <("$here/runc-host-caps" --missing)
if ((${#missing[@]})); then
  command -v runc >/dev/null || die "runc not found (docker.io depends on it)"
  wrapper="$dir/runc-host-caps"
  cp "$here/runc-host-caps" "$wrapper"
  log "this host's capability bounding set lacks ${missing[*]}: dockerd's default runtime is $wrapper (runc without them)"
  printf '{"runtimes": {"jsi-runc": {"path": "%s"}}, "default-runtime": "jsi-runc"}\n' "$wrapper" >"$config"
else
  echo '{}' >"$config"
fi

if [[ "$(cat /proc/sys/net/ipv4/ip_forward)" != 1 ]]; then
  log "enabling IPv4 forwarding first, so that dockerd keeps the FORWARD policy as it is"
  sysctl -q -w net.ipv4.ip_forward=1
fi
forward_before="$(iptables -S FORWARD 2>/dev/null | head -1 || true)"

log "starting dockerd (log: $dir/dockerd.log) ..."
setsid dockerd --config-file "$config" --pidfile "$pidfile" >"$dir/dockerd.log" 2>&1 </dev/null &
for _ in $(seq 120); do
  docker info >/dev/null 2>&1 && break
  kill -0 $! 2>/dev/null || { tail -20 "$dir/dockerd.log" >&2; die "dockerd exited"; }
  sleep 0.5
done
docker info >/dev/null 2>&1 || { tail -20 "$dir/dockerd.log" >&2; die "dockerd did not answer within 60 s"; }
forward_after="$(iptables -S FORWARD 2>/dev/null | head -1 || true)"
[[ "$forward_before" == "$forward_after" ]] ||
  log "warning: the FORWARD policy changed from '$forward_before' to '$forward_after'"
check
