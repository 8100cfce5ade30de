#!/usr/bin/env bash
# Install, from Debian packages only, what a real kubelet node needs on this VM:
# a container runtime (containerd 1.6 + runc), CNI plugins, the host tools kubelet and
# kube-proxy-less pod networking call (iptables, conntrack, socat, iproute2), and the
# offline image tool chain (debootstrap, umoci, skopeo, catatonit, busybox-static).
#
# Idempotent: a package that is already installed is skipped; when everything is there
# the script does no apt work at all (not even `apt-get update`).
#
# Usage: testbed/realnode/install-runtime.sh
# Needs root (apt-get). Does NOT start the distribution's containerd service: see
# testbed/realnode/containerd.sh for the project's own containerd instance.
set -euo pipefail

log() { printf '[install-runtime %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# package -> a file it provides (used only for the progress line)
packages=(
  containerd                   # /usr/bin/containerd, ctr, containerd-shim-runc-v2
  runc                         # /usr/sbin/runc
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
  # Do not let the package's postinst start the distribution's containerd.service
  # (we run our own instance on our own socket). policy-rc.d is only added if absent.
  added_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    added_policy=1
  fi
  trap '[[ -n "$added_policy" ]] && rm -f /usr/sbin/policy-rc.d' EXIT
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
for b in containerd ctr containerd-shim-runc-v2 runc umoci skopeo debootstrap catatonit \
  busybox iptables conntrack; do
  command -v "$b" >/dev/null || { log "ERROR: $b not on PATH"; exit 1; }
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
  || { log "ERROR: CNI plugins missing under /usr/lib/cni"; exit 1; }
log "ok: containerd $(containerd --version | awk '{print $3}'), $(runc --version | head -1)"
