package leader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/leader"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// leaseTTL is short so failover tests finish in seconds; 1 s is the
// smallest limit-marker TTL the server accepts.
const leaseTTL = time.Second

var names = bus.Names{Prefix: "lt"}

// leaseBucket creates the lease bucket the way every service does and returns
// a handle on it through a connection of its own (one per candidate, so a
// test can kill one candidate by closing its connection).
func leaseBucket(t *testing.T, n *testkit.NATS) func() (jetstream.KeyValue, *nats.Conn) {
	t.Helper()
	return leaseBucketTTL(t, n, leaseTTL)
}

// leaseBucketTTL is leaseBucket with a bucket TTL of ttl.
func leaseBucketTTL(t *testing.T, n *testkit.NATS, ttl time.Duration) func() (jetstream.KeyValue, *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	o := bus.DefaultOptions()
	o.LeaseTTL = ttl
	if err := bus.SetupLeases(ctx, js, names, o); err != nil {
		t.Fatal(err)
	}
	return func() (jetstream.KeyValue, *nats.Conn) {
		nc := n.Connect(t)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, names.LeaseBucket())
		if err != nil {
			t.Fatal(err)
		}
		return kv, nc
	}
}

// term is one observed leadership term.
type term struct {
	id    string
	epoch uint64
	at    time.Time
}

// arena counts concurrent leaders; any overlap is a violation.
type arena struct {
	active     atomic.Int32
	violations atomic.Int32
	terms      chan term
}

func newArena() *arena { return &arena{terms: make(chan term, 100)} }

func (a *arena) lead(id string) func(ctx context.Context, epoch uint64) error {
	return func(ctx context.Context, epoch uint64) error {
		if a.active.Add(1) > 1 {
			a.violations.Add(1)
		}
		a.terms <- term{id: id, epoch: epoch, at: time.Now()}
		<-ctx.Done()
		a.active.Add(-1)
		return nil
	}
}

func (a *arena) next(t *testing.T, within time.Duration) term {
	t.Helper()
	select {
	case tm := <-a.terms:
		return tm
	case <-time.After(within):
		t.Fatalf("no leader within %s", within)
		return term{}
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// candidate runs leader.Run in a goroutine owned by the test.
type candidate struct {
	cancel context.CancelFunc
	done   chan error
	conn   *nats.Conn
}

func start(t *testing.T, kv jetstream.KeyValue, nc *nats.Conn, id string, a *arena) *candidate {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{cancel: cancel, done: make(chan error, 1), conn: nc}
	cfg := leader.Config{KV: kv, Key: "role", ID: id, TTL: leaseTTL, Clock: clock.Real{}, Log: quiet()}
	go func() { c.done <- leader.Run(ctx, cfg, a.lead(id)) }()
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *candidate) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
		c.done <- nil // later stops return at once
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestFailoverWhenHolderDies(t *testing.T) {
	n := testkit.StartNATS(t)
	open := leaseBucket(t, n)
	a := newArena()
	kvA, ncA := open()
	start(t, kvA, ncA, "a", a)
	first := a.next(t, 5*time.Second)
	if first.id != "a" {
		t.Fatalf("first leader %q, want a", first.id)
	}
	kvB, ncB := open()
	start(t, kvB, ncB, "b", a)

	// Kill a without a clean release: its NATS connection goes away, so it
	// can neither renew nor delete the lease.
	killed := time.Now()
	ncA.Close()
	second := a.next(t, 30*time.Second)
	t.Logf("standby took over %s after the holder died (TTL %s)", second.at.Sub(killed).Round(time.Millisecond), leaseTTL)
	if second.id != "b" {
		t.Fatalf("second leader %q, want b", second.id)
	}
	if second.epoch <= first.epoch {
		t.Fatalf("epoch went from %d to %d", first.epoch, second.epoch)
	}
	if v := a.violations.Load(); v != 0 {
		t.Fatalf("%d moments with two leaders", v)
	}
	l, ok, err := leader.Current(context.Background(), kvB, "role")
	if err != nil || !ok || l.Holder != "b" {
		t.Fatalf("Current = %+v %v %v, want holder b", l, ok, err)
	}
}

func TestCleanStopReleasesAtOnce(t *testing.T) {
	n := testkit.StartNATS(t)
	open := leaseBucket(t, n)
	a := newArena()
	kvA, ncA := open()
	ca := start(t, kvA, ncA, "a", a)
	first := a.next(t, 5*time.Second)
	kvB, ncB := open()
	start(t, kvB, ncB, "b", a)

	stopped := time.Now()
	ca.stop(t)
	// Released, not left to expire: right after Run returns the key is gone
	// (or already b's).
	l, ok, err := leader.Current(context.Background(), kvB, "role")
	if err != nil {
		t.Fatal(err)
	}
	if ok && l.Holder == "a" {
		t.Fatalf("lease still held by a after a clean stop")
	}
	second := a.next(t, 30*time.Second)
	t.Logf("standby took over %s after a clean stop (TTL %s)", second.at.Sub(stopped).Round(time.Millisecond), leaseTTL)
	if second.id != "b" || second.epoch <= first.epoch {
		t.Fatalf("second term %+v after %+v", second, first)
	}
}

// TestCleanStopReleasesAfterAnUnconfirmedRenewal: a renewal can be stored
// while its holder, stopping, no longer waits for the answer, so the holder's
// last known revision is stale when it releases. The lease must still go at
// once. The renewal is simulated by rewriting the holder's own value from
// another connection; the TTL is long so the holder's next real renewal does
// not come first.
func TestCleanStopReleasesAfterAnUnconfirmedRenewal(t *testing.T) {
	n := testkit.StartNATS(t)
	const ttl = 9 * time.Second // renewals every 3 s
	open := leaseBucketTTL(t, n, ttl)
	a := newArena()
	kvA, _ := open()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- leader.Run(ctx, leader.Config{KV: kvA, Key: "role", ID: "a", TTL: ttl, Clock: clock.Real{}, Log: quiet()}, a.lead("a"))
	}()
	t.Cleanup(cancel)
	a.next(t, 5*time.Second)
	kvB, _ := open()
	var cur jetstream.KeyValueEntry
	for {
		// Wait for the first renewal's epoch stamp, so the rewrite below
		// follows it rather than racing it.
		e, err := kvB.Get(context.Background(), "role")
		if err != nil {
			t.Fatal(err)
		}
		if l, _, _ := leader.Current(context.Background(), kvB, "role"); l.Epoch != 0 {
			cur = e
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := kvB.Update(context.Background(), "role", cur.Value(), cur.Revision()); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if l, ok, err := leader.Current(context.Background(), kvB, "role"); err != nil || ok {
		t.Fatalf("after a clean stop the lease is %+v (held %v, err %v), want released", l, ok, err)
	}
}

// TestEpochsIncreaseAndNeverOverlap hands the lease around three candidates
// many times, by clean stops and by kills, and checks that every term's
// epoch is greater than the one before and that no two terms overlapped.
func TestEpochsIncreaseAndNeverOverlap(t *testing.T) {
	n := testkit.StartNATS(t)
	open := leaseBucket(t, n)
	a := newArena()
	cands := map[string]*candidate{}
	spawn := func(id string) {
		kv, nc := open()
		cands[id] = start(t, kv, nc, id, a)
	}
	for i := range 3 {
		spawn(fmt.Sprint("c", i))
	}
	var last uint64
	serial := 3
	for round := range 6 {
		tm := a.next(t, 30*time.Second)
		if tm.epoch <= last {
			t.Fatalf("round %d: epoch %d after %d", round, tm.epoch, last)
		}
		last = tm.epoch
		// Remove the leader, alternately cleanly and by killing it, and
		// bring in a fresh candidate.
		c := cands[tm.id]
		if round%2 == 0 {
			c.stop(t)
		} else {
			c.conn.Close()
			c.cancel()
		}
		delete(cands, tm.id)
		spawn(fmt.Sprint("c", serial))
		serial++
	}
	if v := a.violations.Load(); v != 0 {
		t.Fatalf("%d moments with two leaders", v)
	}
}

func TestEpochSurvivesExpiry(t *testing.T) {
	n := testkit.StartNATS(t)
	open := leaseBucket(t, n)
	a := newArena()
	kvA, ncA := open()
	start(t, kvA, ncA, "a", a)
	first := a.next(t, 5*time.Second)
	ncA.Close()

	// Wait until the server has expired the lease with nobody standing by.
	kv, _ := open()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, ok, err := leader.Current(context.Background(), kv, "role")
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lease never expired")
		}
		time.Sleep(50 * time.Millisecond) // waiting on the server's real-time expiry
	}
	kvB, ncB := open()
	start(t, kvB, ncB, "b", a)
	if second := a.next(t, 10*time.Second); second.epoch <= first.epoch {
		t.Fatalf("epoch %d after expiry, earlier term had %d", second.epoch, first.epoch)
	}
}

func TestLeadErrorEndsRunAndReleases(t *testing.T) {
	n := testkit.StartNATS(t)
	open := leaseBucket(t, n)
	kv, _ := open()
	boom := errors.New("boom")
	err := leader.Run(context.Background(), leader.Config{KV: kv, Key: "role", ID: "a", Log: quiet()},
		func(ctx context.Context, epoch uint64) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want boom", err)
	}
	if _, ok, err := leader.Current(context.Background(), kv, "role"); err != nil || ok {
		t.Fatalf("lease still held after lead failed (ok=%v err=%v)", ok, err)
	}
}

func TestConfigValidation(t *testing.T) {
	n := testkit.StartNATS(t)
	open := leaseBucket(t, n)
	kv, nc := open()
	js, _ := jetstream.New(nc)
	noTTL, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "no_ttl"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  leader.Config
	}{
		{"no bucket", leader.Config{Key: "k", ID: "a"}},
		{"no key", leader.Config{KV: kv, ID: "a"}},
		{"no id", leader.Config{KV: kv, Key: "k"}},
		{"ttl above bucket ttl", leader.Config{KV: kv, Key: "k", ID: "a", TTL: 2 * leaseTTL}},
		{"bucket without ttl", leader.Config{KV: noTTL, Key: "k", ID: "a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			led := false
			err := leader.Run(context.Background(), c.cfg, func(ctx context.Context, _ uint64) error {
				mu.Lock()
				led = true
				mu.Unlock()
				return nil
			})
			if err == nil || led {
				t.Fatalf("Run = %v (led=%v), want a configuration error", err, led)
			}
		})
	}
}
