#!/usr/bin/env bash
# A Debian bookworm image built offline: the stand-in for `debian:bookworm-slim`, the base
# images/Dockerfile starts from, which no registry here serves. A minimal root file system from
# the machine's own apt mirror (debootstrap --variant=minbase), so apt inside it uses the same
# sources; plus the machine's own certificate authorities (/usr/local/share/ca-certificates),
# so pip and apt inside a build trust what the machine trusts (an intercepting egress proxy's
# CA, say). No registry is asked for anything.
#
#   bash testbed/kind/debian-image.sh    # prints the image's name (jobset-inplace/debian:bookworm-<hash>)
#
# Tagged by a hash of its inputs (this script, the mirror, debootstrap's version, the CA files):
# re-running is cheap. testbed/kind/run.sh passes it to `docker build --build-arg BASE=...`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=testbed/versions.sh
source "$here/../versions.sh"
# shellcheck source=testbed/debian-mirror.sh
source "$here/../debian-mirror.sh"
log() { printf '[debian-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
docker info >/dev/null 2>&1 || die "no Docker engine answers: run testbed/kind/engine.sh first"

suite=bookworm
mirror="$(debian_mirror "$suite")"
cas=/usr/local/share/ca-certificates
hash="$(
  {
    cat "${BASH_SOURCE[0]}"
    echo "$suite $mirror $(dpkg-query -W -f '${Version}' debootstrap)"
    find "$cas" -name '*.crt' -type f -exec cat {} + 2>/dev/null || true
  } | sha256sum | cut -c1-16
)"
image="jobset-inplace/debian:$suite-$hash"
if docker image inspect "$image" >/dev/null 2>&1; then
  log "cached $image"
  echo "$image"
  exit 0
fi

work="$JSI_CACHE/kind/debian-$hash"
rootfs="$work/rootfs"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
began=$SECONDS
log "debootstrap $suite (minbase) from $mirror ..."
debootstrap --variant=minbase --include=ca-certificates --components=main \
  "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2
  die "debootstrap failed"
}
if compgen -G "$cas/*.crt" >/dev/null; then
  install -m 0644 "$cas"/*.crt "$rootfs/usr/local/share/ca-certificates/"
  chroot "$rootfs" update-ca-certificates >/dev/null
  log "the machine's own certificate authorities added: $(cd "$cas" && echo *.crt)"
fi
chroot "$rootfs" /bin/sh -c \
  'apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/*'

mkdir -p "$work/context"
tar -C "$rootfs" --numeric-owner -cf "$work/context/rootfs.tar" .
printf 'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n' >"$work/context/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t "$image" "$work/context" >/dev/null
log "built $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MiB", $1/1048576}')) in $((SECONDS - began)) s"
echo "$image"
