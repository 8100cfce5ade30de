#!/usr/bin/env bash
# kind's node image (kindest/node) for the pinned Kubernetes, built offline: what `kind build
# node-image` makes (kind v0.33.0's pkg/build/nodeimage/buildcontext.go, replayed step by step;
# its own command fetches every image it did not build from a registry), from
# - kind's base image built offline (base-image.sh);
# - kubelet, kubeadm, kubectl and the control plane built from the pinned Kubernetes module,
#   etcd and CoreDNS as the local cluster builds them (build-binaries.sh), pause from the
#   testbed's image build (testbed/images.py);
# - the images kubeadm and kind start, preloaded and pinned in the node's containerd as kind
#   preloads them: each control-plane binary on an empty root (plus /tmp and a passwd file);
#   kube-proxy on a Debian root with nftables and iptables (debian-image.sh);
# - the pod network: testbed/kind/net (kind's kindnetd is not served by the module proxy here).
#
#   bash testbed/kind/node-image.sh   # prints the image: jobset-inplace/kind-node:<k8s>-<hash>
#
# Tagged by a hash of its inputs: re-running is cheap. etcd and CoreDNS are not the versions
# kubeadm names by default: their images carry their real versions, and testbed/kind/run.sh
# points kubeadm at them (kubeadmConfigPatches), as printed by `--kubeadm-tags`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$here/../.."
lib_tag=kind-node
# shellcheck source=testbed/kind/lib.sh
source "$here/lib.sh"

# The tags the images below carry for etcd and CoreDNS (kubeadm's ClusterConfiguration fields).
etcd_tag="${ETCD_VERSION#v}-0"
coredns_version="$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' \
  "$repo/testbed/coredns/go.mod")"
[[ -n "$coredns_version" ]] || die "no coredns version in testbed/coredns/go.mod"
coredns_tag="$coredns_version-jsi"
if [[ "${1:-}" == "--kubeadm-tags" ]]; then
  echo "$etcd_tag $coredns_tag"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--kubeadm-tags]" >&2
  exit 2
fi
need_engine

base="$(bash "$here/base-image.sh")"
debian="$(bash "$here/debian-image.sh")"
bash "$here/../build-binaries.sh" kubernetes etcd coredns >&2
read -r etcd_bin coredns_bin < <(cd "$repo" &&
  python3 -c 'from testbed.versions import binaries as b; print(b().etcd, b().coredns)')
pause_archive="$(pause_archive)"
# The pause image kind's containerd configuration names (sandbox_image).
kind_src="$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r .Dir)"
sandbox="$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$kind_src/images/base/files/etc/containerd/config.toml")"
[[ -n "$sandbox" ]] || die "no sandbox_image in kind's containerd configuration"

hash="$(echo "$base $debian $KUBERNETES_VERSION $etcd_bin $coredns_bin $pause_archive $sandbox" |
  inputs_hash "${BASH_SOURCE[0]}" "$here/static-image.sh" "$here"/net/*)"
image="jobset-inplace/kind-node:$KUBERNETES_VERSION-$hash"
exit_if_cached "$image"

began=$SECONDS
work="$JSI_CACHE/kind/node-$hash"
builder="jsi-kind-node-build-$hash"
rm -rf "$work"
mkdir -p "$work"
cleanup() { docker rm -f -v "$builder" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
build() {  # build TAG DIR: the classic builder (no BuildKit needed for these)
  DOCKER_BUILDKIT=0 docker build -q --network host -t "$1" "$2" >/dev/null || die "building $1 failed"
}

# Control-plane images: the static binary on an empty root, as upstream's (distroless) are.
registry=registry.k8s.io
refs=()
static_image() {  # static_image REF BINARY: at /usr/local/bin/<name>, run as root
  bash "$here/static-image.sh" "$1" "$2" "/usr/local/bin/$(basename "$2")" || die "building $1 failed"
  refs+=("$1")
}
log "control-plane images ..."
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  static_image "$registry/$c:$KUBERNETES_VERSION" "$KUBERNETES_BIN/$c"
done
static_image "$registry/etcd:$etcd_tag" "$etcd_bin"
mkdir -p "$work/coredns"
cp "$coredns_bin" "$work/coredns/coredns"
static_image "$registry/coredns/coredns:$coredns_tag" "$work/coredns/coredns"

# kube-proxy and the pod network need the netfilter and routing tools: a Debian root with them.
log "kube-proxy and pod network images ..."
tools="$work/ctx-tools"
mkdir -p "$tools"
cat >"$tools/Dockerfile" <<EOF
FROM $debian
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      iptables nftables conntrack iproute2 curl jq >/dev/null \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/*
EOF
build "jobset-inplace/kind-tools:$hash" "$tools"
tools_image() {  # tools_image REF FILE PATH: FILE at PATH on the tools image
  local ctx
  ctx="$work/ctx-$(basename "$3")"
  mkdir -p "$ctx"
  install -m 0755 "$2" "$ctx/file"
  printf 'FROM jobset-inplace/kind-tools:%s\nCOPY file %s\n' "$hash" "$3" >"$ctx/Dockerfile"
  build "$1" "$ctx"
  refs+=("$1")
}
tools_image "$registry/kube-proxy:$KUBERNETES_VERSION" "$KUBERNETES_BIN/kube-proxy" /usr/local/bin/kube-proxy
net_image="jobset-inplace/kind-net:$hash"
tools_image "$net_image" "$here/net/kind-net.sh" /usr/local/bin/kind-net
docker rmi "jobset-inplace/kind-tools:$hash" >/dev/null 2>&1 || true
docker load -q -i "$pause_archive" >/dev/null
docker image inspect "$sandbox" >/dev/null 2>&1 ||
  die "$pause_archive does not hold $sandbox (kind's sandbox_image)"
refs+=("$sandbox")

# buildcontext.go's steps: a build container from the base, the binaries and manifests copied
# in, the images imported into its containerd pinned (kubelet never evicts or pulls them),
# committed with kind's entrypoint.
log "node image from $base ..."
docker run -d --name "$builder" --entrypoint=sleep --security-opt seccomp=unconfined \
  "$base" infinity >/dev/null
for b in kubelet kubeadm kubectl; do
  docker cp "$KUBERNETES_BIN/$b" "$builder:/usr/bin/$b"
  docker exec "$builder" chmod 0755 "/usr/bin/$b"
done
docker exec "$builder" sh -c "mkdir -p /kind/manifests && echo $KUBERNETES_VERSION >/kind/version"
sed "s#image: IMAGE#image: $net_image#" "$here/net/kind-net.yaml" |
  docker exec -i "$builder" sh -c 'cat >/kind/manifests/default-cni.yaml'
docker exec "$builder" sh -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
for _ in $(seq 60); do
  docker exec "$builder" ctr version >/dev/null 2>&1 && break
  sleep 0.5
done
docker exec "$builder" ctr version >/dev/null 2>&1 || {
  docker exec "$builder" tail -20 /tmp/containerd.log >&2
  die "containerd did not start in the build container"
}
docker save "${refs[@]}" |
  docker exec -i "$builder" ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned \
    --all-platforms --no-unpack --digests - 2> >(quiet_ctr >&2) >/dev/null
imported="$(docker exec "$builder" ctr -n k8s.io images ls -q 2> >(quiet_ctr >&2))"
for ref in "${refs[@]}"; do
  full="$ref"
  [[ "$ref" == */*/* || "$ref" == *.*/* ]] || full="docker.io/$ref"
  grep -qxF "$full" <<<"$imported" || die "$full is not in the node's containerd after the import"
done
# What kubeadm will ask for must be there: the Kubernetes images exactly (etcd and CoreDNS are
# asked for by the tags run.sh gives kubeadm; pause by containerd's sandbox_image, above).
while read -r want; do
  case "$want" in */etcd:* | */coredns/* | */pause:*) continue ;; esac
  printf '%s\n' "${refs[@]}" | grep -qxF "$want" ||
    die "kubeadm $KUBERNETES_VERSION asks for $want, which is not preloaded"
done < <(docker exec "$builder" kubeadm config images list --kubernetes-version "$KUBERNETES_VERSION" 2>/dev/null)
docker exec "$builder" pkill containerd
# (it stays a zombie: the build container's PID 1 is sleep, which reaps nothing)
docker exec "$builder" sh -c \
  'while ps -C containerd -o stat= | grep -qv "^Z"; do sleep 0.2; done; rm -f /tmp/containerd.log'
docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' --change 'CMD []' \
  "$builder" "$image" >/dev/null
for ref in "${refs[@]}"; do docker rmi "$ref" >/dev/null 2>&1 || true; done
built "$image" "$((SECONDS - began))"
log "preloaded: ${refs[*]}"
