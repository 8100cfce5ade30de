#!/usr/bin/env bash
# End-to-end smoke test of a real node, from a bare machine (needs root and the pinned
# binaries of e2e/build-binaries.sh; installs the Debian runtime and builds the images if
# missing):
#   1. install-runtime.sh, build-images.sh
#   2. a throwaway etcd + kube-apiserver (e2e.harness.controlplane) unless KUBECONFIG is given
#   3. kubelet.sh up NODE: Node registers Ready, label jobset-inplace.dev/real-node=true,
#      declares RestartAllContainersOnContainerExits
#   4. pod (nodeName set, jobset-inplace/python:local, imagePullPolicy Never) prints 1
#   5. a pod whose main container exits 88 under a RestartAllContainers rule is restarted in
#      place: same UID and IP, init container re-ran, every restartCount 1, emptyDir kept
#   6. kubelet.sh purge NODE, control plane stopped (also on failure)
# Usage: e2e/realnode/smoke.sh [NODE]     (default NODE=realnode-smoke)
# Env: KUBECONFIG_OVERRIDE=path to use an existing cluster instead of starting one.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=e2e/versions.env
source "$here/../versions.env"
cache="${JSI_CACHE_DIR:-$HOME/.cache/jobset-inplace}"
kubectl_bin="$cache/bin/kubernetes-$KUBERNETES_VERSION/kubectl"
node="${1:-realnode-smoke}"
ns=default
passed=0
failed=0

log() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
check() { # check DESCRIPTION COMMAND...
  local what="$1"
  shift
  if "$@"; then
    log "PASS $what"
    passed=$((passed + 1))
  else
    log "FAIL $what"
    failed=$((failed + 1))
  fi
}

cp_pid=""
cp_out="$(mktemp /tmp/jsi-smoke-cp.XXXXXX)"
cleanup() {
  set +e
  log "cleanup"
  bash "$here/kubelet.sh" purge "$node" >/dev/null 2>&1
  if [[ -n "${KUBECONFIG_OVERRIDE:-}" ]]; then
    "$kubectl_bin" --kubeconfig "$kc" delete node "$node" --ignore-not-found >/dev/null 2>&1
    "$kubectl_bin" --kubeconfig "$kc" -n "$ns" delete pod jsi-smoke-print jsi-smoke-rac \
      --ignore-not-found --force --grace-period=0 >/dev/null 2>&1
  fi
  if [[ -n "$cp_pid" ]] && kill -0 "$cp_pid" 2>/dev/null; then
    kill -TERM "$cp_pid" 2>/dev/null # the harness stops etcd + kube-apiserver on SIGTERM
    for _ in $(seq 1 100); do kill -0 "$cp_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if [[ -n "$cp_pid" ]]; then
    # setsid made the harness python a process-group leader: take etcd/apiserver down too.
    kill -TERM -- "-$cp_pid" 2>/dev/null
    sleep 1
    kill -KILL -- "-$cp_pid" 2>/dev/null
  fi
  rm -f "$cp_out"
}
trap cleanup EXIT

t0=$SECONDS
bash "$here/install-runtime.sh" 2>&1 | tail -1 >&2
bash "$here/build-images.sh" >/dev/null

if [[ -n "${KUBECONFIG_OVERRIDE:-}" ]]; then
  kc="$KUBECONFIG_OVERRIDE"
else
  log "starting a throwaway etcd + kube-apiserver"
  # The harness removes its temp dir and stops its processes on normal interpreter exit;
  # SIGTERM is turned into SystemExit for that.
  (
    cd "$repo"
    exec setsid "$repo/.venv/bin/python" -c '
import signal, sys, time
from e2e.harness.controlplane import start_control_plane
cp = start_control_plane()
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print(cp.kubeconfig, flush=True)
try:
    time.sleep(3600)
finally:
    cp.stop()
' >"$cp_out" 2>&1 </dev/null
  ) &
  cp_pid=$!
  for _ in $(seq 1 120); do
    kc="$(grep -m1 '/kubeconfig$' "$cp_out" || true)"
    [[ -n "$kc" ]] && break
    kill -0 "$cp_pid" 2>/dev/null || { cat "$cp_out" >&2; log "control plane failed"; exit 1; }
    sleep 0.5
  done
  [[ -n "$kc" ]] || { cat "$cp_out" >&2; log "control plane not up in 60s"; exit 1; }
fi
k() { "$kubectl_bin" --kubeconfig "$kc" "$@"; }
log "kubeconfig $kc"

bash "$here/kubelet.sh" up "$node" "$kc" 2>&1 | grep -v '^\[images' >&2
check "node $node Ready" \
  test "$(k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True
check "node label jobset-inplace.dev/real-node=true" \
  test "$(k get node "$node" -o jsonpath='{.metadata.labels.jobset-inplace\.dev/real-node}')" = true
check "node declares RestartAllContainersOnContainerExits" \
  grep -q RestartAllContainersOnContainerExits <<<"$(k get node "$node" -o jsonpath='{.status.declaredFeatures}')"

# No controller-manager: the default ServiceAccount and kube-root-ca.crt do not appear by
# themselves, so create the SA and do not mount a token.
k -n "$ns" get sa default >/dev/null 2>&1 || k -n "$ns" create sa default >/dev/null

wait_phase() { # wait_phase POD PHASE... (30 s)
  local pod="$1" p=""
  shift
  for _ in $(seq 1 120); do
    p="$(k -n "$ns" get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
    for want in "$@"; do [[ "$p" == "$want" ]] && return 0; done
    sleep 0.25
  done
  log "pod $pod phase '$p', wanted $*"
  k -n "$ns" get pod "$pod" -o jsonpath='{.status}' >&2 || true
  return 1
}
pod_log() { # pod_log POD CONTAINER: newest log file written by the kubelet
  cat "$cache/realnode/$node/kubelet/pod-logs/${ns}_$1_"*/"$2"/*.log 2>/dev/null | sed 's/^[^ ]* [^ ]* [^ ]* //'
}

k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: jsi-smoke-print, namespace: $ns}
spec:
  nodeName: $node
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
  - name: py
    image: jobset-inplace/python:local
    imagePullPolicy: Never
    command: [python3, -c, 'print(1)']
EOF
check "pod with python3 -c 'print(1)' Succeeded" wait_phase jsi-smoke-print Succeeded
check "its log is '1'" test "$(pod_log jsi-smoke-print py)" = 1

k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: jsi-smoke-rac, namespace: $ns}
spec:
  nodeName: $node
  restartPolicy: Never
  automountServiceAccountToken: false
  volumes: [{name: data, emptyDir: {}}]
  initContainers:
  - name: init
    image: jobset-inplace/python:local
    imagePullPolicy: Never
    command: [sh, -c, 'echo run >> /data/init-runs']
    volumeMounts: [{name: data, mountPath: /data}]
  containers:
  - name: trainer
    image: jobset-inplace/python:local
    imagePullPolicy: Never
    restartPolicy: Never
    restartPolicyRules:
    - action: RestartAllContainers
      exitCodes: {operator: In, values: [88]}
    # First run: exit 88 (triggers the in-place restart). Second run: stay up.
    command: [sh, -c, 'n=\$(wc -l < /data/init-runs); echo "init runs: \$n"; if [ "\$n" -lt 2 ]; then sleep 1; exit 88; fi; exec sleep 3600']
    volumeMounts: [{name: data, mountPath: /data}]
  - name: peer
    image: jobset-inplace/python:local
    imagePullPolicy: Never
    command: [sleep, '3600']
EOF
uid0="$(k -n "$ns" get pod jsi-smoke-rac -o jsonpath='{.metadata.uid}')"
ip0=""
for _ in $(seq 1 60); do
  ip0="$(k -n "$ns" get pod jsi-smoke-rac -o jsonpath='{.status.podIP}')"
  [[ -n "$ip0" ]] && break
  sleep 0.25
done
restarted() {
  local rc
  rc="$(k -n "$ns" get pod jsi-smoke-rac -o jsonpath='{range .status.containerStatuses[*]}{.restartCount}{" "}{.ready}{","}{end}')"
  [[ "$rc" == "1 true,1 true," ]]
}
ok=""
for _ in $(seq 1 120); do
  if restarted; then ok=1; break; fi
  sleep 0.25
done
check "RestartAllContainers: every container restarted once and Ready again" test -n "$ok"
check "same pod UID after the in-place restart" \
  test "$(k -n "$ns" get pod jsi-smoke-rac -o jsonpath='{.metadata.uid}')" = "$uid0"
check "same pod IP after the in-place restart ($ip0)" \
  test "$(k -n "$ns" get pod jsi-smoke-rac -o jsonpath='{.status.podIP}')" = "$ip0"
check "init container re-ran, emptyDir content kept (trainer saw 2 init runs)" \
  test "$(pod_log jsi-smoke-rac trainer | tail -1)" = "init runs: 2"
check "pod phase Running" wait_phase jsi-smoke-rac Running

log "$passed passed, $failed failed in $((SECONDS - t0))s"
echo "realnode smoke: $passed passed, $failed failed"
((failed == 0))
