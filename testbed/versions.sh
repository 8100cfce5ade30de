# Sourced by the testbed shell scripts: loads testbed/versions.env and resolves the Kubernetes
# minor chosen by K8S (default K8S_DEFAULT) to KUBERNETES_VERSION. testbed/versions.py does the
# same for Python; tests/unit/test_harness_versions.py checks that both agree.
# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables below are for the scripts that source this file
# shellcheck source=testbed/versions.env
source "$(dirname "${BASH_SOURCE[0]}")/versions.env"
K8S="${K8S:-$K8S_DEFAULT}"
_jsi_k8s_key="KUBERNETES_${K8S//./_}"
if [[ ! "$K8S" =~ ^1\.[0-9]+$ || -z "${!_jsi_k8s_key:-}" ]]; then
  echo "K8S=$K8S: not a supported Kubernetes minor (accepted: $(
    sed -n 's/^KUBERNETES_\([0-9]*\)_\([0-9]*\)=.*/\1.\2/p' "$(dirname "${BASH_SOURCE[0]}")/versions.env" | paste -sd' '
  ))" >&2
  # shellcheck disable=SC2317 # sourced: return; run: exit
  return 2 2>/dev/null || exit 2
fi
KUBERNETES_VERSION="${!_jsi_k8s_key}"
unset _jsi_k8s_key

# Where testbed/build-binaries.sh caches what it builds (testbed/versions.py: binaries()).
JSI_CACHE="${JSI_CACHE_DIR:-$HOME/.cache/jobset-inplace}"
KUBERNETES_BIN="$JSI_CACHE/bin/kubernetes-$KUBERNETES_VERSION"
CONTAINERD_BIN="$JSI_CACHE/bin/containerd-$CONTAINERD_VERSION"
RUNC_BIN="$JSI_CACHE/bin/runc-$RUNC_VERSION/runc"

# ctr (containerd 2.2+) warns on every call that cgroup v1 is deprecated: this VM is cgroup v1
# (docs/real-node.md), so drop that one line and keep every other message.
quiet_ctr() { grep -v 'support for cgroup v1 is deprecated' || true; }
ctr_quiet() { "$CONTAINERD_BIN/ctr" "$@" 2> >(quiet_ctr >&2); }
