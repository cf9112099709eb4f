package testrelay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore"
	eventbadger "github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/khatrulock"
	"github.com/grasp-sync/grasp-sync/pkg/store/badgerlock"
)

// DefaultMaxLimit is the per-filter result cap a test relay applies when
// Options.MaxLimit is 0. It matches strfry's maxFilterLimit (500), the
// most common cap our fetcher meets in the wild.
const DefaultMaxLimit = 500

// storeMaxLimit is the badger store's own query cap. It is set deliberately:
// badger allocates O(MaxLimit) per query, and a filter without a limit gets
// MaxLimit/4 (see docs: dependencies.md). The relay-level cap
// (Options.MaxLimit) is what tests tune; this only has to be larger.
const storeMaxLimit = 100_000

// Options configures a test relay started by Start.
type Options struct {
	// Negentropy enables NIP-77 (NEG-OPEN/NEG-MSG) on the khatru relay, so
	// tests can cover both reconciling and REQ-only remotes.
	Negentropy bool
	// MaxLimit caps the results of each REQ filter (0 means DefaultMaxLimit).
	// A filter without a limit gets MaxLimit, a larger limit is clamped,
	// emulating strfry's per-filter cap so paging code is exercised.
	// Negentropy sessions are not capped.
	MaxLimit int
	// Limits are what the relay enforces on each connection, as strfry or
	// nostr-rs-relay do (zero: unlimited, and NIP-11 says nothing); see
	// Relay.LimitCounts for what they refused.
	Limits Limits
	// Software replaces khatru's NIP-11 software, so a test can present
	// a relay the fetcher does not know.
	Software string
}

// Relay is a real khatru relay (the "remote relay" of tests) listening on a
// random 127.0.0.1 port and backed by an eventstore badger store in
// t.TempDir(). It accepts every valid event.
type Relay struct {
	// URL is the websocket URL, ws://127.0.0.1:PORT.
	URL string
	// HTTPURL is the same endpoint over HTTP (NIP-11, health checks).
	HTTPURL string
	// Khatru is the relay itself, so tests can add hooks or inspect it.
	Khatru *khatru.Relay
	// Store is the backing store, for direct reads and writes that bypass
	// the relay's policies.
	Store eventstore.Store

	// saved run after each event the relay stores (not on duplicates),
	// with the storing call's context; set before the relay serves.
	saved []func(context.Context, *nostr.Event)

	srv       *http.Server
	lim       *limiter // nil: no limits
	gate      gate
	conns     sync.Map // hijacked websocket connections: net.Conn -> struct{}
	closeOnce sync.Once
}

// Start starts a relay as configured by opts. It is stopped, and its
// store closed, when the test ends.
func Start(t testing.TB, opts Options) *Relay {
	t.Helper()
	return startRelay(t, opts, nil)
}

// startRelay is Start with a hook: configure (if not nil) runs once the
// relay's URLs are known and before it serves its first connection, so
// variants (StartGraspRelay) can add khatru hooks without racing with
// requests.
func startRelay(t testing.TB, opts Options, configure func(*Relay)) *Relay {
	t.Helper()
	maxLimit := opts.MaxLimit
	if maxLimit <= 0 {
		maxLimit = DefaultMaxLimit
	}

	db := &eventbadger.BadgerBackend{
		Path:     t.TempDir(),
		MaxLimit: storeMaxLimit,
		BadgerOptionsModifier: func(o badger.Options) badger.Options {
			// quiet and small: tests start many relays
			return o.WithLogger(nil).
				WithMemTableSize(8 << 20).
				WithValueLogFileSize(16 << 20).
				WithBlockCacheSize(8 << 20).
				WithIndexCacheSize(4 << 20)
		},
	}
	if err := db.Init(); err != nil {
		t.Fatalf("testrelay: init badger store: %v", err)
	}

	if err := opts.Limits.Validate(); err != nil {
		db.Close()
		t.Fatalf("testrelay: %v", err)
	}
	r := &Relay{Khatru: khatru.NewRelay(), Store: db}
	rl := r.Khatru
	rl.Negentropy = opts.Negentropy
	var handler http.Handler = rl
	if opts.Limits.active() || opts.Limits.Advertise {
		r.lim = &limiter{lim: opts.Limits, negentropy: opts.Negentropy}
		r.lim.install(rl)
		handler = limitsNIP11(rl, opts.Limits, maxLimit)
	}
	rl.Info.Name = "testkit relay"
	if opts.Software != "" {
		rl.Info.Software = opts.Software
	}
	// khatru notifies listeners without its lock; these hooks broadcast
	// under it instead (see pkg/khatrulock).
	// They also end khatru's own path (so its OnEventSaved never runs):
	// r.afterSave stands in for it.
	rl.StoreEvent = append(rl.StoreEvent, khatrulock.SaveThenBroadcast(rl, r.guard(db.SaveEvent), r.afterSave))
	rl.ReplaceEvent = append(rl.ReplaceEvent, khatrulock.SaveThenBroadcast(rl, r.guard(db.ReplaceEvent), r.afterSave))
	rl.DeleteEvent = append(rl.DeleteEvent, r.guard(func(ctx context.Context, evt *nostr.Event) error {
		return badgerlock.Delete(ctx, db, evt) // badger's delete path races across stores
	}))
	rl.QueryEvents = append(rl.QueryEvents, r.query)
	rl.CountEvents = append(rl.CountEvents, func(ctx context.Context, f nostr.Filter) (int64, error) {
		if !r.gate.enter() {
			return 0, errRelayClosed
		}
		defer r.gate.leave()
		return db.CountEvents(ctx, f)
	})
	rl.OverwriteFilter = append(rl.OverwriteFilter, func(ctx context.Context, f *nostr.Filter) {
		if eventstore.IsNegentropySession(ctx) || f.LimitZero {
			return
		}
		if f.Limit <= 0 || f.Limit > maxLimit {
			f.Limit = maxLimit
		}
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		t.Fatalf("testrelay: listen for relay: %v", err)
	}
	if r.lim != nil {
		ln = limitListener{Listener: ln, l: r.lim}
	}
	r.srv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ConnState: func(c net.Conn, s http.ConnState) {
			// http.Server.Close does not close hijacked (websocket)
			// connections, so track them ourselves.
			if s == http.StateHijacked {
				r.conns.Store(c, struct{}{})
			}
		},
	}
	addr := ln.Addr().String()
	r.URL = "ws://" + addr
	r.HTTPURL = "http://" + addr
	rl.ServiceURL = r.HTTPURL
	if configure != nil {
		configure(r)
	}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(r.Close)
	return r
}

// LimitCounts are what the relay's Limits refused so far (zero without
// limits).
func (r *Relay) LimitCounts() LimitCounts {
	if r.lim == nil {
		return LimitCounts{}
	}
	return r.lim.counts()
}

// Close stops the relay early, e.g. to simulate a remote going away: it
// closes the listener and every websocket, waits (up to 5 s) for store calls
// in flight, then closes the store. It is safe to call more than once and
// is called automatically when the test ends.
func (r *Relay) Close() {
	r.closeOnce.Do(func() {
		_ = r.srv.Close()
		r.conns.Range(func(k, _ any) bool {
			_ = k.(net.Conn).Close()
			return true
		})
		r.gate.shut(5 * time.Second)
		r.Store.Close()
	})
}

// Add stores events directly through Khatru.AddEvent (so replaceable and
// addressable handling apply) and broadcasts them to live subscribers, like
// an EVENT received over websocket but without id/signature checks. It fails
// the test on error, so call it from the test goroutine. Note that khatru only
// applies kind-5 deletions on the websocket path: Add stores a deletion
// without removing its targets; use Publish for that.
func (r *Relay) Add(t testing.TB, evts ...*nostr.Event) {
	t.Helper()
	ctx := context.Background()
	for _, evt := range evts {
		// The store hook broadcasts (under khatru's lock) as it saves.
		if _, err := r.Khatru.AddEvent(ctx, evt); err != nil {
			t.Fatalf("testrelay: add event %s (kind %d) to relay %s: %v", evt.ID, evt.Kind, r.URL, err)
		}
	}
}

// Has reports whether an event with that id is stored, reading the store
// directly (no relay limits apply).
func (r *Relay) Has(ctx context.Context, id string) (bool, error) {
	ch, err := r.query(ctx, nostr.Filter{IDs: []string{id}})
	if err != nil {
		return false, fmt.Errorf("query relay store for %s: %w", id, err)
	}
	found := false
	for evt := range ch { // drain fully so the store's goroutine ends
		if evt.ID == id {
			found = true
		}
	}
	return found, nil
}

// afterSave runs the saved hooks.
func (r *Relay) afterSave(ctx context.Context, evt *nostr.Event) {
	for _, fn := range r.saved {
		fn(ctx, evt)
	}
}

var errRelayClosed = errors.New("testkit: relay closed")

// guard wraps a store write so it is refused after Close and waited for by it.
func (r *Relay) guard(fn func(context.Context, *nostr.Event) error) func(context.Context, *nostr.Event) error {
	return func(ctx context.Context, evt *nostr.Event) error {
		if !r.gate.enter() {
			return errRelayClosed
		}
		defer r.gate.leave()
		return fn(ctx, evt)
	}
}

// query runs a store query that Close waits for. Badger's QueryEvents sends
// on an unbuffered channel and never closes it if the DB was closed first;
// the forwarding goroutine keeps that from hanging or racing with Close,
// and drains the store's channel if the reader goes away.
func (r *Relay) query(ctx context.Context, f nostr.Filter) (chan *nostr.Event, error) {
	if !r.gate.enter() {
		return nil, errRelayClosed
	}
	in, err := r.Store.QueryEvents(ctx, f)
	if err != nil {
		r.gate.leave()
		return nil, err
	}
	out := make(chan *nostr.Event)
	closing := r.gate.closing()
	go func() {
		defer r.gate.leave()
		defer close(out)
		for evt := range in {
			select {
			case out <- evt:
			case <-ctx.Done():
				drain(in)
				return
			case <-closing:
				drain(in)
				return
			}
		}
	}()
	return out, nil
}

// drain consumes ch until it is closed, so its sender can finish.
func drain(ch <-chan *nostr.Event) {
	for range ch {
	}
}

// gate counts store calls in flight and refuses new ones once shut.
type gate struct {
	mu     sync.Mutex
	n      int
	shutCh chan struct{}
	isShut bool
}

func (g *gate) init() {
	if g.shutCh == nil {
		g.shutCh = make(chan struct{})
	}
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	if g.isShut {
		return false
	}
	g.n++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	g.n--
	g.mu.Unlock()
}

func (g *gate) closing() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	return g.shutCh
}

// shut refuses new calls and waits up to d for those in flight.
func (g *gate) shut(d time.Duration) {
	g.mu.Lock()
	g.init()
	if !g.isShut {
		g.isShut = true
		close(g.shutCh)
	}
	g.mu.Unlock()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		g.mu.Lock()
		n := g.n
		g.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
