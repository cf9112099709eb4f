package validate

import (
	"net/netip"
	"testing"

	"github.com/grasp-sync/grasp-sync/services/relay"
)

// podNetworkPeers are addresses an ingress controller's pod connects to the
// relay from, on common clusters.
var podNetworkPeers = map[string]string{
	"kind, flannel, AKS kubenet":      "10.244.1.7",
	"k3s":                             "10.42.0.9",
	"GKE":                             "10.8.0.5",
	"Calico's default pool":           "192.168.12.3",
	"EKS (VPC addresses)":             "172.31.5.6",
	"EKS custom networking":           "100.64.1.2",
	"an IPv6 pod network":             "fd00:10:244::7",
	"a service-mesh sidecar":          "127.0.0.6",
	"a hostNetwork controller (node)": "10.0.12.4",
}

// dockerPeers are addresses a proxy container (or the host, through a
// published port) reaches a compose service from.
var dockerPeers = map[string]string{
	"the default bridge pool":     "172.18.0.5",
	"the second address pool":     "192.168.16.3",
	"a proxy on the host network": "127.0.0.1",
}

// publicPeers must never be trusted: anyone there could name any client.
var publicPeers = []string{"203.0.113.5", "198.51.100.20", "2001:db8::5"}

// checkRelayTrustsProxy: the relay configured by env lets a reverse proxy
// at each of peers name its clients in X-Forwarded-For (otherwise every
// client would share the proxy's address and its limits), and no public
// address.
func checkRelayTrustsProxy(t *testing.T, env map[string]string, peers map[string]string) {
	t.Helper()
	var cfg relay.Config
	loadEnv(t, env, &cfg)
	for where, addr := range peers {
		if !cfg.MayForward(netip.MustParseAddr(addr)) {
			t.Errorf("a reverse proxy at %s (%s) is not a trusted proxy (GRASP_RELAY_TRUSTED_PROXIES=%q): every client it forwards would share its address's limits",
				addr, where, cfg.TrustedProxies)
		}
	}
	for _, addr := range publicPeers {
		if cfg.MayForward(netip.MustParseAddr(addr)) {
			t.Errorf("public address %s is a trusted proxy (GRASP_RELAY_TRUSTED_PROXIES=%q): it could name any client", addr, cfg.TrustedProxies)
		}
	}
}
