# Sourced by the testbed's image builds: the Debian mirror the machine's apt uses for a suite
# (never a public mirror named here). JSI_DEBIAN_MIRROR overrides it.
# shellcheck shell=bash
debian_mirror() {
  local suite="$1"
  if [[ -n "${JSI_DEBIAN_MIRROR:-}" ]]; then
    echo "$JSI_DEBIAN_MIRROR"
    return
  fi
  local m=""
  # deb822 sources: first URIs line of a stanza whose Suites has the suite and that is not security
  if compgen -G '/etc/apt/sources.list.d/*.sources' >/dev/null; then
    m="$(awk -v s="$suite" '
      /^URIs:/ {u=$2} /^Suites:/ {for (i=2;i<=NF;i++) if ($i==s) ok=1}
      /^$/ {if (ok && u !~ /security/) {print u; exit} ok=0; u=""}
      END {if (ok && u !~ /security/) print u}' /etc/apt/sources.list.d/*.sources | head -1)"
  fi
  if [[ -z "$m" && -f /etc/apt/sources.list ]]; then
    m="$(awk -v s="$suite" '$1=="deb" && $3==s && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)"
  fi
  # No fallback to a public mirror: the build uses the machine's configured sources only.
  if [[ -z "$m" ]]; then
    echo "no Debian mirror found for suite $suite in /etc/apt/sources.list or" \
      "/etc/apt/sources.list.d/*.sources: configure one for apt, or set JSI_DEBIAN_MIRROR=URL" >&2
    return 1
  fi
  echo "$m"
}
