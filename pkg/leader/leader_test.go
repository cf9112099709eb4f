package leader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/leader"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/delayproxy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/loadgen"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// leaseTTL is short so failover tests finish in seconds; 1 s is the
// smallest limit-marker TTL the server accepts.
const leaseTTL = time.Second

var names = bus.Names{Prefix: "lt"}

// leaseBucket creates the lease bucket the way every service does and returns
// a handle on it through a connection of its own (one per candidate, so a
// test can kill one candidate by closing its connection).
func leaseBucket(t *testing.T, n *natstest.NATS) func() (jetstream.KeyValue, *nats.Conn) {
	t.Helper()
	return leaseBucketTTL(t, n, leaseTTL)
}

// leaseBucketTTL is leaseBucket with a bucket TTL of ttl.
func leaseBucketTTL(t *testing.T, n *natstest.NATS, ttl time.Duration) func() (jetstream.KeyValue, *nats.Conn) {
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
	n := natstest.Start(t)
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
	n := natstest.Start(t)
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
	n := natstest.Start(t)
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
	for {
		// Wait for the first renewal's epoch stamp, so the rewrite below
		// follows it rather than racing it. A renewal landing between the
		// read and the rewrite makes the rewrite's revision stale: read
		// again and rewrite after that one.
		e, err := kvB.Get(context.Background(), "role")
		if err != nil {
			t.Fatal(err)
		}
		if l, _, _ := leader.Current(context.Background(), kvB, "role"); l.Epoch != 0 {
			_, err := kvB.Update(context.Background(), "role", e.Value(), e.Revision())
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrKeyExists) && !strings.Contains(err.Error(), "wrong last sequence") {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
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
	n := natstest.Start(t)
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
	n := natstest.Start(t)
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
	n := natstest.Start(t)
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
	n := natstest.Start(t)
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

// proxiedCandidate opens the lease bucket through a delay proxy, so the test
// can slow, stall or cut this candidate's NATS traffic.
func proxiedCandidate(t *testing.T, n *natstest.NATS) (jetstream.KeyValue, *delayproxy.Proxy) {
	t.Helper()
	p := delayproxy.Start(t, strings.TrimPrefix(n.URL, "nats://"))
	nc, err := nats.Connect("nats://" + p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), names.LeaseBucket())
	if err != nil {
		t.Fatal(err)
	}
	return kv, p
}

// leadUntilLost runs Run for id with the given TTL until the test ends and
// reports every term's start and the cause of its end.
func leadUntilLost(t *testing.T, kv jetstream.KeyValue, id string, ttl time.Duration) (started chan uint64, ended chan error) {
	t.Helper()
	started, ended = make(chan uint64, 10), make(chan error, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- leader.Run(ctx, leader.Config{KV: kv, Key: "role", ID: id, TTL: ttl, Clock: clock.Real{}, Log: quiet()},
			func(ctx context.Context, epoch uint64) error {
				started <- epoch
				<-ctx.Done()
				ended <- context.Cause(ctx)
				return nil
			})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return started, ended
}

// Issue 23 §3: a leader on a saturated process — every core busy, the
// embedded NATS flooded, its NATS traffic 50–100 ms late each way and its
// answers stalled for longer than a renewal's timeout every two TTLs —
// keeps leading for three TTLs. Before, a renewal that timed out left one
// more attempt before the deadline, and a renewal stored with its answer
// late made the next one "refused": the term ended.
func TestLeaderKeepsLeaseOnSaturatedProcess(t *testing.T) {
	n := natstest.Start(t)
	const ttl = 6 * time.Second
	open := leaseBucketTTL(t, n, ttl)
	_, nc := open()
	kv, p := proxiedCandidate(t, n)
	started, ended := leadUntilLost(t, kv, "a", ttl)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
	}
	load := loadgen.Start(t, 1, nc, 2)
	p.SetDelay(delayproxy.Up, 50*time.Millisecond, 50*time.Millisecond)
	p.SetDelay(delayproxy.Down, 50*time.Millisecond, 50*time.Millisecond)
	stopStalls := p.Stalls(t, delayproxy.Down, 2*ttl, ttl/3+200*time.Millisecond)
	select {
	case cause := <-ended:
		t.Fatalf("leadership lost under load: %v", cause)
	case <-time.After(3 * ttl):
	}
	stopStalls()
	load.Stop()
}

// A renewal stored on the server whose answer comes after the renewal gave
// up waiting is recognised as ours (the key names this holder and term at
// a newer revision): the term goes on.
func TestLeaderRenewalStoredWithoutAnswer(t *testing.T) {
	n := natstest.Start(t)
	const ttl = 6 * time.Second
	open := leaseBucketTTL(t, n, ttl)
	direct, _ := open()
	kv, p := proxiedCandidate(t, n)
	started, ended := leadUntilLost(t, kv, "a", ttl)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
	}
	rev := func() uint64 {
		e, err := direct.Get(context.Background(), "role")
		if err != nil {
			p.Hold(delayproxy.Down, false)
			t.Fatalf("lease key: %v (the term ended and released it)", err)
		}
		return e.Revision()
	}
	waitRev := func(what string, cond func(uint64) bool, within time.Duration) {
		t.Helper()
		for until := time.Now().Add(within); !cond(rev()); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(until) {
				p.Hold(delayproxy.Down, false)
				t.Fatalf("no %s within %s", what, within)
			}
		}
	}
	r0 := rev()
	waitRev("renewal", func(r uint64) bool { return r > r0 }, ttl)
	// Between two renewals (due every TTL/4), once this one's answer is in,
	// hold the server's answers: the next renewal is stored, its answer held
	// past the renewal's timeout.
	time.Sleep(ttl / 8)
	p.Hold(delayproxy.Down, true)
	r1 := rev()
	waitRev("renewal stored while answers are held", func(r uint64) bool { return r > r1 }, ttl/2)
	time.Sleep(ttl/3 + 200*time.Millisecond)
	p.Hold(delayproxy.Down, false)
	r2 := rev()
	waitRev("renewals after the held answer", func(r uint64) bool { return r > r2+1 }, 2*ttl)
	select {
	case cause := <-ended:
		t.Fatalf("leadership lost after a renewal stored without its answer: %v", cause)
	default:
	}
}

// A leader cut off from NATS (its connection open, nothing getting through)
// steps down before its lease can expire on the server, and a standby takes
// over within 30 s, never while the first still leads.
func TestLeaderPartitionedStandbyTakesOver(t *testing.T) {
	n := natstest.Start(t)
	const ttl = 2 * time.Second
	open := leaseBucketTTL(t, n, ttl)
	a := newArena()
	kvA, p := proxiedCandidate(t, n)
	ctx, cancel := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() {
		doneA <- leader.Run(ctx, leader.Config{KV: kvA, Key: "role", ID: "a", TTL: ttl, Clock: clock.Real{}, Log: quiet()}, a.lead("a"))
	}()
	t.Cleanup(func() {
		p.Hold(delayproxy.Up, false)
		p.Hold(delayproxy.Down, false)
		cancel()
		<-doneA
	})
	if first := a.next(t, 10*time.Second); first.id != "a" {
		t.Fatalf("first leader %q", first.id)
	}
	kvB, ncB := open()
	start(t, kvB, ncB, "b", a)
	cut := time.Now()
	p.Hold(delayproxy.Up, true)
	p.Hold(delayproxy.Down, true)
	second := a.next(t, 30*time.Second)
	t.Logf("leader partitioned: standby leads after %s (TTL %s)", second.at.Sub(cut).Round(time.Millisecond), ttl)
	if second.id != "b" {
		t.Fatalf("second leader %q", second.id)
	}
	if v := a.violations.Load(); v != 0 {
		t.Fatalf("%d moments with two leaders", v)
	}
}
