package relay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/verify"
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

// connLimits are the per-connection limits the guard enforces.
type connLimits struct {
	maxMessage  int // bytes of one client message
	maxFilters  int // filters in one REQ
	maxSubs     int // open subscriptions per connection
	maxSubIDLen int // characters of a subscription id
	// writeTimeout bounds one write to the client (zero: 10 s); a write
	// that times out closes the connection.
	writeTimeout time.Duration
	// orderWait bounds how long the next message waits for khatru to
	// finish the previous one (zero: defaultOrderWait); see order.go.
	orderWait time.Duration
}

// connState is what the guard knows about one connection's protocol state.
type connState struct {
	mu   sync.Mutex
	subs map[string]struct{}
}

func newConnState() *connState { return &connState{subs: map[string]struct{}{}} }

// verdict is the guard's decision on one client message.
type verdict struct {
	forward bool   // hand the message to khatru
	reply   []byte // a message to send the client instead (JSON), if any
	what    string // why it was answered instead (metrics), with reply
	// await is how the guard learns that khatru has finished the message.
	await awaited
	// replaces: a REQ with the id of an open subscription, which khatru
	// would keep alongside the new one; the guard closes it first (NIP-01:
	// the new REQ replaces it).
	replaces bool
}

// searchUnsupported answers a REQ with a NIP-50 search filter. The guard
// refuses such REQs before khatru sees them: khatru, refusing a later filter
// of a REQ, leaves the earlier filters subscribed under an id the client
// was told is closed.
const searchUnsupported = "unsupported: full-text search (NIP-50) is not offered here"

// inspect decides on one complete client message and, for a message khatru
// gets, says what ends khatru's work on it. eventAllowed is asked (and
// consumes a token) only for EVENT messages. Pure apart from st and
// eventAllowed, so it is table-tested without sockets.
//
// Messages other than EVENT are parsed here with the parser khatru uses
// (they are small), so the guard knows which envelope khatru will see: what
// khatru would answer only with a parse-failure NOTICE the guard answers
// itself, client-to-relay labels khatru ignores are dropped, and a message
// without a proper label never reaches khatru (whose NIP-77 fallback parser
// panics on some, e.g. `[","]`, taking the process down).
func inspect(msg []byte, st *connState, lim connLimits, eventAllowed func() bool) verdict {
	l := label(msg)
	if !isLabel(l) {
		return malformed(errors.New("want a JSON array starting with a label"))
	}
	if l == "EVENT" {
		// khatru answers every EVENT with an OK, or a NOTICE if it cannot
		// parse it; parsing half a megabyte twice is not needed for that.
		if eventAllowed != nil && !eventAllowed() {
			return verdict{reply: okFalse(eventID(msg), "rate-limited: slow down, too many events from your address"), what: "event"}
		}
		if reason := badKeyOrSig(msg); reason != "" {
			return verdict{reply: okFalse(eventID(msg), reason), what: "malformed"}
		}
		return verdict{forward: true, await: answer("", "OK")}
	}
	if strings.HasPrefix(l, "NEG-") {
		switch env := nip77.ParseNegMessage(string(msg)).(type) {
		case *nip77.OpenEnvelope:
			return verdict{forward: true, await: answer(env.SubscriptionID, "NEG-MSG", "NEG-ERROR")}
		case *nip77.MessageEnvelope:
			return verdict{forward: true, await: answer(env.SubscriptionID, "NEG-MSG", "NEG-ERROR")}
		case *nip77.CloseEnvelope:
			return verdict{forward: true}
		case *nip77.ErrorEnvelope:
			return verdict{} // relay-to-client; khatru ignores it
		}
		return malformed(nostr.UnknownLabel)
	}
	env, err := nostr.NewMessageParser().ParseMessage(string(msg))
	if err != nil {
		return malformed(err)
	}
	switch env := env.(type) {
	case *nostr.ReqEnvelope:
		id := env.SubscriptionID
		if len(id) > lim.maxSubIDLen {
			return verdict{reply: closed(id, fmt.Sprintf("invalid: subscription id longer than %d characters", lim.maxSubIDLen)), what: "req"}
		}
		if n := len(env.Filters); n > lim.maxFilters {
			return verdict{reply: closed(id, fmt.Sprintf("blocked: too many filters in one REQ (%d, limit %d)", n, lim.maxFilters)), what: "req"}
		}
		for _, f := range env.Filters {
			if f.Search != "" {
				return verdict{reply: closed(id, searchUnsupported), what: "req"}
			}
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		_, open := st.subs[id]
		if !open && len(st.subs) >= lim.maxSubs {
			return verdict{reply: closed(id, fmt.Sprintf("blocked: too many open subscriptions (limit %d); CLOSE one first", lim.maxSubs)), what: "req"}
		}
		st.subs[id] = struct{}{}
		return verdict{forward: true, await: answer(id, "EOSE", "CLOSED"), replaces: open}
	case *nostr.CloseEnvelope:
		id := string(*env)
		st.mu.Lock()
		defer st.mu.Unlock()
		if _, open := st.subs[id]; !open {
			return verdict{} // khatru has nothing to close
		}
		delete(st.subs, id)
		return verdict{forward: true, await: awaited{kind: awaitClose, sub: id}}
	case *nostr.CountEnvelope:
		return verdict{forward: true, await: answer(env.SubscriptionID, "COUNT", "CLOSED")}
	case *nostr.AuthEnvelope:
		// khatru checks the AUTH event's signature (nip42) before anything
		// of ours sees it; see badKeyOrSig.
		if reason := keyOrSigReason(env.Event.PubKey, env.Event.Sig); reason != "" {
			return verdict{reply: okFalse(env.Event.ID, reason), what: "malformed"}
		}
		return verdict{forward: true, await: answer("", "OK")}
	}
	return verdict{} // NOTICE, EOSE, OK, CLOSED: relay-to-client, khatru ignores them
}

// badKeyOrSig returns why an EVENT message's event must not reach khatru,
// or "": a pubkey or signature that is not 64 / 128 lower-case hex
// characters. khatru verifies the signature before any hook of ours runs,
// and go-nostr's libsecp256k1 verifier (the default build, docs/decisions.md
// "Signature verification: libsecp256k1 by default, pure Go as fallback")
// panics on an oversized pubkey or signature, which would end the process.
// The event is split as go-nostr splits it (gjson, ["EVENT", ev] or
// ["EVENT", sub, ev]) and every "pubkey" and "sig" member is checked, so a
// duplicate key (the decoder keeps the last) cannot slip past. gjson scans
// without decoding the content, so a large event is not parsed twice.
func badKeyOrSig(msg []byte) string {
	arr := gjson.ParseBytes(msg).Array()
	if len(arr) < 2 || len(arr) > 3 {
		return "" // khatru refuses the envelope without verifying
	}
	reason := ""
	arr[len(arr)-1].ForEach(func(k, v gjson.Result) bool {
		if v.Type != gjson.String {
			return true // null is skipped by the decoder, other types fail it
		}
		switch k.String() {
		case "pubkey":
			if !verify.WellFormedPubKey(v.String()) {
				reason = badPubKey
			}
		case "sig":
			if !verify.WellFormedSig(v.String()) {
				reason = badSig
			}
		}
		return reason == ""
	})
	return reason
}

// The refusals of an event whose pubkey or signature does not have the
// shape a verifier accepts, worded as pkg/policy words them so both builds
// answer alike.
const (
	badPubKey = "invalid: pubkey must be 64 lower-case hex characters"
	badSig    = "invalid: signature must be 128 lower-case hex characters"
)

// keyOrSigReason is the refusal for pubkey and sig, or "" if both are well
// formed.
func keyOrSigReason(pubkey, sig string) string {
	switch {
	case !verify.WellFormedPubKey(pubkey):
		return badPubKey
	case !verify.WellFormedSig(sig):
		return badSig
	}
	return ""
}

// malformed is the answer to a message khatru could not parse, worded as
// khatru words it.
func malformed(err error) verdict {
	return verdict{reply: notice(parseFailure + err.Error()), what: "malformed"}
}

// isLabel reports whether l can be a message label: letters and dashes.
func isLabel(l string) bool {
	if l == "" {
		return false
	}
	for _, r := range l {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') && r != '-' {
			return false
		}
	}
	return true
}

func (st *connState) forget(id string) {
	st.mu.Lock()
	delete(st.subs, id)
	st.mu.Unlock()
}

// label returns the first element of a JSON array message if it is a
// string of letters and dashes, without parsing the rest (an EVENT can be
// half a megabyte).
func label(msg []byte) string {
	msg = bytes.TrimLeft(msg, " \t\r\n")
	if len(msg) < 2 || msg[0] != '[' {
		return ""
	}
	msg = bytes.TrimLeft(msg[1:], " \t\r\n")
	if len(msg) < 2 || msg[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(msg[1:], '"')
	if end < 0 || end > 16 {
		return ""
	}
	return string(msg[1 : 1+end])
}

var idField = regexp.MustCompile(`"id"\s*:\s*"([0-9a-f]{64})"`)

// eventID finds the id of the event in an EVENT message (or its first
// bytes) without parsing it whole; "" if not found.
func eventID(msg []byte) string {
	if m := idField.FindSubmatch(msg); m != nil {
		return string(m[1])
	}
	return ""
}

func okFalse(id, reason string) []byte {
	b, _ := json.Marshal([]any{"OK", id, false, reason})
	return b
}

func closed(id, reason string) []byte {
	b, _ := json.Marshal(nostr.ClosedEnvelope{SubscriptionID: id, Reason: reason})
	return b
}

func notice(text string) []byte {
	b, _ := json.Marshal(nostr.NoticeEnvelope(text))
	return b
}

// oversized answers a message over the size limit from its first bytes.
func oversized(head []byte, limit int) []byte {
	if label(head) == "EVENT" {
		return okFalse(eventID(head), fmt.Sprintf("invalid: event too large (message over %d bytes)", limit))
	}
	return notice(fmt.Sprintf("invalid: message too large (over %d bytes)", limit))
}

// rewriteServerMessage turns khatru's non-standard NEG-ERROR into NIP-77's
// NEG-ERR with a prefixed reason, and reports CLOSED subscription ids. It
// returns msg itself when there is nothing to change.
func rewriteServerMessage(msg []byte) (out []byte, closedID string) {
	switch label(msg) {
	case "NEG-ERROR":
		var parts []string
		if err := json.Unmarshal(msg, &parts); err != nil || len(parts) < 2 {
			return bytes.Replace(msg, []byte(`"NEG-ERROR"`), []byte(`"NEG-ERR"`), 1), ""
		}
		reason := ""
		if len(parts) > 2 {
			reason = parts[2]
		}
		b, _ := json.Marshal([]string{"NEG-ERR", parts[1], negReason(reason)})
		return b, ""
	case "CLOSED":
		var parts []string
		if json.Unmarshal(msg, &parts) == nil && len(parts) >= 2 {
			return msg, parts[1]
		}
	}
	return msg, ""
}

// negReason gives khatru's negentropy errors the machine-readable prefixes
// NIP-77 uses ("closed:" for a session the relay no longer has, "blocked:"
// and "error:" otherwise).
func negReason(r string) string {
	switch {
	case r == "CLOSED":
		return "closed: unknown or expired negentropy session"
	case strings.HasPrefix(r, "invalid limit"):
		return "blocked: " + r
	case r == "":
		return "error: negentropy failed"
	}
	return nostr.NormalizeOKMessage(r, "error")
}

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
}

func newGuardConn(c net.Conn, lim connLimits, eventAllowed func() bool, onRefuse func(string)) *guardConn {
	return &guardConn{Conn: c, lim: lim, st: newConnState(), eventAllowed: eventAllowed, onRefuse: onRefuse,
		closed: make(chan struct{})}
}

// Read hands khatru the client's frames after inspection, each message only
// once khatru has finished the one before (order.go).
func (c *guardConn) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.held != nil {
			err := c.settle()
			if err == nil {
				c.forward(c.heldOp, c.held, c.heldAwait)
			} else {
				c.rerr = err
			}
			c.held = nil
			continue
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		progressed, err := c.step()
		if err != nil {
			// Let khatru see what came before, then the error.
			c.rerr = err
			continue
		}
		if !progressed {
			if err := c.fill(); err != nil {
				c.rerr = err
			}
		}
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	if len(c.out) == 0 {
		c.out = nil
	}
	return n, nil
}

// fill reads more client bytes.
func (c *guardConn) fill() error {
	var tmp [32 << 10]byte
	n, err := c.Conn.Read(tmp[:])
	c.rbuf = append(c.rbuf, tmp[:n]...)
	if n > 0 {
		return nil
	}
	if err == nil {
		err = errors.New("websocket: empty read")
	}
	return err
}

// step consumes what it can from rbuf; false when it needs more bytes.
func (c *guardConn) step() (bool, error) {
	if c.skip > 0 {
		if len(c.rbuf) == 0 {
			return false, nil
		}
		n := min(uint64(len(c.rbuf)), c.skip)
		c.rbuf = c.rbuf[n:]
		c.skip -= n
		return true, nil
	}
	h, ok, err := parseHeader(c.rbuf)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, nil
	}
	if h.control() {
		total := h.headLen + int(h.length)
		if len(c.rbuf) < total {
			return false, nil
		}
		c.out = append(c.out, c.rbuf[:total]...)
		c.rbuf = c.rbuf[total:]
		return true, nil
	}
	starts := h.opcode != opContinuation
	if starts == c.inMsg {
		return false, errBadFrame // continuation without a message, or a new message inside one
	}
	if c.dropping || uint64(len(c.msg))+h.length > uint64(c.lim.maxMessage) {
		if !c.dropping {
			// Answered after khatru's answer to the message before.
			if err := c.settle(); err != nil {
				return false, err
			}
		}
		return c.drop(h), nil
	}
	total := h.headLen + int(h.length)
	if len(c.rbuf) < total {
		return false, nil
	}
	payload := c.rbuf[h.headLen:total]
	if h.masked {
		unmask(payload, h.mask, 0)
	}
	if starts {
		c.inMsg, c.msgOp, c.msg = true, h.opcode, c.msg[:0]
	}
	c.msg = append(c.msg, payload...)
	c.rbuf = c.rbuf[total:]
	if h.fin {
		c.inMsg = false
		err := c.deliver()
		c.msg = c.msg[:0]
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// drop starts or continues discarding an oversized message, answering it
// once from its first bytes.
func (c *guardConn) drop(h frameHeader) bool {
	if !c.dropping {
		head := append([]byte(nil), c.msg...)
		avail := c.rbuf[h.headLen:min(len(c.rbuf), h.headLen+int(min(h.length, 4096)))]
		chunk := append([]byte(nil), avail...)
		if h.masked {
			unmask(chunk, h.mask, 0)
		}
		head = append(head, chunk...)
		c.dropping = true
		c.msg = c.msg[:0]
		c.refuse("message-too-large", oversized(head, c.lim.maxMessage))
	}
	c.inMsg = !h.fin
	if h.fin {
		c.dropping = false
	}
	c.rbuf = c.rbuf[h.headLen:]
	c.skip = h.length
	return true
}

// deliver decides on a complete client message, once khatru has finished
// the previous one. khatru treats binary messages as text, so does the
// guard.
func (c *guardConn) deliver() error {
	if err := c.settle(); err != nil {
		return err
	}
	v := inspect(c.msg, c.st, c.lim, c.eventAllowed)
	if !v.forward {
		if v.reply != nil {
			c.refuse(v.what, v.reply)
		}
		return nil
	}
	if v.replaces {
		b, _ := json.Marshal(nostr.CloseEnvelope(v.await.sub))
		c.forward(opText, b, awaited{kind: awaitClose, sub: v.await.sub})
		c.held = append([]byte(nil), c.msg...)
		c.heldOp, c.heldAwait = c.msgOp, v.await
		return nil
	}
	c.forward(c.msgOp, c.msg, v.await)
	return nil
}

// forward queues a client message for khatru and notes what will end
// khatru's work on it.
func (c *guardConn) forward(op byte, msg []byte, a awaited) {
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

// errOrderWait ends a wait for khatru that took longer than orderWait.
var errOrderWait = errors.New("khatru did not finish the previous message in time")

// settle waits until khatru has finished the last forwarded message: its
// answer passed (observe), or for a CLOSE, the subscription's contexts are
// cancelled. It fails only when the connection is closed; after orderWait
// it gives up waiting (order.go).
func (c *guardConn) settle() error {
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
	wait := c.lim.orderWait
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
func (c *guardConn) observe(msg []byte) {
	c.seqMu.Lock()
	defer c.seqMu.Unlock()
	p := c.waiting
	if p == nil || p.answered || !p.await.ends(msg) {
		return
	}
	p.answered = true
	close(p.done)
}

// Close closes the connection and ends any wait for khatru.
func (c *guardConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

func (c *guardConn) refuse(what string, reply []byte) {
	if c.onRefuse != nil {
		c.onRefuse(what)
	}
	if reply != nil {
		_ = c.inject(reply)
	}
}

// inject sends a guard answer, between khatru's messages.
func (c *guardConn) inject(msg []byte) error {
	frame := appendFrame(nil, opText, true, false, msg)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// Bytes in wbuf are not on the wire yet, so only a fragmented server
	// message in progress makes the answer wait.
	if c.wmsg {
		c.pending = append(c.pending, frame)
		return nil
	}
	if !c.upgraded {
		c.pending = append(c.pending, frame)
		return nil
	}
	return c.send(frame)
}

// send writes to the client within the write timeout; c.wmu held. A client
// that stops reading is disconnected rather than allowed to block khatru's
// writers (a broadcast holds khatru's lock over every subscription).
func (c *guardConn) send(b []byte) error {
	timeout := c.lim.writeTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Conn.Write(b); err != nil {
		_ = c.Close()
		return err
	}
	return nil
}

// Write passes khatru's frames on, rewriting NEG-ERROR, once each frame is
// whole.
func (c *guardConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.upgraded {
		// The upgrader writes the HTTP 101 response through this
		// connection first, in one write.
		end := bytes.Index(p, []byte("\r\n\r\n"))
		if end < 0 {
			return c.Conn.Write(p)
		}
		c.upgraded = true
		if _, err := c.Conn.Write(p[:end+4]); err != nil {
			return 0, err
		}
		if n, err := c.writeFrames(p[end+4:]); err != nil {
			return end + 4 + n, err
		}
		return len(p), nil
	}
	return c.writeFrames(p)
}

// writeFrames is Write once the connection speaks websocket; c.wmu held.
func (c *guardConn) writeFrames(p []byte) (int, error) {
	c.wbuf = append(c.wbuf, p...)
	for {
		h, ok, err := parseHeader(c.wbuf)
		if err != nil {
			// Not a frame stream we understand: pass everything through.
			werr := c.send(c.wbuf)
			c.wbuf = nil
			if werr != nil {
				return 0, werr
			}
			return len(p), nil
		}
		total := uint64(h.headLen) + h.length
		if !ok || uint64(len(c.wbuf)) < total {
			break
		}
		frame := c.wbuf[:total]
		starts := !h.control() && h.opcode != opContinuation && !h.masked
		if starts && h.fin {
			payload := frame[h.headLen:]
			if out, closedID := rewriteServerMessage(payload); closedID != "" {
				c.st.forget(closedID)
			} else if len(out) != len(payload) || !bytes.Equal(out, payload) {
				frame = appendFrame(nil, h.opcode, true, false, out)
			}
		} else if starts && bytes.HasPrefix(frame[h.headLen:], []byte(`["NEG-ERROR"`)) {
			// A fragmented NEG-ERROR (a very long reason): fix the label.
			payload := bytes.Replace(frame[h.headLen:], []byte(`"NEG-ERROR"`), []byte(`"NEG-ERR"`), 1)
			frame = appendFrame(nil, h.opcode, false, false, payload)
		}
		if err := c.send(frame); err != nil {
			return 0, err
		}
		if starts {
			c.observe(c.wbuf[h.headLen:total])
		}
		c.wbuf = c.wbuf[total:]
		if !h.control() {
			c.wmsg = !h.fin
		}
		if !c.wmsg && len(c.pending) > 0 {
			for _, f := range c.pending {
				if err := c.send(f); err != nil {
					return 0, err
				}
			}
			c.pending = nil
		}
	}
	if len(c.wbuf) == 0 {
		c.wbuf = nil
	}
	return len(p), nil
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
