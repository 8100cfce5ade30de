// Command jsi-coredns is CoreDNS (github.com/coredns/coredns, its own coremain) built with the
// plugins the local cluster's DNS uses, as CoreDNS documents for custom builds: the Corefile
// testbed/dns.py writes serves cluster.local from the API server (kubernetes), forwards the
// rest (forward), and reports readiness (health, ready). Every other plugin is left out: the
// full build pulls every cloud SDK for nothing here.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
