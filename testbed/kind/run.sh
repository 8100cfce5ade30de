#!/usr/bin/env bash
# Run the e2e suite on a kind cluster: `make e2e-kind`, here and in .github/workflows/e2e-kind.yaml
# (docs/testing.md#kind). One control plane and four workers of the pinned Kubernetes; JobSet and
# Kueue installed from their pinned module sources; jobset-inplace's images built from
# images/Dockerfile, and jobset-inplace installed from manifests/ by the suite, as a user would.
#
# Only the image sources differ between machines (JSI_KIND_IMAGES):
#   local   (default) everything built on this machine, no registry asked: kind's node image
#           (node-image.sh: it preloads the control plane, etcd, CoreDNS, kube-proxy, pause and
#           the pod network), JobSet's and Kueue's images from their pinned builds, the
#           Dockerfile's base from debian-image.sh;
#   public  what registries serve: kindest/node, JobSet's and Kueue's release images,
#           debian:bookworm-slim (a hosted runner: the workflow sets it).
# K8S picks the Kubernetes minor as everywhere else. The cluster is left up (kind delete cluster
# --name jsi, or `make cluster-down`, removes it); a second run reuses it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=testbed/versions.sh
source "$here/../versions.sh"
log() { printf '[e2e-kind %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
images="${JSI_KIND_IMAGES:-local}"
[[ "$images" == local || "$images" == public ]] ||
  die "JSI_KIND_IMAGES=$images: accepted values are local (built here) and public (registries)"
began=$SECONDS
step() { log "$1 (at $((SECONDS - began)) s)"; }

# The host's engine if one answers, else Debian's docker.io installed and started (engine.sh).
step "engine"
bash "$here/engine.sh"

# The pinned kubectl and kind, as on the local path (built from their Go modules once, cached);
# JobSet's and Kueue's managers for their local images.
components=(kubernetes kind)
if [[ "$images" == local ]]; then components+=(jobset kueue); fi
bash "$here/../build-binaries.sh" "${components[@]}"
kubectl() { "$KUBERNETES_BIN/kubectl" "$@"; }
kind() { "$JSI_CACHE/bin/kind-$KIND_VERSION/kind" "$@"; }

# BuildKit (images/Dockerfile uses COPY --chmod): through buildx where the CLI has it (a hosted
# runner), else the built-in BuildKit of Debian's docker.io client (a newer docker CLI without
# buildx refuses DOCKER_BUILDKIT=1).
docker_build() {
  if docker buildx version >/dev/null 2>&1; then
    docker buildx build --load "$@"
  elif [[ -x /usr/bin/docker ]] && dpkg -S /usr/bin/docker 2>/dev/null | grep -q '^docker.io:'; then
    DOCKER_BUILDKIT=1 /usr/bin/docker build --progress plain "$@"
  else
    die "no BuildKit: install docker-buildx, or Debian's docker.io (testbed/kind/engine.sh)"
  fi
}

cd "$repo"
etcd_tag="" coredns_tag=""
if [[ "$images" == local ]]; then
  # The Debian tools the image builds use (debootstrap, jq, libseccomp-dev for runc): as the
  # local cluster installs them (idempotent: no apt work when all are there).
  bash "$here/../realnode/install-runtime.sh"
  step "kind's node image (node-image.sh)"
  node_image="$(bash "$here/node-image.sh")"
  read -r etcd_tag coredns_tag < <(bash "$here/node-image.sh" --kubeadm-tags)
  base_image="$(bash "$here/debian-image.sh")"
  jobset_image="jobset-inplace/jobset:$JOBSET_VERSION"
  kueue_image="jobset-inplace/kueue:$KUEUE_VERSION"
  read -r jobset_bin kueue_bin < <(python3 -c \
    'from testbed.versions import binaries as b; print(b().jobset, b().kueue)')
  # As upstream's images: the manager at /manager on an empty root, run as 65532 (runAsNonRoot).
  bash "$here/static-image.sh" "$jobset_image" "$jobset_bin" /manager 65532
  bash "$here/static-image.sh" "$kueue_image" "$kueue_bin" /manager 65532
else
  node_image="kindest/node:$KUBERNETES_VERSION"
  base_image=debian:bookworm-slim
  jobset_image="registry.k8s.io/jobset/jobset:$JOBSET_VERSION"
  kueue_image="registry.k8s.io/kueue/kueue:$KUEUE_VERSION"
fi

kubeconfig="${JSI_KIND_KUBECONFIG:-$HOME/.kube/jsi-kind.yaml}"
if ! kind get clusters 2>/dev/null | grep -qx jsi; then
  config="$(mktemp)"
  trap 'rm -f "$config"' EXIT
  # testbed/kindconfig.py: what the configuration holds and why. Where the host lacks
  # CAP_SYS_RESOURCE (engine.sh), so do the nodes, and their containerd is told so.
  args=("$node_image")
  if [[ -n "$etcd_tag" ]]; then args+=(--etcd-tag "$etcd_tag" --coredns-tag "$coredns_tag"); fi
  if "$here/runc-host-caps" --missing | grep -qx CAP_SYS_RESOURCE; then
    args+=(--restrict-oom-score-adj)
  fi
  .venv/bin/python -m testbed.kindconfig "${args[@]}" >"$config"
  step "kind create cluster ($node_image)"
  kind create cluster --config "$config" --kubeconfig "$kubeconfig" --wait 5m
fi
export KUBECONFIG="$kubeconfig"

# This host reaches the pods, as it reaches the local cluster's (the Prometheus test scrapes
# them from here): a route to each node's pod range through the node (idempotent).
as_root=()
if [[ $(id -u) != 0 ]]; then as_root=(sudo -n); fi
while read -r node cidr address; do
  [[ -n "$cidr" && -n "$address" ]] || die "node $node has no pod range or address yet"
  "${as_root[@]}" ip route replace "$cidr" via "$address"
  log "route $cidr via $address ($node)"
done < <(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')

step "JobSet $JOBSET_VERSION and Kueue $KUEUE_VERSION ($jobset_image, $kueue_image)"
pull=(cat)
if [[ "$images" == local ]]; then
  kind load docker-image --name jsi "$jobset_image" "$kueue_image"
  # Kueue's manager says imagePullPolicy: Always; a loaded image is in no registry.
  pull=(sed "s#imagePullPolicy: Always#imagePullPolicy: IfNotPresent#")
fi
gomod="$(go env GOMODCACHE)"
go mod download "sigs.k8s.io/jobset@$JOBSET_VERSION" "sigs.k8s.io/kueue@$KUEUE_VERSION"
kubectl kustomize "$gomod/sigs.k8s.io/jobset@$JOBSET_VERSION/config/default" |
  sed "s#image: .*jobset:.*#image: $jobset_image#" | "${pull[@]}" |
  kubectl apply --server-side -f -
kubectl kustomize "$gomod/sigs.k8s.io/kueue@$KUEUE_VERSION/config/default" |
  sed "s#image: .*kueue:.*#image: $kueue_image#" | "${pull[@]}" |
  kubectl apply --server-side -f -

# The product images and the e2e trainer image, built with the Dockerfile (the offline recipe's
# equivalent: docs/images.md) and loaded into every kind node; names from testbed/images.py.
step "jobset-inplace's images (images/Dockerfile from $base_image)"
read -r agent controller trainer < <(.venv/bin/python -c \
  'from testbed.images import AGENT_IMAGE as a, CONTROLLER_IMAGE as c, NODE_IMAGE as t; print(a, c, t)')
for target in agent:"$agent" controller:"$controller" demo-trainer:"$trainer"; do
  docker_build --network host --build-arg "BASE=$base_image" -f images/Dockerfile \
    --target "${target%%:*}" -t "${target#*:}" .
done
kind load docker-image --name jsi "$agent" "$controller" "$trainer"
# The e2e trainers run where the local cluster's real kubelet nodes would: every kind worker.
kubectl label nodes -l '!node-role.kubernetes.io/control-plane' --overwrite \
  jobset-inplace.dev/real-node=true
# JobSet and Kueue came up meanwhile (their webhook certificates take a minute or two).
step "JobSet and Kueue ready"
kubectl -n jobset-system rollout status deploy/jobset-controller-manager --timeout=5m
kubectl -n kueue-system rollout status deploy/kueue-controller-manager --timeout=5m

# The suite installs jobset-inplace from manifests/ as a user would (JSI_E2E_IMAGES_LOADED: the
# nodes have the images) and runs the in-cluster tests against it. The tests that need the
# local cluster's own levers (kwok nodes, the real nodes' host) do not run: a partial run is
# accepted here, and the summary at the end lists each test that did not run and why.
step "the e2e suite"
JSI_E2E_IMAGES_LOADED=1 JSI_E2E_PARTIAL=1 JSI_KUBECONFIG="$kubeconfig" JSI_E2E_IMAGE="$trainer" \
  JSI_E2E_NODE_SELECTOR="${JSI_E2E_NODE_SELECTOR:-jobset-inplace.dev/real-node=true}" \
  .venv/bin/python -m pytest e2e "$@"
