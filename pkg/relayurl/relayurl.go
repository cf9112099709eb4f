// Package relayurl parses, normalises and vets relay and clone URLs.
//
// Every URL grasp-sync dials or compares comes from a user-written repository
// announcement, so it is hostile input: this package accepts a narrow,
// canonical subset of URL syntax, compares services by host and effective port
// (never by substring), and refuses addresses on internal networks unless an
// operator allowlists them.
package relayurl

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// MaxLength is the longest URL accepted, in bytes. Real relay URLs are short;
// the bound keeps hostile announcements from costing memory and log space.
const MaxLength = 512

// Sentinel errors for the reasons a URL is refused; match them with errors.Is.
var (
	// ErrScheme: the scheme is not one this operation accepts (Normalize
	// accepts only ws and wss).
	ErrScheme = errors.New("relayurl: unsupported scheme")
	// ErrCredentials: the URL carries userinfo (user:pass@); relay URLs
	// never need it and it would leak into logs and configuration.
	ErrCredentials = errors.New("relayurl: credentials in URL")
	// ErrTooLong: the URL is longer than MaxLength.
	ErrTooLong = errors.New("relayurl: URL too long")
	// ErrPrivateAddress: the URL or dialled address is on a loopback,
	// private, link-local, shared (CGNAT) or otherwise internal network.
	ErrPrivateAddress = errors.New("relayurl: private or internal address")
	// ErrMalformed: the URL cannot be parsed or has parts we do not accept
	// (fragment, empty or invalid host, bad port, whitespace, ...).
	ErrMalformed = errors.New("relayurl: malformed URL")
)

// parsed is a URL broken into the canonical parts this package works with.
type parsed struct {
	scheme string     // lower-case: ws, wss, http or https
	host   string     // lower-case name, or canonical IP text without brackets
	ip     netip.Addr // valid when host is an IP literal
	port   string     // explicit port in canonical decimal, "" when absent
	path   string     // escaped path without trailing slashes
	query  string     // raw query, "" when absent or empty
}

// defaultPort returns the port a scheme implies.
func defaultPort(scheme string) string {
	switch scheme {
	case "wss", "https":
		return "443"
	default:
		return "80"
	}
}

// effectivePort is the explicit port or the scheme's default.
func (p parsed) effectivePort() string {
	if p.port != "" {
		return p.port
	}
	return defaultPort(p.scheme)
}

// hostForURL renders the host as it appears in a URL (IPv6 in brackets).
func (p parsed) hostForURL() string {
	if p.ip.Is6() {
		return "[" + p.host + "]"
	}
	return p.host
}

// parse validates raw as an absolute ws, wss, http or https URL and returns its
// canonical parts. It is deliberately stricter than net/url: anything a relay
// URL has no use for is refused rather than carried along.
func parse(raw string) (parsed, error) {
	if len(raw) > MaxLength {
		return parsed{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLong, len(raw), MaxLength)
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return parsed{}, fmt.Errorf("%w: empty URL", ErrMalformed)
	}
	for i := 0; i < len(raw); i++ {
		// Whitespace and control bytes inside a URL are never legitimate and
		// net/url lets some of them (spaces) through.
		if raw[i] <= ' ' || raw[i] == 0x7f {
			return parsed{}, fmt.Errorf("%w: whitespace or control character at byte %d", ErrMalformed, i)
		}
	}
	if strings.Contains(raw, "#") {
		return parsed{}, fmt.Errorf("%w: fragment not allowed", ErrMalformed)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole input; the caller already has it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return parsed{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	var p parsed
	p.scheme = strings.ToLower(u.Scheme)
	switch p.scheme {
	case "ws", "wss", "http", "https":
	case "":
		return parsed{}, fmt.Errorf("%w: missing scheme", ErrScheme)
	default:
		return parsed{}, fmt.Errorf("%w: %q", ErrScheme, p.scheme)
	}
	if u.Opaque != "" {
		return parsed{}, fmt.Errorf("%w: no authority (expected %s://host)", ErrMalformed, p.scheme)
	}
	if u.User != nil {
		return parsed{}, ErrCredentials
	}
	if err := p.setHost(u); err != nil {
		return parsed{}, err
	}
	if ps := u.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		if err != nil || n < 1 || n > 65535 {
			return parsed{}, fmt.Errorf("%w: invalid port %q", ErrMalformed, ps)
		}
		p.port = strconv.Itoa(n)
	}
	p.path = strings.TrimRight(u.EscapedPath(), "/")
	p.query = u.RawQuery
	return p, nil
}

// setHost validates and canonicalises the host of u into p.
func (p *parsed) setHost(u *url.URL) error {
	name := u.Hostname()
	if name == "" {
		return fmt.Errorf("%w: empty host", ErrMalformed)
	}
	if strings.HasPrefix(u.Host, "[") {
		addr, err := netip.ParseAddr(name)
		if err != nil || !addr.Is6() || addr.Zone() != "" {
			return fmt.Errorf("%w: invalid IPv6 literal %q", ErrMalformed, name)
		}
		p.ip, p.host = addr, addr.String()
		return nil
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if addr, err := netip.ParseAddr(name); err == nil && addr.Is4() {
		p.ip, p.host = addr, addr.String()
		return nil
	}
	if err := checkHostname(name); err != nil {
		return err
	}
	p.host = name
	return nil
}

// checkHostname accepts DNS names made of ASCII letters, digits, '-' and '_'
// labels. Internationalised names must arrive in punycode; numeric forms the
// system resolver would read as IPv4 ("127.1", "0x7f.1", "2130706433") are
// refused so they cannot slip past the address checks.
func checkHostname(name string) error {
	if len(name) > 253 {
		return fmt.Errorf("%w: host name too long", ErrMalformed)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("%w: invalid host name %q", ErrMalformed, name)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%w: invalid character in host name %q", ErrMalformed, name)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.HasPrefix(last, "0x") || strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("%w: numeric host %q is not a canonical IPv4 address", ErrMalformed, name)
	}
	return nil
}

// Normalize returns the canonical form of a relay URL, so that the same relay
// written differently by different announcements is one relay to us.
//
// Only ws:// and wss:// are accepted. Scheme and host are lower-cased, a
// trailing dot on the host is dropped, the default port (80 for ws, 443 for
// wss) is dropped, the path is kept without trailing slashes and a non-empty
// query is kept. URLs with credentials, fragments, an empty or invalid host, or
// longer than MaxLength are refused. IPv6 hosts stay in brackets.
func Normalize(raw string) (string, error) {
	p, err := parse(raw)
	if err != nil {
		return "", err
	}
	if p.scheme != "ws" && p.scheme != "wss" {
		return "", fmt.Errorf("%w: %q (relay URLs must be ws:// or wss://)", ErrScheme, p.scheme)
	}
	out := p.format()
	if len(out) > MaxLength {
		// Escaping can lengthen the path; the canonical form must obey the
		// same bound as the input so Normalize stays idempotent.
		return "", fmt.Errorf("%w: canonical form is %d bytes, limit %d", ErrTooLong, len(out), MaxLength)
	}
	return out, nil
}

// format renders p as a canonical URL.
func (p parsed) format() string {
	var b strings.Builder
	b.WriteString(p.scheme)
	b.WriteString("://")
	b.WriteString(p.hostForURL())
	if p.port != "" && p.port != defaultPort(p.scheme) {
		b.WriteByte(':')
		b.WriteString(p.port)
	}
	b.WriteString(p.path)
	if p.query != "" {
		b.WriteByte('?')
		b.WriteString(p.query)
	}
	return b.String()
}

// HostPort returns the lower-cased host (IPv6 without brackets, in canonical
// form) and the effective port of a ws, wss, http or https URL: the explicit
// port, or 80 for ws/http and 443 for wss/https. It is what "this URL names
// our service" and own-relay exclusion compare.
func HostPort(raw string) (host string, port string, err error) {
	p, err := parse(raw)
	if err != nil {
		return "", "", err
	}
	return p.host, p.effectivePort(), nil
}

// SameService reports whether two URLs (each ws, wss, http or https) reach the
// same host and effective port. The scheme itself is not compared: a GRASP
// server serves its relay (wss://host) and its git clone URLs
// (https://host/...) on the same port, so ws/http and wss/https name the same
// service when their ports agree. Hosts are compared exactly after
// normalisation, so "example.com.attacker.net" never matches "example.com".
// Unparseable URLs match nothing.
func SameService(a, b string) bool {
	ha, pa, err := HostPort(a)
	if err != nil {
		return false
	}
	hb, pb, err := HostPort(b)
	if err != nil {
		return false
	}
	return ha == hb && pa == pb
}

// FromCloneURL maps a GRASP-style clone URL,
// http(s)://host[:port]/<npub1…>/<identifier>.git, to the relay that GRASP
// puts at the root of the same host: ws(s)://host[:port], normalised. Any
// other clone URL (github.com/x/y.git, ssh, git@…, a path that is not
// /<npub>/<identifier>.git with a valid npub) yields ok=false: only GRASP
// servers are known to run a relay next to their git service.
func FromCloneURL(raw string) (relay string, ok bool) {
	p, err := parse(raw)
	if err != nil || (p.scheme != "http" && p.scheme != "https") || p.query != "" {
		return "", false
	}
	// The escaped path must already be the plain form: an npub and an
	// identifier never need percent-escapes, and decoding them would let
	// "%2F" smuggle in extra segments.
	segs := strings.Split(p.path, "/")
	if len(segs) != 3 || segs[0] != "" || !validNpub(segs[1]) {
		return "", false
	}
	id, found := strings.CutSuffix(segs[2], ".git")
	if !found || id == "" || id == "." || id == ".." || strings.Contains(id, "%") {
		return "", false
	}
	p.scheme = map[string]string{"http": "ws", "https": "wss"}[p.scheme]
	p.path = ""
	relay, err = Normalize(p.format())
	if err != nil {
		return "", false
	}
	return relay, true
}

// bech32Charset is the BIP-173 data alphabet.
const bech32Charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"

// validNpub reports whether s is a lower-case NIP-19 npub: "npub1", 52 data
// characters encoding 32 bytes (zero padding bits) and a valid bech32
// checksum. Implemented here rather than through go-nostr's nip19 to keep this
// package's dependencies to the standard library.
func validNpub(s string) bool {
	const hrp = "npub"
	if len(s) != len(hrp)+1+52+6 || !strings.HasPrefix(s, hrp+"1") {
		return false
	}
	values := make([]byte, 0, 2*len(hrp)+1+52+6)
	for i := 0; i < len(hrp); i++ {
		values = append(values, hrp[i]>>5)
	}
	values = append(values, 0)
	for i := 0; i < len(hrp); i++ {
		values = append(values, hrp[i]&31)
	}
	data := s[len(hrp)+1:]
	for i := 0; i < len(data); i++ {
		v := strings.IndexByte(bech32Charset, data[i])
		if v < 0 {
			return false
		}
		values = append(values, byte(v))
	}
	// 52 groups of 5 bits carry 260 bits; the last 4 are padding and must be
	// zero for the encoding of 32 bytes to be canonical.
	if values[len(values)-7]&0x0f != 0 {
		return false
	}
	return bech32Polymod(values) == 1
}

// bech32Polymod is the BIP-173 checksum function.
func bech32Polymod(values []byte) uint32 {
	gen := [5]uint32{0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3}
	chk := uint32(1)
	for _, v := range values {
		top := chk >> 25
		chk = (chk&0x1ffffff)<<5 ^ uint32(v)
		for i := 0; i < 5; i++ {
			if (top>>i)&1 == 1 {
				chk ^= gen[i]
			}
		}
	}
	return chk
}
