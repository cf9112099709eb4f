package relayconn

import (
	"sync"

	"github.com/nbd-wtf/go-nostr"
)

// How a subscription with a Handler is served
// (docs/measurements/2026-12-05-issue32-goroutines-at-rest.md): the read
// goroutine queues each of its messages on the subscription's bounded
// queue, and one delivery goroutine per connection, started when a queue
// gets its first message and gone once every queue is empty, calls the
// handlers, one message of each waiting subscription in turn. A connection
// at rest therefore holds no goroutine for its subscriptions, however many
// are open: a goroutine per live subscription was most of what graspd held
// at rest (issue 32).

// Handler receives the messages of one subscription, in the relay's order,
// on the connection's delivery goroutine. A handler may block (publishing
// with backpressure), but while it does no other handler of the connection
// runs, and once the subscription's queue is full the read goroutine waits
// for room: the socket is pushed back on, as with a full Events channel.
// A handler must not call Close of a subscription of its connection.
// The connection ending is told by Conn.Context, not by the handler.
type Handler struct {
	// Event receives an event; more says whether more of the
	// subscription's messages are queued behind it (a burst), so a
	// caller gathering events into batches knows when to send.
	Event func(evt *nostr.Event, more bool)
	// EOSE is called after the last stored event (may be nil).
	EOSE func()
	// Closed receives the relay's CLOSED reason; the subscription has
	// ended (Done is closed) and nothing follows.
	Closed func(reason string)
}

// delivery is one message queued for a Handler.
type delivery struct {
	evt    *nostr.Event // EVENT
	eose   bool         // EOSE
	closed *string      // CLOSED, with its reason
}

// handled is the part of a Subscription that serves a Handler.
type handled struct {
	h *Handler
	// q is the subscription's queue (guarded by Conn.dmu), at most
	// Options.SubscriptionBuffer events; EOSE and CLOSED are always taken
	// (one of each at most), so the end of a subscription is never waited
	// for. queued says whether it is on Conn.ready; stopped that the caller
	// closed it (its queue is dropped, nothing more is delivered).
	q       []delivery
	nev     int // events in q
	queued  bool
	stopped bool
	// space is signalled when the delivery goroutine takes a message, for
	// a read goroutine waiting on a full queue; stop is closed by Close.
	space chan struct{}
	stop  chan struct{}
	// calling is held while a handler of the subscription runs, so Close
	// returns only once no call is in progress.
	calling sync.Mutex
}

// enqueue queues a message for s's handler, waiting while s's queue is
// full (the socket is then pushed back on) until there is room, s is
// closed by its caller, or the connection ends.
func (c *Conn) enqueue(s *Subscription, d delivery) {
	for {
		c.dmu.Lock()
		if s.hd.stopped {
			c.dmu.Unlock()
			return
		}
		if d.evt == nil || s.hd.nev < c.opts.SubscriptionBuffer {
			s.hd.q = append(s.hd.q, d)
			if d.evt != nil {
				s.hd.nev++
			}
			if !s.hd.queued {
				s.hd.queued = true
				c.ready = append(c.ready, s)
			}
			start := !c.draining
			if start {
				c.draining = true
				// The read goroutine is counted in loops: Add is not racing a
				// Wait that has seen zero.
				c.loops.Add(1)
			}
			c.dmu.Unlock()
			if start {
				go c.drain()
			}
			return
		}
		c.dmu.Unlock()
		c.delivering.Store(true)
		select {
		case <-s.hd.space:
		case <-s.hd.stop:
		case <-c.ctx.Done():
		}
		c.delivering.Store(false)
		if c.ctx.Err() != nil {
			return
		}
	}
}

// drain is the delivery goroutine: it calls the handlers of the queued
// messages, one per waiting subscription in turn, and returns once every
// queue is empty or the connection has ended.
func (c *Conn) drain() {
	defer c.loops.Done()
	for {
		c.dmu.Lock()
		if len(c.ready) == 0 || c.ctx.Err() != nil {
			c.ready = nil
			c.draining = false
			c.dmu.Unlock()
			return
		}
		s := c.ready[0]
		c.ready[0] = nil
		c.ready = c.ready[1:]
		if len(s.hd.q) == 0 || s.hd.stopped {
			s.hd.queued = false
			c.dmu.Unlock()
			continue
		}
		d := s.hd.q[0]
		s.hd.q[0] = delivery{}
		s.hd.q = s.hd.q[1:]
		if d.evt != nil {
			s.hd.nev--
		}
		more := len(s.hd.q) > 0
		if more {
			c.ready = append(c.ready, s) // its next message waits its turn
		} else {
			s.hd.queued = false
			s.hd.q = nil
		}
		// Taken before dmu is let go: a Close that comes after this
		// sees the call in progress and waits for it.
		s.hd.calling.Lock()
		c.dmu.Unlock()
		select {
		case s.hd.space <- struct{}{}:
		default:
		}
		h := s.hd.h
		switch {
		case d.evt != nil:
			h.Event(d.evt, more)
		case d.eose:
			if h.EOSE != nil {
				h.EOSE()
			}
		case d.closed != nil:
			if h.Closed != nil {
				h.Closed(*d.closed)
			}
		}
		s.hd.calling.Unlock()
	}
}

// stopHandler drops s's queue and waits for a handler call in progress.
func (c *Conn) stopHandler(s *Subscription) {
	c.dmu.Lock()
	if !s.hd.stopped {
		s.hd.stopped = true
		s.hd.q, s.hd.nev = nil, 0
		close(s.hd.stop)
	}
	c.dmu.Unlock()
	s.hd.calling.Lock()
	//nolint:staticcheck // an empty critical section: waiting for the call in progress
	s.hd.calling.Unlock()
}

// deliver hands v to out, waiting while out is full until done or the
// connection ends; while it waits, c.delivering is set, so the keepalive
// knows the reader is held up by a slow consumer, not by a silent relay.
func deliver[T any](c *Conn, out chan<- T, v T, done <-chan struct{}) {
	select {
	case out <- v:
		return
	default:
	}
	c.delivering.Store(true)
	defer c.delivering.Store(false)
	select {
	case out <- v:
	case <-done:
	case <-c.ctx.Done():
	}
}
