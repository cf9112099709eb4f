package relay

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// The relay's limits over the websocket: per REQ, per connection, per
// address, and the write timeout that disconnects a client that stops reading;
// then the per-address limiters (limits.go) alone. The frame guard's own
// tests are in package frameguard.

// TestLimits: filters per REQ, subscriptions per connection, event rate and
// connections per address, and the trusted-address exemption.
func TestLimits(t *testing.T) {
	now := time.Unix(1_750_000_000, 0)
	clock := func() time.Time { return now }
	cfg := Config{MaxFilters: 2, MaxSubscriptions: 2, EventRate: 1, EventBurst: 2, ConnectRate: 1, ConnectBurst: 100, MaxConnsPerAddr: 3}
	s := startServer(t, serverOpts{cfg: cfg, now: clock, keep: true})
	c := dial(t, s.url)
	closedFor := func(id string) func(nostr.Envelope, string) bool {
		return func(env nostr.Envelope, _ string) bool {
			cl, ok := env.(*nostr.ClosedEnvelope)
			return ok && cl.SubscriptionID == id
		}
	}
	eoseFor := func(id string) func(nostr.Envelope, string) bool {
		return func(env nostr.Envelope, _ string) bool {
			e, ok := env.(*nostr.EOSEEnvelope)
			return ok && string(*e) == id
		}
	}

	c.write(nostr.ReqEnvelope{SubscriptionID: "f", Filters: nostr.Filters{{}, {}, {}}})
	if env, _ := c.next(closedFor("f")); !strings.HasPrefix(env.(*nostr.ClosedEnvelope).Reason, "blocked: too many filters") {
		t.Fatalf("got %v", env)
	}
	c.write(nostr.ReqEnvelope{SubscriptionID: "a", Filters: nostr.Filters{{Kinds: []int{1}}}})
	c.next(eoseFor("a"))
	c.write(nostr.ReqEnvelope{SubscriptionID: "b", Filters: nostr.Filters{{Kinds: []int{1}}}})
	c.next(eoseFor("b"))
	c.write(nostr.ReqEnvelope{SubscriptionID: "c", Filters: nostr.Filters{{Kinds: []int{1}}}})
	if env, _ := c.next(closedFor("c")); !strings.HasPrefix(env.(*nostr.ClosedEnvelope).Reason, "blocked: too many open subscriptions") {
		t.Fatalf("got %v", env)
	}
	c.write(nostr.CloseEnvelope("a"))
	c.write(nostr.ReqEnvelope{SubscriptionID: "c", Filters: nostr.Filters{{Kinds: []int{1}}}})
	c.next(eoseFor("c"))

	// Event rate: a burst of 2, then one per second of the injected clock.
	m := testkit.NewKey()
	for i := 0; i < 2; i++ {
		if ok, msg := c.publish(m.Note("x")); strings.HasPrefix(msg, "rate-limited") || ok {
			t.Fatalf("event %d within the burst: %v %q (want a policy refusal, not a rate limit)", i, ok, msg)
		}
	}
	if ok, msg := c.publish(m.Note("x")); ok || !strings.HasPrefix(msg, "rate-limited: ") {
		t.Fatalf("event over the rate: %v %q", ok, msg)
	}
	now = now.Add(time.Second)
	if _, msg := c.publish(m.Note("x")); strings.HasPrefix(msg, "rate-limited") {
		t.Fatal("token not refilled after a second")
	}

	// Connections per address: c holds one, two more fit, the fourth is
	// refused with HTTP 429.
	dial(t, s.url)
	dial(t, s.url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := testrelay.Dial(ctx, s.url)
	if err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("fourth connection: %v, want a 429 refusal", err)
	}

	// A trusted address is exempt from all of it.
	trusted := startServer(t, serverOpts{cfg: Config{EventRate: 1, EventBurst: 1, MaxConnsPerAddr: 1}, now: clock})
	tc := dial(t, trusted.url)
	dial(t, trusted.url)
	for i := 0; i < 5; i++ {
		if _, msg := tc.publish(m.Note("x")); strings.HasPrefix(msg, "rate-limited") {
			t.Fatal("trusted address rate-limited")
		}
	}
}

// A client that subscribes and stops reading is disconnected after the
// write timeout; until then its full socket holds khatru's broadcast, which
// holds the lock over every subscription. Publishers and other readers keep
// being served, and the stalled client's connection ends.
func TestStalledReaderDisconnected(t *testing.T) {
	s := startServer(t, serverOpts{cfg: Config{WriteTimeout: 300 * time.Millisecond}})
	alice := testkit.NewKey()
	pub := dial(t, s.url)
	if ok, m := pub.publish(served(alice, "repo")); !ok {
		t.Fatal(m)
	}
	stalled := dial(t, s.url)
	stalled.write(nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{1621}, Limit: 0, LimitZero: true}}})
	stalled.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EOSEEnvelope); return ok })

	// Far more than loopback socket buffers hold: the relay's writes to
	// the stalled client must block, then time out.
	big := strings.Repeat("x", 60_000)
	for i := 0; i < 200; i++ {
		if ok, m := pub.publish(alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), fmt.Sprint(i), testkit.WithContent(big))); !ok {
			t.Fatalf("publish %d: %s", i, m)
		}
	}
	if got := dial(t, s.url).query(nostr.Filter{Kinds: []int{1621}, Limit: 1}); len(got) != 1 {
		t.Fatalf("another reader got %d events", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err := stalled.c.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatal("the stalled client is still connected")
			}
			return
		}
	}
}

func TestAddrLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newAddrLimiter(1, 3, func() time.Time { return now })
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for i := 0; i < 3; i++ {
		if !l.allow(a) {
			t.Fatalf("burst token %d refused", i)
		}
	}
	if l.allow(a) {
		t.Fatal("fourth token within the same instant allowed")
	}
	if !l.allow(b) {
		t.Fatal("another address is limited by the first")
	}
	now = now.Add(time.Second)
	if !l.allow(a) || l.allow(a) {
		t.Fatal("refill after one second should give exactly one token")
	}
}

func TestConnCounter(t *testing.T) {
	c := &connCounter{max: 2, count: map[netip.Addr]int{}}
	a := netip.MustParseAddr("192.0.2.1")
	if !c.acquire(a) || !c.acquire(a) || c.acquire(a) {
		t.Fatal("want exactly two slots")
	}
	c.release(a)
	if !c.acquire(a) {
		t.Fatal("released slot not reusable")
	}
}
