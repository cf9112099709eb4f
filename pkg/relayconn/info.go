package relayconn

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// vettedTransport is an HTTP transport whose every dial is vetted by
// checkDial on the address actually dialled (nil: none), without proxies:
// the websocket and the NIP-11 document of a relay go through the same
// guard.
func vettedTransport(checkDial func(host, address string) error) *http.Transport {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			if checkDial != nil {
				// Vet the address the dialer picks, not the name: a name may
				// resolve differently at dial time than when it was checked.
				d := *dialer
				d.Control = func(network, address string, _ syscallRawConn) error {
					return checkDial(host, address)
				}
				return d.DialContext(ctx, network, addr)
			}
			return dialer.DialContext(ctx, network, addr)
		},
		TLSHandshakeTimeout: 15 * time.Second,
		ForceAttemptHTTP2:   false,
	}
}

// MaxInfoBytes bounds a NIP-11 document: real ones are a few KiB.
const MaxInfoBytes = 256 << 10

// FetchInfo reads a relay's NIP-11 document (GET on the relay's http(s)
// URL with Accept: application/nostr+json), its dial vetted by checkDial as
// the websocket's is. A document over MaxInfoBytes, a status other than
// 200 or a redirect is an error: the document must come from the relay
// itself, not from wherever it points.
func FetchInfo(ctx context.Context, relayURL string, checkDial func(host, address string) error) ([]byte, error) {
	u := relayURL
	switch {
	case strings.HasPrefix(u, "wss://"):
		u = "https://" + u[len("wss://"):]
	case strings.HasPrefix(u, "ws://"):
		u = "http://" + u[len("ws://"):]
	default:
		return nil, fmt.Errorf("NIP-11 of %s: not a websocket URL", relayURL)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("NIP-11 of %s: %w", relayURL, err)
	}
	req.Header.Set("Accept", "application/nostr+json")
	transport := vettedTransport(checkDial)
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("NIP-11 of %s: %w", relayURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("NIP-11 of %s: HTTP %d", relayURL, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxInfoBytes+1))
	if err != nil {
		return nil, fmt.Errorf("NIP-11 of %s: %w", relayURL, err)
	}
	if len(body) > MaxInfoBytes {
		return nil, fmt.Errorf("NIP-11 of %s: document over %d bytes", relayURL, MaxInfoBytes)
	}
	return body, nil
}
