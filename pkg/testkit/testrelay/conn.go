package testrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
)

// Conn is a minimal nostr websocket client driven entirely by its caller:
// no background goroutines, explicit writes and reads. Tests use it to speak
// raw protocol (REQ, EVENT, NEG-OPEN, ...) to a relay. It exists because
// go-nostr's Relay client (v0.52.3) has a data race between Close and its
// write loop (both touch Relay.Connection) that `go test -race` reports.
// A Conn is not safe for concurrent use.
type Conn struct {
	// URL is the relay URL the connection was dialled to.
	URL string
	ws  *nostr.Connection
	// challenge is the last NIP-42 challenge Read saw, for Auth.
	challenge string
}

// Dial opens a websocket connection to the relay at url.
func Dial(ctx context.Context, url string) (*Conn, error) {
	return DialHeader(ctx, url, nil)
}

// DialHeader is Dial with extra HTTP headers on the websocket upgrade, e.g.
// X-Forwarded-For with a public address so a relay that limits per client
// address (GraspRelay) sees each test client as a different address.
func DialHeader(ctx context.Context, url string, header http.Header) (*Conn, error) {
	ws, err := nostr.NewConnection(ctx, url, header, nil)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	return &Conn{URL: url, ws: ws}, nil
}

// Write sends one message, the JSON encoding of v (typically a go-nostr or
// nip77 envelope, or a raw []any for malformed-input tests).
func (c *Conn) Write(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode message for %s: %w", c.URL, err)
	}
	if err := c.ws.WriteMessage(ctx, b); err != nil {
		return fmt.Errorf("write to %s: %w", c.URL, err)
	}
	return nil
}

// ReadRaw returns the next message as received. Note that cancelling ctx
// while a read is pending closes the connection (coder/websocket semantics).
func (c *Conn) ReadRaw(ctx context.Context) (string, error) {
	var buf bytes.Buffer
	if err := c.ws.ReadMessage(ctx, &buf); err != nil {
		return "", fmt.Errorf("read from %s: %w", c.URL, err)
	}
	return buf.String(), nil
}

// Read returns the next message parsed as a go-nostr envelope (EVENT, OK,
// EOSE, CLOSED, NOTICE, ...) or a nip77 envelope (NEG-MSG, NEG-ERR), along
// with the raw text. env is nil for labels go-nostr does not know, such as
// khatru's non-standard "NEG-ERROR": inspect raw then.
func (c *Conn) Read(ctx context.Context) (env nostr.Envelope, raw string, err error) {
	raw, err = c.ReadRaw(ctx)
	if err != nil {
		return nil, "", err
	}
	if strings.HasPrefix(raw, `["NEG-`) {
		return nip77.ParseNegMessage(raw), raw, nil
	}
	env = nostr.ParseMessage(raw)
	if a, ok := env.(*nostr.AuthEnvelope); ok && a.Challenge != nil {
		c.challenge = *a.Challenge
	}
	return env, raw, nil
}

// Close closes the connection with a normal websocket close.
func (c *Conn) Close() error {
	if err := c.ws.Close(); err != nil {
		return fmt.Errorf("close connection to %s: %w", c.URL, err)
	}
	return nil
}
