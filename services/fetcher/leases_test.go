package fetcher

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/delayproxy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/loadgen"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// A replica stopping gracefully keeps its shard's lease while the shard's
// relay connections close — here for three lease TTLs, as a relay that
// ignores the close handshake under load can make it — so no other replica
// can take the shard and connect to a relay ours is still connected to;
// once they are closed the lease is freed at once.
func TestGracefulReleaseHoldsLeaseUntilConnectionsClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	kv := leaseBucket(t, ctx, ttl)
	gained := make(chan int, 1)
	closing, closed := make(chan struct{}), make(chan struct{})
	l := newShardLeases(kv, "a", ShardLeaseConfig{TTL: ttl, Shards: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(s int) { gained <- s },
		func(s int, reason string) {
			close(closing)
			<-closed // the shard's connections are still closing
		})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(runCtx)
	}()
	finish := sync.OnceFunc(func() { close(closed) }) // the connections have closed
	defer func() {
		finish()
		<-done
	}()
	select {
	case <-gained:
	case <-ctx.Done():
		t.Fatal("shard never gained")
	}
	stop() // graceful stop
	<-closing
	for until := time.Now().Add(3 * ttl); time.Now().Before(until); {
		if _, err := kv.Create(ctx, bus.FetcherShardKey(0), []byte("b")); err == nil {
			t.Fatal("another replica took the shard while its connections were still closing")
		}
		time.Sleep(50 * time.Millisecond)
	}
	finish()
	<-done
	if _, err := kv.Create(ctx, bus.FetcherShardKey(0), []byte("b")); err != nil {
		t.Fatalf("the shard's lease was not freed once its connections closed: %v", err)
	}
}

// A shard moved to a new replica is handed over the same way, and while
// its connections close the leases of the shards this replica keeps are
// renewed too: none lapses for another replica to take while we still
// serve it.
func TestRebalanceKeepsOtherLeasesWhileClosing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	kv := leaseBucket(t, ctx, ttl)
	// A shard count at which a second member "b" takes some shards from
	// "a" and leaves it others.
	shards := 2
	for ; len(RendezvousShards([]string{"a", "b"}, "a", shards)) == 0 || len(RendezvousShards([]string{"a", "b"}, "b", shards)) == 0; shards++ {
	}
	kept := RendezvousShards([]string{"a", "b"}, "a", shards)
	gained := make(chan int, shards)
	closing, closed := make(chan int, shards), make(chan struct{})
	l := newShardLeases(kv, "a", ShardLeaseConfig{TTL: ttl, Shards: shards}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(s int) { gained <- s },
		func(s int, reason string) {
			closing <- s
			<-closed // the moved shard's connections are still closing
		})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(runCtx)
	}()
	finish := sync.OnceFunc(func() { close(closed) }) // the moved shard's connections have closed
	defer func() {
		finish()
		stop()
		<-done
	}()
	for range shards {
		select {
		case <-gained:
		case <-ctx.Done():
			t.Fatal("shards never gained")
		}
	}
	// "b" joins (its member key kept alive) and takes its shards.
	go func() {
		for runCtx.Err() == nil {
			_, _ = kv.Put(runCtx, "m.b", []byte("b"))
			time.Sleep(ttl / 4)
		}
	}()
	<-closing
	for until := time.Now().Add(3 * ttl); time.Now().Before(until); {
		for _, s := range kept {
			if e, err := kv.Get(ctx, bus.FetcherShardKey(s)); err != nil || string(e.Value()) != "a" {
				t.Fatalf("the lease of shard %d, which we keep, lapsed while a moved shard's connections closed (%v)", s, err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	finish()
}

// leaseBucket is a lease bucket with the given TTL on a fresh embedded NATS.
func leaseBucket(t *testing.T, ctx context.Context, ttl time.Duration) jetstream.KeyValue {
	t.Helper()
	srv := natstest.Start(t)
	nc, err := nats.Connect("", nats.InProcessServer(srv.Server))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases", TTL: ttl, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// proxiedLeaseBucket is a lease bucket with the given TTL on a fresh
// embedded NATS, opened twice: directly (the test's view, another
// replica's) and through a delay proxy (the replica under test, whose
// network the test slows, stalls or cuts).
func proxiedLeaseBucket(t *testing.T, ctx context.Context, ttl time.Duration) (direct, proxied jetstream.KeyValue, p *delayproxy.Proxy, nc *nats.Conn) {
	t.Helper()
	srv := natstest.Start(t)
	open := func(url string) (jetstream.KeyValue, *nats.Conn) {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases", TTL: ttl, History: 1})
		if err != nil {
			t.Fatal(err)
		}
		return kv, nc
	}
	direct, nc = open(srv.URL)
	p = delayproxy.Start(t, strings.TrimPrefix(srv.URL, "nats://"))
	proxied, _ = open("nats://" + p.Addr)
	return direct, proxied, p, nc
}

// leaseEvents records a shardLeases' gain and lose callbacks with their
// times.
type leaseEvents struct {
	mu    sync.Mutex
	gains map[int]time.Time // last gain per shard
	calls int               // gain callbacks
	loses []leaseLoss
	lost  chan leaseLoss
}

type leaseLoss struct {
	shard  int
	reason string
	at     time.Time
}

func newLeaseEvents() *leaseEvents {
	return &leaseEvents{gains: map[int]time.Time{}, lost: make(chan leaseLoss, 64)}
}

func (e *leaseEvents) gain(s int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gains[s] = time.Now()
	e.calls++
}

func (e *leaseEvents) lose(s int, reason string) {
	l := leaseLoss{shard: s, reason: reason, at: time.Now()}
	e.mu.Lock()
	e.loses = append(e.loses, l)
	e.mu.Unlock()
	select {
	case e.lost <- l:
	default:
	}
}

func (e *leaseEvents) gained() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

func (e *leaseEvents) losses() []leaseLoss {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.loses)
}

// runLeases runs l until the test ends (then releases its leases).
func runLeases(t *testing.T, ctx context.Context, l *shardLeases) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(runCtx)
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Issue 23 §3: a replica on a saturated process — every core busy, the
// embedded NATS flooded, its NATS traffic 50–100 ms late each way (each KV
// call took 0.3–1 s in all on this 2-core box) and its answers stalled for
// longer than a renewal's timeout every two TTLs — keeps all 16 of its
// shards for three TTLs (12 renewal periods): no lose callback, so no relay
// is disconnected. Before, one round renewed the shards one after the other
// within TTL/3, and a renewal stored with its answer late was taken for
// another replica's write: the shards went.
func TestShardLeasesSurviveSaturatedProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl, shards = 6 * time.Second, 16
	direct, proxied, p, nc := proxiedLeaseBucket(t, ctx, ttl)
	ev := newLeaseEvents()
	l := newShardLeases(proxied, "a", ShardLeaseConfig{TTL: ttl, Shards: shards}, quietLog(), ev.gain, ev.lose)
	runLeases(t, ctx, l)
	waitUntil(t, ctx, "all shards gained", func() bool { return ev.gained() == shards })

	load := loadgen.Start(t, 1, nc, 2)
	p.SetDelay(delayproxy.Up, 50*time.Millisecond, 50*time.Millisecond)
	p.SetDelay(delayproxy.Down, 50*time.Millisecond, 50*time.Millisecond)
	stopStalls := p.Stalls(t, delayproxy.Down, 2*ttl, ttl/3+200*time.Millisecond)
	time.Sleep(3 * ttl)
	stopStalls()
	load.Stop()
	t.Logf("flood stored %d messages meanwhile", load.Published.Load())
	if lost := ev.losses(); len(lost) > 0 {
		t.Fatalf("%d shard losses under load, first: shard %d (%s)", len(lost), lost[0].shard, lost[0].reason)
	}
	for s := range shards {
		if e, err := direct.Get(ctx, bus.FetcherShardKey(s)); err != nil || string(e.Value()) != "a" {
			t.Fatalf("shard %d's lease after the load: %v", s, err)
		}
	}
}

// A renewal stored on the server whose answer comes after the renewal
// gave up waiting is recognised as ours (the key names us at a newer
// revision): the shard is kept. Before, the next renewal's compare-and-set
// at the old revision was refused and read as a takeover.
func TestShardLeaseRenewalStoredWithoutAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 6 * time.Second
	direct, proxied, p, _ := proxiedLeaseBucket(t, ctx, ttl)
	ev := newLeaseEvents()
	l := newShardLeases(proxied, "a", ShardLeaseConfig{TTL: ttl, Shards: 1}, quietLog(), ev.gain, ev.lose)
	runLeases(t, ctx, l)
	waitUntil(t, ctx, "shard gained", func() bool { return ev.gained() == 1 })
	key := bus.FetcherShardKey(0)
	rev := func() uint64 {
		e, err := direct.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision()
	}
	// Between two renewals (due every TTL/4), once this one's answer is in,
	// hold the server's answers; the next renewal is stored, its answer held
	// past the renewal's timeout.
	r0 := rev()
	waitUntil(t, ctx, "a renewal", func() bool { return rev() > r0 })
	time.Sleep(ttl / 8)
	p.Hold(delayproxy.Down, true)
	r1 := rev()
	landed := time.Now().Add(ttl / 2)
	for rev() == r1 && time.Now().Before(landed) {
		time.Sleep(10 * time.Millisecond)
	}
	if rev() == r1 {
		p.Hold(delayproxy.Down, false)
		t.Fatal("no renewal reached the server while its answers were held")
	}
	time.Sleep(ttl/3 + 200*time.Millisecond) // the renewal has given up on its answer
	p.Hold(delayproxy.Down, false)
	r2 := rev()
	waitUntil(t, ctx, "renewals after the held answer", func() bool { return rev() > r2+1 })
	if lost := ev.losses(); len(lost) > 0 {
		t.Fatalf("shard lost after a renewal stored without its answer: %s", lost[0].reason)
	}
	if e, err := direct.Get(ctx, key); err != nil || string(e.Value()) != "a" {
		t.Fatalf("lease after the held answer: %v", err)
	}
}

// A lease another replica has taken is given up at the next renewal.
func TestShardLeaseTakenOverIsLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	direct, proxied, _, _ := proxiedLeaseBucket(t, ctx, ttl)
	ev := newLeaseEvents()
	l := newShardLeases(proxied, "a", ShardLeaseConfig{TTL: ttl, Shards: 1}, quietLog(), ev.gain, ev.lose)
	runLeases(t, ctx, l)
	waitUntil(t, ctx, "shard gained", func() bool { return ev.gained() == 1 })
	taken := time.Now()
	if _, err := direct.Put(ctx, bus.FetcherShardKey(0), []byte("b")); err != nil {
		t.Fatal(err)
	}
	select {
	case lost := <-ev.lost:
		if d := lost.at.Sub(taken); d > ttl {
			t.Fatalf("lease taken over given up after %s (TTL %s)", d, ttl)
		}
	case <-ctx.Done():
		t.Fatal("a lease taken by another replica was kept")
	}
}

// An owner cut off from NATS (its connection open, nothing getting through)
// stops serving before its lease can expire on the server, and the other
// replica takes the shard over within 30 s — never while the first still
// serves it. When the partition heals, the first does not take it back.
func TestShardMovesWhenOwnerPartitioned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	direct, proxied, p, _ := proxiedLeaseBucket(t, ctx, ttl)
	evA, evB := newLeaseEvents(), newLeaseEvents()
	cfg := ShardLeaseConfig{TTL: ttl, Shards: 1, Fixed: []int{0}}
	runLeases(t, ctx, newShardLeases(proxied, "a", cfg, quietLog(), evA.gain, evA.lose))
	waitUntil(t, ctx, "a holds the shard", func() bool { return evA.gained() == 1 })
	runLeases(t, ctx, newShardLeases(direct, "b", cfg, quietLog(), evB.gain, evB.lose))
	time.Sleep(ttl) // b stands by
	if evB.gained() != 0 {
		t.Fatal("b took a shard a holds")
	}
	cut := time.Now()
	p.Hold(delayproxy.Up, true)
	p.Hold(delayproxy.Down, true)
	waitUntil(t, ctx, "b takes the shard over", func() bool { return evB.gained() == 1 })
	evB.mu.Lock()
	gainedB := evB.gains[0]
	evB.mu.Unlock()
	t.Logf("a partitioned: b serves the shard after %s (TTL %s)", gainedB.Sub(cut).Round(time.Millisecond), ttl)
	if d := gainedB.Sub(cut); d > 30*time.Second {
		t.Fatalf("takeover took %s", d)
	}
	lostA := evA.losses()
	if len(lostA) != 1 || !lostA[0].at.Before(gainedB) {
		t.Fatalf("a's losses %v; b gained at %s: a must have stopped first", lostA, gainedB.Sub(cut))
	}
	p.Hold(delayproxy.Up, false)
	p.Hold(delayproxy.Down, false)
	time.Sleep(2 * ttl)
	if n := evA.gained(); n != 1 || len(evB.losses()) != 0 {
		t.Fatalf("after the partition healed: a gained %d times, b lost %v", n, evB.losses())
	}
}

// Every reason shardLeases gives for stopping a shard has its own label on
// grasp_fetcher_shard_releases_total.
func TestShardReleaseLabels(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range []string{releaseRebalanced, releaseStopping, releaseTakenOver, releaseGone, releaseExpired} {
		l := releaseLabel(r)
		if l == "other" || seen[l] {
			t.Fatalf("reason %q has label %q", r, l)
		}
		seen[l] = true
	}
}

// A replica that joins gets its shards as soon as the holder has handed
// them over, not at the rounds' pace: the holder sees the new member key and
// hands over at once, and the newcomer sees each lease it wants deleted and
// claims it (docs/decisions/0073-shard-hand-over-on-change.md). The TTL is a
// minute, so a round is every 20 s: the test's 10 s would not see the move
// if either waited for its next round.
func TestJoiningReplicaTakesShardsOnChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ttl, shards = time.Minute, 8
	kv := leaseBucket(t, ctx, ttl)
	a, b := newLeaseEvents(), newLeaseEvents()
	runLeases(t, ctx, newShardLeases(kv, "a", ShardLeaseConfig{TTL: ttl, Shards: shards}, quietLog(), a.gain, a.lose))
	waitUntil(t, ctx, "a holding every shard", func() bool { return a.gained() == shards })

	bs := RendezvousShards([]string{"a", "b"}, "b", shards)
	if len(bs) == 0 {
		t.Fatal("the split gives b nothing; pick another shard count")
	}
	runLeases(t, ctx, newShardLeases(kv, "b", ShardLeaseConfig{TTL: ttl, Shards: shards}, quietLog(), b.gain, b.lose))
	waitUntil(t, ctx, "b holding its shards", func() bool { return b.gained() == len(bs) })
	var moved []int
	for _, l := range a.losses() {
		if l.reason != releaseRebalanced {
			t.Errorf("a lost shard %d: %s, want a hand-over", l.shard, l.reason)
		}
		moved = append(moved, l.shard)
	}
	slices.Sort(moved)
	if !slices.Equal(moved, bs) {
		t.Errorf("a handed over %v, want b's share %v", moved, bs)
	}
	for _, s := range bs {
		if e, err := kv.Get(ctx, bus.FetcherShardKey(s)); err != nil || string(e.Value()) != "b" {
			t.Errorf("shard %d's lease: %v %v, want b's", s, e, err)
		}
	}
}
