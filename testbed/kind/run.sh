#!/usr/bin/env bash
# Run the e2e suite on a kind cluster (.github/workflows/e2e-kind.yaml on a hosted runner; on this
# project's own machines the engine comes from testbed/kind/engine.sh, the node image is not
# built offline yet: docs/testing.md#kind).
# JobSet and Kueue are installed from the pinned module sources with their release images;
# jobset-inplace from manifests/, with its images built from images/Dockerfile.
# K8S picks the Kubernetes minor as everywhere else (kindest/node:<release> must exist for it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$here/../.."
# shellcheck source=testbed/versions.sh
source "$here/../versions.sh"

# The host's engine if one answers, else Debian's docker.io installed and started (engine.sh).
bash "$here/engine.sh"

# The pinned kubectl and kind, as on the local path (built from their Go modules once, cached).
bash "$here/../build-binaries.sh" kubernetes kind
kubectl() { "$KUBERNETES_BIN/kubectl" "$@"; }
kind() { "$JSI_CACHE/bin/kind-$KIND_VERSION/kind" "$@"; }

kubeconfig="${JSI_KIND_KUBECONFIG:-$HOME/.kube/jsi-kind.yaml}"
if ! kind get clusters | grep -qx jsi; then
  config="$(mktemp)"
  trap 'rm -f "$config"' EXIT
  # One control plane, four workers, the gates the in-place path needs on this release
  # (jobset_inplace/platform.py: none from 1.36).
  PYTHONPATH="$repo" python3 - "$KUBERNETES_VERSION" >"$config" <<'EOF'
import sys
from jobset_inplace.platform import gates_needed
release = sys.argv[1]
print("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nname: jsi")
gates = gates_needed(int(release.split(".")[1]))
if gates:
    print("featureGates:", *(f"  {g}: true" for g in gates), sep="\n")
print("nodes:")
for role in ["control-plane"] + ["worker"] * 4:
    print(f"- role: {role}\n  image: kindest/node:{release}")
EOF
  kind create cluster --config "$config" --kubeconfig "$kubeconfig" --wait 5m
fi
export KUBECONFIG="$kubeconfig"
gomod="$(go env GOMODCACHE)"
go mod download "sigs.k8s.io/jobset@$JOBSET_VERSION" "sigs.k8s.io/kueue@$KUEUE_VERSION"
kubectl kustomize "$gomod/sigs.k8s.io/jobset@$JOBSET_VERSION/config/default" |
  sed "s#image: .*/jobset:.*#image: registry.k8s.io/jobset/jobset:$JOBSET_VERSION#" |
  kubectl apply --server-side -f -
kubectl kustomize "$gomod/sigs.k8s.io/kueue@$KUEUE_VERSION/config/default" |
  sed "s#image: .*/kueue:.*#image: registry.k8s.io/kueue/kueue:$KUEUE_VERSION#" |
  kubectl apply --server-side -f -
kubectl -n jobset-system rollout status deploy/jobset-controller-manager --timeout=5m
kubectl -n kueue-system rollout status deploy/kueue-controller-manager --timeout=5m

cd "$repo"
# The product images and the e2e trainer image, built with the Dockerfile (the offline recipe's
# equivalent: docs/images.md) and loaded into every kind node; names from testbed/images.py.
read -r agent controller trainer < <(.venv/bin/python -c \
  'from testbed.images import AGENT_IMAGE as a, CONTROLLER_IMAGE as c, NODE_IMAGE as t; print(a, c, t)')
docker build -f images/Dockerfile --target agent -t "$agent" .
docker build -f images/Dockerfile --target controller -t "$controller" .
docker build -f images/Dockerfile --target demo-trainer -t "$trainer" .
kind load docker-image --name jsi "$agent" "$controller" "$trainer"
# The e2e trainers run where the local cluster's real kubelet nodes would: every kind worker.
kubectl label nodes -l '!node-role.kubernetes.io/control-plane' --overwrite \
  jobset-inplace.dev/real-node=true

# The suite installs jobset-inplace from manifests/ as a user would (JSI_E2E_IMAGES_LOADED: the
# nodes have the images) and runs the in-cluster tests against it. The tests that need the
# local cluster's own levers (kwok nodes, the real-node restart test) do not run: a partial run
# is accepted here, and the summary at the end lists each test that did not run and why.
JSI_E2E_IMAGES_LOADED=1 JSI_E2E_PARTIAL=1 JSI_KUBECONFIG="$kubeconfig" \
  JSI_E2E_NODE_SELECTOR="${JSI_E2E_NODE_SELECTOR:-jobset-inplace.dev/real-node=true}" \
  .venv/bin/python -m pytest e2e "$@"
