#!/usr/bin/env bash
# A real kubelet (the pinned Kubernetes, built by testbed/build-binaries.sh) as one node of a
# cluster, on this VM's cgroup v1, against the node's own containerd (containerd.sh).
#
# Usage:
#   testbed/realnode/kubelet.sh up     NODE_NAME KUBECONFIG   start containerd (if needed) + kubelet,
#                                                        wait until the Node is Ready
#   testbed/realnode/kubelet.sh stop   NODE_NAME              stop the kubelet only; containers keep
#                                                        running (kubelet crash / partition)
#   testbed/realnode/kubelet.sh down   NODE_NAME              power-off: kubelet and every container
#                                                        killed at one instant, then containerd
#   testbed/realnode/kubelet.sh purge  NODE_NAME              down + delete the node's dirs, cgroups
#   testbed/realnode/kubelet.sh status NODE_NAME
#
# Everything of a node lives under $JSI_CACHE_DIR/realnode/<node>/ (kubelet/ and containerd/).
# KUBECONFIG is flattened (certificates embedded) into kubelet/kubeconfig, so the kubelet
# keeps working if the original file goes away; it needs rights to register a Node
# (the harness's admin token is fine). The kubelet:
#   - registers NODE_NAME with label jobset-inplace.dev/real-node=true, node IP = the node's
#     CNI bridge gateway (10.244.<n>.1, unique per node; see containerd.sh),
#   - serves its API on <node IP>:<free port> (webhook authn/authz against the apiserver,
#     no anonymous access, self-signed serving cert), healthz on 127.0.0.1:<free port>,
#     read-only port off,
#   - uses cgroup v1 + cgroupfs (failCgroupV1: false) under its own cgroup root /jsi-<node>,
#   - runs with the feature gates the in-place path needs on the pinned Kubernetes
#     (jobset_inplace/platform.py: RestartAllContainersOnContainerExits and NodeDeclaredFeatures
#     on 1.35; none from 1.36, where they are on by default), and ResourceHealthStatus on 1.35
#     (device health in pod status, for the device-fault tests).
# K8S picks the Kubernetes minor (testbed/versions.env), as for build-binaries.sh.
# Env: JSI_CACHE_DIR, JSI_KUBELET_VERBOSITY (default 2), JSI_NODE_READY_TIMEOUT (default 120 s),
#   JSI_KUBELET_CLIENT_CA_FILE  CA whose client certs the kubelet accepts (x509 authn). Needed
#     for `kubectl logs/exec` through the apiserver: the apiserver must then run with
#     --kubelet-client-certificate/--kubelet-client-key signed by that CA and
#     --kubelet-preferred-address-types=InternalIP (see docs/real-node.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=testbed/versions.sh
source "$here/../versions.sh"
cache="$JSI_CACHE"
bindir="$KUBERNETES_BIN"
minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
# "featureGates:" YAML for the gates the in-place path needs here (empty from 1.36).
FEATURE_GATES_YAML="$(PYTHONPATH="$here/../.." python3 -c '
import sys
from jobset_inplace.platform import device_health_gates, gates_needed
gates = gates_needed(int(sys.argv[1])) + device_health_gates(int(sys.argv[1]))
print("featureGates:" if gates else "", *(f"  {g}: true" for g in gates), sep="\n")
' "$minor")"
NODE_LABELS="jobset-inplace.dev/real-node=true"

cmd="${1:-}"
node="${2:-}"
[[ -n "$cmd" && -n "$node" ]] || { sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d' >&2; exit 2; }
[[ "$node" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || { echo "bad node name: $node" >&2; exit 2; }

dir="$cache/realnode/$node/kubelet"
pidfile="$dir/kubelet.pid"
logfile="$dir/kubelet.log"
cgroot="/jsi-$node"

log() { printf '[kubelet %s %s] %s\n' "$node" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

running_pid() {
  [[ -f "$pidfile" ]] || return 1
  local pid
  pid="$(cat "$pidfile")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--config $dir/config.yaml" || return 1
  echo "$pid"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])'; }

# cgroup v1: the kubelet requires --cgroup-root to exist in every hierarchy. A new cpuset
# cgroup starts with empty cpus/mems, so copy them from the root.
ensure_cgroup_root() {
  local h
  for h in /sys/fs/cgroup/*/; do
    h="${h%/}"
    [[ "$(basename "$h")" == unified ]] && continue
    mountpoint -q "$h" || continue
    mkdir -p "$h$cgroot"
    if [[ -f "$h/cpuset.cpus" ]]; then
      [[ -n "$(cat "$h$cgroot/cpuset.cpus")" ]] || cat "$h/cpuset.cpus" >"$h$cgroot/cpuset.cpus"
      [[ -n "$(cat "$h$cgroot/cpuset.mems")" ]] || cat "$h/cpuset.mems" >"$h$cgroot/cpuset.mems"
    fi
  done
}

remove_cgroup_root() {
  local h
  for h in /sys/fs/cgroup/*/; do
    h="${h%/}"
    [[ -d "$h$cgroot" ]] || continue
    find "$h$cgroot" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

write_config() {
  local port="$1" hport="$2" sock="$3" node_ip="$4" client_ca="" cluster_dns=""
  # The cluster DNS (testbed/dns.py: CoreDNS on the host); without it pods get the host's resolvers.
  if [[ -n "${JSI_CLUSTER_DNS:-}" ]]; then cluster_dns="clusterDNS: [$JSI_CLUSTER_DNS]"; fi
  mkdir -p "$dir/root" "$dir/pki" "$dir/pod-logs"
  if [[ -n "${JSI_KUBELET_CLIENT_CA_FILE:-}" ]]; then
    cp "$JSI_KUBELET_CLIENT_CA_FILE" "$dir/pki/client-ca.crt"
    client_ca="$dir/pki/client-ca.crt"
  fi
  cat >"$dir/config.yaml.tmp" <<EOF
# Generated by testbed/realnode/kubelet.sh for node $node. Rewritten on every 'up'.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
$FEATURE_GATES_YAML
# This VM is cgroup v1, deprecated since Kubernetes 1.35 (the kubelet refuses it by default).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $cgroot
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$sock
registerNode: true
address: $node_ip
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $hport
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "$client_ca"
authorization:
  mode: Webhook
podLogsDir: $dir/pod-logs
failSwapOn: false
serializeImagePulls: false
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
$cluster_dns
# Short status reports: tests see node/pod changes quickly.
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
# Offline node: never garbage-collect the locally built images.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 5%
  imagefs.available: 5%
EOF
  mv -f "$dir/config.yaml.tmp" "$dir/config.yaml"
}

kubectl_() { "$bindir/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

up() {
  local kubeconfig="${1:-}"
  [[ -n "$kubeconfig" && -r "$kubeconfig" ]] || die "usage: kubelet.sh up NODE_NAME KUBECONFIG (readable)"
  [[ $(id -u) -eq 0 ]] || die "needs root"
  [[ -x "$bindir/kubelet" && -x "$bindir/kubectl" ]] || die "no kubelet/kubectl in $bindir: run testbed/build-binaries.sh kubernetes"
  local pid
  if pid="$(running_pid)"; then
    log "already running (pid $pid)"
  else
    local env sock node_ip port hport
    env="$(bash "$here/containerd.sh" up "$node")"
    sock="$(sed -n 's/^CONTAINERD_ADDRESS=//p' <<<"$env")"
    node_ip="$(sed -n 's/^NODE_IP=//p' <<<"$env")"
    mkdir -p "$dir"
    "$bindir/kubectl" --kubeconfig "$kubeconfig" config view --raw --flatten --minify >"$dir/kubeconfig"
    chmod 600 "$dir/kubeconfig"
    port="$(free_port)"
    hport="$(free_port)"
    while [[ "$hport" == "$port" ]]; do hport="$(free_port)"; done
    write_config "$port" "$hport" "$sock" "$node_ip"
    ensure_cgroup_root
    log "starting kubelet $KUBERNETES_VERSION (node IP $node_ip, port $port, healthz $hport, cgroup root $cgroot)"
    setsid "$bindir/kubelet" --config "$dir/config.yaml" --kubeconfig "$dir/kubeconfig" \
      --root-dir "$dir/root" --cert-dir "$dir/pki" --hostname-override "$node" \
      --node-ip "$node_ip" --node-labels "$NODE_LABELS" \
      --v "${JSI_KUBELET_VERBOSITY:-2}" >>"$logfile" 2>&1 </dev/null &
    echo $! >"$pidfile"
    echo "$hport" >"$dir/healthz.port"
    for _ in $(seq 1 60); do
      if curl -fsS "http://127.0.0.1:$hport/healthz" >/dev/null 2>&1; then break; fi
      kill -0 "$(cat "$pidfile")" 2>/dev/null || { grep -E '^[EF][0-9]{4}' "$logfile" | tail -10 >&2; die "kubelet exited (log $logfile)"; }
      sleep 0.5
    done
    curl -fsS "http://127.0.0.1:$hport/healthz" >/dev/null 2>&1 || die "kubelet healthz not ok after 30s (log $logfile)"
    log "healthz ok (pid $(cat "$pidfile"))"
  fi
  local t0=$SECONDS timeout="${JSI_NODE_READY_TIMEOUT:-120}" ready=""
  while ((SECONDS - t0 < timeout)); do
    ready="$(kubectl_ get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)"
    [[ "$ready" == True ]] && break
    sleep 1
  done
  if [[ "$ready" != True ]]; then
    kubectl_ get node "$node" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
    die "node $node not Ready after ${timeout}s (log $logfile)"
  fi
  log "node $node Ready ($((SECONDS - t0))s)"
}

# Stop the kubelet only: containers keep running (a node whose kubelet died or is cut off).
stop_kubelet() {
  local pid
  if pid="$(running_pid)"; then
    log "stopping kubelet (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  else
    log "kubelet not running"
  fi
  rm -f "$pidfile"
}

# A power loss stops the whole node at one instant: freeze its pods (the freezer cgroup of its
# root takes every container at once), SIGKILL the kubelet and every frozen process, then thaw
# (a frozen task dies of its pending SIGKILL before it runs another instruction of its own).
# Stopping the kubelet first and the containers after it (one `ctr` call each, seconds on this
# machine) let trainers step on after the node's last Lease renewal (about 3 s in one run): steps
# that no node which lost its power makes.
cut_power() {
  local fz="/sys/fs/cgroup/freezer$cgroot" pid procs=() frozen=0
  if [[ -w "$fz/freezer.state" ]] && echo FROZEN >"$fz/freezer.state" 2>/dev/null; then
    frozen=1
  fi
  if pid="$(running_pid)"; then
    kill -KILL "$pid" 2>/dev/null || true
    log "power cut: kubelet (pid $pid) killed"
  fi
  ((frozen)) || return 0
  for _ in $(seq 1 100); do
    [[ "$(cat "$fz/freezer.state")" == FROZEN ]] && break
    sleep 0.02
  done
  mapfile -t procs < <(find "$fz" -name cgroup.procs -exec cat {} + 2>/dev/null)
  if ((${#procs[@]})); then kill -KILL "${procs[@]}" 2>/dev/null || true; fi
  echo THAWED >"$fz/freezer.state"
  log "power cut: the node's ${#procs[@]} pod processes frozen and killed at once"
}

# Power-off: the node stops at once (cut_power), then its containerd and what it leaves go.
down() {
  cut_power
  stop_kubelet
  bash "$here/containerd.sh" down "$node"
  # The kubelet bind-mounts its root dir onto itself (rshared) and mounts pod volumes there.
  local m
  while read -r m; do
    [[ -n "$m" ]] && { umount -l "$m" 2>/dev/null || true; }
  done < <(awk -v d="$dir/root" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r)
  log "down"
}

purge() {
  down
  rm -rf "$dir"
  remove_cgroup_root
  bash "$here/containerd.sh" purge "$node"
  rmdir "$cache/realnode/$node" 2>/dev/null || true
  log "purged"
}

status() {
  local pid
  if pid="$(running_pid)"; then
    log "running: pid $pid, log $logfile"
    kubectl_ get node "$node" -o wide >&2 || true
  else
    log "not running"
    return 1
  fi
}

case "$cmd" in
  up) up "${3:-}" ;;
  stop) stop_kubelet ;;
  down) down ;;
  purge) purge ;;
  status) status ;;
  *) die "unknown command: $cmd (up|stop|down|purge|status)" ;;
esac
