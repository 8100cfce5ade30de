#!/usr/bin/env bash
# kind's base image (kindest/base), built offline: what kind's images/base/Dockerfile builds,
# from a Debian root file system (debootstrap, the machine's own apt mirror), kind's own files
# from its pinned Go module, and containerd, runc, crictl and the CNI plugins built from their
# Go modules by testbed/build-binaries.sh. No registry is asked for anything.
#
#   bash testbed/kind/base-image.sh     # prints the image's name (jobset-inplace/kind-base:<hash>)
#
# The image is cached in the Docker engine (testbed/kind/engine.sh) under a tag that hashes its
# inputs (this script, the versions, the package list, the mirror): re-running is cheap.
# Differences from upstream's, on purpose: Debian bookworm (systemd 252) rather than trixie,
# whose systemd refuses cgroup v1 hosts like this one; containerd and runc at the versions the
# real nodes use (versions.env); no fuse-overlayfs snapshotter (only for zfs or rootless hosts).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib_tag=kind-base
# shellcheck source=testbed/kind/lib.sh
source "$here/lib.sh"
# shellcheck source=testbed/debian-mirror.sh
source "$here/../debian-mirror.sh"
need_debootstrap
need_engine

suite=bookworm
# kind's base packages (its Dockerfile's clean-install list), but fuse-overlayfs.
packages=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz
packages+=,nfs-common,open-iscsi,e2fsprogs,bash,ca-certificates,curl,jq,procps
mirror="$(debian_mirror "$suite")"
bash "$here/../build-binaries.sh" kind containerd runc cni-plugins crictl >&2
kind_src="$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r .Dir)"
[[ -d "$kind_src/images/base/files" ]] || die "no images/base/files in $kind_src"
bin="$JSI_CACHE/bin"
cni="$bin/cni-plugins-$CNI_PLUGINS_VERSION"
crictl="$bin/crictl-$CRICTL_VERSION/crictl"

hash="$(
  {
    echo "$suite $mirror $packages $KIND_VERSION $CONTAINERD_VERSION $RUNC_VERSION"
    echo "$CNI_PLUGINS_VERSION $CRICTL_VERSION $(dpkg-query -W -f '${Version}' debootstrap)"
  } | inputs_hash "${BASH_SOURCE[0]}"
)"
image="jobset-inplace/kind-base:$hash"
exit_if_cached "$image"

work="$JSI_CACHE/kind/base-$hash"
rootfs="$work/rootfs"
began=$SECONDS
debootstrap_rootfs "$work" "$suite" "$mirror" "$packages"
log "root file system ready in $((SECONDS - began)) s"

# kind's files, with the modes its Dockerfile gives them (the module's copies are read-only).
files="$kind_src/images/base/files"
install -m 0755 "$files"/usr/local/bin/* "$rootfs/usr/local/bin/"
mkdir -p "$rootfs/kind/bin" "$rootfs/LICENSES" "$rootfs/etc/systemd/system/kubelet.service.d"
(cd "$files/kind" && find . -type f) | while read -r f; do
  mode=0644
  [[ "$f" == ./bin/* ]] && mode=0755
  install -D -m "$mode" "$files/kind/$f" "$rootfs/kind/$f"
done
chmod 0755 "$rootfs/kind" "$rootfs/kind/bin"
install -m 0644 "$files"/LICENSES/* "$rootfs/LICENSES/"
for d in etc etc/containerd etc/default etc/sysctl.d etc/systemd/system etc/systemd/system/kubelet.service.d; do
  mkdir -p "$rootfs/$d"
  find "$files/$d" -maxdepth 1 -type f -exec install -m 0644 {} "$rootfs/$d/" \;
done

# The Dockerfile's RUN steps.
in_root() { chroot "$rootfs" /bin/bash -c "$1"; }
in_root '
  set -e
  find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete
  rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
    /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
    /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >> /etc/systemd/journald.conf
  ln -sf /usr/lib/systemd/systemd /sbin/init
  systemctl enable kubelet.service containerd.service undo-mount-hacks.service
  systemctl mask systemd-binfmt.service
  mkdir -p /etc/kubernetes/manifests
'

# The runtime and tools, where kind's image has them.
install -m 0755 "$CONTAINERD_BIN"/{containerd,ctr,containerd-shim-runc-v2} "$rootfs/usr/local/bin/"
install -D -m 0755 "$RUNC_BIN" "$rootfs/usr/local/sbin/runc"
install -m 0755 "$crictl" "$rootfs/usr/local/bin/"
install -D -m 0755 -t "$rootfs/opt/cni/bin" "$cni"/{host-local,loopback,ptp,portmap}
"$CONTAINERD_BIN/ctr" oci spec 2> >(quiet_ctr >&2) |
  jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
  jq 'del(.process.rlimits)' >"$rootfs/etc/containerd/cri-base.json"
chroot "$rootfs" /usr/local/sbin/runc --version >/dev/null || die "runc does not run in the root file system"
in_root 'apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/lib/dpkg/*-old'

log "importing $image ..."
image_from_rootfs "$rootfs" "$image" 'ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]'
built "$image" "$((SECONDS - began))"
