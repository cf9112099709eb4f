package testrelay

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
)

// Public relays enforce limits a plain khatru relay does not (issue 30):
// the size of a client message, the subscriptions a connection may hold
// open, the filters of one REQ, the events one filter returns. How strfry
// and nostr-rs-relay enforce each, and which file or config key it comes
// from, is in docs/dependencies.md ("Public relays' limits"); the test
// relays reproduce that behaviour on the wire, with the same texts, so the
// fetcher can be tested against what it meets.
//
// The limits are enforced below khatru, on the socket: a limitConn reads
// the client's websocket frames, refuses what the real software refuses
// (dropping the message before khatru sees it, or ending the connection)
// and answers through khatru's own writer, so its replies never interleave
// with khatru's frames.

// LimitStyle is whose answers a limited relay gives.
type LimitStyle string

const (
	// StyleStrfry answers as strfry does (the default): an oversized
	// message ends the TCP connection at once with no close frame and no
	// notice; a REQ over the subscription limit gets NOTICE
	// StrfryTooManyREQs and nothing else; a NEG-OPEN over it NOTICE
	// StrfryTooManyNEGs; a REQ with too many filters CLOSED
	// StrfryTooManyFilters.
	StyleStrfry LimitStyle = "strfry"
	// StyleNostrRsRelay answers as nostr-rs-relay does: an oversized
	// message gets NOTICE "message too large (N > MAX)" and then the
	// connection ends with no close frame; a REQ over the subscription
	// limit gets NOTICE NostrRsRelayTooManySubs. nostr-rs-relay has no
	// filter limit: a farm that sets one answers with strfry's CLOSED.
	StyleNostrRsRelay LimitStyle = "nostr-rs-relay"
	// StyleClosed answers as a relay that follows NIP-01 to the letter
	// does (khatru-based relays' own size limit): an oversized message gets
	// a websocket close frame with status 1009 (message too big); a REQ
	// over the subscription limit and one with too many filters get a
	// CLOSED (ClosedTooManySubs, ClosedTooManyFilters), a NEG-OPEN over it
	// a NEG-ERR.
	StyleClosed LimitStyle = "closed"
)

// The refusal texts of the real software (docs/dependencies.md cites their
// origin), and the ones StyleClosed uses.
const (
	StrfryTooManyREQs       = "ERROR: too many concurrent REQs"
	StrfryTooManyNEGs       = "ERROR: too many concurrent NEG requests"
	StrfryTooManyFilters    = "ERROR: bad req: arr too big"
	NostrRsRelayTooManySubs = "Subscription error: Maximum concurrent subscription count reached"
	// nostrRsRelayTooLarge is formatted with the message's size and the
	// limit.
	nostrRsRelayTooLarge = "message too large (%d > %d)"
	// ClosedTooManySubs and ClosedTooManyFilters are StyleClosed's
	// reasons: no relay we read has these exact texts, so they carry
	// NIP-01's machine-readable "error:" prefix and strfry's wording.
	ClosedTooManySubs    = "error: too many concurrent REQs"
	ClosedTooManyFilters = "error: too many filters"
	// AuthReadsReason is a relay's CLOSED reason for a read by a client
	// that has not authenticated (FarmOptions.AuthReadsFraction).
	AuthReadsReason = "auth-required: reading here requires NIP-42 authentication"
)

// CloseMessageTooBig is the websocket close status StyleClosed sends for an
// oversized message (RFC 6455 §7.4.1).
const CloseMessageTooBig = 1009

// Limits are the limits a test relay enforces on each client
// connection, as public relays do. The zero value is unlimited: nothing is
// refused and NIP-11 says nothing.
type Limits struct {
	// MaxMessageBytes is the largest client message accepted, in payload
	// bytes (strfry's maxWebsocketPayloadSize and nostr-rs-relay's
	// max_ws_message_bytes, both 131,072 by default). 0: unlimited.
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`
	// MaxSubscriptions is how many REQ subscriptions a connection may hold
	// open (strfry's maxSubsPerConnection, 20 for years and 200 now;
	// nostr-rs-relay's fixed 32). NIP-77 sessions have a pool of the same
	// size of their own, as in strfry. A REQ reusing an open id replaces
	// it; a CLOSE, or the relay's CLOSED, frees its slot. 0: unlimited.
	MaxSubscriptions int `json:"max_subscriptions,omitempty"`
	// MaxFilters is how many filters one REQ may carry (strfry's
	// maxReqFilterSize, 20 then 200). 0: unlimited.
	MaxFilters int `json:"max_filters,omitempty"`
	// Style is whose answers the relay gives ("" means StyleStrfry).
	Style LimitStyle `json:"style,omitempty"`
	// Advertise publishes the limits in NIP-11 as strfry does: a
	// "limitation" object with max_message_length, max_subscriptions and
	// max_limit (the per-filter cap). Without it the document has no
	// "limitation", like nostr-rs-relay's (whose only limitation fields
	// are about payment) and khatru's.
	Advertise bool `json:"advertise,omitempty"`
}

// active reports whether any limit is set (Advertise alone changes only
// NIP-11).
func (l Limits) active() bool {
	return l.MaxMessageBytes > 0 || l.MaxSubscriptions > 0 || l.MaxFilters > 0
}

func (l Limits) style() LimitStyle {
	if l.Style == "" {
		return StyleStrfry
	}
	return l.Style
}

// Validate reports an unknown Style or a negative limit.
func (l Limits) Validate() error {
	switch l.style() {
	case StyleStrfry, StyleNostrRsRelay, StyleClosed:
	default:
		return fmt.Errorf("relay limits: unknown style %q (want %s, %s or %s)", l.Style, StyleStrfry, StyleNostrRsRelay, StyleClosed)
	}
	if l.MaxMessageBytes < 0 || l.MaxSubscriptions < 0 || l.MaxFilters < 0 {
		return errors.New("relay limits: limits must not be negative")
	}
	return nil
}

// LimitCounts are what a relay's limits refused, and how close clients came.
type LimitCounts struct {
	// TooBig counts connections ended (or closed with 1009) for an
	// oversized message.
	TooBig int64 `json:"refused_too_big"`
	// REQsRefused counts REQs over the subscription limit; NegsRefused
	// NEG-OPENs over it; FiltersRefused REQs with too many filters;
	// AuthRefused reads refused "auth-required:".
	REQsRefused    int64 `json:"refused_reqs"`
	NegsRefused    int64 `json:"refused_negs"`
	FiltersRefused int64 `json:"refused_filters"`
	AuthRefused    int64 `json:"refused_auth"`
	// MaxOpenSubs and MaxOpenNegs are the most REQ subscriptions and
	// NIP-77 sessions one connection held open at once.
	MaxOpenSubs int64 `json:"max_open_subs"`
	MaxOpenNegs int64 `json:"max_open_negs"`
	// LargestMessage is the largest client message seen, in payload bytes
	// (a refused one counts with the size its frame announced);
	// MostFilters the most filters one REQ carried.
	LargestMessage int64 `json:"largest_message"`
	MostFilters    int64 `json:"most_filters"`
}

// limiter is one relay's limits, counters and connections.
type limiter struct {
	lim        Limits
	negentropy bool // NEG-OPENs count only where NIP-77 is served

	tooBig, reqsRefused, negsRefused, filtersRefused, authRefused atomic.Int64
	maxOpenSubs, maxOpenNegs, largest, mostFilters                atomic.Int64

	conns sync.Map // remote address -> *limitConn, for khatru's OnConnect
}

func (l *limiter) counts() LimitCounts {
	return LimitCounts{
		TooBig: l.tooBig.Load(), REQsRefused: l.reqsRefused.Load(), NegsRefused: l.negsRefused.Load(),
		FiltersRefused: l.filtersRefused.Load(), AuthRefused: l.authRefused.Load(),
		MaxOpenSubs: l.maxOpenSubs.Load(), MaxOpenNegs: l.maxOpenNegs.Load(), LargestMessage: l.largest.Load(),
		MostFilters: l.mostFilters.Load(),
	}
}

// install hooks the limiter into rl: its connections learn their khatru
// WebSocket (to answer through it), and oversized messages that khatru's
// own read limit would catch first are left to the limiter.
func (l *limiter) install(rl *khatru.Relay) {
	if l.lim.MaxMessageBytes > 0 && rl.MaxMessageSize < int64(l.lim.MaxMessageBytes)+1 {
		rl.MaxMessageSize = int64(l.lim.MaxMessageBytes) + 1
	}
	rl.OnConnect = append(rl.OnConnect, func(ctx context.Context) {
		ws := khatru.GetConnection(ctx)
		if ws == nil || ws.Request == nil {
			return
		}
		if c, ok := l.conns.Load(ws.Request.RemoteAddr); ok {
			c.(*limitConn).ws.Store(ws)
		}
	})
}

// wrap puts conn under the limiter.
func (l *limiter) wrap(conn net.Conn) *limitConn {
	c := &limitConn{Conn: conn, l: l, subs: map[string]struct{}{}, negs: map[string]struct{}{}}
	c.out = frameSniffer{line: nil, keep: maxPrefix, onPrefix: c.sawReply}
	l.conns.Store(conn.RemoteAddr().String(), c)
	return c
}

// limitListener puts every accepted connection under a limiter.
type limitListener struct {
	net.Listener
	l *limiter
}

func (ll limitListener) Accept() (net.Conn, error) {
	conn, err := ll.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return ll.l.wrap(conn), nil
}

// limitConn enforces a relay's limits on one client connection. Until the
// relay answers the websocket upgrade it passes bytes through (an HTTP
// exchange such as NIP-11); then it reads whole frames, holds a data
// message's frames until its last one, and passes the message on to khatru
// or refuses it.
type limitConn struct {
	net.Conn
	l  *limiter
	ws atomic.Pointer[khatru.WebSocket]

	upgraded atomic.Bool

	// Read side (khatru's one reading goroutine).
	rbuf    []byte // bytes read and not yet framed
	ready   []byte // frames passed, for the caller
	msgRaw  []byte // the frames of the data message being assembled
	msg     []byte // its unmasked payload
	inMsg   bool
	rerr    error // the underlying read's error, once it failed
	dead    error // set once the limiter ended the connection
	scratch []byte

	mu   sync.Mutex // subs, negs: read side and khatru's writers
	subs map[string]struct{}
	negs map[string]struct{}

	outMu sync.Mutex // the write side's sniffer
	out   frameSniffer
}

// errLimitClosed is what khatru reads once the limiter ended a connection.
var errLimitClosed = errors.New("testkit: connection ended by the relay's message size limit")

func (c *limitConn) Read(p []byte) (int, error) {
	for len(c.ready) == 0 {
		if c.dead != nil {
			return 0, c.dead
		}
		if !c.upgraded.Load() {
			return c.Conn.Read(p)
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		if c.scratch == nil {
			c.scratch = make([]byte, 32<<10)
		}
		n, err := c.Conn.Read(c.scratch)
		c.rbuf = append(c.rbuf, c.scratch[:n]...)
		if err != nil {
			c.rerr = err
		}
		c.frames()
	}
	n := copy(p, c.ready)
	c.ready = c.ready[n:]
	if len(c.ready) == 0 {
		c.ready = c.ready[:0:0]
	}
	return n, nil
}

// frames consumes every complete frame of rbuf.
func (c *limitConn) frames() {
	for c.dead == nil {
		b := c.rbuf
		if len(b) < 2 {
			break
		}
		hlen := 2
		switch b[1] & 0x7f {
		case 126:
			hlen += 2
		case 127:
			hlen += 8
		}
		masked := b[1]&0x80 != 0
		if masked {
			hlen += 4
		}
		if len(b) < hlen {
			break
		}
		n := uint64(b[1] & 0x7f)
		switch n {
		case 126:
			n = uint64(binary.BigEndian.Uint16(b[2:4]))
		case 127:
			n = binary.BigEndian.Uint64(b[2:10])
		}
		op := b[0] & 0x0f
		fin := b[0]&0x80 != 0
		data := op < 8
		if data {
			size := n
			if op == 0 {
				size += uint64(len(c.msg))
			}
			if max := c.l.lim.MaxMessageBytes; max > 0 && size > uint64(max) {
				// Both real relays decide on the frame's header, before
				// reading its payload.
				c.tooBig(size, n, uint64(len(b)-hlen))
				return
			}
		}
		if uint64(len(b)-hlen) < n {
			break
		}
		end := hlen + int(n)
		fr := b[:end]
		if !data {
			c.ready = append(c.ready, fr...)
		} else {
			c.msgRaw = append(c.msgRaw, fr...)
			start := len(c.msg)
			c.msg = append(c.msg, fr[hlen:]...)
			if masked {
				key := fr[hlen-4 : hlen]
				for i := range c.msg[start:] {
					c.msg[start+i] ^= key[i%4]
				}
			}
			if fin {
				if int64(len(c.msg)) > c.l.largest.Load() {
					storeMax(&c.l.largest, int64(len(c.msg)))
				}
				if c.admit(c.msg) {
					c.ready = append(c.ready, c.msgRaw...)
				}
				c.msg, c.msgRaw = c.msg[:0], c.msgRaw[:0]
			}
		}
		c.rbuf = b[end:]
	}
	if len(c.rbuf) == 0 {
		c.rbuf = c.rbuf[:0:0]
	}
}

// tooBig refuses an oversized message in the relay's style and ends the
// connection. have is how much of the frame's payload has arrived.
func (c *limitConn) tooBig(size, frameLen, have uint64) {
	c.l.tooBig.Add(1)
	storeMax(&c.l.largest, int64(size))
	max := c.l.lim.MaxMessageBytes
	switch c.l.lim.style() {
	case StyleNostrRsRelay:
		c.reply(nostr.NoticeEnvelope(fmt.Sprintf(nostrRsRelayTooLarge, size, max)))
		// Read the rest of the frame (briefly) so the close is a FIN and
		// not a reset that could discard the notice on its way.
		if rest := int64(frameLen) - int64(have); rest > 0 {
			_ = c.Conn.SetReadDeadline(time.Now().Add(time.Second))
			_, _ = io.CopyN(io.Discard, c.Conn, rest)
		}
	case StyleClosed:
		if ws := c.ws.Load(); ws != nil {
			payload := binary.BigEndian.AppendUint16(nil, CloseMessageTooBig)
			_ = ws.WriteMessage(8, payload) // 8: close frame
		}
	}
	c.dead = errLimitClosed
	_ = c.Conn.Close()
}

// admit decides on one client message: false drops it (after answering as
// the relay would).
func (c *limitConn) admit(msg []byte) bool {
	label := messageLabel(msg[:min(len(msg), labelPrefix)])
	switch label {
	case "REQ", "CLOSE", "NEG-OPEN", "NEG-CLOSE":
	default:
		return true
	}
	var arr []json.RawMessage
	if json.Unmarshal(msg, &arr) != nil || len(arr) < 2 {
		return true // khatru answers malformed messages itself
	}
	var id string
	if json.Unmarshal(arr[1], &id) != nil {
		return true
	}
	lim := c.l.lim
	switch label {
	case "REQ":
		storeMax(&c.l.mostFilters, int64(len(arr)-2))
		if lim.MaxFilters > 0 && len(arr)-2 > lim.MaxFilters {
			c.l.filtersRefused.Add(1)
			reason := StrfryTooManyFilters
			if lim.style() == StyleClosed {
				reason = ClosedTooManyFilters
			}
			c.reply(nostr.ClosedEnvelope{SubscriptionID: id, Reason: reason})
			return false
		}
		if !c.open(c.subs, id, lim.MaxSubscriptions, &c.l.maxOpenSubs) {
			c.l.reqsRefused.Add(1)
			switch lim.style() {
			case StyleNostrRsRelay:
				c.reply(nostr.NoticeEnvelope(NostrRsRelayTooManySubs))
			case StyleClosed:
				c.reply(nostr.ClosedEnvelope{SubscriptionID: id, Reason: ClosedTooManySubs})
			default:
				c.reply(nostr.NoticeEnvelope(StrfryTooManyREQs))
			}
			return false
		}
	case "CLOSE":
		c.shut(c.subs, id)
	case "NEG-OPEN":
		if !c.l.negentropy {
			return true // khatru without NIP-77 answers a NOTICE itself
		}
		if !c.open(c.negs, id, lim.MaxSubscriptions, &c.l.maxOpenNegs) {
			c.l.negsRefused.Add(1)
			if lim.style() == StyleClosed {
				c.reply(nip77.ErrorEnvelope{SubscriptionID: id, Reason: ClosedTooManySubs})
			} else {
				c.reply(nostr.NoticeEnvelope(StrfryTooManyNEGs))
			}
			return false
		}
	case "NEG-CLOSE":
		c.shut(c.negs, id)
	}
	return true
}

// open takes a slot for id in set unless the set is full (max > 0); an id
// already open keeps its slot, as both real relays replace it.
func (c *limitConn) open(set map[string]struct{}, id string, max int, most *atomic.Int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := set[id]; !ok {
		if max > 0 && len(set) >= max {
			return false
		}
		set[id] = struct{}{}
	}
	storeMax(most, int64(len(set)))
	return true
}

func (c *limitConn) shut(set map[string]struct{}, id string) {
	c.mu.Lock()
	delete(set, id)
	c.mu.Unlock()
}

// reply sends v to the client through khatru's writer.
func (c *limitConn) reply(v any) {
	if ws := c.ws.Load(); ws != nil {
		_ = ws.WriteJSON(v)
	}
}

// sawReply frees the slot of a subscription the relay ended itself: a
// CLOSED (a refused filter, "auth-required:") or a NEG-ERR.
func (c *limitConn) sawReply(prefix []byte) {
	label := messageLabel(prefix[:min(len(prefix), labelPrefix)])
	if label != "CLOSED" && label != "NEG-ERR" {
		return
	}
	id, ok := secondString(prefix)
	if !ok {
		return
	}
	if label == "CLOSED" {
		c.shut(c.subs, id)
	} else {
		c.shut(c.negs, id)
	}
}

// secondString is the second element of a JSON array prefix when it is a
// plain string (`["CLOSED","sub",…` → "sub").
func secondString(p []byte) (string, bool) {
	i := bytes.IndexByte(p, ',')
	if i < 0 {
		return "", false
	}
	p = bytes.TrimLeft(p[i+1:], " \t\r\n")
	if len(p) == 0 || p[0] != '"' {
		return "", false
	}
	p = p[1:]
	j := bytes.IndexByte(p, '"')
	if j < 0 || bytes.IndexByte(p[:j], '\\') >= 0 {
		return "", false
	}
	return string(p[:j]), true
}

func (c *limitConn) Write(p []byte) (int, error) {
	if !c.upgraded.Load() {
		n, err := c.Conn.Write(p)
		// The upgrade's answer is written in one piece (fasthttp/websocket).
		if bytes.HasPrefix(p, []byte("HTTP/1.1 101")) {
			c.upgraded.Store(true)
		}
		return n, err
	}
	// Sniffed before it is written: a client that reads the CLOSED may send
	// its next REQ at once, and that REQ must find the slot free, as in
	// strfry, where a refused REQ never took one.
	c.outMu.Lock()
	c.out.feed(p)
	c.outMu.Unlock()
	return c.Conn.Write(p)
}

func (c *limitConn) Close() error {
	c.l.conns.Delete(c.Conn.RemoteAddr().String())
	return c.Conn.Close()
}

// storeMax raises v to n.
func storeMax(v *atomic.Int64, n int64) {
	for {
		m := v.Load()
		if n <= m || v.CompareAndSwap(m, n) {
			return
		}
	}
}

// limitsNIP11 serves NIP-11 for rl with the limits in "limitation" when
// they are advertised (strfry's three fields, nothing else), and passes
// every other request to rl.
func limitsNIP11(rl *khatru.Relay, lim Limits, maxLimit int) http.Handler {
	if !lim.Advertise {
		return rl
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" || r.Header.Get("Accept") != "application/nostr+json" {
			rl.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		rl.ServeHTTP(rec, r)
		var doc map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			http.Error(w, "nip11: "+err.Error(), http.StatusInternalServerError)
			return
		}
		limitation := map[string]any{"max_limit": maxLimit}
		if lim.MaxMessageBytes > 0 {
			limitation["max_message_length"] = lim.MaxMessageBytes
		}
		if lim.MaxSubscriptions > 0 {
			limitation["max_subscriptions"] = lim.MaxSubscriptions
		}
		doc["limitation"] = limitation
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_ = json.NewEncoder(w).Encode(doc)
	})
}
