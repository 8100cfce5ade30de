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
lib_tag=debian-image
# shellcheck source=testbed/kind/lib.sh
source "$here/lib.sh"
# shellcheck source=testbed/debian-mirror.sh
source "$here/../debian-mirror.sh"
need_debootstrap
need_engine

suite=bookworm
mirror="$(debian_mirror "$suite")"
cas=/usr/local/share/ca-certificates
hash="$(
  {
    echo "$suite $mirror $(dpkg-query -W -f '${Version}' debootstrap)"
    find "$cas" -name '*.crt' -type f -exec cat {} + 2>/dev/null || true
  } | inputs_hash "${BASH_SOURCE[0]}"
)"
image="jobset-inplace/debian:$suite-$hash"
exit_if_cached "$image"

work="$JSI_CACHE/kind/debian-$hash"
rootfs="$work/rootfs"
began=$SECONDS
debootstrap_rootfs "$work" "$suite" "$mirror" ca-certificates
if compgen -G "$cas/*.crt" >/dev/null; then
  install -m 0644 "$cas"/*.crt "$rootfs/usr/local/share/ca-certificates/"
  chroot "$rootfs" update-ca-certificates >/dev/null
  log "the machine's own certificate authorities added: $(cd "$cas" && echo *.crt)"
fi
chroot "$rootfs" /bin/sh -c \
  'apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/*'

image_from_rootfs "$rootfs" "$image" 'CMD ["bash"]'
built "$image" "$((SECONDS - began))"
