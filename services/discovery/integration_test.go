package discovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// env is one NATS with the contract's buckets, shared by the discovery
// instances of a test.
type env struct {
	nats *natstest.NATS
	kv   jetstream.KeyValue
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := natstest.Start(t)
	b, err := bus.ConnectInProcess(n.Server, "test", bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	ctx := context.Background()
	if err := bus.Setup(ctx, b.JS, b.Names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, b.Names.RepoIndexBucket())
	if err != nil {
		t.Fatal(err)
	}
	return &env{nats: n, kv: kv}
}

// instance is one running discovery, stopped when the test ends.
type instance struct {
	d      *Discovery
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func (e *env) start(t *testing.T, cfg Config, clk clock.Clock) *instance {
	t.Helper()
	b, err := bus.ConnectInProcess(e.nats.Server, "discovery", bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if cfg.MaxRelaysPerAnnouncement == 0 {
		cfg.MaxRelaysPerAnnouncement = 20
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax = 100*time.Millisecond, 500*time.Millisecond
	}
	pol := &policy.Policy{ServiceURL: service}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	d := New(cfg, b, service, pol.ListsService, clk, log, reg)
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{d: d, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { in.done <- d.Run(ctx) }()
	t.Cleanup(func() { in.stop(t) })
	return in
}

func (in *instance) stop(t *testing.T) {
	in.cancel()
	select {
	case err := <-in.done:
		if err != nil {
			t.Errorf("discovery Run: %v", err)
		}
		in.done <- nil
	case <-time.After(15 * time.Second):
		t.Error("discovery did not stop")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// eventually polls cond until it holds or the deadline passes. It waits for
// asynchronous work (NATS, websockets), not for time to pass: batch timing
// itself is tested with a fake clock.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// entries reads the repository entries of the index bucket.
func entries(t *testing.T, kv jetstream.KeyValue) map[nip34.RepoRef]*graspv1.RepoSyncNeeds {
	t.Helper()
	w, err := kv.WatchAll(context.Background(), jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	out := map[nip34.RepoRef]*graspv1.RepoSyncNeeds{}
	for e := range w.Updates() {
		if e == nil {
			break
		}
		ref, ok := nip34.ParseKey(e.Key())
		if !ok {
			continue
		}
		var v graspv1.RepoSyncNeeds
		if err := proto.Unmarshal(e.Value(), &v); err != nil {
			t.Fatalf("key %s: %v", e.Key(), err)
		}
		out[ref] = &v
	}
	return out
}

func announce(k testkit.Key, d string, relays []string, opts ...testkit.Option) *nostr.Event {
	return k.Announcement(d, []string{testkit.GraspCloneURL(service, k.PubKey, d)}, append([]string{service}, relays...), nil, opts...)
}

func refOf(k testkit.Key, d string) nip34.RepoRef {
	return nip34.RepoRef{PubKey: k.PubKey, Identifier: d}
}

// add stores events in the test relay; testkit's Add broadcasts them under
// khatru's client-list lock (pkg/khatrulock), so discovery (re)subscribing
// meanwhile is not a data race.
func add(t *testing.T, r *testrelay.Relay, evts ...*nostr.Event) {
	t.Helper()
	r.Add(t, evts...)
}

// TestHistoryThroughCappedRelay: 2,000 announcements, with many sharing a
// created_at, through a relay that returns at most 500 events per REQ, all
// reach the index; so do the roots stored with them.
func TestHistoryThroughCappedRelay(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{MaxLimit: 500})
	owner := testkit.NewKey()
	base := nostr.Now() - 1000
	// 40 announcements per second of created_at, so pages end inside a
	// run of equal timestamps. Signed on every core: signing dominates
	// this test under -race.
	evts := make([]*nostr.Event, 2000)
	var wg sync.WaitGroup
	for w := range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := w; i < len(evts); i += runtime.GOMAXPROCS(0) {
				evts[i] = announce(owner, fmt.Sprint("repo-", i), []string{"wss://a.example"}, testkit.At(base+nostr.Timestamp(i/40)))
			}
		})
	}
	wg.Wait()
	issue := owner.Issue(testkit.RepoRef(owner.PubKey, "repo-7"), "bug", testkit.At(base))
	evts = append(evts, issue)
	// Straight into the store: nothing is subscribed yet, and each
	// identifier is new, so there is nothing to replace.
	for _, evt := range evts {
		if err := relay.Store.SaveEvent(context.Background(), evt); err != nil {
			t.Fatal(err)
		}
	}

	e := newEnv(t)
	started := time.Now()
	in := e.start(t, Config{RelayURL: relay.URL, BatchWindow: 50 * time.Millisecond, PageSize: 500}, clock.Real{})
	eventually(t, 60*time.Second, "2,000 index entries", func() bool { return len(entries(t, e.kv)) == 2000 })
	t.Logf("2,000 announcements read in 500-event pages and indexed in %s", time.Since(started).Round(time.Millisecond))
	got := entries(t, e.kv)
	if r := got[refOf(owner, "repo-7")].GetRootEventIds(); !slices.Equal(r, []string{issue.ID}) {
		t.Errorf("repo-7 roots = %v, want the issue", r)
	}
	if v := testutil.ToFloat64(in.d.metrics.repos); v != 2000 {
		t.Errorf("repos indexed metric = %v", v)
	}
	if v := testutil.ToFloat64(in.d.metrics.roots); v != 1 {
		t.Errorf("root events metric = %v", v)
	}
	if v := testutil.ToFloat64(in.d.metrics.relays); v != 1 {
		t.Errorf("relays referenced metric = %v", v)
	}
}

// TestLiveIndexing: roots before their announcement are attached, relay
// changes and removals (no longer listing us, NIP-09 deletion) reach the
// bucket, the bootstrap relays are published, and refused URLs are counted.
func TestLiveIndexing(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	e := newEnv(t)
	in := e.start(t, Config{RelayURL: relay.URL, BatchWindow: 50 * time.Millisecond,
		BootstrapRelays: []string{"wss://boot.example"}}, clock.Real{})
	eventually(t, 10*time.Second, "ready", func() bool { return in.d.Ready() == nil })

	b, err := e.kv.Get(context.Background(), bus.BootstrapRelaysKey)
	if err != nil {
		t.Fatal(err)
	}
	var boot graspv1.BootstrapRelays
	if err := proto.Unmarshal(b.Value(), &boot); err != nil || !slices.Equal(boot.Relays, []string{"wss://boot.example"}) {
		t.Fatalf("bootstrap relays = %v (%v)", boot.Relays, err)
	}

	owner, other := testkit.NewKey(), testkit.NewKey()
	ref := refOf(owner, "r")
	now := nostr.Now()
	issue := other.Issue(ref.String(), "early", testkit.At(now-10))
	add(t, relay, issue)
	add(t, relay, announce(owner, "r", []string{"wss://a.example", "ws://10.0.0.1", "http://x.example"}, testkit.At(now-5)))
	eventually(t, 10*time.Second, "entry with the early root", func() bool {
		return slices.Equal(entries(t, e.kv)[ref].GetRootEventIds(), []string{issue.ID})
	})
	if got := entries(t, e.kv)[ref].GetRelays(); !slices.Equal(got, []string{"wss://a.example"}) {
		t.Fatalf("relays = %v", got)
	}
	if v := testutil.ToFloat64(in.d.metrics.refused.WithLabelValues(RefusedInternal)); v != 1 {
		t.Errorf("refused private_address = %v", v)
	}
	if v := testutil.ToFloat64(in.d.metrics.refused.WithLabelValues(RefusedScheme)); v != 1 {
		t.Errorf("refused scheme = %v", v)
	}

	add(t, relay, announce(owner, "r", []string{"wss://b.example"}, testkit.At(now-4)))
	eventually(t, 10*time.Second, "relay change", func() bool {
		return slices.Equal(entries(t, e.kv)[ref].GetRelays(), []string{"wss://b.example"})
	})

	add(t, relay, owner.Announcement("r", []string{"https://elsewhere.example/r.git"}, []string{"wss://b.example"}, nil, testkit.At(now-3)))
	eventually(t, 10*time.Second, "removal when no longer listed", func() bool { return entries(t, e.kv)[ref] == nil })

	v4 := announce(owner, "r", []string{"wss://c.example"}, testkit.At(now-2))
	add(t, relay, v4)
	eventually(t, 10*time.Second, "listed again", func() bool { return entries(t, e.kv)[ref] != nil })
	add(t, relay, owner.Deletion([]*nostr.Event{v4}, testkit.At(now-1)))
	eventually(t, 10*time.Second, "removal by NIP-09 deletion", func() bool { return entries(t, e.kv)[ref] == nil })
}

// TestBatchWindow checks discovery's flush rule with a fake clock: a
// change is written once changes have been quiet for the quiet period (a
// single announcement does not wait out the window), changes within the
// quiet period share one write, and a stream that never pauses is still
// written when the window, counted from its first change, closes.
func TestBatchWindow(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	e := newEnv(t)
	fake := clock.NewFake(time.Now())
	const quiet, window = 150 * time.Millisecond, 5 * time.Second
	in := e.start(t, Config{RelayURL: relay.URL, BatchQuiet: quiet, BatchWindow: window}, fake)
	eventually(t, 10*time.Second, "ready", func() bool { return in.d.Ready() == nil })
	if n := fake.Waiters(); n != 0 {
		t.Fatalf("%d timers armed before any event", n)
	}
	batches := func() float64 { return testutil.ToFloat64(in.d.metrics.batches) }
	before := batches()
	applied := func(n int64) func() bool { return func() bool { return in.d.applied.Load() == n } }
	armed := func() bool { return fake.Waiters() == 1 }
	var n int64
	announceOne := func(what string) {
		t.Helper()
		n++
		add(t, relay, announce(testkit.NewKey(), "r", nil))
		eventually(t, 10*time.Second, what+" applied", applied(n))
		eventually(t, 10*time.Second, what+": timer armed", armed)
	}

	// A single announcement is written after the quiet period.
	announceOne("lone announcement")
	fake.Advance(quiet - time.Millisecond)
	if got := len(entries(t, e.kv)); got != 0 {
		t.Fatalf("%d entries written before the quiet period ended", got)
	}
	fake.Advance(time.Millisecond)
	eventually(t, 10*time.Second, "lone announcement written after the quiet period", func() bool { return len(entries(t, e.kv)) == 1 })
	// The batch is counted once its write returns, a moment after the
	// entries are visible.
	eventually(t, 10*time.Second, "batch 1 counted", func() bool { return batches()-before >= 1 })
	if got := batches() - before; got != 1 {
		t.Fatalf("%v batches, want 1", got)
	}

	// Two changes inside the quiet period are one write, quiet after the
	// second.
	announceOne("burst 1/2")
	fake.Advance(quiet / 2)
	announceOne("burst 2/2")
	fake.Advance(quiet / 2) // the first timer fires and is re-armed
	eventually(t, 10*time.Second, "re-armed for the second change", armed)
	if got := len(entries(t, e.kv)); got != 1 {
		t.Fatalf("%d entries before the burst was quiet", got)
	}
	fake.Advance(quiet / 2)
	eventually(t, 10*time.Second, "one batch with the burst", func() bool { return len(entries(t, e.kv)) == 3 })
	// The batch is counted once its write returns, a moment after the
	// entries are visible.
	eventually(t, 10*time.Second, "batch 2 counted", func() bool { return batches()-before >= 2 })
	if got := batches() - before; got != 2 {
		t.Fatalf("%v batches, want 2", got)
	}

	// A stream that never pauses is written when the window closes.
	step := quiet - 50*time.Millisecond
	announceOne("stream start")
	var elapsed time.Duration
	for elapsed+step < window {
		fake.Advance(step)
		elapsed += step
		announceOne("stream")
		if got := len(entries(t, e.kv)); got != 3 {
			t.Fatalf("%d entries written %s into a stream that never paused", got, elapsed)
		}
	}
	fake.Advance(window - elapsed)
	eventually(t, 10*time.Second, "stream written at the window", func() bool { return len(entries(t, e.kv)) == int(n) })
	// The batch is counted once its write returns, a moment after the
	// entries are visible.
	eventually(t, 10*time.Second, "batch 3 counted", func() bool { return batches()-before >= 3 })
	if got := batches() - before; got != 3 {
		t.Fatalf("%v batches, want 3", got)
	}
}

// proxy is a TCP forwarder in front of the own relay that the test can take
// down and bring back on the same address: to discovery it is the relay
// restarting, while the relay itself keeps storing what is published during
// the gap.
type proxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
	wg           sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), target: target}
	p.serve(ln)
	t.Cleanup(func() {
		p.down()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

// down closes the listener and every connection.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// up listens again on the same address.
func (p *proxy) up(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

// TestReconnectMissesNothing: while the own relay is unreachable discovery is
// not ready; what was stored during the gap — including an event whose
// created_at is a few minutes before the disconnection (it propagated late)
// — is in the index after the reconnect.
func TestReconnectMissesNothing(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	host := relay.URL[len("ws://"):]
	p := startProxy(t, host)
	e := newEnv(t)
	in := e.start(t, Config{RelayURL: "ws://" + p.addr, BatchWindow: 50 * time.Millisecond}, clock.Real{})
	eventually(t, 10*time.Second, "ready", func() bool { return in.d.Ready() == nil })

	owner := testkit.NewKey()
	now := nostr.Now()
	before := announce(owner, "before", []string{"wss://a.example"}, testkit.At(now-60))
	add(t, relay, before)
	eventually(t, 10*time.Second, "entry before the gap", func() bool { return entries(t, e.kv)[refOf(owner, "before")] != nil })

	p.down()
	eventually(t, 10*time.Second, "not ready while disconnected", func() bool { return in.d.Ready() != nil })
	if v := testutil.ToFloat64(in.d.metrics.connected); v != 0 {
		t.Errorf("connected metric = %v while disconnected", v)
	}
	ctx := context.Background()
	gap := []*nostr.Event{
		announce(owner, "during", []string{"wss://b.example"}, testkit.At(nostr.Now())),
		announce(owner, "late", []string{"wss://c.example"}, testkit.At(now-5*60)), // created before the disconnection
		owner.Issue(testkit.RepoRef(owner.PubKey, "before"), "gap issue", testkit.At(nostr.Now())),
	}
	gap = append(gap, owner.Deletion([]*nostr.Event{before}, testkit.At(nostr.Now())))
	// Stored without a broadcast: nobody is subscribed during the gap, and
	// a broadcast right after the proxy dropped the connections would race
	// with khatru removing their listeners (khatru v0.19.1, see
	// docs/decisions/0003-khatru-listener-race.md).
	for _, evt := range gap {
		if err := relay.Store.SaveEvent(ctx, evt); err != nil {
			t.Fatal(err)
		}
	}
	p.up(t)
	eventually(t, 20*time.Second, "gap events indexed", func() bool {
		got := entries(t, e.kv)
		return got[refOf(owner, "during")] != nil && got[refOf(owner, "late")] != nil && got[refOf(owner, "before")] == nil
	})
	eventually(t, 10*time.Second, "ready again", func() bool { return in.d.Ready() == nil })
}

// TestOneActiveDiscovery: of two instances one is active and one stands by
// (both ready); when the active one stops, the standby takes over and keeps
// the index.
func TestOneActiveDiscovery(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	e := newEnv(t)
	cfg := Config{RelayURL: relay.URL, BatchWindow: 50 * time.Millisecond}
	cfg.InstanceID = "one"
	first := e.start(t, cfg, clock.Real{})
	eventually(t, 10*time.Second, "first active", func() bool { return first.d.state.Load() == stateConnected })
	cfg.InstanceID = "two"
	second := e.start(t, cfg, clock.Real{})
	eventually(t, 10*time.Second, "second standing by", func() bool { return second.d.state.Load() == stateStandby })
	if err := second.d.Ready(); err != nil {
		t.Fatalf("standby not ready: %v", err)
	}
	if v := testutil.ToFloat64(second.d.metrics.leader); v != 0 {
		t.Fatal("standby reports itself leader")
	}

	// Stored without a broadcast, so only a history read finds it: the new
	// active instance's, after the takeover. (A broadcast after the first
	// instance's connections close would also race inside khatru v0.19.1.)
	k := testkit.NewKey()
	if err := relay.Store.SaveEvent(context.Background(), announce(k, "r", nil)); err != nil {
		t.Fatal(err)
	}
	first.stop(t)
	eventually(t, 30*time.Second, "standby took over", func() bool { return second.d.state.Load() == stateConnected })
	eventually(t, 10*time.Second, "index kept by the new active instance", func() bool { return entries(t, e.kv)[refOf(k, "r")] != nil })
}

func TestConfigValidate(t *testing.T) {
	good := Config{BatchQuiet: 150 * time.Millisecond, BatchWindow: time.Second, PageSize: 500, BackoffBase: time.Second, BackoffMax: time.Minute,
		BootstrapRelays: []string{"WSS://Boot.Example:443/"}}
	if err := good.Validate(); err != nil || good.BootstrapRelays[0] != "wss://boot.example" {
		t.Fatalf("Validate = %v, bootstrap %v", err, good.BootstrapRelays)
	}
	for name, mutate := range map[string]func(*Config){
		"zero window":        func(c *Config) { c.BatchWindow = 0 },
		"backoff max < base": func(c *Config) { c.BackoffMax = time.Millisecond },
		"bad bootstrap":      func(c *Config) { c.BootstrapRelays = []string{"http://x.example"} },
	} {
		c := good
		c.BootstrapRelays = []string{"wss://boot.example"}
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	defaults := Config{}.withDefaults()
	if err := defaults.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	if err := (&Config{}).Validate(); err == nil {
		t.Error("empty config accepted")
	}
}

// TestFixedSettingsNotRead: how discovery reads its own relay is fixed,
// so the former variables do nothing, and a Config from the environment
// gets the fixed values, the reconnect buffer included.
func TestFixedSettingsNotRead(t *testing.T) {
	t.Setenv("GRASP_DISCOVERY_PAGE_SIZE", "0")
	t.Setenv("GRASP_DISCOVERY_RECONNECT_BUFFER", "-1s")
	var c Config
	if err := config.Load(&c); err != nil {
		t.Fatal(err)
	}
	c = c.withDefaults()
	if c.PageSize != 500 || c.RelayMinCap != 100 || c.ReconnectBuffer != 15*time.Minute || c.BatchQuiet != 150*time.Millisecond {
		t.Fatalf("config %+v", c)
	}
}

// TestHistoryCrowdedSecond: 1,000 announcements share one created_at on an
// own relay that returns at most 100 events per REQ. With NIP-77 every one
// reaches the index; without it the second cannot be read completely, and
// discovery says so (metric, not ready, read again) instead of indexing the
// 100 it saw as if that were all.
func TestHistoryCrowdedSecond(t *testing.T) {
	owner := testkit.NewKey()
	at := nostr.Now() - 1000
	evts := make([]*nostr.Event, 1000)
	var wg sync.WaitGroup
	for w := range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := w; i < len(evts); i += runtime.GOMAXPROCS(0) {
				evts[i] = announce(owner, fmt.Sprint("crowded-", i), []string{"wss://a.example"}, testkit.At(at))
			}
		})
	}
	wg.Wait()
	for _, nip77 := range []bool{true, false} {
		t.Run(fmt.Sprintf("nip77=%v", nip77), func(t *testing.T) {
			relay := testrelay.Start(t, testrelay.Options{MaxLimit: 100, Negentropy: nip77})
			for _, evt := range evts {
				if err := relay.Store.SaveEvent(context.Background(), evt); err != nil {
					t.Fatal(err)
				}
			}
			e := newEnv(t)
			in := e.start(t, Config{RelayURL: relay.URL, BatchWindow: 50 * time.Millisecond, PageSize: 500}, clock.Real{})
			if nip77 {
				eventually(t, 60*time.Second, "1,000 index entries", func() bool { return len(entries(t, e.kv)) == 1000 })
				eventually(t, 10*time.Second, "ready", func() bool { return in.d.Ready() == nil })
				if v := testutil.ToFloat64(in.d.metrics.historyIncomplete); v != 0 {
					t.Errorf("incomplete histories = %v, want 0", v)
				}
				return
			}
			// Two incomplete reads: the first, and its retry after the
			// reconnect backoff.
			eventually(t, 60*time.Second, "the history reported incomplete twice", func() bool {
				return testutil.ToFloat64(in.d.metrics.historyIncomplete) >= 2
			})
			if err := in.d.Ready(); err == nil {
				t.Error("discovery reports ready with an incomplete history")
			}
		})
	}
}
