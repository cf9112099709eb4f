// Package frameguard is the own relay's websocket frame guard: it sits
// between a client's websocket connection and khatru, at the frame level of
// the hijacked TCP connection (docs/decisions/0010-relay-frame-guard.md).
// khatru v0.19.1 has no hooks for what the relay must enforce per message or
// per connection, and gets one thing wrong on the wire, so the guard:
//
//   - reads each client message before khatru does and answers, instead of
//     khatru, REQs with too many filters, subscriptions beyond the
//     per-connection limit, EVENTs over the per-IP rate and messages over the
//     size limit (khatru would close the connection on those; a client gets
//     an OK or NOTICE it can act on instead);
//   - rewrites khatru's "NEG-ERROR" into the standard "NEG-ERR" (rust-nostr
//     clients do not understand the former and hang until their timeout), with
//     a NIP-77 reason prefix;
//   - sees CLOSED messages, so closed subscriptions stop counting;
//   - hands khatru a connection's messages one at a time, each once khatru
//     has finished the one before, so that they take effect in the order
//     sent (order.go); a REQ reusing an open subscription's id is preceded
//     by a CLOSE of it (NIP-01: it replaces it);
//   - answers itself messages khatru could only answer with a parse-failure
//     NOTICE, and keeps messages without a label from khatru (some crash it).
//
// Client messages khatru does get are re-framed as one frame each with an
// all-zero mask; server frames pass unchanged except NEG-ERROR. Answers the
// guard adds are written between khatru's messages, never inside a
// fragmented one.
//
// The guard's parts: conn.go (the connection, its limits, the hijack),
// wsframe.go (the frame codec), read.go (client frames to khatru),
// inspect.go (the decision on each client message), refusals.go (the
// answers it sends instead of khatru), write.go (khatru's frames to the
// client) and order.go (one message at a time). What is about the relay
// itself (khatru's hooks, per-address limits, who a client is behind a
// proxy) stays in package relay, which wires the guard in.
package frameguard

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits are the per-connection limits the guard enforces. The relay fills
// them from its configuration; a message over a limit is answered by the
// guard and never reaches khatru, which would close the connection instead.
type Limits struct {
	MaxMessage  int // bytes of one client message
	MaxFilters  int // filters in one REQ
	MaxSubs     int // open subscriptions per connection
	MaxSubIDLen int // characters of a subscription id
	// WriteTimeout bounds one write to the client (zero: 10 s); a write
	// that times out closes the connection.
	WriteTimeout time.Duration
	// OrderWait bounds how long the next message waits for khatru to
	// finish the previous one (zero: defaultOrderWait); see order.go.
	OrderWait time.Duration
}

// netConn names the wrapped connection's field: unexported, so that
// nothing outside the guard reads or writes past it, while its other
// methods (addresses, deadlines) are Conn's.
type netConn = net.Conn

// Conn is a hijacked client connection behind the guard: khatru reads the
// client's messages and writes its own through it (Read, Write), and the
// guard answers, rewrites and orders them as the package comment says.
type Conn struct {
	netConn
	lim          Limits
	st           *connState
	eventAllowed func() bool
	// onRefuse observes refusals (metrics); may be nil.
	onRefuse func(kind string)

	// read side: used only by khatru's reading goroutine.
	rbuf     []byte // raw bytes from the client not parsed yet
	out      []byte // frames ready for khatru
	msg      []byte // payload of the message being reassembled
	msgOp    byte
	inMsg    bool
	dropping bool   // discarding the rest of an oversized message
	skip     uint64 // payload bytes of the current frame still to discard
	rerr     error

	// ordering (order.go). subs is nil when messages are not ordered
	// (tests of the framing alone).
	subs      *Subscriptions
	seqMu     sync.Mutex
	waiting   *pending // the forwarded message khatru has not finished
	held      []byte   // a REQ waiting for the CLOSE of the one it replaces
	heldOp    byte
	heldAwait awaited
	closed    chan struct{} // closed when the connection is
	closeOnce sync.Once

	// write side.
	wmu      sync.Mutex
	upgraded bool     // the HTTP 101 response has been written
	wbuf     []byte   // server bytes not yet forming a whole frame
	wmsg     bool     // inside a fragmented server message
	pending  [][]byte // guard answers waiting for the end of a server message
	wevent   bool     // the server message being written is an EVENT
	// coalescing (write.go): frames not yet written, and the timer
	// that writes them at the latest coalesceDelay after they were held.
	obuf          []byte
	flushTimer    *time.Timer
	flushArmed    bool
	coalesceDelay time.Duration
}

// New puts the guard in front of c, a client's connection hijacked for
// khatru. subs, shared with the relay's filter hook (Subscriptions), lets
// the guard order the connection's messages; nil leaves them unordered (the
// framing's tests). eventAllowed, asked once per EVENT, takes a token of the
// client's event rate (nil: no rate). onRefuse, which may be nil, observes
// each refusal by what was refused ("event", "req", "malformed",
// "message-too-large"), for the relay's metrics.
func New(c net.Conn, lim Limits, subs *Subscriptions, eventAllowed func() bool, onRefuse func(kind string)) *Conn {
	return &Conn{netConn: c, lim: lim, st: newConnState(), subs: subs, eventAllowed: eventAllowed, onRefuse: onRefuse,
		closed: make(chan struct{}), coalesceDelay: defaultCoalesceDelay}
}

// Close closes the connection and ends any wait for khatru.
func (c *Conn) Close() error {
	// A coalescing timer still armed fires within coalesceDelay and finds
	// the connection closed (write.go).
	c.closeOnce.Do(func() { close(c.closed) })
	return c.netConn.Close()
}

// HijackWriter is the http.ResponseWriter the relay hands khatru's
// websocket upgrader: its Hijack gives the upgrader the client's connection
// already wrapped by Wrap (New, in the relay), so that khatru speaks to the
// client only through the guard.
type HijackWriter struct {
	http.ResponseWriter
	// Wrap wraps the hijacked connection; it is called once, on Hijack.
	Wrap func(net.Conn) net.Conn
}

// Hijack wraps the connection. Bytes the HTTP server buffered beyond the
// request (a client must not send any before the handshake completes, and
// the upgrader refuses such a client) are kept in front of the stream.
func (w HijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: connection cannot be hijacked")
	}
	conn, brw, err := h.Hijack()
	if err != nil {
		return nil, nil, err
	}
	wrapped := w.Wrap(conn)
	var r *bufio.Reader
	if brw != nil && brw.Reader.Buffered() > 0 {
		// Keep the server's reader so its buffered bytes are not lost; the
		// upgrader refuses such a client anyway.
		r = brw.Reader
	} else {
		r = bufio.NewReader(wrapped)
	}
	return wrapped, bufio.NewReadWriter(r, bufio.NewWriter(wrapped)), nil
}
