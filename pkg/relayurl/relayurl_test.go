package relayurl_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/relayurl"
)

// Known-good npubs, checked against go-nostr's nip19 encoder.
const (
	npubA = "npub180cvv07tjdrrgpa0j7j7tmnyl2yr6yr7l8j4s3evf6u64th6gkwsyjh6w6"
	npubB = "npub10xlxvlhemja6c4dqv22uapctqupfhlxm9h8z3k2e72q4k9hcz7vqpkge6d"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{in: "wss://relay.example", want: "wss://relay.example"},
		{in: "WSS://Relay.Example:443/", want: "wss://relay.example"},
		{in: "ws://relay.example:80", want: "ws://relay.example"},
		{in: "wss://relay.example:80", want: "wss://relay.example:80"},
		{in: "ws://relay.example:443", want: "ws://relay.example:443"},
		{in: "wss://relay.example:4443/path/", want: "wss://relay.example:4443/path"},
		{in: "wss://relay.example//", want: "wss://relay.example"},
		{in: "wss://relay.example/a/b?x=1&y=2", want: "wss://relay.example/a/b?x=1&y=2"},
		{in: "wss://relay.example/?", want: "wss://relay.example"},
		{in: "wss://relay.example:0443", want: "wss://relay.example"},
		{in: "wss://relay.example.", want: "wss://relay.example"},
		{in: "  wss://relay.example  ", want: "wss://relay.example"},
		{in: "wss://relay.example/a%2Fb", want: "wss://relay.example/a%2Fb"},
		{in: "wss://relay.example/ünï", want: "wss://relay.example/%C3%BCn%C3%AF"},
		{in: "ws://[::1]", want: "ws://[::1]"},
		{in: "ws://[0:0:0:0:0:0:0:1]:7000/", want: "ws://[::1]:7000"},
		{in: "ws://[2001:DB8::1]:443", want: "ws://[2001:db8::1]:443"},
		{in: "ws://169.254.169.254", want: "ws://169.254.169.254"}, // syntax only; Guard refuses it
		{in: "ws://10.0.0.1", want: "ws://10.0.0.1"},
		{in: "ws://127.0.0.1:7777", want: "ws://127.0.0.1:7777"},

		{in: "http://relay.example", wantErr: relayurl.ErrScheme},
		{in: "https://relay.example", wantErr: relayurl.ErrScheme},
		{in: "ftp://relay.example", wantErr: relayurl.ErrScheme},
		{in: "relay.example", wantErr: relayurl.ErrScheme},
		{in: "//relay.example", wantErr: relayurl.ErrScheme},
		{in: "wss://user:pw@relay.example", wantErr: relayurl.ErrCredentials},
		{in: "wss://user@relay.example", wantErr: relayurl.ErrCredentials},
		{in: "wss://@relay.example", wantErr: relayurl.ErrCredentials},
		{in: "wss://relay.example/" + strings.Repeat("a", 2000), wantErr: relayurl.ErrTooLong},
		{in: "wss://relay.example/" + strings.Repeat("%", 170), wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example/" + strings.Repeat("ü", 200), wantErr: relayurl.ErrTooLong}, // grows when escaped
		{in: "wss://relay.example#frag", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example/#", wantErr: relayurl.ErrMalformed},
		{in: "wss://", wantErr: relayurl.ErrMalformed},
		{in: "wss:///path", wantErr: relayurl.ErrMalformed},
		{in: "wss:relay.example", wantErr: relayurl.ErrMalformed},
		{in: "", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example:0", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example:65536", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example:99999999999999999999", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay example", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example/a b", wantErr: relayurl.ErrMalformed},
		{in: "wss://relay.example/\x00", wantErr: relayurl.ErrMalformed},
		{in: "wss://rel%61y.example", wantErr: relayurl.ErrMalformed},
		{in: "wss://rélay.example", wantErr: relayurl.ErrMalformed},
		{in: "wss://a..b", wantErr: relayurl.ErrMalformed},
		{in: "wss://127.1", wantErr: relayurl.ErrMalformed},
		{in: "wss://2130706433", wantErr: relayurl.ErrMalformed},
		{in: "wss://0x7f.0.0.1", wantErr: relayurl.ErrMalformed},
		{in: "wss://010.0.0.1", wantErr: relayurl.ErrMalformed},
		{in: "wss://[fe80::1%25eth0]", wantErr: relayurl.ErrMalformed},
		{in: "wss://[127.0.0.1]", wantErr: relayurl.ErrMalformed},
		{in: "wss://[::1", wantErr: relayurl.ErrMalformed},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 60 {
			name = name[:60] + "…"
		}
		t.Run(name, func(t *testing.T) {
			got, err := relayurl.Normalize(tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Normalize(%q) = %q, %v; want error %v", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Normalize(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
			again, err := relayurl.Normalize(got)
			if err != nil || again != got {
				t.Fatalf("Normalize not idempotent: %q → %q, %v", got, again, err)
			}
		})
	}
}

func TestFromCloneURL(t *testing.T) {
	tests := []struct {
		in     string
		want   string
		wantOK bool
	}{
		{"https://git.example.com/" + npubA + "/repo.git", "wss://git.example.com", true},
		{"https://Git.Example.com:443/" + npubA + "/repo.git", "wss://git.example.com", true},
		{"http://127.0.0.1:7777/" + npubB + "/x.git", "ws://127.0.0.1:7777", true},
		{"http://git.example.com/" + npubA + "/x.git", "ws://git.example.com", true},
		{"https://git.example.com:8443/" + npubA + "/a.b-c_d.git", "wss://git.example.com:8443", true},
		{"https://git.example.com/" + npubA + "/repo.git/", "wss://git.example.com", true}, // trailing slash, as normalised
		{"https://[2001:db8::1]/" + npubA + "/r.git", "wss://[2001:db8::1]", true},

		{"https://github.com/a/b.git", "", false},
		{"https://github.com/" + npubA + "/b", "", false},                  // no .git
		{"https://git.example.com/" + npubA + "/.git", "", false},          // empty identifier
		{"https://git.example.com/" + npubA + "/..git", "", false},         // "." identifier
		{"https://git.example.com/x/" + npubA + "/repo.git", "", false},    // extra segment
		{"https://git.example.com/" + npubA + "/a%2Fb.git", "", false},     // escaped slash
		{"https://git.example.com/" + npubA + "/repo.git?x=1", "", false},  // query
		{"https://git.example.com/" + npubA + "/repo.git#frag", "", false}, // fragment
		{"https://git.example.com/" + npubA[:62] + "7/repo.git", "", false},
		{"https://git.example.com/" + strings.ToUpper(npubA) + "/repo.git", "", false},
		{"https://git.example.com/nsec180cvv07tjdrrgpa0j7j7tmnyl2yr6yr7l8j4s3evf6u64th6gkwsyjh6w6/repo.git", "", false},
		{"https://git.example.com/npub1/repo.git", "", false},
		{"https://user:pw@git.example.com/" + npubA + "/repo.git", "", false},
		{"ssh://git.example.com/" + npubA + "/repo.git", "", false},
		{"git@github.com:a/b.git", "", false},
		{"wss://git.example.com/" + npubA + "/repo.git", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, ok := relayurl.FromCloneURL(tt.in)
			if ok != tt.wantOK || got != tt.want {
				t.Fatalf("FromCloneURL(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestHostPort(t *testing.T) {
	tests := []struct {
		in, host, port string
		wantErr        bool
	}{
		{in: "wss://Relay.Example", host: "relay.example", port: "443"},
		{in: "ws://relay.example", host: "relay.example", port: "80"},
		{in: "https://relay.example/x", host: "relay.example", port: "443"},
		{in: "http://relay.example:8080", host: "relay.example", port: "8080"},
		{in: "ws://[::1]:7000", host: "::1", port: "7000"},
		{in: "ws://127.0.0.1", host: "127.0.0.1", port: "80"},
		{in: "ftp://relay.example", wantErr: true},
		{in: "not a url", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			host, port, err := relayurl.HostPort(tt.in)
			if (err != nil) != tt.wantErr || host != tt.host || port != tt.port {
				t.Fatalf("HostPort(%q) = %q, %q, %v; want %q, %q, err=%v", tt.in, host, port, err, tt.host, tt.port, tt.wantErr)
			}
		})
	}
}

func TestSameService(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"wss://example.com", "wss://example.com", true},
		{"wss://example.com", "wss://EXAMPLE.com:443/", true},
		{"https://example.com/" + npubA + "/x.git", "wss://example.com", true},
		{"http://example.com/" + npubA + "/x.git", "ws://example.com", true},
		{"http://127.0.0.1:7777/" + npubA + "/x.git", "ws://127.0.0.1:7777", true},
		{"wss://example.com.", "wss://example.com", true},

		{"wss://example.com.attacker.net", "wss://example.com", false},
		{"wss://attacker.net/example.com", "wss://example.com", false},
		{"wss://example.com@attacker.net", "wss://example.com", false},
		{"wss://evilexample.com", "wss://example.com", false},
		{"wss://sub.example.com", "wss://example.com", false},
		{"wss://example.com:4443", "wss://example.com", false},
		{"ws://example.com", "wss://example.com", false}, // port 80 vs 443
		{"http://example.com/" + npubA + "/x.git", "wss://example.com", false},
		{"https://example.com:8443/x.git", "wss://example.com", false},
		{"ws://127.0.0.1:7777", "ws://127.0.0.1:7778", false},
		{"", "", false},
		{"garbage", "garbage", false},
	}
	for _, tt := range tests {
		t.Run(tt.a+" vs "+tt.b, func(t *testing.T) {
			if got := relayurl.SameService(tt.a, tt.b); got != tt.want {
				t.Fatalf("SameService(%q, %q) = %v; want %v", tt.a, tt.b, got, tt.want)
			}
			if got := relayurl.SameService(tt.b, tt.a); got != tt.want {
				t.Fatalf("SameService is not symmetric for %q, %q", tt.a, tt.b)
			}
		})
	}
}

func TestGuardCheckURL(t *testing.T) {
	tests := []struct {
		url     string
		allow   []string
		wantErr bool
	}{
		{url: "wss://relay.example"},
		{url: "wss://8.8.8.8"},
		{url: "wss://[2001:4860:4860::8888]"},
		{url: "ws://169.254.169.254", wantErr: true},
		{url: "ws://169.254.1.1", wantErr: true},
		{url: "ws://[::1]", wantErr: true},
		{url: "ws://127.0.0.1:7777", wantErr: true},
		{url: "ws://127.9.9.9", wantErr: true},
		{url: "ws://10.0.0.1", wantErr: true},
		{url: "ws://172.16.5.4", wantErr: true},
		{url: "ws://172.32.0.1"}, // just outside 172.16/12
		{url: "ws://192.168.1.1", wantErr: true},
		{url: "ws://100.64.1.1", wantErr: true},
		{url: "ws://100.128.0.1"}, // just outside 100.64/10
		{url: "ws://0.0.0.0", wantErr: true},
		{url: "ws://[::]", wantErr: true},
		{url: "ws://[fc00::1]", wantErr: true},
		{url: "ws://[fd00:ec2::254]", wantErr: true},
		{url: "ws://[fe80::1]", wantErr: true},
		{url: "ws://[::ffff:127.0.0.1]", wantErr: true},
		{url: "ws://[::ffff:10.1.2.3]", wantErr: true},
		{url: "ws://[64:ff9b::a9fe:a9fe]", wantErr: true}, // NAT64 of 169.254.169.254
		{url: "ws://224.0.0.1", wantErr: true},
		{url: "ws://255.255.255.255", wantErr: true},
		{url: "ws://localhost", wantErr: true},
		{url: "ws://LOCALHOST.", wantErr: true},
		{url: "ws://relay.localhost", wantErr: true},
		{url: "ws://localhost.example.com"},
		{url: "http://10.0.0.1", wantErr: true},
		{url: "not a url", wantErr: true},

		// allowlist
		{url: "ws://127.0.0.1:7777", allow: []string{"127.0.0.1"}},
		{url: "ws://127.0.0.1:7777", allow: []string{"127.0.0.1:7777"}},
		{url: "ws://127.0.0.1:7778", allow: []string{"127.0.0.1:7777"}, wantErr: true},
		{url: "ws://127.0.0.2:7777", allow: []string{"127.0.0.1"}, wantErr: true},
		{url: "ws://127.0.0.1", allow: []string{"127.0.0.1:80"}},
		{url: "ws://localhost:7000", allow: []string{"localhost"}},
		{url: "ws://localhost:7000", allow: []string{"LocalHost:7000"}},
		{url: "ws://relay.localhost:7000", allow: []string{"localhost"}, wantErr: true},
		{url: "ws://[::1]:7000", allow: []string{"[::1]"}},
		{url: "ws://[::1]:7000", allow: []string{"::1"}},
		{url: "ws://[::1]:7000", allow: []string{"[::1]:7000"}},
		{url: "ws://[::1]:7001", allow: []string{"[::1]:7000"}, wantErr: true},
		{url: "ws://[::ffff:127.0.0.1]:7000", allow: []string{"127.0.0.1"}},
		{url: "ws://10.0.0.1", allow: []string{"10.0.0.2", "localhost"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.url+" allow="+strings.Join(tt.allow, ","), func(t *testing.T) {
			err := relayurl.Guard{Allow: tt.allow}.CheckURL(tt.url)
			if (err != nil) != tt.wantErr {
				t.Fatalf("CheckURL(%q) = %v; wantErr %v", tt.url, err, tt.wantErr)
			}
			if err != nil && tt.url != "not a url" && !errors.Is(err, relayurl.ErrPrivateAddress) {
				t.Fatalf("CheckURL(%q) = %v; want ErrPrivateAddress", tt.url, err)
			}
		})
	}
}

func TestGuardCheckDial(t *testing.T) {
	tests := []struct {
		host, addr string
		allow      []string
		wantErr    error
	}{
		{host: "relay.example", addr: "93.184.216.34:443"},
		{host: "relay.example", addr: "[2606:2800:220:1::1]:443"},
		// DNS rebinding: a public name resolving to an internal address.
		{host: "relay.example", addr: "127.0.0.1:443", wantErr: relayurl.ErrPrivateAddress},
		{host: "relay.example", addr: "169.254.169.254:80", wantErr: relayurl.ErrPrivateAddress},
		{host: "relay.example", addr: "[::1]:443", wantErr: relayurl.ErrPrivateAddress},
		{host: "relay.example", addr: "[::ffff:192.168.0.1]:443", wantErr: relayurl.ErrPrivateAddress},
		{host: "relay.example", addr: "[fe80::1%eth0]:443", wantErr: relayurl.ErrPrivateAddress},
		{host: "relay.example", addr: "10.0.0.1:443", allow: []string{"relay.example"}},
		{host: "relay.example", addr: "10.0.0.1:443", allow: []string{"relay.example:8443"}, wantErr: relayurl.ErrPrivateAddress},
		{host: "localhost", addr: "127.0.0.1:7000", allow: []string{"localhost"}},
		{host: "localhost", addr: "[::1]:7000", allow: []string{"localhost:7000"}},
		{host: "localhost", addr: "127.0.0.1:7000", wantErr: relayurl.ErrPrivateAddress},
		{host: "localhost", addr: "93.184.216.34:7000", wantErr: relayurl.ErrPrivateAddress},
		{host: "127.0.0.1", addr: "127.0.0.1:7000", allow: []string{"127.0.0.1:7000"}},
		{host: "127.0.0.1", addr: "127.0.0.1:7001", allow: []string{"127.0.0.1:7000"}, wantErr: relayurl.ErrPrivateAddress},
		{host: "[::1]", addr: "[::1]:7000", allow: []string{"::1"}},
		{host: "relay.example", addr: "relay.example:443", wantErr: relayurl.ErrMalformed},
		{host: "relay.example", addr: "127.0.0.1", wantErr: relayurl.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.host+"→"+tt.addr+" allow="+strings.Join(tt.allow, ","), func(t *testing.T) {
			err := relayurl.Guard{Allow: tt.allow}.CheckDial(tt.host, tt.addr)
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("CheckDial(%q, %q) = %v; want %v", tt.host, tt.addr, err, tt.wantErr)
			}
		})
	}
}

func FuzzNormalize(f *testing.F) {
	for _, s := range []string{
		"wss://relay.example", "WSS://Relay.Example:443/", "ws://[::1]:7000/x?y#z",
		"wss://user:pw@relay.example", "ws://relay.example:80/a//", "wss://a.b/%2F?q=%20",
		"https://git.example.com/" + npubA + "/repo.git", "ws://127.1", "wss://ü.example",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		n, err := relayurl.Normalize(raw)
		// These must never panic, whatever the input.
		relayurl.FromCloneURL(raw)
		relayurl.SameService(raw, "wss://relay.example")
		_ = relayurl.Guard{Allow: []string{raw}}.CheckURL(raw)
		_ = relayurl.Guard{}.CheckDial(raw, raw)
		if err != nil {
			return
		}
		if len(n) > relayurl.MaxLength {
			t.Fatalf("Normalize(%q) = %q, longer than MaxLength", raw, n)
		}
		again, err := relayurl.Normalize(n)
		if err != nil {
			t.Fatalf("Normalize(%q) = %q, which does not normalise again: %v", raw, n, err)
		}
		if again != n {
			t.Fatalf("Normalize not idempotent: %q → %q → %q", raw, n, again)
		}
		if _, _, err := relayurl.HostPort(n); err != nil {
			t.Fatalf("HostPort(%q) failed on a normalised URL: %v", n, err)
		}
		if !relayurl.SameService(raw, n) {
			t.Fatalf("SameService(%q, %q) = false for a URL and its normal form", raw, n)
		}
	})
}
