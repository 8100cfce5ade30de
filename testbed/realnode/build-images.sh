#!/usr/bin/env bash
# Build the container images a real kubelet node needs, offline, from Debian packages only
# (no registry is reachable here), and optionally import them into a containerd.
#
# Images (docker-archive tarballs, cached by a hash of their inputs):
#   pause   registry.k8s.io/pause:3.10 (+ tag jobset-inplace/pause:local)
#           one static file: catatonit in pause mode (`/catatonit -P`), from Debian's catatonit.
#   python  jobset-inplace/python:local
#           `debootstrap --variant=minbase --include=python3 bookworm` rootfs
#           -> umoci (new layout, unpack, repack, config) -> skopeo copy oci: -> docker-archive:.
#           Has /bin/sh (dash), python3 (3.11) with its full standard library, coreutils;
#           no pip. (python3-minimal alone lacks json/asyncio/http: see JSI_PYTHON_IMAGE_PACKAGES.)
#
# Cache: $JSI_CACHE_DIR/images/<name>-<hash>.tar (default JSI_CACHE_DIR=~/.cache/jobset-inplace).
# <hash> covers the build recipe (the bash functions below, as `declare -f` prints them),
# the versions of the Debian tools used, suite, mirror and package list. An existing
# archive is reused as is; --force rebuilds.
# Package *versions inside* the Python image are whatever the mirror serves at build time;
# the list is written next to the archive (<name>-<hash>.packages).
#
# Images on top of the Python image: --image KEY=NAME=DIR adds the tree under DIR (laid out
# as from /) to the cached base as one more layer, tagged NAME, with the image config of
# $DIR.config (optional; lines of `umoci config` options, e.g. --config.user=65532:65532);
# the archive is KEY-<base hash>-<tree hash>.tar (no debootstrap re-run). The product images
# (testbed/images.py: agent, controller) and the local nodes' python:local (the project's
# code and the demo trainer, testbed/cluster.py) are made this way. See docs/images.md.
#
# Usage:
#   testbed/realnode/build-images.sh [--force] [--image KEY=NAME=DIR]... [--import SOCK]...
#     --image KEY=NAME=DIR  an image of DIR's tree on the Python image (NAME may be the Python
#                     image's own tag: it then replaces it)
#     --import SOCK   also import every image into containerd at SOCK, namespace k8s.io
#                     (skipped when the image there already carries the same build hash label)
# Env:
#   JSI_CACHE_DIR             cache root
#   JSI_DEBIAN_MIRROR         mirror for debootstrap (default: the one apt uses for the suite;
#                             none configured and none set: the script stops with an error)
#   JSI_DEBIAN_SUITE          default bookworm
#   JSI_PYTHON_IMAGE_PACKAGES debootstrap --include list for the Python image (default python3;
#                             python3-minimal gives a smaller image without json/asyncio/http)
#   JSI_IMAGES                more --image specs, separated by spaces (how containerd.sh up,
#                             which runs this script, gets the harness's images onto a node)
#   JSI_KEEP_OLD_IMAGES=1     keep archives of other recipes (default: prune them)
set -euo pipefail

# shellcheck source=testbed/versions.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../versions.sh"
cache="$JSI_CACHE"
imgdir="$cache/images"
suite="${JSI_DEBIAN_SUITE:-bookworm}"
# python3-minimal alone lacks json, asyncio, http, ctypes, uuid, concurrent... (they are in
# libpython3.11-stdlib), which the kubernetes client and kopf need: default to python3.
python_packages="${JSI_PYTHON_IMAGE_PACKAGES:-python3}"
# Fixed timestamp for files, layers and image configs (reproducibility).
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}" # 2024-01-01T00:00:00Z
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

PAUSE_NAME="registry.k8s.io/pause:3.10"
PAUSE_ALIAS="jobset-inplace/pause:local"
PYTHON_NAME="jobset-inplace/python:local"
HASH_LABEL="dev.jobset-inplace.build-hash"

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

force=""
imports=()
overlays=() # KEY=NAME=DIR
read -ra overlays <<<"${JSI_IMAGES:-}"
while (($#)); do
  case "$1" in
    --force) force=1 ;;
    --import) imports+=("$2"); shift ;;
    --image) overlays+=("$2"); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
  shift
done

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, umoci unpack keep file ownership)"
for b in debootstrap umoci skopeo catatonit; do
  command -v "$b" >/dev/null || die "$b missing: run testbed/realnode/install-runtime.sh"
done

# shellcheck source=testbed/debian-mirror.sh
source "$(dirname "${BASH_SOURCE[0]}")/../debian-mirror.sh"
mirror="$(debian_mirror "$suite")" || exit 1

pkgver() { dpkg-query -W -f='${Version}' "$1"; }

# Deterministic tar of a tree -> sha256 (used for the overlay hash).
tree_hash() {
  tar --sort=name --mtime="@0" --owner=0 --group=0 --numeric-owner -C "$1" -cf - . | sha256sum | cut -c1-64
}

# Clamp mtimes so that layer tarballs depend on content, not on build time.
clamp_mtimes() {
  find "$1" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
}

# ---- recipes (their `declare -f` text is part of the cache key) ----

# $1 = bundle rootfs dir
pause_rootfs() {
  install -m 0755 "$(command -v catatonit)" "$1/catatonit"
}
pause_config() {
  umoci config --image "$1" --no-history --created "$created" \
    --config.entrypoint /catatonit --config.entrypoint -P \
    --config.workingdir / --config.user 65535:65535 \
    --config.label org.opencontainers.image.description="catatonit -P (pause) built by jobset-inplace"
}

# $1 = bundle rootfs dir (must exist and be empty)
python_rootfs() {
  local r="${1:?rootfs dir}"
  debootstrap --variant=minbase --include="$python_packages" --components=main \
    "$suite" "$r" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -30 "$work/debootstrap.log" >&2
    return 1
  }
  # Drop caches, logs and per-machine files (containerd supplies hostname/hosts/resolv.conf).
  [[ "$r" == "$work/bundle/rootfs" ]] || return 1 # never clean anything but our rootfs
  rm -rf "${r:?}"/var/cache/apt/*.bin "${r:?}"/var/cache/apt/archives/*.deb \
    "${r:?}"/var/lib/apt/lists/* "${r:?}"/var/log/* "${r:?}"/var/cache/ldconfig/aux-cache \
    "${r:?}"/var/lib/dpkg/*-old "${r:?}"/debootstrap "${r:?}"/dev/* "${r:?}"/run/* "${r:?}"/tmp/*
  # Documentation, manuals and translations: nothing in a container reads them (~50 MB of
  # 160); the packages' copyright files stay.
  find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "${r:?}"/usr/share/man/* "${r:?}"/usr/share/info/* "${r:?}"/usr/share/locale/*
  # The images' non-root user (as distroless's "nonroot"): programs that look up their user
  # (getpass, ~) find one.
  echo "nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin" >>"$r/etc/passwd"
  echo "nonroot:x:65532:" >>"$r/etc/group"
  : >"$r/etc/machine-id"
  : >"$r/etc/hostname"
  rm -f "$r/etc/resolv.conf"
}
python_config() {
  umoci config --image "$1" --no-history --created "$created" \
    --config.cmd python3 --config.workingdir / \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env LANG=C.UTF-8 --config.env PYTHONUNBUFFERED=1 \
    --config.label org.opencontainers.image.description="Debian $suite minbase + $python_packages, built by jobset-inplace"
}

# ---- generic machinery ----

# build_image KEY NAME ALIAS ROOTFS_FN CONFIG_FN -> sets $archive
build_image() {
  local key="$1" name="$2" alias="$3" rootfs_fn="$4" config_fn="$5"
  local hash
  hash="$(
    {
      declare -f "$rootfs_fn" "$config_fn" build_image clamp_mtimes
      echo "$name $alias $suite $mirror $created $python_packages"
      echo "debootstrap=$(pkgver debootstrap) umoci=$(pkgver umoci) skopeo=$(pkgver skopeo) catatonit=$(pkgver catatonit)"
    } | sha256sum | cut -c1-16
  )"
  archive="$imgdir/$key-$hash.tar"
  eval "${key}_hash=$hash"
  if [[ -s "$archive" && -z "$force" ]]; then
    log "$key: cached $archive ($(du -h "$archive" | cut -f1))"
    return
  fi
  local t0=$SECONDS t
  log "$key: building $name (hash $hash) ..."
  work="$(mktemp -d "$imgdir/.work-$key-XXXXXX")"
  local layout="$work/oci"
  umoci init --layout "$layout"
  umoci new --image "$layout:img"
  umoci unpack --image "$layout:img" "$work/bundle" >/dev/null
  t=$SECONDS
  "$rootfs_fn" "$work/bundle/rootfs"
  log "$key: rootfs ready in $((SECONDS - t))s ($(du -sh "$work/bundle/rootfs" | cut -f1))"
  clamp_mtimes "$work/bundle/rootfs"
  t=$SECONDS
  umoci repack --image "$layout:img" --history.created "$created" \
    --history.created_by "jobset-inplace build-images.sh $rootfs_fn" "$work/bundle"
  "$config_fn" "$layout:img"
  umoci gc --layout "$layout"
  log "$key: umoci repack+config in $((SECONDS - t))s"
  t=$SECONDS
  local extra=()
  [[ -n "$alias" ]] && extra=(--additional-tag "$alias")
  rm -f "$archive.tmp"
  skopeo copy --quiet "${extra[@]}" "oci:$layout:img" "docker-archive:$archive.tmp:$name"
  log "$key: skopeo copy in $((SECONDS - t))s"
  if [[ "$key" == python ]]; then
    # shellcheck disable=SC2016 # dpkg-query format, not shell
    chroot "$work/bundle/rootfs" dpkg-query -W -f='${Package} ${Version}\n' >"$imgdir/$key-$hash.packages" 2>/dev/null || true
  fi
  mv -f "$archive.tmp" "$archive"
  rm -rf "$work"
  work=""
  log "$key: built $archive ($(du -h "$archive" | cut -f1)) in $((SECONDS - t0))s"
}

# build_overlay KEY BASE_ARCHIVE BASE_HASH NAME DIR -> sets $archive, $overlay_hash
# The cached base image plus one layer holding DIR's tree (no debootstrap re-run), with the
# extra `umoci config` options listed in DIR.config (one per line), if that file exists.
build_overlay() {
  local key="$1" base="$2" base_hash="$3" name="$4" src="$5" ohash opts=()
  [[ -d "$src" ]] || die "--image $key: $src is not a directory"
  [[ ! -f "$src.config" ]] || mapfile -t opts <"$src.config"
  ohash="$({ tree_hash "$src"; echo "$name ${opts[*]}"; declare -f build_overlay; } | sha256sum | cut -c1-16)"
  overlay_hash="$base_hash-$ohash"
  archive="$imgdir/$key-$overlay_hash.tar"
  if [[ -s "$archive" && -z "$force" ]]; then
    log "$key: cached $archive ($(du -h "$archive" | cut -f1))"
    return
  fi
  local t0=$SECONDS
  log "$key: adding $src (hash $ohash) as a layer on $(basename "$base") ..."
  work="$(mktemp -d "$imgdir/.work-$key-XXXXXX")"
  skopeo copy --quiet "docker-archive:$base" "oci:$work/oci:img"
  umoci unpack --image "$work/oci:img" "$work/bundle" >/dev/null
  cp -a "$src/." "$work/bundle/rootfs/"
  clamp_mtimes "$work/bundle/rootfs"
  umoci repack --image "$work/oci:img" --history.created "$created" \
    --history.created_by "jobset-inplace $key layer $ohash" "$work/bundle"
  if ((${#opts[@]})); then
    umoci config --image "$work/oci:img" --no-history --created "$created" "${opts[@]}"
  fi
  umoci gc --layout "$work/oci"
  rm -f "$archive.tmp"
  skopeo copy --quiet "oci:$work/oci:img" "docker-archive:$archive.tmp:$name"
  mv -f "$archive.tmp" "$archive"
  rm -rf "$work"
  work=""
  log "$key: built $archive ($(du -h "$archive" | cut -f1)) in $((SECONDS - t0))s"
}

# import_image ADDRESS ARCHIVE HASH NAME...
import_image() {
  local addr="$1" archive="$2" hash="$3"
  shift 3
  local c=(ctr_quiet --address "$addr" --namespace k8s.io)
  local want=() n full
  for n in "$@"; do
    full="$n"
    [[ "$n" == */* && "${n%%/*}" == *[.:]* ]] || full="docker.io/$n"
    if "${c[@]}" images ls "name==$full" 2>/dev/null | grep -q "$HASH_LABEL=$hash"; then
      continue
    fi
    want+=("$full")
  done
  if ((${#want[@]} == 0)); then
    log "import: $* already in $addr (hash $hash)"
    return
  fi
  local t=$SECONDS
  # --discard-unpacked-layers (it needs --local, the client-side import): containers run from
  # the unpacked snapshots; the layers' blobs kept beside them would double every image on the
  # host's disk (the PyTorch examples' image is 6 GB per node)
  "${c[@]}" images import --local --snapshotter overlayfs --discard-unpacked-layers "$archive" >/dev/null
  for full in "${want[@]}"; do
    "${c[@]}" images label "$full" "$HASH_LABEL=$hash" >/dev/null
  done
  log "import: ${want[*]} -> $addr in $((SECONDS - t))s"
}

work=""
trap '[[ -z "$work" ]] || rm -rf "$work"' EXIT
mkdir -p "$imgdir"
rm -rf "$imgdir"/.work-* # leftovers of an interrupted build
total=$SECONDS
log "Debian mirror $mirror, suite $suite, cache $imgdir"
build_image pause "$PAUSE_NAME" "$PAUSE_ALIAS" pause_rootfs pause_config
pause_archive="$archive"
build_image python "$PYTHON_NAME" "" python_rootfs python_config
python_archive="$archive"
# shellcheck disable=SC2154 # pause_hash and python_hash: set by build_image (its eval)
python_base_hash="$python_hash"
declare -A out_archive=([pause]="$pause_archive" [python]="$python_archive")
# shellcheck disable=SC2154
declare -A out_hash=([pause]="$pause_hash" [python]="$python_hash")
declare -A out_name=([pause]="$PAUSE_NAME $PAUSE_ALIAS" [python]="$PYTHON_NAME")
keys=(pause python)
for spec in "${overlays[@]}"; do
  [[ "$spec" == ?*=?*=?* ]] || die "--image: expected KEY=NAME=DIR, got '$spec'"
  key="${spec%%=*}" rest="${spec#*=}"
  name="${rest%%=*}" dir="${rest#*=}"
  [[ "$key" =~ ^[a-z][a-z0-9-]*$ && "$key" != pause ]] || die "--image: bad KEY '$key' (a-z, 0-9, -)"
  build_overlay "$key" "$python_archive" "$python_base_hash" "$name" "$dir"
  # shellcheck disable=SC2154
  out_archive[$key]="$archive" out_hash[$key]="$overlay_hash" out_name[$key]="$name"
  [[ " ${keys[*]} " == *" $key "* ]] || keys+=("$key")
done
log "images ready in $((SECONDS - total))s"
# Drop archives of older recipes and trees (each is ~100 MB or more); JSI_KEEP_OLD_IMAGES=1
# keeps them. The base Python archive stays while an image is built on it.
if [[ "${JSI_KEEP_OLD_IMAGES:-}" != 1 ]]; then
  for key in "${keys[@]}"; do
    for f in "$imgdir/$key"-*.tar; do
      [[ -e "$f" && "$f" != "${out_archive[$key]}" && "$f" != "$python_archive" ]] || continue
      [[ "$key" != python || "$f" != "$imgdir/python-$python_base_hash.tar" ]] || continue
      log "pruning stale $(basename "$f")"
      rm -f "$f" "${f%.tar}.packages"
    done
  done
fi
for addr in "${imports[@]}"; do
  [[ -x "$CONTAINERD_BIN/ctr" ]] || die "no $CONTAINERD_BIN/ctr: run testbed/build-binaries.sh containerd"
  [[ -S "$addr" ]] || die "no containerd socket at $addr (start it: testbed/realnode/containerd.sh up)"
  for key in "${keys[@]}"; do
    # The bare Python image only when no --image builds on it without replacing it (it would
    # overwrite a python:local layer imported earlier; the other images carry its layers).
    if [[ "$key" == python && "${out_archive[python]}" == "$python_archive" && ${#overlays[@]} -gt 0 ]]; then
      continue
    fi
    # shellcheck disable=SC2086 # names are words
    import_image "$addr" "${out_archive[$key]}" "${out_hash[$key]}" ${out_name[$key]}
  done
done
# Machine-readable summary on stdout: KEY=ARCHIVE per image.
for key in "${keys[@]}"; do echo "$key=${out_archive[$key]}"; done
