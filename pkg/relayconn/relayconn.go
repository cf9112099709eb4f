// Package relayconn is grasp-sync's own NIP-01 client connection to one
// relay, used where go-nostr's Relay falls short for a long-running service
// (see spec/dependencies.md): messages are dispatched in arrival order (EOSE
// after the stored events it ends), a slow consumer pushes back on the socket
// instead of spawning goroutines, the dialled address can be vetted
// (DNS-rebinding safe), message size is bounded, and Close is race-free.
package relayconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/tidwall/gjson"
)

// Options tunes a connection.
type Options struct {
	// CheckDial vets the address actually dialled ("ip:port") for the URL's
	// host; an error aborts the dial. Nil allows everything.
	CheckDial func(host, address string) error
	// MaxMessageBytes bounds one message from the relay (default 4 MiB).
	MaxMessageBytes int64
	// OnNotice receives NOTICE messages.
	OnNotice func(string)
	// OnMessage receives every message no subscription consumed (OK, AUTH,
	// NEG-MSG …), as raw JSON.
	OnMessage func(label string, raw []byte)
	// Header is sent with the upgrade request.
	Header http.Header
	// SubscriptionBuffer is the event buffer of each subscription.
	SubscriptionBuffer int
}

// Conn is one websocket connection to a relay.
type Conn struct {
	url  string
	ws   *websocket.Conn
	opts Options

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	subs   map[string]*Subscription
	serial atomic.Uint64
	// BytesIn counts the bytes of every message received.
	BytesIn atomic.Uint64
}

// Dial connects to url (ws:// or wss://).
func Dial(ctx context.Context, url string, opts Options) (*Conn, error) {
	if opts.MaxMessageBytes == 0 {
		opts.MaxMessageBytes = 4 << 20
	}
	if opts.SubscriptionBuffer == 0 {
		opts.SubscriptionBuffer = 256
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			if opts.CheckDial != nil {
				// Vet the address the dialer picks, not the name: a name may
				// resolve differently at dial time than when it was checked.
				d := *dialer
				d.Control = func(network, address string, _ syscallRawConn) error {
					return opts.CheckDial(host, address)
				}
				return d.DialContext(ctx, network, addr)
			}
			return dialer.DialContext(ctx, network, addr)
		},
		TLSHandshakeTimeout: 15 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: transport},
		HTTPHeader: opts.Header,
	})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial %s: HTTP %d: %w", url, resp.StatusCode, err)
		}
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	ws.SetReadLimit(opts.MaxMessageBytes)
	c := &Conn{url: url, ws: ws, opts: opts, subs: map[string]*Subscription{}}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	go c.readLoop()
	return c, nil
}

// URL is the relay's URL.
func (c *Conn) URL() string { return c.url }

// Context ends when the connection does; context.Cause says why.
func (c *Conn) Context() context.Context { return c.ctx }

// ErrClosed is the cause when Close was called.
var ErrClosed = errors.New("connection closed")

// Close ends the connection and every subscription.
func (c *Conn) Close() error {
	c.cancel(ErrClosed)
	return c.ws.Close(websocket.StatusNormalClosure, "")
}

// Write sends one message (any JSON-marshallable envelope).
func (c *Conn) Write(ctx context.Context, msg any) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	if err := c.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return fmt.Errorf("write to %s: %w", c.url, err)
	}
	return nil
}

func (c *Conn) readLoop() {
	defer func() {
		c.mu.Lock()
		for _, s := range c.subs {
			s.end()
		}
		c.subs = map[string]*Subscription{}
		c.mu.Unlock()
	}()
	for {
		_, data, err := c.ws.Read(c.ctx)
		if err != nil {
			c.cancel(fmt.Errorf("read from %s: %w", c.url, err))
			return
		}
		c.BytesIn.Add(uint64(len(data)))
		c.dispatch(data)
	}
}

func (c *Conn) dispatch(data []byte) {
	label, subID := peek(data)
	switch label {
	case "EVENT", "EOSE", "CLOSED":
		c.mu.Lock()
		s := c.subs[subID]
		c.mu.Unlock()
		if s == nil {
			return
		}
		switch label {
		case "EVENT":
			var env nostr.EventEnvelope
			if err := env.FromJSON(string(data)); err != nil {
				s.malformed.Add(1)
				return
			}
			evt := env.Event
			select {
			case s.events <- &evt:
			case <-s.done:
			case <-c.ctx.Done():
			}
		case "EOSE":
			s.eoseOnce.Do(func() { close(s.eose) })
		case "CLOSED":
			var env nostr.ClosedEnvelope
			_ = env.FromJSON(string(data))
			select {
			case s.closed <- env.Reason:
			default:
			}
			c.forget(s)
		}
	case "NOTICE":
		var env nostr.NoticeEnvelope
		if env.FromJSON(string(data)) == nil && c.opts.OnNotice != nil {
			c.opts.OnNotice(string(env))
		}
	default:
		if c.opts.OnMessage != nil {
			c.opts.OnMessage(label, data)
		}
	}
}

// peek reads the label and, when it is a string, the second element of a
// relay message without decoding the rest.
func peek(data []byte) (label, second string) {
	if !gjson.ValidBytes(data) {
		return "", ""
	}
	return gjson.GetBytes(data, "0").String(), gjson.GetBytes(data, "1").String()
}

// Subscription is one REQ. Events arrive on Events in the relay's order;
// EOSE is closed after the last stored event; Closed receives the relay's
// CLOSED reason.
type Subscription struct {
	ID     string
	conn   *Conn
	events chan *nostr.Event
	eose   chan struct{}
	closed chan string
	done   chan struct{}

	eoseOnce  sync.Once
	doneOnce  sync.Once
	malformed atomic.Uint64
}

// Events delivers the subscription's events.
func (s *Subscription) Events() <-chan *nostr.Event { return s.events }

// EOSE is closed when the relay has sent every stored event.
func (s *Subscription) EOSE() <-chan struct{} { return s.eose }

// Closed receives the reason when the relay closes the subscription.
func (s *Subscription) Closed() <-chan string { return s.closed }

// Done is closed when the subscription ends (Close, CLOSED, or the
// connection ending).
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Malformed counts EVENT messages that could not be decoded.
func (s *Subscription) Malformed() uint64 { return s.malformed.Load() }

func (s *Subscription) end() { s.doneOnce.Do(func() { close(s.done) }) }

// Subscribe sends a REQ.
func (c *Conn) Subscribe(ctx context.Context, fs nostr.Filters) (*Subscription, error) {
	if err := context.Cause(c.ctx); err != nil {
		return nil, fmt.Errorf("subscribe on %s: %w", c.url, err)
	}
	s := &Subscription{
		ID:     "g" + strconv.FormatUint(c.serial.Add(1), 36),
		conn:   c,
		events: make(chan *nostr.Event, c.opts.SubscriptionBuffer),
		eose:   make(chan struct{}),
		closed: make(chan string, 1),
		done:   make(chan struct{}),
	}
	c.mu.Lock()
	c.subs[s.ID] = s
	c.mu.Unlock()
	if err := c.Write(ctx, nostr.ReqEnvelope{SubscriptionID: s.ID, Filters: fs}); err != nil {
		c.forget(s)
		return nil, err
	}
	return s, nil
}

func (c *Conn) forget(s *Subscription) {
	c.mu.Lock()
	delete(c.subs, s.ID)
	c.mu.Unlock()
	s.end()
}

// Close sends CLOSE for the subscription and stops delivering its events.
func (s *Subscription) Close() {
	select {
	case <-s.done:
		return
	default:
	}
	s.conn.forget(s)
	if s.conn.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.conn.Write(ctx, nostr.CloseEnvelope(s.ID))
	}
}
