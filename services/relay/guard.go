package relay

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// The guard sits between a client's websocket connection and khatru, at the
// frame level of the hijacked TCP connection. khatru v0.19.1 has no hooks for
// what the relay must enforce per message or per connection, and gets one
// thing wrong on the wire, so the guard:
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
// The guard's parts: guard_read.go (client frames to khatru), inspect.go
// (the decision on each client message), refusals.go (the answers it sends
// instead of khatru), guard_write.go (khatru's frames to the client),
// order.go (one message at a time) and limits.go (the limits it enforces).

// guardConn wraps a hijacked client connection; see the comment at the top.
type guardConn struct {
	net.Conn
	lim          connLimits
	st           *connState
	eventAllowed func() bool
	// onVerdict observes refusals (metrics); may be nil.
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
	subs      *subContexts
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
	// coalescing (guard_write.go): frames not yet written, and the timer
	// that writes them at the latest coalesceDelay after they were held.
	obuf          []byte
	flushTimer    *time.Timer
	flushArmed    bool
	coalesceDelay time.Duration
}

func newGuardConn(c net.Conn, lim connLimits, eventAllowed func() bool, onRefuse func(string)) *guardConn {
	return &guardConn{Conn: c, lim: lim, st: newConnState(), eventAllowed: eventAllowed, onRefuse: onRefuse,
		closed: make(chan struct{}), coalesceDelay: defaultCoalesceDelay}
}

// Close closes the connection and ends any wait for khatru.
func (c *guardConn) Close() error {
	// A coalescing timer still armed fires within coalesceDelay and finds
	// the connection closed (guard_write.go).
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// guardWriter hands khatru's websocket upgrader a hijacked connection
// wrapped in a guardConn.
type guardWriter struct {
	http.ResponseWriter
	wrap func(net.Conn) net.Conn
}

// Hijack wraps the connection. Bytes the HTTP server buffered beyond the
// request (a client must not send any before the handshake completes, and
// the upgrader refuses such a client) are kept in front of the stream.
func (w guardWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: connection cannot be hijacked")
	}
	conn, brw, err := h.Hijack()
	if err != nil {
		return nil, nil, err
	}
	wrapped := w.wrap(conn)
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
