package frameguard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"sync"
	"time"
)

// Messages of one connection take effect in the order they were sent
// (docs/decisions/0019-messages-of-one-connection-in-order.md).
// khatru v0.19.1 reads a connection's messages in order but handles each in a
// goroutine of its own, so a CLOSE could run after the REQ sent after it
// (cancelling it: no events, then EOSE) and an EVENT could be judged before
// the announcement sent before it. The guard therefore hands khatru the next
// message only once khatru has finished the previous one, which it learns
// from khatru's answer (OK, EOSE, CLOSED, COUNT, NEG-MSG, NEG-ERROR or the
// NOTICE of a message khatru cannot parse) or, for a CLOSE, which khatru does
// not answer, from the cancellation of the subscription's contexts.

// defaultOrderWait bounds how long the guard holds a connection's next
// message back when khatru has not finished the previous one: a safety net
// (every message the guard forwards has an answer or a cancellation to wait
// for), after which the next message goes to khatru anyway.
const defaultOrderWait = 20 * time.Second

// awaitKind says how the guard learns that khatru has finished a message.
type awaitKind int

const (
	// awaitNothing: the message's effect can be ignored for ordering
	// (NEG-CLOSE, see docs/decisions/0019-messages-of-one-connection-in-order.md).
	awaitNothing awaitKind = iota
	// awaitAnswer: khatru's last act on the message is one of labels.
	awaitAnswer
	// awaitClose: a CLOSE, done when khatru has cancelled the contexts of
	// the subscription's filters (it does so under the lock under which it
	// removes the listeners).
	awaitClose
)

// awaited describes the end of khatru's work on one forwarded message.
type awaited struct {
	kind   awaitKind
	labels []string // awaitAnswer: the answers that end it
	sub    string   // the subscription the answer or the CLOSE is about; "" any
}

func answer(sub string, labels ...string) awaited {
	return awaited{kind: awaitAnswer, labels: labels, sub: sub}
}

// ends reports whether the server message msg (or the first frame of it)
// is khatru's last answer to the awaited message. A NOTICE "failed to parse
// envelope" ends any message: it is khatru's only answer to one it cannot
// parse.
func (a awaited) ends(msg []byte) bool {
	if a.kind != awaitAnswer {
		return false
	}
	l := label(msg)
	if l == "NOTICE" {
		text, _ := secondString(msg)
		return len(text) >= len(parseFailure) && text[:len(parseFailure)] == parseFailure
	}
	if !slices.Contains(a.labels, l) {
		return false
	}
	if a.sub == "" || l == "OK" {
		return true
	}
	sub, ok := secondString(msg)
	return ok && sub == a.sub
}

// parseFailure starts khatru's NOTICE for a message it cannot parse; the
// guard answers the same way for the messages it refuses to forward as
// unparsable.
const parseFailure = "failed to parse envelope: "

// secondString returns the second element of a JSON array message when it
// is a string, reading no further than that string (a NEG-MSG answer can be
// a megabyte).
func secondString(msg []byte) (string, bool) {
	msg = bytes.TrimLeft(msg, " \t\r\n")
	if len(msg) < 2 || msg[0] != '[' {
		return "", false
	}
	rest := msg[1:]
	n := stringEnd(rest) // the label
	if n < 0 {
		return "", false
	}
	rest = bytes.TrimLeft(rest[n:], " \t\r\n")
	if len(rest) == 0 || rest[0] != ',' {
		return "", false
	}
	rest = rest[1:]
	n = stringEnd(rest)
	var second string
	if n < 0 || json.Unmarshal(rest[:n], &second) != nil {
		return "", false
	}
	return second, true
}

// stringEnd returns the length of the JSON string (with its quotes and any
// leading whitespace) at the start of b, or -1.
func stringEnd(b []byte) int {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	if i == len(b) || b[i] != '"' {
		return -1
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// Subscriptions records, for one connection, the contexts khatru gives the
// filters of each open subscription (its OverwriteFilter hook sees them;
// the relay hands them over with Add). khatru cancels them when a CLOSE
// removes the subscription, which is how the guard knows a CLOSE has taken
// effect: khatru does not answer a CLOSE. Bounded by the guard's limits on
// subscriptions and filters: entries leave with their CLOSE, and cancelled
// ones are dropped as new ones arrive.
type Subscriptions struct {
	mu   sync.Mutex
	byID map[string][]context.Context
}

// NewSubscriptions returns an empty record, one per connection: the
// relay's filter hook and the connection's guard (New) share it.
func NewSubscriptions() *Subscriptions {
	return &Subscriptions{byID: map[string][]context.Context{}}
}

// Add records ctx, the context khatru gave one filter of subscription id
// (khatru's OverwriteFilter hook sees it): a CLOSE of id has taken effect
// once every context recorded for id is done.
func (s *Subscriptions) Add(id string, ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := slices.DeleteFunc(s.byID[id], func(c context.Context) bool { return c.Err() != nil })
	s.byID[id] = append(live, ctx)
}

// take removes and returns the contexts of subscription id.
func (s *Subscriptions) take(id string) []context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctxs := s.byID[id]
	delete(s.byID, id)
	return ctxs
}

// pending is a forwarded message khatru has not finished yet.
type pending struct {
	await    awaited
	done     chan struct{} // closed by the write side on khatru's answer
	answered bool
	ctxs     []context.Context // awaitClose: the subscription's contexts
}

// forward queues a client message for khatru and notes what will end
// khatru's work on it.
func (c *Conn) forward(op byte, msg []byte, a awaited) {
	if c.subs != nil && a.kind != awaitNothing {
		p := &pending{await: a, done: make(chan struct{})}
		if a.kind == awaitClose {
			p.ctxs = c.subs.take(a.sub)
		}
		c.seqMu.Lock()
		c.waiting = p
		c.seqMu.Unlock()
	}
	c.out = appendFrame(c.out, op, true, true, msg)
}

// errOrderWait ends a wait for khatru that took longer than Limits.OrderWait.
var errOrderWait = errors.New("khatru did not finish the previous message in time")

// settle waits until khatru has finished the last forwarded message: its
// answer passed (observe), or for a CLOSE, the subscription's contexts are
// cancelled. It fails only when the connection is closed; after OrderWait
// it gives up waiting (order.go).
func (c *Conn) settle() error {
	c.seqMu.Lock()
	p := c.waiting
	c.seqMu.Unlock()
	if p == nil {
		return nil
	}
	defer func() {
		c.seqMu.Lock()
		if c.waiting == p {
			c.waiting = nil
		}
		c.seqMu.Unlock()
	}()
	wait := c.lim.OrderWait
	if wait <= 0 {
		wait = defaultOrderWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	until := func(done <-chan struct{}) error {
		select {
		case <-done:
			return nil
		case <-c.closed:
			return net.ErrClosed
		case <-timer.C:
			return errOrderWait
		}
	}
	var err error
	if p.await.kind == awaitClose {
		for _, ctx := range p.ctxs {
			if err = until(ctx.Done()); err != nil {
				break
			}
		}
	} else {
		err = until(p.done)
	}
	if errors.Is(err, errOrderWait) {
		return nil // the safety net: let the next message go
	}
	return err
}

// observe ends the wait for khatru when msg, a message khatru is writing
// to the client, is its answer to the last forwarded message.
func (c *Conn) observe(msg []byte) {
	c.seqMu.Lock()
	defer c.seqMu.Unlock()
	p := c.waiting
	if p == nil || p.answered || !p.await.ends(msg) {
		return
	}
	p.answered = true
	close(p.done)
}
