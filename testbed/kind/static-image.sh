#!/usr/bin/env bash
# An image of one static binary, as upstream's distroless-static images are: the binary, an
# empty /tmp (1777), passwd and group files naming root and nonroot (65532), PATH set, nothing
# else. For the images no registry here serves (testbed/kind/node-image.sh, run.sh).
#
#   bash testbed/kind/static-image.sh REF BINARY PATH [USER]
#     REF     the image's name and tag
#     BINARY  the static executable on this machine
#     PATH    where it goes in the image (its entrypoint)
#     USER    the user it runs as (a number: Kubernetes' runAsNonRoot checks need one); default root
set -euo pipefail
if [[ $# -lt 3 || $# -gt 4 ]]; then
  sed -n '7,11p' "${BASH_SOURCE[0]}" >&2
  exit 2
fi
ref="$1" bin="$2" dest="$3" user="${4:-0}"
[[ -x "$bin" ]] || { echo "static-image.sh: $bin: not an executable file" >&2; exit 2; }
[[ "$dest" == /* ]] || { echo "static-image.sh: PATH must be absolute, got '$dest'" >&2; exit 2; }
[[ "$user" =~ ^[0-9]+$ ]] || { echo "static-image.sh: USER must be a number, got '$user'" >&2; exit 2; }
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root/tmp" "$ctx/root/etc" "$ctx/root$(dirname "$dest")"
chmod 1777 "$ctx/root/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$ctx/root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/root/etc/group"
install -m 0755 "$bin" "$ctx/root$dest"
cat >"$ctx/Dockerfile" <<EOF
FROM scratch
COPY root/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER $user:$user
ENTRYPOINT ["$dest"]
EOF
DOCKER_BUILDKIT=0 docker build -q -t "$ref" "$ctx" >/dev/null
