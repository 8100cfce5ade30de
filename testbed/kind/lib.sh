# Sourced by testbed/kind's image scripts (base-image.sh, debian-image.sh, node-image.sh): the
# versions, logging under the script's tag, the checks they share, and the cache lookup (each
# image is tagged by a hash of its inputs, so one found under its tag is current).
#   lib_tag=kind-base; source "$here/lib.sh"
# shellcheck shell=bash
# shellcheck source=testbed/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/../versions.sh"
log() { printf '[%s %s] %s\n' "${lib_tag:?}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_engine() {
  docker info >/dev/null 2>&1 || die "no Docker engine answers: run testbed/kind/engine.sh first"
}

need_debootstrap() {
  [[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
}

# pause_archive: the testbed's pause image (registry.k8s.io/pause, testbed/images.py builds
# it with the real nodes' images; built here if missing), as an archive `docker load` reads.
pause_archive() {
  local repo archive
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  # shellcheck disable=SC2012 # names are pause-<hex>.tar; the newest is the current build
  archive="$(ls -t "$JSI_CACHE"/images/pause-*.tar 2>/dev/null | head -1 || true)"
  if [[ -z "$archive" ]]; then
    log "building the testbed's images for the pause image (python -m testbed.images) ..."
    (cd "$repo" && .venv/bin/python -m testbed.images >&2)
    # shellcheck disable=SC2012
    archive="$(ls -t "$JSI_CACHE"/images/pause-*.tar | head -1)"
  fi
  echo "$archive"
}

# inputs_hash FILE...: the tag of an image built from these inputs: the files given (the
# building script, what it copies), this file, and what comes on stdin (versions, mirror...).
inputs_hash() {
  { cat "$@" "${BASH_SOURCE[0]}"; cat; } | sha256sum | cut -c1-16
}

# debootstrap_rootfs WORK SUITE MIRROR PACKAGES: a fresh directory WORK (removed when the
# script exits) holding WORK/rootfs, SUITE's minimal root file system from MIRROR with PACKAGES
# (comma-separated); its log in WORK/debootstrap.log, shown on failure.
debootstrap_rootfs() {
  local work="$1" suite="$2" mirror="$3" packages="$4"
  rm -rf "$work"
  mkdir -p "$work"
  # shellcheck disable=SC2064 # WORK is fixed now, on purpose
  trap "rm -rf '$work'" EXIT
  log "debootstrap $suite (minbase with $packages) from $mirror (log: $work/debootstrap.log) ..."
  debootstrap --variant=minbase --include="$packages" --components=main \
    "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -30 "$work/debootstrap.log" >&2
    die "debootstrap failed"
  }
}

# exit_if_cached IMAGE: print IMAGE and end the script if the engine has it.
exit_if_cached() {
  if docker image inspect "$1" >/dev/null 2>&1; then
    log "cached $1"
    echo "$1"
    exit 0
  fi
}

# built IMAGE SECONDS: log that IMAGE was built, with its size, and print its name.
built() {
  log "built $1 ($(docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MiB", $1/1048576}')) in $2 s"
  echo "$1"
}

# image_from_rootfs DIR IMAGE DOCKERFILE_TAIL: IMAGE from the root file system DIR, its
# Dockerfile's instructions after `ADD rootfs.tar /` given (ENV, ENTRYPOINT...).
image_from_rootfs() {
  local rootfs="$1" image="$2" tail="$3" context
  context="$(dirname "$rootfs")/context"
  mkdir -p "$context"
  tar -C "$rootfs" --numeric-owner -cf "$context/rootfs.tar" .
  printf 'FROM scratch\nADD rootfs.tar /\n%s\n' "$tail" >"$context/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$image" "$context" >/dev/null || die "building $image failed"
}
