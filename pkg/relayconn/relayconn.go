// Package relayconn is grasp-sync's own NIP-01 client connection to one
// relay, used where go-nostr's Relay falls short for a long-running service
// (see docs/dependencies.md): messages are dispatched in arrival order (EOSE
// after the stored events it ends), a slow consumer pushes back on the socket
// instead of spawning goroutines, the dialled address can be vetted
// (DNS-rebinding safe), message size is bounded, a connection that stops
// answering pings is declared dead, and Close is race-free.
package relayconn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// Defaults of Options.
const (
	DefaultMaxMessageBytes = 4 << 20
	DefaultPingInterval    = 30 * time.Second
	DefaultPongTimeout     = 20 * time.Second
	DefaultWriteTimeout    = 30 * time.Second
)

// Options tunes a connection.
type Options struct {
	// CheckDial vets the address actually dialled ("ip:port") for the URL's
	// host; an error aborts the dial. Nil allows everything.
	CheckDial func(host, address string) error
	// MaxMessageBytes bounds one message from the relay (default 4 MiB). A
	// larger message ends the connection: websocket has no way to skip it.
	MaxMessageBytes int64
	// PingInterval is how often the keepalive looks at the connection
	// (default 30 s; negative disables keepalive): it pings only a relay it
	// heard nothing from (no message, no ping of its own) since it last
	// looked, so a silent relay is pinged after one to two intervals of
	// silence, and one that pings us as often (khatru every 30 s, strfry
	// every 55 s) is pinged rarely or never.
	PingInterval time.Duration
	// PongTimeout is how long a ping may go unanswered before the connection
	// is declared dead (default 20 s).
	PongTimeout time.Duration
	// WriteTimeout bounds one write when the caller's context has no earlier
	// deadline (default 30 s), so a peer that stops reading cannot block us.
	WriteTimeout time.Duration
	// OnNotice receives NOTICE messages (on the read goroutine: do not block).
	OnNotice func(string)
	// OnMessage receives every message no subscription or channel consumed
	// (OK, AUTH, unknown labels …), as raw JSON, on the read goroutine: do
	// not block.
	OnMessage func(label string, raw []byte)
	// Header is sent with the upgrade request.
	Header http.Header
	// SubscriptionBuffer is the event buffer of each subscription.
	SubscriptionBuffer int
	// OnLimit is told of every refusal of a budget the relay sent (a
	// NOTICE or CLOSED that relaylimits.Classify calls a limit), with what
	// was open and sent when it came: open subscriptions (the refused one
	// included), the refused REQ's filters and its size. It runs on the read
	// goroutine: do not block. The connection has already lowered its own
	// subscription gate when the refusal was of a count.
	OnLimit func(r relaylimits.Refusal, text string, open, filters, size int)
	// OnSent is told of every message written to the relay, with its size
	// in bytes and its purpose: for a REQ, the purpose its caller set on
	// the context (WithPurpose; "req" when none, "req_resent" when the
	// connection sent it again after a refusal of its count), otherwise
	// the message's label in lower case with '-' as '_' (close, neg_open,
	// neg_msg, neg_close, auth …). It runs on the writer's goroutine: do
	// not block. It is what says what the bytes graspd sends are (issue 32).
	OnSent func(purpose string, bytes int)
}

type purposeKey struct{}

// WithPurpose labels the REQs written under ctx for Options.OnSent (e.g.
// "history", "ids", "live_new"); other messages are named by their label.
func WithPurpose(ctx context.Context, purpose string) context.Context {
	return context.WithValue(ctx, purposeKey{}, purpose)
}

// sentPurpose names a message written under ctx for Options.OnSent.
func sentPurpose(ctx context.Context, data []byte) string {
	label := ""
	if len(data) > 2 && data[0] == '[' && data[1] == '"' {
		if end := bytes.IndexByte(data[2:min(len(data), 34)], '"'); end > 0 {
			label = string(data[2 : 2+end])
		}
	}
	switch label {
	case "":
		return "other"
	case "REQ":
		if p, ok := ctx.Value(purposeKey{}).(string); ok && p != "" {
			return p
		}
		return "req"
	}
	return strings.ReplaceAll(strings.ToLower(label), "-", "_")
}

// ErrDead is the cause of a connection that stopped answering pings.
var ErrDead = errors.New("relay stopped answering pings")

// DialError is a failed connection attempt. StatusCode is the HTTP status of
// a refused websocket upgrade (0 when the failure came earlier).
type DialError struct {
	URL        string
	StatusCode int
	Err        error
}

func (e *DialError) Error() string {
	if e.StatusCode != 0 {
		return fmt.Sprintf("dial %s: HTTP %d: %v", e.URL, e.StatusCode, e.Err)
	}
	return fmt.Sprintf("dial %s: %v", e.URL, e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// Conn is one websocket connection to a relay.
type Conn struct {
	url  string
	ws   *websocket.Conn
	opts Options

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	subs     map[string]*Subscription
	channels map[string]*Channel
	// unanswered are the REQs sent that have had no answer yet (no EVENT,
	// EOSE or CLOSED), with the message that sent them: strfry's and
	// nostr-rs-relay's NOTICE refusing a subscription over their count names
	// none, and with several REQs in flight any of these may be the one
	// (docs/dependencies.md, "Public relays' limits"); they are sent again.
	unanswered map[*Subscription][]byte
	// burstOpen, burstN and burstAt count the subscription refusals that
	// came together (resendUnanswered).
	burstOpen, burstN int
	burstAt           time.Time
	// maxOut bounds the messages we send (0: unbounded); maxWritten is
	// the largest one sent, what a 1009 close refused at most.
	maxOut     atomic.Int64
	maxWritten atomic.Int64
	// lastLarge is the size and time (unix ns) of the last message over
	// largeWrite bytes sent: strfry drops a connection whose message is
	// over its limit without a word (no close frame), and this is how
	// the drop can be told from a failure (RecentLargeWrite).
	lastLargeSize, lastLargeAt atomic.Int64
	gate                       slotGate
	watchers                   map[*noticeWatcher]struct{}
	serial                     atomic.Uint64
	// BytesIn counts the bytes of every message received.
	BytesIn   atomic.Uint64
	malformed atomic.Uint64
	// delivering is set while the read loop waits for a slow consumer: the
	// socket is then quiet because of us, not the relay.
	delivering atomic.Bool
	// heard is set by every message and ping the relay sends and cleared
	// by the keepalive: a relay heard from is alive without our ping. At
	// 1,000 relays our pings and their pongs were most of what woke graspd
	// at rest, while the relays pinged it as often
	// (docs/decisions/0078-quiet-keepalive-and-heartbeat.md).
	heard *atomic.Bool
	// sock is the TCP connection under ws.
	sock  *socket
	loops sync.WaitGroup
	// dmu guards the queues of subscriptions with a Handler, ready (those
	// with messages waiting, in turn) and draining (the delivery goroutine
	// runs); deliver.go.
	dmu      sync.Mutex
	ready    []*Subscription
	draining bool
	// pinger runs keepalive every PingInterval (a timer, not a goroutine
	// waiting on a ticker: issue 32); pmu guards it and pingStopped, set
	// by Close so no ping starts once Close waits for the loops.
	pmu         sync.Mutex
	pinger      *time.Timer
	pingStopped bool
}

// Dial connects to url (ws:// or wss://).
func Dial(ctx context.Context, url string, opts Options) (*Conn, error) {
	if opts.MaxMessageBytes == 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if opts.SubscriptionBuffer == 0 {
		opts.SubscriptionBuffer = 256
	}
	if opts.PingInterval == 0 {
		opts.PingInterval = DefaultPingInterval
	}
	if opts.PongTimeout <= 0 {
		opts.PongTimeout = DefaultPongTimeout
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	transport := vettedTransport(opts.CheckDial)
	// The socket is kept so Close can end it: the websocket library's own
	// CloseNow does nothing while its Close waits (up to 5 s) for a close
	// frame from a relay that has stopped answering.
	sock := new(socket)
	dial := transport.DialContext
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err == nil {
			sock.set(nc)
		}
		return nc, err
	}
	heard := new(atomic.Bool)
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: transport},
		HTTPHeader: opts.Header,
		OnPingReceived: func(context.Context, []byte) bool {
			heard.Store(true)
			return true // answered with a pong, as without the callback
		},
	})
	if err != nil {
		de := &DialError{URL: url, Err: err}
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			de.StatusCode = resp.StatusCode
		}
		return nil, de
	}
	ws.SetReadLimit(opts.MaxMessageBytes)
	c := &Conn{url: url, ws: ws, sock: sock, opts: opts,
		heard: heard, subs: map[string]*Subscription{}, channels: map[string]*Channel{}, watchers: map[*noticeWatcher]struct{}{},
		unanswered: map[*Subscription][]byte{}}
	c.gate.init()
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	c.loops.Add(1)
	go c.readLoop()
	if opts.PingInterval > 0 {
		c.pmu.Lock()
		c.pinger = time.AfterFunc(opts.PingInterval, c.keepalive)
		c.pmu.Unlock()
	}
	return c, nil
}

// URL is the relay's URL.
func (c *Conn) URL() string { return c.url }

// Context ends when the connection does; context.Cause says why.
func (c *Conn) Context() context.Context { return c.ctx }

// Malformed counts messages that were not valid JSON arrays.
func (c *Conn) Malformed() uint64 { return c.malformed.Load() }

// ErrClosed is the cause when Close was called.
var ErrClosed = errors.New("connection closed")

// Close ends the connection and every subscription, and waits for the
// connection's goroutines.
// Call it from the caller's goroutine, never from OnNotice or OnMessage.
func (c *Conn) Close() error {
	c.pmu.Lock()
	c.pingStopped = true
	if c.pinger != nil {
		c.pinger.Stop()
	}
	c.pmu.Unlock()
	var err error
	if c.ctx.Err() != nil {
		// Already ended (lost, dead): no close handshake to wait for.
		err = c.ws.CloseNow()
	} else {
		c.cancel(ErrClosed)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		done := make(chan struct{})
		go func() {
			defer close(done)
			err = c.ws.Close(websocket.StatusNormalClosure, "")
		}()
		select {
		case <-done:
		case <-ctx.Done():
			// A relay that does not answer the close handshake: end the
			// socket, which ends the handshake's wait (ws.CloseNow would
			// only wait for it; docs/dependencies.md).
			c.sock.close()
			<-done
		}
		cancel()
	}
	c.loops.Wait()
	return err
}

// Write sends one message (any JSON-marshallable envelope).
func (c *Conn) Write(ctx context.Context, msg any) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	return c.WriteRaw(ctx, data)
}

// TooLargeError is a message we did not send because it is over the
// relay's message budget (SetLimits): the caller splits what it carries.
type TooLargeError struct{ Size, Limit int }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("message of %d bytes is over the relay's limit of %d", e.Size, e.Limit)
}

// SetLimits sets the budgets the connection keeps to from now on: the
// largest message it sends (larger ones fail with *TooLargeError, unsent),
// how many subscriptions and channels may be open at once (Subscribe and
// OpenChannel wait for a free one), and how many of those are kept for
// short reads (live subscriptions may hold at most subs − reserved, so
// history is never starved by them). 0 leaves a budget unbounded.
func (c *Conn) SetLimits(maxMessage, subs, reserved int) {
	c.maxOut.Store(int64(maxMessage))
	c.gate.setLimit(subs, reserved)
}

// largeWrite is the smallest message RecentLargeWrite remembers: below
// relaylimits.Floors, no relay refuses it for its size.
const largeWrite = 16 << 10

// RecentLargeWrite is the size of the last message over 16 KiB sent within
// d before now (0 when none): a connection that ends without a close frame
// right after one was most likely dropped for its size.
func (c *Conn) RecentLargeWrite(now time.Time, d time.Duration) int {
	at := c.lastLargeAt.Load()
	if at == 0 || now.Sub(time.Unix(0, at)) > d {
		return 0
	}
	return int(c.lastLargeSize.Load())
}

// MaxWritten is the size of the largest message sent on the connection.
func (c *Conn) MaxWritten() int { return int(c.maxWritten.Load()) }

// OpenSubscriptions is how many subscriptions and channels hold a slot.
func (c *Conn) OpenSubscriptions() int { return c.gate.inUse() }

// WriteRaw sends one message that is already JSON.
func (c *Conn) WriteRaw(ctx context.Context, data []byte) error {
	if limit := int(c.maxOut.Load()); limit > 0 && len(data) > limit {
		return &TooLargeError{Size: len(data), Limit: limit}
	}
	if len(data) > largeWrite {
		c.lastLargeSize.Store(int64(len(data)))
		c.lastLargeAt.Store(time.Now().UnixNano())
	}
	for {
		prev := c.maxWritten.Load()
		if int64(len(data)) <= prev || c.maxWritten.CompareAndSwap(prev, int64(len(data))) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write to %s: %w", c.url, err)
	}
	// The websocket library closes the whole connection when a write's
	// context ends while it writes (a frame may be half sent), and may
	// even start a write whose context has already ended. One caller
	// giving up (a live group replaced, a batch cancelled) must not end
	// every other subscription on the connection, so a write is bounded
	// by the caller's deadline or WriteTimeout, never by its cancellation.
	timeout := c.opts.WriteTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := c.ws.Write(wctx, websocket.MessageText, data); err != nil {
		return fmt.Errorf("write to %s: %w", c.url, err)
	}
	if c.opts.OnSent != nil {
		c.opts.OnSent(sentPurpose(ctx, data), len(data))
	}
	return nil
}

type noticeWatcher struct{ ch chan string }

// WatchNotices returns a channel receiving the relay's NOTICE texts from now
// on (a full buffer drops notices: they are advisory), and a stop function.
func (c *Conn) WatchNotices(buffer int) (<-chan string, func()) {
	w := &noticeWatcher{ch: make(chan string, max(buffer, 1))}
	c.mu.Lock()
	c.watchers[w] = struct{}{}
	c.mu.Unlock()
	return w.ch, func() {
		c.mu.Lock()
		delete(c.watchers, w)
		c.mu.Unlock()
	}
}
