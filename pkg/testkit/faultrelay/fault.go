package faultrelay

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip42"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// Faults is what a Relay does wrong. The zero value forwards
// everything unchanged. Counters (RateLimitREQs) are consumed as they fire.
type Faults struct {
	// DropAfterEvents closes a connection (without a close handshake) once it
	// has forwarded this many EVENT messages.
	DropAfterEvents int
	// DropMidNegentropy closes the connection instead of forwarding the
	// relay's first NEG-MSG answer.
	DropMidNegentropy bool
	// NegOpenAnswer answers every NEG-OPEN itself instead of forwarding it:
	// "NEG-ERR" or "NEG-ERROR" (khatru's label) with NegOpenText as reason,
	// "NOTICE" with NegOpenText as the notice, or "SILENT": no answer at all.
	NegOpenAnswer string
	NegOpenText   string
	// WithholdIDs answers every REQ whose filters name ids with EOSE only,
	// like a relay whose negentropy set lies.
	WithholdIDs bool
	// PageCap forwards at most this many events per REQ, then EOSE.
	PageCap int
	// RateLimitREQs answers this many of the next REQs with CLOSED
	// RateLimitReason (default "rate-limited: slow down").
	RateLimitREQs   int
	RateLimitReason string
	// NoticeOnREQ sends this NOTICE right after forwarding a REQ.
	NoticeOnREQ string
	// StallAfterEvents stops a connection after forwarding this many EVENT
	// messages: nothing more is forwarded either way and pings go
	// unanswered, but the TCP connection stays open. Negative stalls at once.
	StallAfterEvents int
	// Inject returns raw messages sent to the client right before the EOSE
	// of each REQ (malformed JSON, events with bad ids or signatures,
	// oversized messages …).
	Inject func(subID string) [][]byte
	// RejectConnections answers this many of the next websocket upgrades
	// with HTTP 503.
	RejectConnections int
	// RequireAuth sends a NIP-42 AUTH challenge on connect and refuses REQs
	// and NEG-OPENs with "auth-required:" until the client authenticates.
	RequireAuth bool
}

// ConnSpan is when one client connection to a Relay was open (Closed is
// zero while it is).
type ConnSpan struct {
	Opened, Closed time.Time
}

// Relay is a real websocket server in front of a testrelay.Relay that forwards
// every message both ways and injects the faults it is told to, so clients
// can be tested against the misbehaviour of real relays. Nothing is mocked:
// the relay behind it is a khatru relay.
type Relay struct {
	// URL is the websocket URL clients dial, ws://127.0.0.1:PORT.
	URL string
	// Relay is the relay behind the faults.
	Relay *testrelay.Relay

	srv       *http.Server
	info      *httputil.ReverseProxy // plain HTTP (NIP-11) to the relay
	outer     net.Listener
	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	pipes     sync.Map // inner-side local address (string) -> *pipe

	mu      sync.Mutex
	faults  Faults
	spans   []*ConnSpan
	reqs    int
	negOpen int
	authed  []string
}

// Start starts a Relay in front of a new testrelay.Relay configured by
// opts. Both stop when the test ends.
func Start(t testing.TB, opts testrelay.Options) *Relay {
	t.Helper()
	up := testrelay.Start(t, opts)
	// Clients reach the websocket proxy through a TCP pipe of ours, so a
	// stall can stop every byte, pongs included, without closing anything.
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultrelay: listen for fault relay: %v", err)
	}
	outer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = inner.Close()
		t.Fatalf("faultrelay: listen for fault relay: %v", err)
	}
	f := &Relay{Relay: up, URL: "ws://" + outer.Addr().String(), outer: outer, closing: make(chan struct{})}
	upHTTP, err := url.Parse(up.HTTPURL)
	if err != nil {
		t.Fatalf("faultrelay: relay address %q: %v", up.HTTPURL, err)
	}
	f.info = httputil.NewSingleHostReverseProxy(upHTTP)
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.srv.Serve(inner) }()
	f.wg.Add(1)
	go f.acceptPipes(outer, inner.Addr().String())
	t.Cleanup(f.Close)
	return f
}

// pipe copies bytes between a client and the proxy until stalled, then
// swallows what the client sends and forwards nothing.
type pipe struct {
	client, inner net.Conn
	stalled       chan struct{}
	once          sync.Once
}

func (p *pipe) stall() { p.once.Do(func() { close(p.stalled) }) }

// copy forwards src to dst until either side ends. When toClient is set, src
// is the proxy's side and its first bytes are the HTTP upgrade response: those
// are forwarded even after a stall, because the proxy stalls right after
// accepting the upgrade and the copy may not yet have forwarded the response
// (a client that never sees it fails to dial instead of meeting a silent
// connection).
func (p *pipe) copy(dst, src net.Conn, toClient bool) {
	buf := make([]byte, 32<<10)
	header := !toClient // true once the upgrade response has gone through
	var tail []byte     // the last bytes of the response seen so far
	for {
		n, err := src.Read(buf)
		chunk := buf[:n]
		if n > 0 && !header {
			end := headerEnd(tail, chunk)
			if end >= 0 {
				header = true
				if _, werr := dst.Write(chunk[:end]); werr != nil {
					err = werr
				}
				chunk = chunk[end:]
			} else {
				if _, werr := dst.Write(chunk); werr != nil {
					err = werr
				}
				tail = append(tail, chunk...)
				if len(tail) > 3 {
					tail = tail[len(tail)-3:]
				}
				chunk = nil
			}
		}
		if len(chunk) > 0 && err == nil {
			select {
			case <-p.stalled:
			default:
				if _, werr := dst.Write(chunk); werr != nil {
					err = werr
				}
			}
		}
		if err != nil {
			_ = p.client.Close()
			_ = p.inner.Close()
			return
		}
	}
}

// headerEnd returns the index in chunk just past the blank line that ends an
// HTTP header, given the up to 3 bytes seen before chunk, or -1.
func headerEnd(tail, chunk []byte) int {
	joined := append(append([]byte{}, tail...), chunk...)
	i := bytes.Index(joined, []byte("\r\n\r\n"))
	if i < 0 {
		return -1
	}
	return i + 4 - len(tail)
}

func (f *Relay) acceptPipes(outer net.Listener, innerAddr string) {
	defer f.wg.Done()
	for {
		client, err := outer.Accept()
		if err != nil {
			return
		}
		inner, err := net.Dial("tcp", innerAddr)
		if err != nil {
			_ = client.Close()
			continue
		}
		p := &pipe{client: client, inner: inner, stalled: make(chan struct{})}
		key := inner.LocalAddr().String()
		f.pipes.Store(key, p)
		f.wg.Add(2)
		go func() { defer f.wg.Done(); p.copy(inner, client, false) }()
		go func() { defer f.wg.Done(); p.copy(client, inner, true); f.pipes.Delete(key) }()
	}
}

// Set replaces the faults; connections already open follow them from their
// next message.
func (f *Relay) Set(faults Faults) {
	f.mu.Lock()
	f.faults = faults
	f.mu.Unlock()
}

// Add stores events in the relay behind the faults.
func (f *Relay) Add(t testing.TB, evts ...*nostr.Event) { f.Relay.Add(t, evts...) }

// Spans returns the connections accepted so far.
func (f *Relay) Spans() []ConnSpan {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]ConnSpan, len(f.spans))
	for i, s := range f.spans {
		out[i] = *s
	}
	return out
}

// OpenConnections is how many client connections are open now.
func (f *Relay) OpenConnections() int {
	n := 0
	for _, s := range f.Spans() {
		if s.Closed.IsZero() {
			n++
		}
	}
	return n
}

// REQs is how many REQ messages clients sent.
func (f *Relay) REQs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reqs
}

// NegOpens is how many NEG-OPEN messages clients sent.
func (f *Relay) NegOpens() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.negOpen
}

// Authed lists the pubkeys that authenticated with NIP-42.
func (f *Relay) Authed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.authed...)
}

// Close stops the server and every connection (stalled ones included).
func (f *Relay) Close() {
	f.closeOnce.Do(func() {
		close(f.closing)
		_ = f.outer.Close()
		_ = f.srv.Close()
		f.pipes.Range(func(_, v any) bool {
			p := v.(*pipe)
			_ = p.client.Close()
			_ = p.inner.Close()
			return true
		})
		f.wg.Wait()
	})
}

func (f *Relay) current() Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faults
}

// faultConn is one proxied client connection.
type faultConn struct {
	f        *Relay
	client   *websocket.Conn
	upstream *websocket.Conn
	ctx      context.Context
	cancel   context.CancelFunc

	mu        sync.Mutex
	events    int
	perSub    map[string]int
	capped    map[string]bool
	negMsgs   int
	challenge string
	authed    bool
	pipe      *pipe
	writeMu   sync.Mutex
}

func (f *Relay) serve(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		// NIP-11 and other plain HTTP: the relay's own answer.
		f.info.ServeHTTP(w, r)
		return
	}
	f.mu.Lock()
	reject := f.faults.RejectConnections > 0
	if reject {
		f.faults.RejectConnections--
	}
	f.mu.Unlock()
	if reject {
		http.Error(w, "try again later", http.StatusServiceUnavailable)
		return
	}
	client, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	client.SetReadLimit(16 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	upstream, _, err := websocket.Dial(ctx, f.Relay.URL, nil)
	if err != nil {
		_ = client.Close(websocket.StatusInternalError, "upstream unavailable")
		return
	}
	upstream.SetReadLimit(16 << 20)
	span := &ConnSpan{Opened: time.Now()}
	f.mu.Lock()
	f.spans = append(f.spans, span)
	f.mu.Unlock()
	f.wg.Add(1)
	defer f.wg.Done()
	c := &faultConn{f: f, client: client, upstream: upstream, ctx: ctx, cancel: cancel,
		perSub: map[string]int{}, capped: map[string]bool{}}
	if p, ok := f.pipes.Load(r.RemoteAddr); ok {
		c.pipe = p.(*pipe)
	}
	defer func() {
		_ = client.CloseNow()
		_ = upstream.CloseNow()
		f.mu.Lock()
		span.Closed = time.Now()
		f.mu.Unlock()
	}()
	go func() {
		select {
		case <-f.closing:
		case <-ctx.Done():
		}
		cancel()
	}()
	if fl := f.current(); fl.StallAfterEvents < 0 {
		c.stall()
	}
	if f.current().RequireAuth {
		c.challenge = randomHex(16)
		c.send([]byte(`["AUTH","` + c.challenge + `"]`))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		c.pumpUp()
	}()
	c.pumpDown()
	cancel()
	<-done
}

// stall stops every byte between the client and us from now on; the
// client sees a silent, open connection.
func (c *faultConn) stall() {
	if c.pipe != nil {
		c.pipe.stall()
	}
}

func (c *faultConn) send(data []byte) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_ = c.client.Write(c.ctx, websocket.MessageText, data)
}

func (c *faultConn) drop() {
	_ = c.client.CloseNow()
	c.cancel()
}

// pumpUp forwards client → relay.
func (c *faultConn) pumpUp() {
	for {
		_, data, err := c.client.Read(c.ctx)
		if err != nil {
			return
		}
		fl := c.f.current()
		label := gjson.GetBytes(data, "0").String()
		sub := gjson.GetBytes(data, "1").String()
		switch label {
		case "AUTH":
			if c.challenge != "" {
				var evt nostr.Event
				ok := json.Unmarshal([]byte(gjson.GetBytes(data, "1").Raw), &evt) == nil
				if ok {
					valid, _ := evt.CheckSignature()
					_, match := nip42.ValidateAuthEvent(&evt, c.challenge, c.f.URL)
					ok = valid && match && evt.CheckID()
				}
				c.mu.Lock()
				c.authed = c.authed || ok
				c.mu.Unlock()
				if ok {
					c.f.mu.Lock()
					c.f.authed = append(c.f.authed, evt.PubKey)
					c.f.mu.Unlock()
				}
				reply, _ := json.Marshal([]any{"OK", evt.ID, ok, map[bool]string{true: "", false: "invalid: auth failed"}[ok]})
				c.send(reply)
				continue
			}
		case "REQ":
			c.f.mu.Lock()
			c.f.reqs++
			limited := c.f.faults.RateLimitREQs > 0
			if limited {
				c.f.faults.RateLimitREQs--
			}
			c.f.mu.Unlock()
			if fl.RequireAuth && !c.isAuthed() {
				c.send(closed(sub, "auth-required: this relay needs NIP-42 authentication"))
				continue
			}
			if limited {
				reason := fl.RateLimitReason
				if reason == "" {
					reason = "rate-limited: slow down"
				}
				c.send(closed(sub, reason))
				continue
			}
			if fl.WithholdIDs && hasIDs(data) {
				c.send([]byte(`["EOSE",` + quote(sub) + `]`))
				continue
			}
			c.mu.Lock()
			c.perSub[sub] = 0
			delete(c.capped, sub)
			c.mu.Unlock()
			if err := c.upstream.Write(c.ctx, websocket.MessageText, data); err != nil {
				return
			}
			if fl.NoticeOnREQ != "" {
				n, _ := json.Marshal([]string{"NOTICE", fl.NoticeOnREQ})
				c.send(n)
			}
			continue
		case "NEG-OPEN":
			c.f.mu.Lock()
			c.f.negOpen++
			c.f.mu.Unlock()
			if fl.RequireAuth && !c.isAuthed() {
				c.send([]byte(`["NEG-ERR",` + quote(sub) + `,"auth-required: authenticate first"]`))
				continue
			}
			switch fl.NegOpenAnswer {
			case "NEG-ERR", "NEG-ERROR":
				c.send([]byte(`["` + fl.NegOpenAnswer + `",` + quote(sub) + `,` + quote(fl.NegOpenText) + `]`))
				continue
			case "NOTICE":
				n, _ := json.Marshal([]string{"NOTICE", fl.NegOpenText})
				c.send(n)
				continue
			case "SILENT":
				continue
			}
		}
		if err := c.upstream.Write(c.ctx, websocket.MessageText, data); err != nil {
			return
		}
	}
}

func (c *faultConn) isAuthed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.authed
}

// pumpDown forwards relay → client.
func (c *faultConn) pumpDown() {
	for {
		_, data, err := c.upstream.Read(c.ctx)
		if err != nil {
			return
		}
		fl := c.f.current()
		label := gjson.GetBytes(data, "0").String()
		sub := gjson.GetBytes(data, "1").String()
		switch label {
		case "EVENT":
			c.mu.Lock()
			if c.capped[sub] {
				c.mu.Unlock()
				continue
			}
			c.perSub[sub]++
			if fl.PageCap > 0 && c.perSub[sub] >= fl.PageCap {
				c.capped[sub] = true
			}
			c.events++
			n := c.events
			capNow := c.capped[sub]
			c.mu.Unlock()
			c.send(data)
			if capNow {
				c.send([]byte(`["EOSE",` + quote(sub) + `]`))
			}
			if fl.DropAfterEvents > 0 && n >= fl.DropAfterEvents {
				c.drop()
				return
			}
			if fl.StallAfterEvents > 0 && n >= fl.StallAfterEvents {
				c.stall()
			}
			continue
		case "EOSE":
			c.mu.Lock()
			wasCapped := c.capped[sub]
			c.mu.Unlock()
			if wasCapped {
				continue // EOSE already sent at the cap
			}
			if fl.Inject != nil {
				for _, m := range fl.Inject(sub) {
					c.send(m)
				}
			}
		case "NEG-MSG":
			if fl.DropMidNegentropy {
				c.drop()
				return
			}
		}
		c.send(data)
	}
}

func hasIDs(req []byte) bool {
	found := false
	gjson.GetBytes(req, "@this").ForEach(func(k, v gjson.Result) bool {
		if k.Int() >= 2 && v.Get("ids").Exists() {
			found = true
			return false
		}
		return true
	})
	return found
}

func closed(sub, reason string) []byte {
	b, _ := json.Marshal([]string{"CLOSED", sub, reason})
	return b
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RawEvent is the EVENT message for sub carrying evt as it is (bad ids and
// signatures included), for Faults.Inject.
func RawEvent(sub string, evt *nostr.Event) []byte {
	b, _ := json.Marshal([]any{"EVENT", sub, evt})
	return b
}

// Oversized is an EVENT-shaped message of about n bytes, for
// Faults.Inject: larger than a client's message limit, it must end the
// connection, not the client.
func Oversized(sub string, n int) []byte {
	return []byte(`["EVENT",` + quote(sub) + `,{"content":"` + strings.Repeat("x", n) + `"}]`)
}
