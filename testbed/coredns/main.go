// Command jsi-coredns is CoreDNS (github.com/coredns/coredns, its own coremain) built with the
// plugins the clusters' DNS uses, as CoreDNS documents for custom builds: the Corefile
// testbed/dns.py writes for the real nodes serves cluster.local from the API server (kubernetes),
// forwards the rest (forward) and reports readiness (health, ready); the one kubeadm writes on
// the offline kind nodes (testbed/kind/node-image.sh) also uses prometheus, loop, reload and
// loadbalance. Every other plugin is left out: the full build pulls every cloud SDK for nothing.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
