package ingester_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// delivery is one message a fetcher would publish on grasp.events.<shard>.
type delivery struct {
	data  []byte
	msgID string // Nats-Msg-Id; "" for a copy arriving after the dedup window
	relay string
}

// workload is a stream of fetched events and what an ingester must make of
// it.
type workload struct {
	deliveries []delivery
	// accepted is the set of ids that must end up stored, each once.
	accepted map[string]bool
	// badID and badSig count the forged deliveries that must be refused.
	badID, badSig int
	// tooLarge counts events over the policy's size limit.
	tooLarge int
	// refusedForGood are the ids the ingester must remember as rejected
	// (pkg/rejected): the oversized events.
	refusedForGood map[string]bool
}

// workloadSpec sizes a workload.
type workloadSpec struct {
	repos, issuesPerRepo, commentsPerIssue int
	orphanIssues                           int // issues delivered after their comments
	dupAfterWindow, dupInWindow            int // copies without / with the same Nats-Msg-Id
	forgedSig, wrongID                     int
	oversized                              int
	unanchored                             int // notes referencing nothing: parked, never stored
}

// spec20k is the integration workload: 20,000+ deliveries, 8,020 of them
// valid. Under -race one valid event costs ~5 ms end to end (signing,
// verification, store, parking lookups on the in-process NATS server),
// a wrong-id one a hash: the mix keeps the test near a minute.
var spec20k = workloadSpec{
	repos: 20, issuesPerRepo: 50, commentsPerIssue: 7, orphanIssues: 100,
	dupAfterWindow: 3000, dupInWindow: 500, forgedSig: 2500, wrongID: 7000, oversized: 6, unanchored: 200,
}

// specSmall is for the fault tests (kill, outage, replicas).
var specSmall = workloadSpec{
	repos: 4, issuesPerRepo: 20, commentsPerIssue: 12, orphanIssues: 8,
	dupAfterWindow: 100, dupInWindow: 30, forgedSig: 50, wrongID: 50, oversized: 2, unanchored: 10,
}

func (s workloadSpec) total() int {
	issues := s.repos * s.issuesPerRepo
	return s.repos + issues + issues*s.commentsPerIssue + s.dupAfterWindow + s.dupInWindow +
		s.forgedSig + s.wrongID + s.oversized + s.unanchored
}

var (
	workloadsMu sync.Mutex
	workloads   = map[workloadSpec]*workload{}
)

// workloadFor builds (once per test binary run) a workload: signing 20,000
// events under -race takes seconds, so every test reuses it. Signing runs
// on every core.
func workloadFor(t testing.TB, s workloadSpec) *workload {
	t.Helper()
	workloadsMu.Lock()
	defer workloadsMu.Unlock()
	if w, ok := workloads[s]; ok {
		return w
	}
	w := buildWorkload(s)
	workloads[s] = w
	return w
}

func buildWorkload(s workloadSpec) *workload {
	owner := testkit.NewKey()
	authors := make([]testkit.Key, 8)
	for i := range authors {
		authors[i] = testkit.NewKey()
	}
	base := nostr.Now() - 100_000
	anns := make([]*nostr.Event, s.repos)
	for r := range anns {
		anns[r] = served(owner, fmt.Sprintf("repo-%d", r))
	}
	// Issues and comments are signed in parallel: one goroutine per core,
	// each with its own slice range.
	type thread struct {
		issue    *nostr.Event
		comments []*nostr.Event
	}
	threads := make([]thread, s.repos*s.issuesPerRepo)
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for wkr := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := wkr; n < len(threads); n += workers {
				r := n % s.repos
				a := authors[n%len(authors)]
				issue := a.Issue(testkit.RepoRef(owner.PubKey, fmt.Sprintf("repo-%d", r)), fmt.Sprintf("issue %d", n),
					testkit.At(base+nostr.Timestamp(n)))
				cs := make([]*nostr.Event, s.commentsPerIssue)
				for c := range cs {
					ca := authors[(n+c+1)%len(authors)]
					cs[c] = ca.Comment(issue, issue, fmt.Sprintf("comment %d on %d", c, n),
						testkit.At(base+nostr.Timestamp(n)+nostr.Timestamp(c)+1))
				}
				threads[n] = thread{issue: issue, comments: cs}
			}
		}()
	}
	wg.Wait()

	w := &workload{accepted: map[string]bool{}, refusedForGood: map[string]bool{}}
	relays := []string{"wss://a.example", "wss://b.example", "wss://c.example"}
	add := func(evt *nostr.Event, msgID, relay string) {
		data, err := json.Marshal(evt)
		if err != nil {
			panic(err)
		}
		w.deliveries = append(w.deliveries, delivery{data: data, msgID: msgID, relay: relay})
	}
	var valid []*nostr.Event
	for _, a := range anns {
		add(a, a.ID, relays[0])
		valid = append(valid, a)
	}
	// The first orphanIssues threads have their comments first, their
	// issue at the very end of the stream.
	for n, th := range threads {
		if n >= s.orphanIssues {
			add(th.issue, th.issue.ID, relays[n%3])
			valid = append(valid, th.issue)
		}
		for _, c := range th.comments {
			add(c, c.ID, relays[n%3])
			valid = append(valid, c)
		}
	}
	// Forged copies of valid events interleaved with the rest: a changed
	// content with a recomputed id (bad signature), or a changed content
	// under the old id (wrong id).
	for n := range s.forgedSig {
		f := *valid[(n*7)%len(valid)]
		f.Tags = append(nostr.Tags{}, f.Tags...)
		f.Content += " (forged)"
		f.ID = f.GetID()
		add(&f, f.ID, relays[1])
		w.badSig++
	}
	for n := range s.wrongID {
		f := *valid[(n+3)%len(valid)] // distinct sources: distinct Nats-Msg-Ids
		f.Content += " (tampered)"
		add(&f, "tampered-"+f.ID, relays[2])
		w.badID++
	}
	for n := range s.oversized {
		big := authors[0].Comment(threads[len(threads)-1].issue, threads[len(threads)-1].issue,
			strings.Repeat("x", 300<<10)+fmt.Sprint(n))
		add(big, big.ID, relays[0])
		w.tooLarge++
		w.refusedForGood[big.ID] = true
	}
	for n := range s.unanchored {
		note := authors[n%len(authors)].Note(fmt.Sprintf("spam %d", n))
		add(note, note.ID, relays[n%3])
	}
	// Copies from other relays: within the dedup window (the stream drops
	// them) and after it (they reach the ingester as duplicates).
	for n := range s.dupInWindow {
		e := valid[(n*13)%len(valid)]
		add(e, e.ID, relays[(n+1)%3])
	}
	for n := range s.dupAfterWindow {
		e := valid[(n*17+5)%len(valid)]
		add(e, "", relays[(n+2)%3])
	}
	for n := range s.orphanIssues {
		add(threads[n].issue, threads[n].issue.ID, relays[n%3])
		valid = append(valid, threads[n].issue)
	}
	for _, e := range valid {
		w.accepted[e.ID] = true
	}
	return w
}

// env is embedded NATS, the contract's streams and a real store, shared by
// the ingester replicas a test starts.
type env struct {
	nats  *natstest.NATS
	bus   *bus.Bus // the publisher's (fetcher's) connection
	store ingester.Store
	raw   *store.Store
	// inProcess connects replicas to the embedded server without TCP, as
	// graspd's services do.
	inProcess bool
}

func newEnv(t testing.TB) *env {
	t.Helper()
	n := natstest.Start(t)
	b, err := bus.Connect(context.Background(), n.URL, "fetcher-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := bus.Setup(context.Background(), b.JS, b.Names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	// GRASP_BENCH_STORE names the embedded store's scheme (kv+pebble,
	// kv+badger, …) so the benchmark can compare engines; unset, a plain
	// directory: the default.
	url := t.TempDir()
	if scheme := os.Getenv("GRASP_BENCH_STORE"); scheme != "" {
		url = scheme + "://" + url
	}
	st, err := store.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return &env{nats: n, bus: b, store: st, raw: st}
}

// replica is one running ingester with its own NATS connection.
type replica struct {
	ing    *ingester.Ingester
	bus    *bus.Bus
	cancel context.CancelFunc
	done   chan error
}

// start runs an ingester replica on its own connection.
func (e *env) start(t testing.TB, cfg ingester.Config, st ingester.Store) *replica {
	t.Helper()
	var b *bus.Bus
	var err error
	if e.inProcess {
		b, err = bus.ConnectInProcess(e.nats.Server, "ingester-test", bus.DefaultNames())
	} else {
		b, err = bus.Connect(context.Background(), e.nats.URL, "ingester-test", bus.DefaultNames(), bus.Security{})
	}
	if err != nil {
		t.Fatal(err)
	}
	if st == nil {
		st = e.store
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ing := ingester.New(cfg, b, st, service, logger, nil)
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{ing: ing, bus: b, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- ing.Run(ctx) }()
	t.Cleanup(func() { r.kill(t) })
	return r
}

// kill stops the replica abruptly: its connection closes under whatever it
// holds, so unacked messages are redelivered to others.
func (r *replica) kill(t testing.TB) {
	if r.cancel == nil {
		return
	}
	r.bus.Close()
	r.cancel()
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, nats.ErrConnectionClosed) {
		t.Logf("ingester stopped: %v", err)
	}
	r.cancel = nil
}

// waitPulling waits until n pull requests wait on the ingesters' consumer:
// replicas started with start are pulling only once their Run has set up
// its streams, which on a loaded machine can take longer than one replica
// needs to drain a whole workload. Each replica with nothing to do holds one
// waiting pull, so n replicas each get a share of what is published after.
func (e *env) waitPulling(t testing.TB, consumer string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if cons, err := e.bus.JS.Consumer(ctx, e.bus.Names.EventsStream(), consumer); err == nil {
			if info, err := cons.Info(ctx); err == nil && info.NumWaiting >= n {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d replicas not pulling from %s after a minute", n, consumer)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// publish sends the deliveries asynchronously with a bounded window, as the
// fetcher does.
func (e *env) publish(t testing.TB, ds []delivery) {
	t.Helper()
	ctx := context.Background()
	for n, d := range ds {
		msg := nats.NewMsg(e.bus.Names.EventsSubject(n % 4))
		msg.Data = d.data
		if d.msgID != "" {
			msg.Header.Set(nats.MsgIdHdr, d.msgID)
		}
		msg.Header.Set(bus.HeaderRelay, d.relay)
		if _, err := e.bus.JS.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
		if n%1000 == 999 {
			e.awaitPublished(t, ctx) // a bounded window, well under the client's 4,096
		}
	}
	e.awaitPublished(t, ctx)
}

func (e *env) awaitPublished(t testing.TB, ctx context.Context) {
	t.Helper()
	select {
	case <-e.bus.JS.PublishAsyncComplete():
	case <-ctx.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("publishing timed out")
	}
}

// waitDrained waits until every event is stored or refused (the consumer
// has nothing pending or unacked) and the store holds want: wake-ups of
// parked events run after their parents' acks, so the store is polled too.
func (e *env) waitDrained(t testing.TB, want map[string]bool, limit time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	for {
		cons, err := e.bus.JS.Consumer(ctx, e.bus.Names.EventsStream(), "ingester")
		if err == nil {
			info, err := cons.Info(ctx)
			// Counting the store is a large query: only once drained.
			if err == nil && info.NumPending == 0 && info.NumAckPending == 0 && e.count(t) >= len(want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained after %s: store holds %d of %d", limit, e.count(t), len(want))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// count is how many events the store holds.
func (e *env) count(t testing.TB) int {
	t.Helper()
	all, err := e.raw.Query(context.Background(), nostr.Filter{Limit: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	return len(all)
}

// assertExactly checks the store holds exactly want, each id once.
func (e *env) assertExactly(t testing.TB, want map[string]bool) {
	t.Helper()
	all, err := e.raw.Query(context.Background(), nostr.Filter{Limit: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, evt := range all {
		seen[evt.ID]++
	}
	missing, extra, twice := 0, 0, 0
	for id := range want {
		if seen[id] == 0 {
			missing++
		}
	}
	for id, n := range seen {
		if !want[id] {
			extra++
		}
		if n > 1 {
			twice++
		}
	}
	if missing+extra+twice > 0 {
		t.Errorf("store: %d events, want %d: %d missing, %d unexpected, %d stored more than once",
			len(all), len(want), missing, extra, twice)
	}
}

// deadLetters returns the messages on the dead-letter stream.
func (e *env) deadLetters(t testing.TB) []jetstream.Msg {
	t.Helper()
	ctx := context.Background()
	s, err := e.bus.JS.Stream(ctx, e.bus.Names.DeadLetterStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(int(info.State.Msgs), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	return out
}
