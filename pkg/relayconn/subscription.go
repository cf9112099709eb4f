package relayconn

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

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
	bytes     atomic.Uint64
	// filters and size are the REQ's, for OnLimit; slot is set while it
	// holds a place in the connection's subscription gate.
	filters, size int
	live          bool
	slot          atomic.Bool
	// hd serves a Handler (deliver.go); nil for a subscription read from
	// its channels.
	hd *handled
}

// Events delivers the subscription's events (never, for a subscription
// with a Handler).
func (s *Subscription) Events() <-chan *nostr.Event { return s.events }

// EOSE is closed when the relay has sent every stored event.
func (s *Subscription) EOSE() <-chan struct{} { return s.eose }

// Buffered returns the events waiting on Events, without blocking. Once EOSE
// is closed they are the rest of the stored events: a reader selecting on
// both channels may see EOSE first, and takes these before it concludes.
func (s *Subscription) Buffered() []*nostr.Event {
	var out []*nostr.Event
	for {
		select {
		case evt := <-s.events:
			out = append(out, evt)
		default:
			return out
		}
	}
}

// Closed receives the reason when the relay closes the subscription. It is
// sent before Done is closed, so after Done a non-blocking read tells
// whether the relay closed it.
func (s *Subscription) Closed() <-chan string { return s.closed }

// Done is closed when the subscription ends (Close, CLOSED, or the
// connection ending).
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Malformed counts EVENT messages that could not be decoded.
func (s *Subscription) Malformed() uint64 { return s.malformed.Load() }

// Bytes counts the bytes of the subscription's messages (EVENT, EOSE, CLOSED).
func (s *Subscription) Bytes() uint64 { return s.bytes.Load() }

func (s *Subscription) end() {
	s.doneOnce.Do(func() { close(s.done) })
	if s.slot.CompareAndSwap(true, false) {
		s.conn.gate.release(s.live)
	}
}

// Subscribe sends a REQ for a read that ends (a page, an id fetch). It
// waits for a free subscription slot when the relay's count is reached
// (SetLimits), and fails with *TooLargeError, unsent, when the REQ is over
// the relay's message budget.
func (c *Conn) Subscribe(ctx context.Context, fs nostr.Filters) (*Subscription, error) {
	return c.subscribe(ctx, fs, false, nil, nil)
}

// SubscribeLive sends a REQ that stays open (a live subscription). Live
// subscriptions hold at most the slots SetLimits does not reserve; onWait,
// if set, is called once when the REQ has to wait for one, so a caller
// replacing old live subscriptions with new ones can close the old first
// instead of waiting forever for slots they hold.
//
// With a Handler h, the subscription's messages go to h (deliver.go) and
// the subscription holds no goroutine of its own or of the caller's: a
// long-lived subscription is served by the connection's goroutines alone.
// With h nil they go to its channels.
func (c *Conn) SubscribeLive(ctx context.Context, fs nostr.Filters, onWait func(), h *Handler) (*Subscription, error) {
	return c.subscribe(ctx, fs, true, onWait, h)
}

func (c *Conn) subscribe(ctx context.Context, fs nostr.Filters, live bool, onWait func(), h *Handler) (*Subscription, error) {
	if err := context.Cause(c.ctx); err != nil {
		return nil, fmt.Errorf("subscribe on %s: %w", c.url, err)
	}
	s := &Subscription{
		ID:      c.NewID(),
		conn:    c,
		eose:    make(chan struct{}),
		closed:  make(chan string, 1),
		done:    make(chan struct{}),
		filters: len(fs),
		live:    live,
	}
	if h != nil {
		s.hd = &handled{h: h, space: make(chan struct{}, 1), stop: make(chan struct{})}
	} else {
		s.events = make(chan *nostr.Event, c.opts.SubscriptionBuffer)
	}
	// The envelope's own encoder: json.Marshal would call it and then
	// compact and copy what it wrote (1 % of graspd's CPU at 1,000 relays).
	data, err := nostr.ReqEnvelope{SubscriptionID: s.ID, Filters: fs}.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode REQ: %w", err)
	}
	s.size = len(data)
	if limit := int(c.maxOut.Load()); limit > 0 && len(data) > limit {
		return nil, &TooLargeError{Size: len(data), Limit: limit}
	}
	if err := c.gate.acquire(ctx, c.ctx, live, onWait); err != nil {
		return nil, fmt.Errorf("subscribe on %s: %w", c.url, err)
	}
	s.slot.Store(true)
	c.mu.Lock()
	c.subs[s.ID] = s
	c.unanswered[s] = data
	c.mu.Unlock()
	if err := c.WriteRaw(ctx, data); err != nil {
		c.forget(s)
		return nil, err
	}
	return s, nil
}

// Close sends CLOSE for the subscription and stops delivering its events;
// for a subscription with a Handler, it drops what is queued and returns
// once no handler call is in progress (never call it from a handler).
func (s *Subscription) Close() {
	c := s.conn
	if s.hd != nil {
		c.stopHandler(s)
	}
	select {
	case <-s.done:
		return
	default:
	}
	c.mu.Lock()
	delete(c.subs, s.ID)
	delete(c.unanswered, s)
	c.mu.Unlock()
	// The slot is freed only once the CLOSE is written: a REQ waiting for
	// it must reach the relay after the CLOSE, or the relay counts both.
	if c.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Write(ctx, nostr.CloseEnvelope(s.ID))
	}
	s.end()
}

// Message is one raw relay message routed to a Channel.
type Message struct {
	Label string
	Raw   []byte
}

// Channel receives every message, other than EVENT, EOSE, CLOSED and
// NOTICE, whose second element is the channel's id: the routing NIP-77
// (NEG-MSG, NEG-ERR) and similar protocols need over one connection.
type Channel struct {
	ID    string
	conn  *Conn
	msgs  chan Message
	done  chan struct{}
	once  sync.Once
	bytes atomic.Uint64
	slot  atomic.Bool
}

// OpenChannel registers a channel for id (use NewID for a fresh one). A
// channel is a subscription to the relay (a NIP-77 session counts toward
// strfry's limit), so it waits for a slot like Subscribe.
func (c *Conn) OpenChannel(ctx context.Context, id string) (*Channel, error) {
	if err := context.Cause(c.ctx); err != nil {
		return nil, fmt.Errorf("open channel on %s: %w", c.url, err)
	}
	ch := &Channel{ID: id, conn: c, msgs: make(chan Message, 16), done: make(chan struct{})}
	c.mu.Lock()
	_, taken := c.channels[id]
	c.mu.Unlock()
	if taken {
		return nil, fmt.Errorf("channel %s already open on %s", id, c.url)
	}
	if err := c.gate.acquire(ctx, c.ctx, false, nil); err != nil {
		return nil, fmt.Errorf("open channel on %s: %w", c.url, err)
	}
	ch.slot.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, taken := c.channels[id]; taken {
		ch.end()
		return nil, fmt.Errorf("channel %s already open on %s", id, c.url)
	}
	c.channels[id] = ch
	return ch, nil
}

// Messages delivers the channel's messages in arrival order.
func (ch *Channel) Messages() <-chan Message { return ch.msgs }

// Done is closed when the channel is closed or the connection ends.
func (ch *Channel) Done() <-chan struct{} { return ch.done }

// Bytes counts the bytes of the messages routed to the channel.
func (ch *Channel) Bytes() uint64 { return ch.bytes.Load() }

func (ch *Channel) end() {
	ch.once.Do(func() { close(ch.done) })
	if ch.slot.CompareAndSwap(true, false) {
		ch.conn.gate.release(false)
	}
}

// Close stops routing messages to the channel.
func (ch *Channel) Close() {
	ch.conn.mu.Lock()
	if ch.conn.channels[ch.ID] == ch {
		delete(ch.conn.channels, ch.ID)
	}
	ch.conn.mu.Unlock()
	ch.end()
}
