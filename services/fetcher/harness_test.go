package fetcher_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// env is one test's world: embedded NATS with the contract's streams, a
// fake clock for backoff and cooldowns, and taps on the report and event
// subjects. The test plays the planner by publishing FetchCommands.
type env struct {
	t     *testing.T
	ctx   context.Context
	nats  *natstest.NATS
	bus   *bus.Bus
	clock *clock.Fake

	mu      sync.Mutex
	reports []*graspv1.FetchReport
	events  map[string]nats.Header // event id -> headers of its first copy
	copies  int
	// messages counts events-stream messages (a batch is one).
	messages int
	raw      map[string][]byte
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	n := natstest.Start(t)
	e := &env{t: t, ctx: ctx, nats: n, clock: clock.NewFake(time.Unix(1_700_000_000, 0)),
		events: map[string]nats.Header{}, raw: map[string][]byte{}}
	e.bus = e.connect("test")
	opts := bus.DefaultOptions()
	opts.Storage = jetstream.MemoryStorage
	if err := bus.Setup(ctx, e.bus.JS, e.bus.Names, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := e.bus.Conn.Subscribe(e.bus.Names.FetchReportSubjects(), func(m *nats.Msg) {
		var r graspv1.FetchReport
		if err := bus.Decode(m.Data, m.Header, &r); err != nil {
			t.Errorf("bad report: %v", err)
			return
		}
		e.mu.Lock()
		e.reports = append(e.reports, &r)
		e.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.bus.Conn.Subscribe(e.bus.Names.EventsSubjects(), func(m *nats.Msg) {
		// One event, or a batch of them (bus.HeaderEvents): each counts.
		e.mu.Lock()
		defer e.mu.Unlock()
		e.messages++
		for _, data := range bus.SplitEvents(m.Header, m.Data) {
			var evt nostr.Event
			if err := evt.UnmarshalJSON(data); err != nil {
				t.Errorf("bad event on %s: %v", m.Subject, err)
				return
			}
			e.copies++
			if _, ok := e.events[evt.ID]; !ok {
				e.events[evt.ID] = m.Header
				e.raw[evt.ID] = data
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) connect(name string) *bus.Bus {
	return e.connectTo(e.nats.URL, name)
}

// connectTo connects to NATS at url (e.g. through a delayproxy.Proxy)
// until the test ends.
func (e *env) connectTo(url, name string) *bus.Bus {
	b, err := bus.Connect(e.ctx, url, name, bus.DefaultNames(), bus.Security{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(b.Close)
	return b
}

// baseConfig is a fetcher for tests: one shard unless changed, loopback
// relays allowed, short lease.
func baseConfig(id string) fetcher.Config {
	return fetcher.Config{ID: id, Shards: 1, LeaseTTL: 2 * time.Second, RelayAllowlist: []string{"127.0.0.1"},
		NegentropyTimeout: 2 * time.Second, PageTimeout: time.Hour, RelayMinCap: 100}
}

type runningFetcher struct {
	*fetcher.Fetcher
	reg    *prometheus.Registry
	bus    *bus.Bus
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs a fetcher on its own NATS connection until the test ends.
func (e *env) start(cfg fetcher.Config, local fetcher.LocalSet) *runningFetcher {
	return e.startWith(cfg, func(f *fetcher.Fetcher) {
		if local != nil {
			f.WithLocalSet(local)
		}
	})
}

// startWith is start with the fetcher set up by setup before it runs.
func (e *env) startWith(cfg fetcher.Config, setup func(*fetcher.Fetcher)) *runningFetcher {
	return e.startOn(e.connect(cfg.ID), cfg, setup)
}

// startOn is startWith on the NATS connection b.
func (e *env) startOn(b *bus.Bus, cfg fetcher.Config, setup func(*fetcher.Fetcher)) *runningFetcher {
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f := fetcher.New(cfg, b, e.clock, log, reg)
	setup(f)
	ctx, cancel := context.WithCancel(e.ctx)
	rf := &runningFetcher{Fetcher: f, reg: reg, bus: b, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rf.done)
		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
			e.t.Errorf("fetcher %s: %v", cfg.ID, err)
		}
	}()
	e.t.Cleanup(rf.stop)
	e.waitFor("fetcher owns its shards", func() bool { return len(f.Shards()) > 0 })
	return rf
}

// stop stops gracefully.
func (rf *runningFetcher) stop() {
	rf.cancel()
	<-rf.done
}

// kill stops like a crash: the NATS connection goes first, so the leases
// are not released and must expire.
func (rf *runningFetcher) kill() {
	rf.bus.Conn.Close()
	rf.cancel()
	<-rf.done
}

// waitFor polls cond (state that other goroutines reach) until true.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	for !cond() {
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (e *env) send(shard int, cmd *graspv1.FetchCommand) {
	e.t.Helper()
	if err := e.bus.Publish(e.ctx, e.bus.Names.FetchCmdSubject(shard), cmd); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) ensure(url string) {
	e.send(bus.ShardOf(url, 1), &graspv1.FetchCommand{RelayUrl: url,
		Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
}

// shardOf is the shard of url for n shards.
func shardOf(url string, n int) int { return bus.ShardOf(url, n) }

func (e *env) addFilters(shard int, url, session, batch string, hist, live []nostr.Filter) {
	e.send(shard, &graspv1.FetchCommand{RelayUrl: url, SessionId: session, Command: &graspv1.FetchCommand_AddFilters{
		AddFilters: &graspv1.AddFilters{BatchId: batch, HistoricFilters: filters.ToProtos(hist), LiveFilters: filters.ToProtos(live)}}})
}

// addFiltersIndexed sends a batch whose live part is its historic filters
// from index from on (AddFilters.live_from_historic).
func (e *env) addFiltersIndexed(shard int, url, session, batch string, hist []nostr.Filter, from uint32) {
	e.send(shard, &graspv1.FetchCommand{RelayUrl: url, SessionId: session, Command: &graspv1.FetchCommand_AddFilters{
		AddFilters: &graspv1.AddFilters{BatchId: batch, HistoricFilters: filters.ToProtos(hist), LiveFromHistoric: &from}}})
}

// report waits for the first report about url matching pick, after skip
// earlier matches.
func (e *env) report(url string, pick func(*graspv1.FetchReport) bool) *graspv1.FetchReport {
	e.t.Helper()
	var got *graspv1.FetchReport
	e.waitFor("report from "+url, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, r := range e.reports {
			if r.GetRelayUrl() == url && pick(r) {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

func (e *env) reportsMatching(url string, pick func(*graspv1.FetchReport) bool) []*graspv1.FetchReport {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*graspv1.FetchReport
	for _, r := range e.reports {
		if r.GetRelayUrl() == url && pick(r) {
			out = append(out, r)
		}
	}
	return out
}

// connected waits for a Connected report about url other than the sessions
// in not, and returns its session.
func (e *env) connected(url string, not ...string) *graspv1.FetchReport {
	e.t.Helper()
	return e.report(url, func(r *graspv1.FetchReport) bool {
		if r.GetConnected() == nil {
			return false
		}
		for _, s := range not {
			if r.GetSessionId() == s {
				return false
			}
		}
		return true
	})
}

func (e *env) batchDone(url, batch string) *graspv1.BatchDone {
	e.t.Helper()
	return e.report(url, func(r *graspv1.FetchReport) bool { return r.GetBatchDone().GetBatchId() == batch }).GetBatchDone()
}

func (e *env) has(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.events[id]
	return ok
}

func (e *env) header(id string) nats.Header {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.events[id]
}

func (e *env) eventCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// waitEvents waits until every event of evts has been published.
func (e *env) waitEvents(evts []*nostr.Event) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("%d events published", len(evts)), func() bool {
		for _, evt := range evts {
			if !e.has(evt.ID) {
				return false
			}
		}
		return true
	})
}

// advanceUntil moves the fake clock in steps until cond holds (timers armed
// by other goroutines fire when the clock passes them).
func (e *env) advanceUntil(what string, step time.Duration, cond func() bool) {
	e.t.Helper()
	for !cond() {
		e.clock.Advance(step)
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// metric reads one series' value from a registry.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				sum += value(m)
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// notes makes n signed notes with distinct ids; every per events share a
// created_at.
func notes(k testkit.Key, n, per int, from nostr.Timestamp) []*nostr.Event {
	out := make([]*nostr.Event, n)
	for i := range out {
		out[i] = k.Note(fmt.Sprintf("note %d", i), testkit.At(from+nostr.Timestamp(i/max(per, 1))))
	}
	return out
}

var kind1 = []nostr.Filter{{Kinds: []int{1}}}

// relayLimits reads the fetchers' limits record of a relay from its bucket,
// waiting for it to appear (it is saved in the background).
func (e *env) relayLimits(url string) *graspv1.RelayLimits {
	e.t.Helper()
	return e.relayLimitsWhere(url, func(rec *graspv1.RelayLimits) bool {
		return len(rec.GetRefusals())+len(rec.GetLimitRefusals()) > 0
	})
}

// relayLimitsWhere reads the fetchers' limits record of a relay once pick
// holds for it.
func (e *env) relayLimitsWhere(url string, pick func(*graspv1.RelayLimits) bool) *graspv1.RelayLimits {
	e.t.Helper()
	var rec graspv1.RelayLimits
	e.waitFor("the relay's limits record", func() bool {
		kv, err := e.bus.JS.KeyValue(e.ctx, e.bus.Names.RelayLimitsBucket())
		if err != nil {
			return false
		}
		entry, err := kv.Get(e.ctx, bus.RelayLimitsKey(url))
		if err != nil {
			return false
		}
		return proto.Unmarshal(entry.Value(), &rec) == nil && pick(&rec)
	})
	return &rec
}
