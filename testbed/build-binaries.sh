#!/usr/bin/env bash
# Build every upstream binary the local cluster needs from Go modules (no downloads of
# prebuilt binaries, no container images). Versions come from testbed/versions.env; K8S
# picks the Kubernetes minor (default K8S_DEFAULT there), e.g. `K8S=1.35 build-binaries.sh`.
#
# Results are cached outside the repository, keyed by version:
#   $JSI_CACHE_DIR/bin/<component>-<version>/<binary>
# A binary that is already there is not rebuilt, so re-running is cheap and safe.
#
# Usage: testbed/build-binaries.sh [component ...]
#   components: kubernetes etcd kwok jobset kueue containerd runc helm (default: all of these)
#               and jobset-ipr-agent (upstream's in-place restart agent, for the benchmark),
#               test-device-plugin (testbed/deviceplugin, for the device-health tests),
#               test-dra-driver (testbed/draplugin, for the DRA device-taint test),
#               coredns (testbed/coredns, the real nodes' cluster DNS),
#               prometheus (promtool and the server: the alerts' checks, the e2e scrape),
#               krew (the kubectl plugin's krew install test),
#               actionlint (make lint: the GitHub Actions workflows),
#               kind (make e2e-kind), cni-plugins and crictl (kind's node image)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=testbed/versions.sh
source "$here/versions.sh"

cache="$JSI_CACHE"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# Builds are memory-heavy (~2 GiB per link); two parallel compile jobs fit 2 cores.
build_flags=(-trimpath -p "${JSI_BUILD_JOBS:-2}")

log() { printf '[binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# go_build OUT_PATH PACKAGE LDFLAGS (run in the current module directory)
go_build() {
  local out="$1" pkg="$2" ldflags="${3:-}"
  if [[ -x "$out" ]]; then
    log "cached   $(basename "$out") ($out)"
    return
  fi
  local start=$SECONDS
  log "building $(basename "$out") from $pkg ..."
  go build "${build_flags[@]}" -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg"
  mv -f "$out.tmp" "$out"
  log "built    $(basename "$out") in $((SECONDS - start))s"
}

# A throwaway module that requires k8s.io/kubernetes and maps every staging module
# (which k8s.io/kubernetes replaces with ./staging/...) to its published v0.X.Y tag.
build_kubernetes() {
  local v="$KUBERNETES_VERSION" dir="$KUBERNETES_BIN"
  local mod="$cache/src/kubernetes-$v"
  mkdir -p "$dir" "$mod"
  local staging="v0.${v#v1.}"
  local components=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy kubeadm)
  local missing=0 c
  for c in "${components[@]}"; do [[ -x "$dir/$c" ]] || missing=1; done
  if (( missing == 0 )); then log "cached   kubernetes $v ($dir)"; return; fi

  # The tools file lists the components; a new component means resolving again.
  local tools
  tools="$(
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "${components[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  )"
  if [[ "$(cat "$mod/tools.go" 2>/dev/null)" != "$tools" ]]; then rm -f "$mod/.resolved"; fi
  if [[ ! -f "$mod/.resolved" ]]; then
    log "resolving k8s.io/kubernetes@$v (staging modules -> $staging) ..."
    (
      cd "$mod"
      local gomod
      gomod="$(go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
      {
        echo "module jobset-inplace.dev/build/kubernetes"
        echo
        echo "go 1.25.0"
        echo
        echo "require k8s.io/kubernetes $v"
        echo
        echo "replace ("
        grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
          awk -v s="$staging" '{print "\t" $1 " => " $1 " " s}'
        echo ")"
      } > go.mod
      echo "$tools" > tools.go
      go mod tidy
      touch .resolved
    )
  fi
  local major="${v#v}"; major="${major%%.*}"
  local minor="${v#v*.}"; minor="${minor%%.*}"
  local date ldflags="" p
  date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  cd "$mod"
  for c in "${components[@]}"; do go_build "$dir/$c" "k8s.io/kubernetes/cmd/$c" "$ldflags"; done
}

# module_build KEY MODULE VERSION LDFLAGS PACKAGE[=BINARY]...: build main packages of MODULE@VERSION
# through a throwaway module that requires it. (Unlike `go install pkg@version`, this does not
# ask the proxy for the module's version list, which the proxy refuses for some modules.)
module_build() {
  local key="$1" module="$2" v="$3" ldflags="$4"
  shift 4
  local dir="$cache/bin/$key-$v" mod="$cache/src/$key-$v" pkg missing=0
  bin_name() { if [[ "$1" == *=* ]]; then echo "${1#*=}"; else basename "$1"; fi; }
  for pkg in "$@"; do [[ -x "$dir/$(bin_name "$pkg")" ]] || missing=1; done
  if (( missing == 0 )); then log "cached   $key $v ($dir)"; return; fi
  mkdir -p "$dir" "$mod"
  cd "$mod"
  # The tools file lists the packages; a new package means resolving again.
  local tools
  tools="$(
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for pkg in "$@"; do printf '\t_ "%s"\n' "${pkg%%=*}"; done
    printf ')\n'
  )"
  if [[ "$(cat tools.go 2>/dev/null)" != "$tools" ]]; then rm -f .resolved; fi
  if [[ ! -f .resolved ]]; then
    log "resolving $module@$v ..."
    printf 'module jobset-inplace.dev/build/%s\n\ngo 1.25.0\n\nrequire %s %s\n' \
      "$key" "$module" "$v" > go.mod
    printf '%s\n' "$tools" > tools.go
    # Start from the checksums the upstream module pins for its own dependencies: some of them
    # (e.g. Kueue's sigs.k8s.io/scheduler-library pre-release) are not in the checksum database.
    local src
    src="$(go mod download -json "$module@$v" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    if [[ -f "$src/go.sum" ]]; then cp "$src/go.sum" go.sum && chmod u+w go.sum; fi
    go mod tidy
    touch .resolved
  fi
  for pkg in "$@"; do go_build "$dir/$(bin_name "$pkg")" "${pkg%%=*}" "$ldflags"; done
}

build_etcd() {
  module_build etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" go.etcd.io/etcd/server/v3=etcd
}

build_kwok() {
  module_build kwok sigs.k8s.io/kwok "$KWOK_VERSION" \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
}

build_jobset() {
  module_build jobset sigs.k8s.io/jobset "$JOBSET_VERSION" \
    "-X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION" sigs.k8s.io/jobset
  fetch_module_source sigs.k8s.io/jobset "$JOBSET_VERSION"
}

# Upstream JobSet's own in-place restart agent (the InPlaceRestart feature), for the
# benchmark's side-by-side runs only (not in the default set). Static: it goes into a node image.
build_jobset_ipr_agent() {
  CGO_ENABLED=0 module_build jobset-ipr-agent sigs.k8s.io/jobset "$JOBSET_VERSION" "" \
    sigs.k8s.io/jobset/cmd/in-place-restart-agent
}

# This repository's own Go modules (testbed/<dir>), each keyed by a hash of its sources
# (testbed/versions.py computes the same: LOCAL_MODULE_SOURCES).
local_module_build() {
  local dir="$1" key="$2" name="$3" src="$here/$1" v
  v="$(cd "$src" && cat main.go go.mod go.sum | sha256sum | cut -c1-12)"
  (cd "$src" && go_build "$cache/bin/$key-$v/$name" . "")
}

# The device-health tests' device plugin.
build_test_device_plugin() { local_module_build deviceplugin test-device-plugin jsi-test-device-plugin; }

# The DRA device-taint test's driver (k8s.io/dynamic-resource-allocation's kubelet plugin).
build_test_dra_driver() { local_module_build draplugin test-dra-driver jsi-test-dra-driver; }

# The real nodes' cluster DNS: CoreDNS with the plugins testbed/dns.py's Corefile uses.
build_coredns() { local_module_build coredns coredns jsi-coredns; }

build_kueue() {
  module_build kueue sigs.k8s.io/kueue "$KUEUE_VERSION" \
    "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
  fetch_module_source sigs.k8s.io/kueue "$KUEUE_VERSION"
}

# The real kubelet nodes' runtime: containerd, its runc shim and ctr. Static (CGO off); the
# btrfs/devmapper/zfs snapshotters are compiled out (overlayfs only, as the node config says).
build_containerd() {
  local v="$CONTAINERD_VERSION"
  GOFLAGS="$GOFLAGS -tags=no_btrfs,no_devmapper,no_zfs,urfave_cli_no_docs" module_build \
    containerd github.com/containerd/containerd/v2 "$v" \
    "-X github.com/containerd/containerd/v2/version.Version=$v -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
}

# runc needs cgo and libseccomp (Debian's libseccomp-dev, installed by realnode/install-runtime.sh).
build_runc() {
  local v="$RUNC_VERSION"
  if [[ ! -x "$cache/bin/runc-$v/runc" ]] && ! pkg-config --exists libseccomp 2>/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
      log "runc needs libseccomp-dev: run testbed/realnode/install-runtime.sh as root"
      exit 1
    fi
    bash "$here/realnode/install-runtime.sh"
  fi
  CGO_ENABLED=1 GOFLAGS="$GOFLAGS -tags=seccomp" module_build runc github.com/opencontainers/runc "$v" \
    "-X main.version=${v#v}" github.com/opencontainers/runc
}

build_helm() {
  module_build helm helm.sh/helm/v4 "$HELM_VERSION" \
    "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" helm.sh/helm/v4/cmd/helm
}

# promtool (the alerts' rule checks and unit tests: tests/integration/test_alerts.py) and the
# server (e2e/test_prometheus.py scrapes the in-cluster controller). Only Kubernetes service
# discovery is compiled in (upstream's plugins/ build tags): the other 25 mechanisms' SDKs
# would double the build for nothing the tests use. No web UI assets (the API is what is used).
build_prometheus() {
  GOFLAGS="$GOFLAGS -tags=remove_all_sd,enable_kubernetes_sd" \
    module_build prometheus github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
    "-X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION}" \
    github.com/prometheus/prometheus/cmd/promtool github.com/prometheus/prometheus/cmd/prometheus
}

# kind (make e2e-kind: testbed/kind/run.sh).
build_kind() { module_build kind sigs.k8s.io/kind "$KIND_VERSION" "" sigs.k8s.io/kind; }
# The CNI plugins and crictl kind's node image carries (testbed/kind/base-image.sh).
build_cni_plugins() {
  local p=github.com/containernetworking/plugins/plugins
  module_build cni-plugins github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION" "" \
    "$p/ipam/host-local" "$p/main/loopback" "$p/main/ptp" "$p/meta/portmap"
}
build_crictl() { module_build crictl sigs.k8s.io/cri-tools "$CRICTL_VERSION" "" sigs.k8s.io/cri-tools/cmd/crictl; }

# krew (the kubectl plugin's krew install: tests/integration/test_krew.py).
build_krew() {
  module_build krew sigs.k8s.io/krew "$KREW_VERSION" \
    "-X sigs.k8s.io/krew/internal/version.gitTag=${KREW_VERSION}" sigs.k8s.io/krew/cmd/krew
}

# actionlint (make lint checks .github/workflows with it).
build_actionlint() {
  module_build actionlint github.com/rhysd/actionlint "$ACTIONLINT_VERSION" \
    "-X github.com/rhysd/actionlint.version=${ACTIONLINT_VERSION}" \
    github.com/rhysd/actionlint/cmd/actionlint
}

# CRDs and manifests are read from the pinned module sources in the Go module cache.
fetch_module_source() {
  local m="$1" v="$2"
  go mod download "$m@$v" >/dev/null 2>&1 || go mod download -x "$m@$v"
  log "source   $m@$v at $(go env GOMODCACHE)/$m@$v"
}

main() {
  local want=("$@")
  (( ${#want[@]} )) || want=(kubernetes etcd kwok jobset kueue containerd runc helm)
  local total=$SECONDS c
  mkdir -p "$cache"
  # One build at a time: concurrent builds would fight over the same outputs and 2 cores.
  exec 9>"$cache/.build.lock"
  if ! flock -n 9; then
    log "another build holds $cache/.build.lock; waiting for it ..."
    flock 9
  fi
  log "cache: $cache"
  for c in "${want[@]}"; do
    case "$c" in
      kubernetes) build_kubernetes ;;
      etcd) build_etcd ;;
      kwok) build_kwok ;;
      jobset) build_jobset ;;
      jobset-ipr-agent) build_jobset_ipr_agent ;;
      test-device-plugin) build_test_device_plugin ;;
      test-dra-driver) build_test_dra_driver ;;
      coredns) build_coredns ;;
      kueue) build_kueue ;;
      containerd) build_containerd ;;
      runc) build_runc ;;
      helm) build_helm ;;
      prometheus) build_prometheus ;;
      krew) build_krew ;;
      actionlint) build_actionlint ;;
      kind) build_kind ;;
      cni-plugins) build_cni_plugins ;;
      crictl) build_crictl ;;
      *) echo "unknown component '$c' (accepted: kubernetes etcd kwok jobset kueue containerd runc helm prometheus krew actionlint kind cni-plugins crictl jobset-ipr-agent test-device-plugin test-dra-driver coredns)" >&2; exit 2 ;;
    esac
  done
  log "all requested binaries present ($((SECONDS - total))s)"
}

main "$@"
