package relay

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// Who a websocket request is counted as, behind reverse proxies (see
// docs/decisions/0017-relay-client-addresses-behind-proxy.md):
//
//   - A request that carries no forwarding header is a direct connection:
//     its TCP peer is the client, and a peer in TrustedAddresses is exempt
//     from the rate and connection limits.
//   - A request that carries one (X-Forwarded-For, X-Real-IP, Forwarded) was
//     forwarded for someone else and is never exempt, whatever address the
//     proxy or the header names: otherwise a proxy on a trusted address
//     (loopback) would lift every limit for every client behind it.
//   - From a trusted proxy, the client is the right-most X-Forwarded-For
//     address that is not itself a trusted proxy (entries left of the
//     proxies' own are the client's to forge), or the left-most one when
//     every hop is a proxy, or else the proxy's X-Real-IP.
//   - From any other peer the forwarding headers are ignored: everyone it
//     forwards shares the peer's limits, and the relay warns once per such
//     peer that it may be a proxy missing from TrustedProxies.

// forwardingHeaders mark a request as forwarded by a proxy.
var forwardingHeaders = []string{"X-Forwarded-For", "X-Real-Ip", "Forwarded"}

// clientOrigin is who a request is counted as.
type clientOrigin struct {
	// addr is the address the limits are counted against.
	addr netip.Addr
	// peer is the TCP peer.
	peer netip.Addr
	// forwarded: the request carries a forwarding header.
	forwarded bool
	// viaProxy: addr was named by a trusted proxy.
	viaProxy bool
}

// exempt reports whether the client skips the rate and connection limits:
// only a direct connection from a trusted address does.
func (c clientOrigin) exempt(trusted prefixList) bool {
	return !c.forwarded && c.addr.IsValid() && trusted.contains(c.addr)
}

// resolveClient decides who request r is counted as, given the trusted
// proxies.
func resolveClient(r *http.Request, proxies prefixList) clientOrigin {
	c := clientOrigin{}
	for _, h := range forwardingHeaders {
		if len(r.Header.Values(h)) > 0 {
			c.forwarded = true
			break
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if peer, err := netip.ParseAddr(host); err == nil {
		c.peer = peer.Unmap()
	}
	c.addr = c.peer
	if !c.forwarded || !c.peer.IsValid() || !proxies.contains(c.peer) {
		return c
	}
	if a, ok := forwardedFor(r.Header.Values("X-Forwarded-For"), proxies); ok {
		c.addr, c.viaProxy = a, true
		return c
	}
	if a, err := netip.ParseAddr(strings.TrimSpace(r.Header.Get("X-Real-Ip"))); err == nil {
		c.addr, c.viaProxy = a.Unmap(), true
	}
	return c
}

// forwardedFor picks the client out of X-Forwarded-For header values: the
// right-most address that is not a trusted proxy, or the left-most when all
// are. An unparsable hop ends the walk (what lies left of it cannot be
// vouched for); ok is false when no hop parses.
func forwardedFor(values []string, proxies prefixList) (netip.Addr, bool) {
	hops := strings.Split(strings.Join(values, ","), ",")
	var last netip.Addr
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		a = a.Unmap()
		if !proxies.contains(a) {
			return a, true
		}
		last = a
	}
	return last, last.IsValid()
}

// maxUntrustedWarnings bounds the peers warned about, so a flood of forged
// headers from many addresses costs a bounded log and memory.
const maxUntrustedWarnings = 32

// untrustedForwarders remembers which peers the relay warned about.
type untrustedForwarders struct {
	mu   sync.Mutex
	seen map[netip.Addr]struct{}
}

// warn logs, once per peer, that a peer which is not a trusted proxy sent
// forwarding headers.
func (u *untrustedForwarders) warn(log *slog.Logger, peer netip.Addr) {
	u.mu.Lock()
	_, done := u.seen[peer]
	full := len(u.seen) >= maxUntrustedWarnings
	if !done && !full {
		if u.seen == nil {
			u.seen = map[netip.Addr]struct{}{}
		}
		u.seen[peer] = struct{}{}
	}
	u.mu.Unlock()
	if done || full {
		return
	}
	log.Warn("forwarding headers from a peer that is not a trusted proxy are ignored: every client it forwards shares its address's limits; if it is your reverse proxy, add it to GRASP_RELAY_TRUSTED_PROXIES",
		"peer", peer.String())
}

// logClientAddressing tells the operator at start which peers may name the
// client and which addresses are exempt from the limits.
func (r *Relay) logClientAddressing() {
	r.log.Info("client addresses: peers in trusted_proxies may name the client in X-Forwarded-For; direct connections from exempt_addresses skip rate and connection limits; forwarded clients never do",
		"trusted_proxies", r.proxies.String(), "exempt_addresses", r.trusted.String())
	if len(r.proxies) == 0 {
		r.log.Warn("no trusted proxies (GRASP_RELAY_TRUSTED_PROXIES is empty): behind a reverse proxy every client counts as the proxy's address and they share its limits")
	}
}

// String lists the prefixes as configured ("none" when empty).
func (l prefixList) String() string {
	if len(l) == 0 {
		return "none"
	}
	parts := make([]string, len(l))
	for i, p := range l {
		if p.IsSingleIP() {
			parts[i] = p.Addr().String()
		} else {
			parts[i] = p.String()
		}
	}
	return strings.Join(parts, ",")
}

// MayForward reports whether a peer at addr is one of the configuration's
// trusted proxies, whose X-Forwarded-For names the client (deploy/validate
// checks the shipped manifests with it).
func (c Config) MayForward(addr netip.Addr) bool {
	proxies, err := parsePrefixes(c.TrustedProxies)
	return err == nil && proxies.contains(addr)
}
