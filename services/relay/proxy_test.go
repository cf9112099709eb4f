package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// These tests put the relay behind a "reverse proxy" over real
// connections: the proxy is a client socket bound to a loopback address
// (127.0.0.1 for a proxy on the same host, 127.0.0.2 standing for an
// ingress controller on the pod network) that sends each of its clients'
// requests with that client's own X-Forwarded-For, as nginx, caddy and
// ingress-nginx do.

const proxiedClients = 80

// proxyLimits are small limits on a frozen clock: 2 open connections and a
// burst of 2 events per address.
func proxyLimits(cfg Config) Config {
	cfg.MaxConnsPerAddr = 2
	cfg.ConnectRate = 1
	cfg.ConnectBurst = 1000
	cfg.EventRate = 1
	cfg.EventBurst = 2
	return cfg
}

// shippedConfig is the relay configuration with every default as an
// operator gets it (GRASP_RELAY_* unset).
func shippedConfig(t *testing.T) Config {
	t.Helper()
	var cfg Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startBehindProxy runs the relay with cfg as given (trust lists included)
// on a frozen clock and returns its URL and its log.
func startBehindProxy(t *testing.T, cfg Config) (string, *testkit.LogBuffer) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = ln.Addr().String()
	cfg.PublicURL = service
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &testkit.LogBuffer{}
	now := time.Unix(1_750_000_000, 0)
	r := newRelay(cfg, st, nil, slog.New(slog.NewTextHandler(logs, nil)), func() time.Time { return now })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return "ws://" + cfg.Addr, logs
}

// proxied is one websocket connection as a proxy forwards it.
type proxied struct {
	t  *testing.T
	ws *websocket.Conn
}

// errRefused is a connection the relay refused with 429.
var errRefused = errors.New("refused with 429")

// dialVia opens a websocket from the loopback address proxy, with
// X-Forwarded-For: forwardedFor when that is not empty.
func dialVia(t *testing.T, url, proxy, forwardedFor string) (*proxied, error) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxy)}}
	h := http.Header{}
	if forwardedFor != "" {
		h.Set("X-Forwarded-For", forwardedFor)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader: h,
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}},
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
			return nil, errRefused
		}
		return nil, fmt.Errorf("dial %s via %s for %s: %w", url, proxy, forwardedFor, err)
	}
	ws.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = ws.CloseNow() })
	return &proxied{t: t, ws: ws}, nil
}

// publish sends evt and returns the message of the relay's OK.
func (p *proxied) publish(evt *nostr.Event) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, _ := json.Marshal(nostr.EventEnvelope{Event: *evt})
	if err := p.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		p.t.Fatal(err)
	}
	for {
		_, data, err := p.ws.Read(ctx)
		if err != nil {
			p.t.Fatalf("read: %v", err)
		}
		if ok, is := nostr.ParseMessage(string(data)).(*nostr.OKEnvelope); is && ok.EventID == evt.ID {
			return ok.Reason
		}
	}
}

// clientAddress is the forwarded address of the i-th client (TEST-NET-3).
func clientAddress(i int) string { return fmt.Sprintf("203.0.113.%d", i+1) }

// connectAll opens n connections for each of the 80 clients through the
// proxy and counts how many connected and how many were refused.
func connectAll(t *testing.T, url, proxy string, n int) (connected, refused int) {
	t.Helper()
	for i := 0; i < proxiedClients; i++ {
		for range n {
			_, err := dialVia(t, url, proxy, clientAddress(i))
			switch {
			case err == nil:
				connected++
			case errors.Is(err, errRefused):
				refused++
			default:
				t.Fatal(err)
			}
		}
	}
	return connected, refused
}

// checkOwnLimits: behind a trusted proxy, each forwarded client has its
// own connection and event limits, and is held to them.
func checkOwnLimits(t *testing.T, url, proxy string) {
	t.Helper()
	// Every client may hold 2 connections: 160 connect.
	if connected, refused := connectAll(t, url, proxy, 2); connected != 2*proxiedClients || refused != 0 {
		t.Fatalf("%d clients with 2 connections each through %s: %d connected, %d refused; want all connected",
			proxiedClients, proxy, connected, refused)
	}
	// A third for any of them is over its own limit.
	for _, i := range []int{0, proxiedClients / 2, proxiedClients - 1} {
		if _, err := dialVia(t, url, proxy, clientAddress(i)); !errors.Is(err, errRefused) {
			t.Fatalf("third connection of forwarded client %s through %s: %v, want refused with 429", clientAddress(i), proxy, err)
		}
	}
	// Events: a new client gets its burst of 2, then is rate-limited;
	// the next client is not affected.
	a, err := dialVia(t, url, proxy, "198.51.100.1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := dialVia(t, url, proxy, "198.51.100.2")
	if err != nil {
		t.Fatal(err)
	}
	key := testkit.NewKey()
	for i := range 2 {
		if msg := a.publish(key.Note(fmt.Sprint("burst ", i))); strings.HasPrefix(msg, "rate-limited") {
			t.Fatalf("event %d within the burst: %q", i, msg)
		}
	}
	if msg := a.publish(key.Note("over")); !strings.HasPrefix(msg, "rate-limited: ") {
		t.Fatalf("forwarded client over its event rate through %s: %q, want rate-limited", proxy, msg)
	}
	if msg := b.publish(key.Note("other")); strings.HasPrefix(msg, "rate-limited") {
		t.Fatalf("another forwarded client is limited by the first: %q", msg)
	}
}

// TestProxyOnSameHost: nginx or caddy on the same host (loopback) in front
// of a relay with the shipped defaults. Each forwarded client gets its own
// limits and is refused over them, though loopback is exempt; a direct
// loopback connection stays exempt.
func TestProxyOnSameHost(t *testing.T) {
	url, logs := startBehindProxy(t, proxyLimits(shippedConfig(t)))
	checkOwnLimits(t, url, "127.0.0.1")

	// Direct loopback connections (the operator's tools, graspd's own
	// discovery) are exempt: a third connection is fine.
	for i := range 3 {
		if _, err := dialVia(t, url, "127.0.0.1", ""); err != nil {
			t.Fatalf("direct loopback connection %d: %v", i, err)
		}
	}

	if strings.Contains(logs.String(), "not a trusted proxy") {
		t.Errorf("a trusted proxy was warned about:\n%s", logs)
	}
	// The operator sees what is trusted at start.
	for _, want := range []string{`trusted_proxies=127.0.0.1,::1`, `exempt_addresses=127.0.0.1,::1`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("start log lacks %s:\n%s", want, logs)
		}
	}
}

// TestProxyOnPodNetwork: an ingress controller at another address
// (127.0.0.2 stands for the pod network), named in TrustedProxies as the
// Kubernetes manifests do; it is not an exempt address.
func TestProxyOnPodNetwork(t *testing.T) {
	cfg := proxyLimits(shippedConfig(t))
	cfg.TrustedProxies = "127.0.0.2"
	url, _ := startBehindProxy(t, cfg)
	checkOwnLimits(t, url, "127.0.0.2")
}

// TestUntrustedProxy: forwarding headers from a peer that is not a trusted
// proxy are ignored: every client it forwards shares its address's limits
// (2 of 80 connect), the relay warns once, and a proxy on an exempt address
// (loopback, with GRASP_RELAY_TRUSTED_PROXIES emptied) does not lift the
// limits for the clients it forwards.
func TestUntrustedProxy(t *testing.T) {
	for _, proxy := range []string{"127.0.0.2", "127.0.0.1"} {
		t.Run(proxy, func(t *testing.T) {
			cfg := proxyLimits(shippedConfig(t))
			cfg.TrustedProxies = ""
			url, logs := startBehindProxy(t, cfg)
			connected, refused := connectAll(t, url, proxy, 1)
			if connected != 2 || refused != proxiedClients-2 {
				t.Fatalf("%d clients through untrusted proxy %s: %d connected, %d refused; want 2 connected (the proxy's own limit)",
					proxiedClients, proxy, connected, refused)
			}
			if n := strings.Count(logs.String(), "not a trusted proxy"); n != 1 {
				t.Errorf("want one warning about the untrusted proxy, got %d:\n%s", n, logs)
			}
			if !strings.Contains(logs.String(), "no trusted proxies") {
				t.Errorf("start log does not say no proxy is trusted:\n%s", logs)
			}
		})
	}
}

func TestResolveClient(t *testing.T) {
	proxies, err := parsePrefixes("10.0.0.0/8, 192.0.2.7, 127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	trusted, _ := parsePrefixes("127.0.0.1, 10.0.0.0/8")
	tests := []struct {
		name          string
		remote        string
		header        http.Header
		want          string
		viaProxy      bool
		exempt        bool
		forwardedFlag bool
	}{
		{"direct", "203.0.113.5:4000", nil, "203.0.113.5", false, false, false},
		{"direct v4-mapped", "[::ffff:203.0.113.5]:4000", nil, "203.0.113.5", false, false, false},
		{"direct from a trusted address", "127.0.0.1:4000", nil, "127.0.0.1", false, true, false},
		{"not a proxy: header ignored", "203.0.113.5:4000", xff("1.2.3.4"), "203.0.113.5", false, false, true},
		{"right-most non-proxy", "10.1.2.3:4000", xff("1.2.3.4, 198.51.100.9"), "198.51.100.9", true, false, true},
		{"proxy hops skipped", "10.1.2.3:4000", xff("198.51.100.9, 192.0.2.7"), "198.51.100.9", true, false, true},
		{"several header lines", "10.1.2.3:4000", http.Header{"X-Forwarded-For": {"1.2.3.4", "198.51.100.9"}}, "198.51.100.9", true, false, true},
		{"every hop a proxy: the left-most", "10.1.2.3:4000", xff("10.9.9.9, 10.0.0.1"), "10.9.9.9", true, false, true},
		{"garbage: the proxy, not exempt", "10.1.2.3:4000", xff("garbage"), "10.1.2.3", false, false, true},
		{"loopback proxy forwarding: not exempt", "127.0.0.1:4000", xff("198.51.100.9"), "198.51.100.9", true, false, true},
		{"loopback proxy forwarding a loopback client: not exempt", "127.0.0.1:4000", xff("127.0.0.1"), "127.0.0.1", true, false, true},
		{"X-Real-IP from a proxy", "10.1.2.3:4000", http.Header{"X-Real-Ip": {"198.51.100.9"}}, "198.51.100.9", true, false, true},
		{"Forwarded alone: the proxy, not exempt", "10.1.2.3:4000", http.Header{"Forwarded": {"for=198.51.100.9"}}, "10.1.2.3", false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.remote, Header: tt.header}
			if r.Header == nil {
				r.Header = http.Header{}
			}
			got := resolveClient(r, proxies)
			if got.addr.String() != tt.want || got.viaProxy != tt.viaProxy || got.forwarded != tt.forwardedFlag || got.exempt(trusted) != tt.exempt {
				t.Errorf("resolveClient(%s, %v) = %s via proxy %v forwarded %v exempt %v; want %s %v %v %v",
					tt.remote, tt.header, got.addr, got.viaProxy, got.forwarded, got.exempt(trusted), tt.want, tt.viaProxy, tt.forwardedFlag, tt.exempt)
			}
		})
	}
	if _, err := parsePrefixes("10.0.0.0/33"); err == nil {
		t.Error("bad prefix accepted")
	}
}

func xff(v string) http.Header { return http.Header{"X-Forwarded-For": {v}} }
