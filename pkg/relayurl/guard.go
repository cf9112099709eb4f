package relayurl

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Guard refuses relay addresses that would make us dial internal networks
// (SSRF through announcements): loopback (127.0.0.0/8, ::1), private
// (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7), link-local
// (169.254.0.0/16, fe80::/10, including the cloud metadata addresses
// 169.254.169.254 and fd00:ec2::254), shared address space (100.64.0.0/10),
// "this network" and unspecified (0.0.0.0/8, ::), multicast and reserved
// ranges, and the names "localhost" and *.localhost — unless Allow names
// them. IPv4-mapped and NAT64 IPv6 forms are judged by their IPv4 address.
//
// The zero Guard allows nothing internal. Tests and local demos allowlist
// their loopback relays.
type Guard struct {
	// Allow lists exceptions: hosts ("127.0.0.1", "localhost", "[::1]" or
	// "::1") allow every port; host:port entries ("127.0.0.1:7000",
	// "[::1]:7000") allow one port. Names match the URL's host name, IPs match
	// the literal or dialled address.
	Allow []string
}

var (
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	reserved4   = netip.MustParsePrefix("240.0.0.0/4") // includes broadcast
	benchmark4  = netip.MustParsePrefix("198.18.0.0/15")
	siteLocal6  = netip.MustParsePrefix("fec0::/10") // deprecated, still routed internally by some stacks
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	metadata6   = netip.MustParseAddr("fd00:ec2::254")
	metadata4   = netip.MustParseAddr("169.254.169.254")
)

// internalReason returns why addr is internal, or "" when it is a public
// unicast address.
func internalReason(addr netip.Addr) string {
	addr = addr.WithZone("").Unmap()
	if addr.Is6() && nat64.Contains(addr) {
		// 64:ff9b::a.b.c.d reaches a.b.c.d through a NAT64 gateway.
		b := addr.As16()
		if r := internalReason(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); r != "" {
			return r + " (via NAT64)"
		}
	}
	switch {
	case addr == metadata4 || addr == metadata6:
		return "cloud metadata address"
	case addr.IsLoopback():
		return "loopback address"
	case addr.IsUnspecified() || thisNetwork.Contains(addr):
		return "unspecified address"
	case addr.IsPrivate():
		return "private address"
	case addr.IsLinkLocalUnicast():
		return "link-local address"
	case cgnat.Contains(addr):
		return "shared (CGNAT) address"
	case addr.IsMulticast():
		return "multicast address"
	case reserved4.Contains(addr) || benchmark4.Contains(addr) || siteLocal6.Contains(addr):
		return "reserved address"
	}
	return ""
}

// isLocalhostName reports whether name is "localhost" or under ".localhost",
// which resolvers answer with loopback addresses without asking DNS (RFC 6761).
func isLocalhostName(name string) bool {
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}

// canonicalHost puts a host into the form used for allowlist comparison:
// lower case, no trailing dot, no brackets, IPs in canonical (unmapped) text.
func canonicalHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if addr, err := netip.ParseAddr(h); err == nil {
		return addr.WithZone("").Unmap().String()
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// allowEntry parses one Allow entry into a canonical host and an optional port.
func allowEntry(e string) (host, port string) {
	e = strings.TrimSpace(e)
	switch {
	case strings.HasPrefix(e, "["):
		// "[v6]" or "[v6]:port"
		if h, p, err := net.SplitHostPort(e); err == nil {
			return canonicalHost(h), p
		}
		return canonicalHost(e), ""
	case strings.Count(e, ":") == 1:
		h, p, _ := strings.Cut(e, ":")
		return canonicalHost(h), p
	default:
		// a name, an IPv4 address or a bare IPv6 address
		return canonicalHost(e), ""
	}
}

// allows reports whether an Allow entry names host (canonical) on port.
func (g Guard) allows(host, port string) bool {
	if host == "" {
		return false
	}
	for _, e := range g.Allow {
		h, p := allowEntry(e)
		if h == host && (p == "" || p == port) {
			return true
		}
	}
	return false
}

// CheckURL checks the literal host of a normalised URL (any of ws, wss, http,
// https). IP literals on internal networks and localhost names are refused
// unless allowlisted; other names pass here because their addresses can
// change — CheckDial checks what they resolve to at connect time.
func (g Guard) CheckURL(normalized string) error {
	p, err := parse(normalized)
	if err != nil {
		return err
	}
	port := p.effectivePort()
	if g.allows(canonicalHost(p.host), port) {
		return nil
	}
	if p.ip.IsValid() {
		if r := internalReason(p.ip); r != "" {
			return fmt.Errorf("%w: %s is a %s", ErrPrivateAddress, p.host, r)
		}
		return nil
	}
	if isLocalhostName(p.host) {
		return fmt.Errorf("%w: %s names the local host", ErrPrivateAddress, p.host)
	}
	return nil
}

// CheckDial checks the address actually being dialled ("ip:port", as passed
// to net.Dialer.Control), which makes the check safe against DNS rebinding: a
// public name that resolves to an internal address is refused at this point.
// host is the host name from the URL, used for allowlist matching, so that
// allowlisting "localhost" or an internal service name works. Anything that is
// not an IP address and port is refused.
func (g Guard) CheckDial(host string, address string) error {
	ipText, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: dial address %q: %v", ErrMalformed, address, err)
	}
	addr, err := netip.ParseAddr(ipText)
	if err != nil {
		return fmt.Errorf("%w: dial address %q is not an IP address", ErrMalformed, address)
	}
	name := canonicalHost(host)
	if g.allows(name, port) || g.allows(canonicalHost(ipText), port) {
		return nil
	}
	if r := internalReason(addr); r != "" {
		return fmt.Errorf("%w: %s resolves to %s, a %s", ErrPrivateAddress, host, addr.WithZone(""), r)
	}
	if isLocalhostName(name) {
		return fmt.Errorf("%w: %s names the local host", ErrPrivateAddress, host)
	}
	return nil
}
