#!/bin/bash
# The offline kind node image's pod network (testbed/kind/node-image.sh), in place of kindnetd,
# whose sources the module proxy here does not serve: what kindnetd does for IPv4 minus network
# policies and masquerading. On every node (a DaemonSet, host network):
# - this node's CNI configuration: ptp (one veth per pod, routed) with host-local addresses from
#   the node's spec.podCIDR, written once the node has one, atomically;
# - a route to every other node's podCIDR through that node's InternalIP (kind's nodes share one
#   Docker network, so one hop), kept current every 5 s: nodes that join later get theirs.
# The API server is reached at CONTROL_PLANE_ENDPOINT, which kind adds to this DaemonSet ("would
# you kindly patch this file" below), so the network does not wait for kube-proxy.
set -uo pipefail
log() { printf '%s kind-net: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
: "${NODE_NAME:?NODE_NAME must be set (from the downward API: spec.nodeName)}"
endpoint="${CONTROL_PLANE_ENDPOINT:-${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}}"
sa=/var/run/secrets/kubernetes.io/serviceaccount
conf=/etc/cni/net.d/10-kind-net.conflist

write_conf() {
  local cidr="$1" tmp="$conf.tmp"
  jq -n --arg cidr "$cidr" '{
    cniVersion: "0.4.0", name: "kind-net",
    plugins: [
      {type: "ptp", ipMasq: false, mtu: 1500,
       ipam: {type: "host-local", ranges: [[{subnet: $cidr}]], routes: [{dst: "0.0.0.0/0"}],
              dataDir: "/run/cni-ipam-state"}},
      {type: "portmap", capabilities: {portMappings: true}}
    ]}' >"$tmp" && mv -f "$tmp" "$conf"
  log "wrote $conf for $cidr"
}

declare -A routed=()
while true; do
  if ! nodes="$(curl -sSf --max-time 10 --cacert "$sa/ca.crt" \
    -H "Authorization: Bearer $(cat "$sa/token")" "https://$endpoint/api/v1/nodes")"; then
    log "listing nodes at $endpoint failed; again in 2 s"
    sleep 2
    continue
  fi
  while IFS=$'\t' read -r name cidr address; do
    [[ -n "$cidr" && -n "$address" ]] || continue
    if [[ "$name" == "$NODE_NAME" ]]; then
      want="$(jq -r '.plugins[0].ipam.ranges[0][0].subnet' "$conf" 2>/dev/null || true)"
      [[ "$want" == "$cidr" ]] || write_conf "$cidr"
    elif ip route replace "$cidr" via "$address"; then  # idempotent: restores a removed route
      if [[ "${routed[$cidr]:-}" != "$address" ]]; then
        log "route $cidr via $address (node $name)"
        routed[$cidr]="$address"
      fi
    fi
  done < <(jq -r '.items[] | [.metadata.name, (.spec.podCIDR // ""),
    ([.status.addresses[]? | select(.type == "InternalIP") | .address | select(test("^[0-9.]+$"))][0] // "")]
    | @tsv' <<<"$nodes")
  sleep 5
done
