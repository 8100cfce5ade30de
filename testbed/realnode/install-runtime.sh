#!/usr/bin/env bash
# Install, from Debian packages only, what a real kubelet node needs on this VM besides the
# runtime (containerd 2.x and runc are built from Go modules by testbed/build-binaries.sh;
# runc's build needs libseccomp-dev from here): CNI plugins, the host tools kubelet and
# kube-proxy-less pod networking call (iptables, conntrack, socat, iproute2), and the
# offline image tool chain (debootstrap, umoci, skopeo, catatonit, busybox-static, jq).
#
# Idempotent: a package that is already installed is skipped; when everything is there
# the script does no apt work at all (not even `apt-get update`).
#
# Usage: testbed/realnode/install-runtime.sh
# Needs root (apt-get). Each node runs the project's own containerd instance:
# testbed/realnode/containerd.sh.
set -euo pipefail

log() { printf '[install-runtime %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# package -> a file it provides (used only for the progress line)
packages=(
  libseccomp-dev               # runc's seccomp support (cgo build; libseccomp2 at run time)
  pkg-config                   # runc's build finds libseccomp with it
  gcc                          # cgo for runc
  containernetworking-plugins  # /usr/lib/cni/{bridge,host-local,loopback,portmap,...}
  iptables                     # CNI bridge ipMasq/portmap, kubelet
  conntrack                    # kubelet / portmap cleanup
  socat                        # kubectl port-forward on the node
  iproute2                     # `ip`, handy for debugging netns/bridges
  debootstrap                  # Python image rootfs
  umoci                        # OCI layout editing
  skopeo                       # oci: -> docker-archive: conversion
  catatonit                    # pause image (catatonit -P)
  busybox-static               # tiny static shell for debugging images
  jq                           # JSON in the kind image scripts (testbed/kind)
)

if [[ $(id -u) -ne 0 ]]; then
  log "ERROR: needs root (apt-get install)"
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    log "present  $p $(dpkg-query -W -f='${Version}' "$p")"
  else
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  log "all ${#packages[@]} packages already installed; nothing to do"
else
  start=$SECONDS
  log "installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get update ..."
  apt-get update -qq
  log "apt-get install ..."
  apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" \
    | grep -E '^(Setting up|Unpacking|E:)' >&2 || true
  for p in "${missing[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
      log "ERROR: $p did not install"
      exit 1
    fi
  done
  log "installed ${#missing[@]} package(s) in $((SECONDS - start))s"
fi

# Sanity: the binaries the other scripts call.
for b in umoci skopeo debootstrap catatonit busybox iptables conntrack pkg-config gcc; do
  command -v "$b" >/dev/null || { log "ERROR: $b not on PATH"; exit 1; }
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
  || { log "ERROR: CNI plugins missing under /usr/lib/cni"; exit 1; }
pkg-config --exists libseccomp || { log "ERROR: libseccomp-dev installed but pkg-config cannot find it"; exit 1; }
log "ok: CNI plugins, image tools, libseccomp $(pkg-config --modversion libseccomp)"
