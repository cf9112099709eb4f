package ingester_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/rejected"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// fastConfig redelivers quickly so fault tests finish in seconds.
func fastConfig() ingester.Config {
	return ingester.Config{
		Consumer: "ingester", MaxDeliver: 3, AckWait: 3 * time.Second,
		FetchBatch: 64, RetryDelay: 50 * time.Millisecond, OutageBackoffMax: 100 * time.Millisecond,
		LagInterval: 500 * time.Millisecond,
	}
}

// TestIngest20k: 20,000+ deliveries with duplicates across relays, forged
// signatures, wrong ids, orphans whose parents arrive last, oversized and
// unanchored events → exactly the valid, accepted set is stored, once, and
// every forgery is counted and refused.
func TestIngest20k(t *testing.T) {
	spec := spec20k
	if testing.Short() {
		spec = specSmall
	}
	w := workloadFor(t, spec)
	if !testing.Short() && len(w.deliveries) < 20_000 {
		t.Fatalf("workload has %d deliveries, want ≥ 20,000", len(w.deliveries))
	}
	e := newEnv(t)
	// This test counts refusals per event, so nothing may be redelivered:
	// under -race on a loaded box messages can wait in the pipeline longer
	// than fastConfig's 3 s AckWait and be counted again. The sweep is off
	// so only wake-ups unpark (the sweep has its own tests).
	cfg := fastConfig()
	cfg.AckWait = time.Minute
	cfg.ParkSweep = time.Hour
	r := e.start(t, cfg, nil)
	start := time.Now()
	e.publish(t, w.deliveries)
	e.waitDrained(t, w.accepted, 6*time.Minute)
	t.Logf("%d deliveries ingested in %s", len(w.deliveries), time.Since(start).Round(time.Millisecond))
	e.assertExactly(t, w.accepted)

	st := r.ing.Stats()
	if got := st.Refused[string(policy.ReasonBadSignature)]; got != int64(w.badSig) {
		t.Errorf("bad-signature refusals = %d, want %d", got, w.badSig)
	}
	if got := st.Refused[string(policy.ReasonBadID)]; got != int64(w.badID) {
		t.Errorf("bad-id refusals = %d, want %d", got, w.badID)
	}
	if got := st.Refused[string(policy.ReasonTooLarge)]; got != int64(w.tooLarge) {
		t.Errorf("too-large refusals = %d, want %d", got, w.tooLarge)
	}
	if st.Stored != int64(len(w.accepted)) {
		t.Errorf("stored counter = %d, want %d (each event stored once)", st.Stored, len(w.accepted))
	}
	if st.Duplicates < int64(spec.dupAfterWindow)/2 {
		t.Errorf("duplicates = %d, want most of the %d late copies", st.Duplicates, spec.dupAfterWindow)
	}
	if st.DeadLettered != 0 {
		t.Errorf("dead-lettered = %d, want 0", st.DeadLettered)
	}
	// Refusals for good are remembered for NIP-77; forgeries never are.
	kv, err := rejected.Open(context.Background(), e.bus)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	remembered := map[string]bool{}
	for k := range keys.Keys() {
		remembered[k] = true
	}
	if len(remembered) != len(w.refusedForGood) {
		t.Errorf("%d events remembered as rejected, want %d", len(remembered), len(w.refusedForGood))
	}
	for id := range w.refusedForGood {
		if !remembered[id] {
			t.Errorf("oversized %s not remembered as rejected", id[:8])
		}
	}
	t.Logf("stats: %+v", st)
}

// TestKillAndRestart kills an ingester mid-stream (its connection closes
// under in-flight messages) and starts another: the final store equals the
// uninterrupted result.
func TestKillAndRestart(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	first := e.start(t, fastConfig(), nil)
	e.publish(t, w.deliveries)
	deadline := time.Now().Add(time.Minute)
	for first.ing.Stats().Stored < int64(len(w.accepted))/3 {
		if time.Now().After(deadline) {
			t.Fatal("first ingester made no progress")
		}
		time.Sleep(5 * time.Millisecond)
	}
	first.kill(t)
	killedAt := first.ing.Stats().Stored
	second := e.start(t, fastConfig(), nil)
	e.waitDrained(t, w.accepted, 2*time.Minute)
	e.assertExactly(t, w.accepted)
	if killedAt >= int64(len(w.accepted)) || second.ing.Stats().Consumed == 0 {
		t.Errorf("the kill was not mid-stream: first stored %d of %d", killedAt, len(w.accepted))
	}
	t.Logf("killed after %d stored; second: %+v", killedAt, second.ing.Stats())
}

// TestTwoReplicasShareTheStream: two replicas on one durable consumer both
// work, and every event is stored exactly once.
func TestTwoReplicasShareTheStream(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	a := e.start(t, fastConfig(), nil)
	b := e.start(t, fastConfig(), nil)
	e.waitPulling(t, fastConfig().Consumer, 2) // both share the work only if both pull
	e.publish(t, w.deliveries)
	e.waitDrained(t, w.accepted, 2*time.Minute)
	e.assertExactly(t, w.accepted)
	sa, sb := a.ing.Stats(), b.ing.Stats()
	if sa.Consumed == 0 || sb.Consumed == 0 {
		t.Errorf("a replica did no work: consumed %d and %d", sa.Consumed, sb.Consumed)
	}
	if got := sa.Stored + sb.Stored; got != int64(len(w.accepted)) {
		t.Errorf("stored by both replicas = %d, want %d (each event exactly once)", got, len(w.accepted))
	}
	if got, want := sa.Consumed+sb.Consumed, int64(len(w.deliveries)-specSmall.dupInWindow); got != want {
		t.Logf("consumed %d messages for %d distinct deliveries (redeliveries)", got, want)
	}
}

// flakyStore wraps a real store with faults: all calls fail while down; Save
// of poisoned ids always fails.
type flakyStore struct {
	ingester.Store
	down     atomic.Bool
	failures atomic.Int64
	mu       sync.Mutex
	poison   map[string]bool
}

var errStoreDown = errors.New("store unavailable (test)")

func (f *flakyStore) fail() error {
	if f.down.Load() {
		f.failures.Add(1)
		return errStoreDown
	}
	return nil
}

func (f *flakyStore) Query(ctx context.Context, flt nostr.Filter) ([]*nostr.Event, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	return f.Store.Query(ctx, flt)
}

func (f *flakyStore) Save(ctx context.Context, evt *nostr.Event) (bool, error) {
	if err := f.fail(); err != nil {
		return false, err
	}
	f.mu.Lock()
	poisoned := f.poison[evt.ID]
	f.mu.Unlock()
	if poisoned {
		return false, errors.New("row rejected by the backend (test poison)")
	}
	return f.Store.Save(ctx, evt)
}

// SaveBatch fails as a whole while down, as a backend without a
// connection does, and for poisoned ids event by event, as the embedded
// backends report a row they reject.
func (f *flakyStore) SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult {
	res := make([]store.SaveResult, len(evts))
	if err := f.fail(); err != nil {
		for n := range res {
			res[n].Err = err
		}
		return res
	}
	var healthy []*nostr.Event
	var at []int
	f.mu.Lock()
	for n, evt := range evts {
		if f.poison[evt.ID] {
			res[n].Err = errors.New("row rejected by the backend (test poison)")
			continue
		}
		healthy = append(healthy, evt)
		at = append(at, n)
	}
	f.mu.Unlock()
	for k, r := range f.Store.SaveBatch(ctx, healthy) {
		res[at[k]] = r
	}
	return res
}

func (f *flakyStore) Delete(ctx context.Context, evt *nostr.Event) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Store.Delete(ctx, evt)
}

// TestStoreOutage: the store fails every call for 10 s mid-stream (real
// time: the outage the issue names); the ingester holds its messages, backs
// off (capped at the test's 100 ms, so it resumes at once) and resumes —
// nothing stored during the outage, nothing lost, nothing stored twice,
// nothing dead-lettered, though the outage outlasts the test's 3 s AckWait
// (messages the ingester holds are kept alive; those still queued in it are
// redelivered and found duplicates).
func TestStoreOutage(t *testing.T) {
	const outage = 10 * time.Second
	w := workloadFor(t, specSmall)
	began := time.Now()
	e := newEnv(t)
	fs := &flakyStore{Store: e.store, poison: map[string]bool{}}
	r := e.start(t, fastConfig(), fs)
	e.publish(t, w.deliveries)
	deadline := time.Now().Add(time.Minute)
	for r.ing.Stats().Stored < int64(len(w.accepted))/4 {
		if time.Now().After(deadline) {
			t.Fatal("no progress before the outage")
		}
		time.Sleep(5 * time.Millisecond)
	}
	fs.down.Store(true)
	end := time.Now().Add(outage)
	// Saves already past the wrapper when it went down may still finish:
	// count from the 20th failure on.
	for fs.failures.Load() < 20 {
		if time.Now().After(deadline) {
			t.Fatal("the ingester stopped calling the failing store")
		}
		time.Sleep(10 * time.Millisecond)
	}
	storedAtOutage, failuresAtOutage := r.ing.Stats().Stored, fs.failures.Load()
	for time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond)
		if got := r.ing.Stats().Stored; got != storedAtOutage {
			t.Fatalf("stored %d events while the store was down", got-storedAtOutage)
		}
	}
	// Probes every ≤ 100 ms: the ingester kept trying all along.
	if n := fs.failures.Load() - failuresAtOutage; n < 20 {
		t.Errorf("only %d store calls during the outage: the ingester stopped probing", n)
	}
	fs.down.Store(false)
	e.waitDrained(t, w.accepted, 2*time.Minute)
	t.Logf("ingest with a %s outage took %s (workload signed beforehand)", outage, time.Since(began).Round(time.Millisecond))
	e.assertExactly(t, w.accepted)
	st := r.ing.Stats()
	if st.DeadLettered != 0 {
		t.Errorf("%d messages dead-lettered because of the outage", st.DeadLettered)
	}
	if st.Stored != int64(len(w.accepted)) {
		t.Errorf("stored counter = %d, want %d", st.Stored, len(w.accepted))
	}
}

// TestPoisonMessageDeadLettered: an event the store keeps rejecting while
// otherwise healthy goes to the dead-letter stream after MaxDeliver
// deliveries, with the reason, and does not hold up the events after it.
func TestPoisonMessageDeadLettered(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	// A comment (nothing depends on it), from the middle of the stream.
	var poisonID string
	for _, d := range w.deliveries[len(w.deliveries)/2:] {
		if strings.Contains(string(d.data), `"kind":1111`) && d.msgID != "" {
			poisonID = d.msgID
			break
		}
	}
	fs := &flakyStore{Store: e.store, poison: map[string]bool{poisonID: true}}
	want := map[string]bool{}
	for id := range w.accepted {
		want[id] = true
	}
	delete(want, poisonID)
	r := e.start(t, fastConfig(), fs)
	e.publish(t, w.deliveries)
	e.waitDrained(t, want, 2*time.Minute)
	e.assertExactly(t, want)
	// Late copies of the poisoned event (from other relays) are poisoned
	// too: every dead letter must be it.
	dead := e.deadLetters(t)
	if len(dead) == 0 || int64(len(dead)) != r.ing.Stats().DeadLettered {
		t.Fatalf("dead-letter stream holds %d messages, counter says %d, want ≥ 1 and equal", len(dead), r.ing.Stats().DeadLettered)
	}
	for _, m := range dead {
		h := m.Headers()
		if !strings.Contains(h.Get(ingester.HeaderDeadReason), "test poison") || h.Get(ingester.HeaderDeadDeliveries) != "3" ||
			!strings.HasPrefix(h.Get(ingester.HeaderDeadSubject), "grasp.events.") {
			t.Errorf("dead letter headers: %v", h)
		}
		if !strings.Contains(string(m.Data()), poisonID) {
			t.Error("a dead letter does not carry the poisoned event")
		}
	}
}

// redeliveringStore fails every Save of its poisoned event, and holds the
// first such failure back until the server has redelivered the message
// (its AckWait ran out while the store answered slowly).
type redeliveringStore struct {
	*flakyStore
	redelivered func(context.Context) error
	once        sync.Once
	calls       atomic.Int64
}

func (r *redeliveringStore) poisoned(ctx context.Context) {
	r.calls.Add(1)
	r.once.Do(func() {
		if err := r.redelivered(ctx); err != nil {
			panic(err)
		}
	})
}

func (r *redeliveringStore) Save(ctx context.Context, evt *nostr.Event) (bool, error) {
	ok, err := r.flakyStore.Save(ctx, evt)
	if err != nil {
		r.poisoned(ctx)
	}
	return ok, err
}

func (r *redeliveringStore) SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult {
	res := r.flakyStore.SaveBatch(ctx, evts)
	for _, s := range res {
		if s.Err != nil {
			r.poisoned(ctx)
		}
	}
	return res
}

// TestDeadLetteredOnceWhenRedelivered: a message redelivered while it is
// being dead-lettered (its AckWait ran out before the ack) is dead-lettered
// again by the redelivery; the dead-letter stream holds it once and the
// counter counts it once.
func TestDeadLetteredOnceWhenRedelivered(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	// A repository announcement: stored on its own, depending on nothing.
	var poison delivery
	var poisonID string
	for _, d := range w.deliveries {
		id, _, _ := strings.Cut(d.msgID, ":")
		if strings.Contains(string(d.data), `"kind":30617`) && w.accepted[id] {
			poison, poisonID = d, id
			break
		}
	}
	if poisonID == "" {
		t.Fatal("the workload has no repository announcement")
	}
	cfg := fastConfig()
	cfg.MaxDeliver, cfg.AckWait = 1, time.Second // the first failure dead-letters
	rs := &redeliveringStore{flakyStore: &flakyStore{Store: e.store, poison: map[string]bool{poisonID: true}}}
	rs.redelivered = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for {
			cons, err := e.bus.JS.Consumer(ctx, e.bus.Names.EventsStream(), cfg.Consumer)
			if err != nil {
				return err
			}
			if info, err := cons.Info(ctx); err == nil && info.NumRedelivered > 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the poisoned message was not redelivered: %w", ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	r := e.start(t, cfg, rs)
	e.publish(t, []delivery{poison})
	waitFor(t, "the redelivery's store failure", func() bool { return rs.calls.Load() >= 2 })
	// A marker settled after the redelivery (batches are settled in order).
	e.publish(t, []delivery{{data: []byte("{not an event"), relay: poison.relay}})
	waitFor(t, "the marker refused", func() bool { return r.ing.Stats().Refused[string(policy.ReasonMalformed)] == 1 })
	dead := e.deadLetters(t)
	if len(dead) != 1 || r.ing.Stats().DeadLettered != 1 {
		t.Fatalf("dead-letter stream holds %d messages, counter says %d, want 1 and 1", len(dead), r.ing.Stats().DeadLettered)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
