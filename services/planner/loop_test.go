package planner_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/planner"
)

// TestPlannerLoopOverNATS runs the planner against an embedded JetStream:
// one discovery batch of several index entries yields one recompute (one
// EnsureConnected per relay, not per entry), the bootstrap list discovery
// publishes under the reserved key is united with the configured one, a
// Connected report gets layer 1 and the items, and the relay's record is
// persisted in grasp_relay_state.
func TestPlannerLoopOverNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, connect := loopNATS(t, ctx, "loop")
	test := connect("test")
	var mu sync.Mutex
	var cmds []*graspv1.FetchCommand
	sub, err := test.Conn.Subscribe(names.FetchCmdSubjects(), func(m *nats.Msg) {
		var c graspv1.FetchCommand
		if proto.Unmarshal(m.Data, &c) == nil {
			mu.Lock()
			cmds = append(cmds, &c)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	commands := func() []*graspv1.FetchCommand {
		mu.Lock()
		defer mu.Unlock()
		return append([]*graspv1.FetchCommand(nil), cmds...)
	}

	index, err := test.JS.KeyValue(ctx, names.RepoIndexBucket())
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, m proto.Message) {
		data, _ := proto.Marshal(m)
		if _, err := index.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	root := "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	put(bus.BootstrapRelaysKey, &graspv1.BootstrapRelays{Relays: []string{"wss://boot-kv.example"}})

	cfg := planner.Config{ID: "p1", Shards: 2, RecomputeDelay: 200 * time.Millisecond, Rules: planner.DefaultRules(),
		BootstrapRelays: []string{"wss://boot-env.example"}}
	// A budget below the relay's minimal live set (7 filters), so its
	// consolidations are deferred to the loop (see the end).
	cfg.MaxLiveFilters = 2
	pb := connect("planner")
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	reg := prometheus.NewRegistry()
	go func() { done <- planner.New(cfg, pb, clock.Real{}, obs.NewLogger(io.Discard, "error"), reg).Run(pctx) }()
	family := func(name string) *dto.MetricFamily {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf
			}
		}
		return nil
	}
	recomputes := func() uint64 {
		if mf := family("grasp_planner_recompute_duration_seconds"); mf != nil {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
		return 0
	}
	defer func() { stop(); <-done }()

	waitFor(t, ctx, "bootstrap relays connected", func() bool { return len(commands()) >= 2 })
	// One discovery batch: three repositories listing the same relay.
	for i, ref := range []string{"30617:aa:r1", "30617:aa:r2", "30617:aa:r3"} {
		put("k"+string(rune('1'+i)), &graspv1.RepoSyncNeeds{RepoRef: ref, Relays: []string{"wss://a.example"}, RootEventIds: []string{root}})
	}
	waitFor(t, ctx, "the batch's recompute", func() bool { return len(commands()) >= 3 })
	got := commands()
	var ensured []string
	for _, c := range got {
		if c.GetEnsureConnected() == nil {
			t.Fatalf("unexpected command %v", c)
		}
		if c.GetEpoch() == 0 {
			t.Fatalf("command without epoch %v", c)
		}
		ensured = append(ensured, c.GetRelayUrl())
	}
	if len(ensured) != 3 || ensured[2] != "wss://a.example" {
		t.Fatalf("ensure-connected for %v, want both bootstrap relays then wss://a.example once", ensured)
	}

	// The fetcher reports a session: layer 1 and the three repositories.
	report := &graspv1.FetchReport{RelayUrl: "wss://a.example", SessionId: "s1", At: time.Now().UnixMilli(),
		Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}}
	if err := test.Publish(ctx, names.FetchReportSubject(bus.ShardOf("wss://a.example", 2)), report); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "layer 1 and items", func() bool { return len(commands()) >= 5 })
	l1, items := commands()[3].GetAddFilters(), commands()[4].GetAddFilters()
	if !l1.GetLayer1() || len(items.GetRepoRefs()) != 3 || items.RootCount() != 1 || commands()[4].GetSessionId() != "s1" {
		t.Fatalf("commands after connect: %v / %v", commands()[3], commands()[4])
	}
	state, err := test.JS.KeyValue(ctx, names.RelayStateBucket())
	if err != nil {
		t.Fatal(err)
	}
	if n := recomputes(); n != 2 {
		t.Errorf("%d recomputes, want 2: the start and one for the discovery batch", n)
	}
	waitFor(t, ctx, "persisted record", func() bool {
		e, err := state.Get(ctx, bus.RelayStateKey("wss://a.example"))
		if err != nil {
			return false
		}
		var st graspv1.RelayState
		return proto.Unmarshal(e.Value(), &st) == nil && st.GetSessionId() == "s1" && st.GetPendingBatches() == 2 &&
			st.GetStatus() == graspv1.RelayStatus_RELAY_STATUS_SYNCING
	})

	// A new root takes the relay past its headroom (8 + 1): the recompute
	// sends the batch with its live filters, and the loop then builds the
	// deferred consolidation after it — not a ReplaceLive of the whole live
	// set but a merge of the two items batches' live sets: their filters
	// opened again as one named set (the new root included), then the two
	// sets closed by name once it is open (CloseLive, make before break).
	root2 := "b1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	put("k1", &graspv1.RepoSyncNeeds{RepoRef: "30617:aa:r1", Relays: []string{"wss://a.example"}, RootEventIds: []string{root, root2}})
	waitFor(t, ctx, "batch and deferred consolidation", func() bool { return len(commands()) >= 8 })
	add, merged, closeLive := commands()[5].GetAddFilters(), commands()[6].GetAddFilters(), commands()[7].GetCloseLive()
	if add == nil || !slices.Equal(add.RootIDs(), []string{root2}) || len(add.GetLiveFilters()) != 3 || add.GetLiveId() != add.GetBatchId() {
		t.Fatalf("batch for the new root: %v", commands()[5])
	}
	if merged == nil || commands()[6].GetSessionId() != "s1" || merged.GetBatchId() != "" || merged.GetLiveId() == "" ||
		len(merged.GetLiveFilters()) != 6 || len(merged.GetHistoricFilters()) != 0 {
		t.Fatalf("deferred consolidation, merged set: %v", commands()[6])
	}
	if closeLive == nil || commands()[7].GetSessionId() != "s1" || closeLive.GetAfterLiveId() != merged.GetLiveId() ||
		!slices.Equal(closeLive.GetLiveIds(), []string{add.GetLiveId(), items.GetLiveId()}) {
		t.Fatalf("deferred consolidation, closing the merged sets: %v (items batches %q, %q)", commands()[7], items.GetLiveId(), add.GetLiveId())
	}
	for _, c := range commands() {
		if c.GetReplaceLive() != nil {
			t.Fatalf("a ReplaceLive was sent: %v", c)
		}
	}
	waitFor(t, ctx, "the deferred-consolidation gauge back at 0", func() bool {
		mf := family("grasp_planner_deferred_consolidations")
		return mf != nil && mf.GetMetric()[0].GetGauge().GetValue() == 0
	})
	var covered int
	for _, f := range merged.GetLiveFilters() {
		for _, tag := range f.GetTags() {
			if tag.GetName() == "e" && slices.Equal(tag.GetValues(), []string{root, root2}) {
				covered++
			}
		}
	}
	if covered != 1 {
		t.Fatalf("merged live set does not cover both roots: %v", merged)
	}
}

// TestRecomputeDebounceOverNATS drives the loop's recompute timing on the
// injected clock (GRASP_PLANNER_RECOMPUTE_DELAY 250 ms, _MAX_DELAY 1 s):
// index updates 200 ms apart are one recompute once they pause for 250 ms,
// not one per 250 ms since the first; updates that never pause are
// recomputed 1 s after the first of them.
func TestRecomputeDebounceOverNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	names, connect := loopNATS(t, ctx, "debounce")
	test := connect("test")
	var mu sync.Mutex
	ensured := map[string]int{}
	sub, err := test.Conn.Subscribe(names.FetchCmdSubjects(), func(m *nats.Msg) {
		var c graspv1.FetchCommand
		if proto.Unmarshal(m.Data, &c) == nil && c.GetEnsureConnected() != nil {
			mu.Lock()
			ensured[c.GetRelayUrl()]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	allEnsured := func(relays []string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range relays {
			if ensured[r] == 0 {
				return false
			}
		}
		return true
	}
	index, err := test.JS.KeyValue(ctx, names.RepoIndexBucket())
	if err != nil {
		t.Fatal(err)
	}

	rules := planner.DefaultRules()
	rules.Heartbeat = 0 // the clock's only timers are the recompute's
	cfg := planner.Config{ID: "p1", Shards: 2, RecomputeDelay: 250 * time.Millisecond, RecomputeMaxDelay: time.Second, Rules: rules}
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	reg := prometheus.NewRegistry()
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- planner.New(cfg, connect("planner"), clk, obs.NewLogger(io.Discard, "error"), reg).Run(pctx)
	}()
	defer func() { stop(); <-done }()
	counter := func(name string) uint64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				if h := mf.GetMetric()[0].GetHistogram(); h != nil {
					return h.GetSampleCount()
				}
				return uint64(mf.GetMetric()[0].GetCounter().GetValue())
			}
		}
		return 0
	}
	recomputes := func() uint64 { return counter("grasp_planner_recompute_duration_seconds") }
	updates := func() uint64 { return counter("grasp_planner_index_updates_total") }
	waitFor(t, ctx, "leading (the start's recompute)", func() bool { return recomputes() == 1 })

	// put writes one index entry listing relay and waits until the loop
	// has applied it, so the clock moves only between updates.
	put := func(key, relay string) {
		t.Helper()
		n := updates()
		data, _ := proto.Marshal(&graspv1.RepoSyncNeeds{RepoRef: "30617:aa:" + key, Relays: []string{relay}})
		if _, err := index.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "index update "+key+" applied", func() bool { return updates() > n })
	}
	// advance moves the clock 200 ms and waits until the loop has acted on
	// the timer that fired, if one did: re-armed it (updates not yet quiet)
	// or recomputed.
	advance := func() {
		t.Helper()
		armed, before := clk.Waiters(), recomputes()
		clk.Advance(200 * time.Millisecond)
		if armed > 0 && clk.Waiters() == 0 {
			waitFor(t, ctx, "the loop acting on its timer", func() bool { return clk.Waiters() > 0 || recomputes() > before })
		}
	}

	// Updates 200 ms apart, then a pause: one recompute.
	burst := []string{"wss://a.example", "wss://b.example", "wss://c.example"}
	for i, relay := range burst {
		put(fmt.Sprintf("k%d", i), relay)
		advance()
	}
	waitFor(t, ctx, "the burst's relays ensured", func() bool {
		if allEnsured(burst) {
			return true
		}
		advance()
		return false
	})
	if n := recomputes(); n != 2 {
		t.Fatalf("%d recomputes for one burst of updates 200 ms apart, want 1 (after the start's)", n-1)
	}

	// Updates 200 ms apart that do not pause: recomputed 1 s after the
	// first, while they continue.
	stream := []string{"wss://d.example", "wss://e.example", "wss://f.example", "wss://g.example", "wss://h.example"}
	for i, relay := range stream {
		put(fmt.Sprintf("s%d", i), relay)
		advance()
	}
	waitFor(t, ctx, "the recompute at the maximum wait", func() bool { return recomputes() == 3 })
	waitFor(t, ctx, "the stream's relays ensured", func() bool { return allEnsured(stream) })
	put("s5", "wss://i.example") // still coming: a new burst
	if n := recomputes(); n != 3 {
		t.Fatalf("%d recomputes, want 3", n)
	}
}

// waitFor polls cond until it holds or ctx ends. The planner-failover test
// in e2e has its own copy since it moved there (it needs graspd).
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// loopNATS starts an embedded NATS with the planner's streams and buckets
// (memory storage) under prefix, and returns the names and a function that
// connects a named client to it, closed when the test ends.
func loopNATS(t *testing.T, ctx context.Context, prefix string) (bus.Names, func(name string) *bus.Bus) {
	t.Helper()
	srv := natstest.Start(t)
	names := bus.Names{Prefix: prefix}
	connect := func(name string) *bus.Bus {
		b, err := bus.ConnectInProcess(srv.Server, name, names)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		return b
	}
	opts := bus.DefaultOptions()
	opts.Storage = jetstream.MemoryStorage
	if err := bus.Setup(ctx, connect("setup").JS, names, opts); err != nil {
		t.Fatal(err)
	}
	return names, connect
}

// TestUnacknowledgedCommandIsRetriedInTheTerm: a command the commands
// stream does not acknowledge (here: the stream is gone for a moment, as
// while a server restarts) is sent again within the same term, instead of
// the term ending and the next one catching up every relay. The command that
// finally lands carries the first term's epoch.
func TestUnacknowledgedCommandIsRetriedInTheTerm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, connect := loopNATS(t, ctx, "retry")
	test := connect("test")
	streamCfg, err := test.JS.Stream(ctx, names.FetchCmdStream())
	if err != nil {
		t.Fatal(err)
	}
	cmdCfg := streamCfg.CachedInfo().Config

	logs := &testkit.LogBuffer{}
	cfg := planner.Config{ID: "p1", Shards: 1, RecomputeDelay: 50 * time.Millisecond, Rules: planner.DefaultRules(),
		BootstrapRelays: []string{"ws://127.0.0.1:1"}}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- planner.New(cfg, connect("planner"), clock.Real{}, obs.NewLogger(logs, "warn"), prometheus.NewRegistry()).Run(pctx)
	}()
	defer func() { stop(); <-done }()

	// The first term's first command, read from the stream.
	next := func() *graspv1.FetchCommand {
		t.Helper()
		c, err := test.JS.CreateOrUpdateConsumer(ctx, names.FetchCmdStream(), jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("no command: %v; planner log:\n%s", err, logs.String())
		}
		_ = m.Ack()
		var cmd graspv1.FetchCommand
		if err := proto.Unmarshal(m.Data(), &cmd); err != nil {
			t.Fatal(err)
		}
		return &cmd
	}
	first := next()

	if err := test.JS.DeleteStream(ctx, names.FetchCmdStream()); err != nil {
		t.Fatal(err)
	}
	index, err := test.JS.KeyValue(ctx, names.RepoIndexBucket())
	if err != nil {
		t.Fatal(err)
	}
	data, _ := proto.Marshal(&graspv1.RepoSyncNeeds{RepoRef: "30617:aa:r1", Relays: []string{"ws://127.0.0.1:2"}})
	if _, err := index.Put(ctx, "k1", data); err != nil {
		t.Fatal(err)
	}
	// Bring the stream back once a publish has failed.
	waitFor(t, ctx, "a refused publish", func() bool {
		s := logs.String()
		return strings.Contains(s, "not acknowledged") || strings.Contains(s, "term failed")
	})
	if _, err := test.JS.CreateStream(ctx, cmdCfg); err != nil {
		t.Fatal(err)
	}
	got := next()
	if got.GetRelayUrl() != "ws://127.0.0.1:2" || got.GetEpoch() != first.GetEpoch() {
		t.Fatalf("after the stream came back: command for %s in epoch %d, want ws://127.0.0.1:2 in the first term's epoch %d; planner log:\n%s",
			got.GetRelayUrl(), got.GetEpoch(), first.GetEpoch(), logs.String())
	}
}
