package ingester_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// countingStore counts the reads made through it: Query calls, each one
// round trip to the store (a few for a filter the store splits), and among
// them the policy's forward-reference reads (one tag, nothing else).
type countingStore struct {
	ingester.Store
	queries, forward atomic.Int64
}

func (c *countingStore) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	c.queries.Add(1)
	if len(f.IDs) == 0 && len(f.Kinds) == 0 && len(f.Authors) == 0 && len(f.Tags) == 1 && f.Limit == 20 {
		c.forward.Add(1)
	}
	return c.Store.Query(ctx, f)
}

// Reachable keeps the wrapped store's outage probe (see failures.go).
func (c *countingStore) Reachable(ctx context.Context) error {
	if r, ok := c.Store.(interface{ Reachable(context.Context) error }); ok {
		return r.Reachable(ctx)
	}
	return nil
}

// refWorld is a sync's later layer: the store already holds repos
// announcements and rootsPerRepo issues on each, written by another writer
// (so the ingester has no memory of them, as in a deployment with several
// ingesters or after more than refCacheTTL), and the deliveries are a
// comment on every stored issue and newPerRepo new issues on every
// repository, interleaved as a relay's page mixes them.
type refWorld struct {
	stored     []*nostr.Event
	deliveries []delivery
	accepted   map[string]bool
}

var (
	refWorldsMu sync.Mutex
	refWorlds   = map[[3]int]*refWorld{}
)

func refWorldFor(t testing.TB, repos, rootsPerRepo, newPerRepo int) *refWorld {
	t.Helper()
	refWorldsMu.Lock()
	defer refWorldsMu.Unlock()
	key := [3]int{repos, rootsPerRepo, newPerRepo}
	if w := refWorlds[key]; w != nil {
		return w
	}
	w := &refWorld{accepted: map[string]bool{}}
	authors := []testkit.Key{testkit.NewKey(), testkit.NewKey(), testkit.NewKey()}
	base := nostr.Now() - 10_000
	var fresh []*nostr.Event
	for r := range repos {
		owner := testkit.NewKey()
		d := fmt.Sprintf("repo-%d", r)
		w.stored = append(w.stored, served(owner, d))
		ref := testkit.RepoRef(owner.PubKey, d)
		for n := range rootsPerRepo {
			issue := authors[n%3].Issue(ref, fmt.Sprintf("issue %d", n), testkit.At(base+nostr.Timestamp(n)))
			w.stored = append(w.stored, issue)
			fresh = append(fresh, authors[(n+1)%3].Comment(issue, issue, "a comment", testkit.At(base+nostr.Timestamp(n)+1)))
		}
		for n := range newPerRepo {
			fresh = append(fresh, authors[n%3].Issue(ref, fmt.Sprintf("new issue %d", n), testkit.At(base+nostr.Timestamp(n)+2)))
		}
	}
	// Repository by repository would give each batch a few repositories;
	// a relay's page of a sync mixes many.
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(fresh), func(i, j int) { fresh[i], fresh[j] = fresh[j], fresh[i] })
	for _, e := range fresh {
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		w.deliveries = append(w.deliveries, delivery{data: data, msgID: e.ID, relay: "wss://a.example"})
		w.accepted[e.ID] = true
	}
	refWorlds[key] = w
	return w
}

// ingestCounted stores w's events in st directly, publishes its deliveries
// in batch messages (as the fetcher does) and runs one ingester, reading
// through a countingStore, until they are all stored. It returns the
// store's reads and the decide and store stages' histograms (count: the
// decide batches; sum: their seconds).
func (e *env) ingestCounted(t testing.TB, w *refWorld) (c *countingStore, decide, store *histogram, wall time.Duration) {
	t.Helper()
	ctx := context.Background()
	res := e.raw.SaveBatch(ctx, w.stored)
	for n, r := range res {
		if r.Err != nil || !r.Stored {
			t.Fatalf("store %s: stored %v, %v", w.stored[n].ID, r.Stored, r.Err)
		}
	}
	e.publishBatched(t, w.deliveries, fetcherPublishBatch)
	c = &countingStore{Store: e.store}
	reg := prometheus.NewRegistry()
	b, err := bus.Connect(ctx, e.nats.URL, "ingester-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	ing := ingester.New(ingester.Config{Consumer: "ingester"}, b, c, service, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- ing.Run(runCtx) }()
	defer func() {
		cancel()
		b.Close()
		<-done
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for ing.Stats().Stored < int64(len(w.accepted)) {
		if time.Now().After(deadline) {
			t.Fatalf("stored %d of %d", ing.Stats().Stored, len(w.accepted))
		}
		time.Sleep(time.Millisecond)
	}
	wall = time.Since(start)
	// The stage is observed just after the batch's last event is counted.
	for time.Since(start) < wall+5*time.Second {
		decide, store = stageHistogram(t, reg, "decide"), stageHistogram(t, reg, "store")
		if decide.sum > 0 && decide.count >= store.count {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return c, decide, store, wall
}

// histogram is one stage's series of grasp_ingester_stage_seconds.
type histogram struct {
	count uint64
	sum   float64
}

func stageHistogram(t testing.TB, reg *prometheus.Registry, stage string) *histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grasp_ingester_stage_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == stage {
					return &histogram{count: m.GetHistogram().GetSampleCount(), sum: m.GetHistogram().GetSampleSum()}
				}
			}
		}
	}
	return &histogram{}
}

// maxReadsPerBatch bounds the store reads of one decide batch of refWorld's
// events: the verify stage's "already stored" (1), the decide stage's
// deletions (1), referenced ids (1) and referenced coordinates (1), with
// room for a second pass. One read per event would be ~100 a batch.
const maxReadsPerBatch = 8

// TestDecideReadsPerBatch: the store reads of ingesting a sync's layer of
// comments and issues on stored issues and repositories do not grow with
// the batch's events: rule 5's reads of every event's references are made
// for the whole batch (docs/decisions/0060-decide-reads-per-batch.md). On
// the embedded store and, with GRASP_TEST_POSTGRES_URL, on PostgreSQL.
func TestDecideReadsPerBatch(t *testing.T) {
	w := refWorldFor(t, 40, 10, 5) // 600 events: 400 comments, 200 issues on 40 repositories
	run := func(t *testing.T, e *env) {
		c, decide, _, _ := e.ingestCounted(t, w)
		want := maps.Clone(w.accepted)
		for _, e := range w.stored {
			want[e.ID] = true
		}
		e.assertExactly(t, want)
		q := c.queries.Load()
		t.Logf("%d events in %d decide batches: %d store reads (%d forward-reference reads)", len(w.accepted), decide.count, q, c.forward.Load())
		if decide.count == 0 {
			t.Fatal("no decide batch observed")
		}
		if perBatch := float64(q) / float64(decide.count); perBatch > maxReadsPerBatch {
			t.Errorf("%.1f store reads per decide batch of ~%d events, want at most %d: the decide stage reads per event",
				perBatch, len(w.accepted)/int(decide.count), maxReadsPerBatch)
		}
		if f := c.forward.Load(); f != 0 {
			t.Errorf("%d forward-reference reads, want none: every event here references a stored one", f)
		}
	}
	t.Run("embedded", func(t *testing.T) { run(t, newEnv(t)) })
	t.Run("postgres", func(t *testing.T) {
		e := newPostgresEnv(t)
		run(t, e)
	})
}

// BenchmarkDecideReads ingests refWorld's layer (1,500 comments and issues
// on 100 stored repositories) with one ingester on the store of
// GRASP_BENCH_DECIDE_STORE (postgres: GRASP_TEST_POSTGRES_URL; else the
// embedded store) and reports the decide and store stages' seconds per
// batch (grasp_ingester_stage_seconds; the decide stage includes the
// store's) and the store reads per batch. Run with -benchtime 1x -count N.
func BenchmarkDecideReads(b *testing.B) {
	w := refWorldFor(b, 100, 10, 5)
	var decide, store float64
	var batches uint64
	var reads int64
	var wall time.Duration
	for range b.N {
		b.StopTimer()
		var e *env
		if os.Getenv("GRASP_BENCH_DECIDE_STORE") == "postgres" {
			e = newPostgresEnv(b)
		} else {
			e = newEnv(b)
		}
		b.StartTimer()
		c, d, s, wl := e.ingestCounted(b, w)
		decide += d.sum
		store += s.sum
		batches += d.count
		reads += c.queries.Load()
		wall += wl
	}
	b.ReportMetric(1000*decide/float64(batches), "decide-ms/batch")
	b.ReportMetric(1000*store/float64(batches), "store-ms/batch")
	b.ReportMetric(float64(reads)/float64(batches), "reads/batch")
	b.ReportMetric(float64(len(w.accepted))*float64(b.N)/float64(batches), "events/batch")
	b.ReportMetric(float64(b.N*len(w.accepted))/wall.Seconds(), "events/s")
}
