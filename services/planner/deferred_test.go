package planner

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// deferRules make one repository's minimal live set (8 filters) exceed the
// budget, with a headroom of exactly 1 (budget/2 + hash % (budget − budget/2)),
// and build one deferred consolidation per round.
func deferRules() Rules {
	r := testRules()
	r.MaxLiveFilters = 2
	r.ConsolidatePerTick = 1
	r.ConsolidateEvery = 10 * time.Millisecond
	return r
}

// twoRelaysSynced brings relays A (session s1) and B (s2) to Connected with
// r1 (roots x, y) confirmed: live 8 each, limit 8 + 1.
func twoRelaysSynced(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, deferRules(), 1)
	h.repo("r1", []string{relayA, relayB}, "x", "y")
	h.recompute()
	h.connect(relayA, "s1") // 1-1, 1-2
	h.connect(relayB, "s2") // 1-3, 1-4
	for _, b := range []string{"1-1", "1-2"} {
		h.done(relayA, "s1", b)
	}
	for _, b := range []string{"1-3", "1-4"} {
		h.done(relayB, "s2", b)
	}
	expect(t, "quiet", h.advance(time.Minute))
	for _, u := range []string{relayA, relayB} {
		if s := h.relay(u); s.LiveFilters != 8 || h.m.LiveBudget(s) != 9 || h.status(u) != "CONNECTED" {
			t.Fatalf("%s: live %d budget %d status %s", u, s.LiveFilters, h.m.LiveBudget(s), h.status(u))
		}
	}
	return h
}

const mergedXYZW = "live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,w,z,yL0 #E=x,w,z,yL0 #q=x,w,z,yL0] hist=[]"

// A relay whose minimal set is above the budget and outgrows its headroom
// is not consolidated inside the recompute: the new items get their live
// subscriptions, and Tick consolidates the queued relays one per round, in
// the order they were queued. A consolidation merges the live sets the
// items batches opened (smallest first, here all three) into one named set
// and closes them by name after it; layer 1's set is left alone.
func TestDeferredConsolidationRunsInOrder(t *testing.T) {
	h := twoRelaysSynced(t)
	h.repo("r1", []string{relayA, relayB}, "x", "y", "z")
	expect(t, "11 > 9 on both: deferred, live kept", h.recompute(),
		"add wss://a.example s1 1-5 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]",
		"add wss://b.example s2 1-6 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]")
	if n := h.m.DeferredConsolidations(); n != 2 {
		t.Fatalf("%d consolidations queued, want 2", n)
	}
	met := NewMetrics(nil)
	met.queue(h.m)
	if g := testutil.ToFloat64(met.deferred); g != 2 {
		t.Fatalf("grasp_planner_deferred_consolidations = %v, want 2", g)
	}
	if next := h.m.NextDeadline(); !next.Equal(h.now) {
		t.Fatalf("next deadline %s, want now (%s)", next, h.now)
	}
	// More items before the drain: live again, the queue keeps one entry
	// per relay; A's batch for z completes (confirmed), B's stays pending.
	h.repo("r1", []string{relayA, relayB}, "x", "y", "z", "w")
	expect(t, "still deferred", h.recompute(),
		"add wss://a.example s1 1-7 roots=w live=[#e=wL0 #E=wL0 #q=wL0] hist=[#e=w #E=w #q=w]",
		"add wss://b.example s2 1-8 roots=w live=[#e=wL0 #E=wL0 #q=wL0] hist=[#e=w #E=w #q=w]")
	if n := h.m.DeferredConsolidations(); n != 2 {
		t.Fatalf("%d consolidations queued, want 2 (one per relay)", n)
	}
	expect(t, "z confirmed on A", h.done(relayA, "s1", "1-5"))

	expect(t, "first round: A, queued first", h.advance(0),
		"add wss://a.example s1  "+mergedXYZW,
		"close wss://a.example s1 live=1-5,1-7,1-2 after=L1-1")
	expect(t, "paced", h.advance(5*time.Millisecond))
	expect(t, "second round: B", h.advance(5*time.Millisecond),
		"add wss://b.example s2  "+mergedXYZW,
		"close wss://b.example s2 live=1-6,1-8,1-4 after=L1-2")
	expect(t, "queue empty", h.advance(time.Minute))
	for _, u := range []string{relayA, relayB} {
		if s := h.relay(u); s.LiveFilters != 8 || s.LiveFilters > h.m.LiveBudget(s) {
			t.Fatalf("%s: live %d after consolidation, budget %d", u, s.LiveFilters, h.m.LiveBudget(s))
		}
	}
	if next := h.m.NextDeadline(); h.m.DeferredConsolidations() != 0 || next.Before(h.now.Add(time.Hour)) {
		t.Fatalf("queue %d, next deadline in %s (only the daily resync is left)", h.m.DeferredConsolidations(), next.Sub(h.now))
	}
	// The batches in flight still confirm.
	h.done(relayA, "s1", "1-7")
	h.done(relayB, "s2", "1-6")
	h.done(relayB, "s2", "1-8")
	for _, u := range []string{relayA, relayB} {
		if got := h.confirmed(u); got != "r1:w,x,y,z" {
			t.Fatalf("%s confirmed %q", u, got)
		}
	}
}

// A queued consolidation is for the session it was queued on: after a
// session change the new session's live set was built from scratch, so it
// is dropped.
func TestDeferredConsolidationDroppedOnSessionChange(t *testing.T) {
	h := twoRelaysSynced(t)
	h.repo("r1", []string{relayA}, "x", "y", "z")
	h.repo("r1", []string{relayA, relayB}, "x", "y", "z")
	h.recompute() // A 1-5, B 1-6, both queued
	h.done(relayA, "s1", "1-5")
	h.disconnect(relayA, "s1")
	// Quick reconnect: one catch-up with layer 1 and x, y, z live (8).
	got := h.connect(relayA, "s3")
	if len(got) != 1 || !contains(got[0], "add wss://a.example s3 1-7 repos=r1 roots=x,z,y since=") {
		t.Fatalf("reconnect: %q", got)
	}
	expect(t, "A's entry dropped, B's built in the same round", h.advance(0),
		"replace wss://b.example s2 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,z,yL0 #E=x,z,yL0 #q=x,z,yL0]")
	if h.m.DeferredConsolidations() != 0 {
		t.Fatalf("%d queued", h.m.DeferredConsolidations())
	}
	if s := h.relay(relayA); s.LiveFilters != 8 {
		t.Fatalf("A: live %d on the new session", s.LiveFilters)
	}
}

// A relay dropped (no repository lists it any more) while its consolidation
// was queued needs none; nor does one consolidated for another reason
// meanwhile (here: the daily resync replaces the live set).
func TestDeferredConsolidationNotNeededAfterRemoval(t *testing.T) {
	h := twoRelaysSynced(t)
	h.repo("r1", []string{relayA, relayB}, "x", "y", "z")
	h.recompute() // A 1-5, B 1-6, both queued
	h.done(relayA, "s1", "1-5")
	h.repo("r1", []string{relayB}, "x", "y", "z")
	expect(t, "A no longer listed", h.recompute(), "drop wss://a.example")
	// z was still pending on B: its batch is a first read, not a resync.
	expect(t, "B's daily resync replaces its live set", h.advance(24*time.Hour),
		"add wss://b.example s2 1-7 L1 resync hist=[k30617,10317]",
		"replace wss://b.example s2 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,z,yL0 #E=x,z,yL0 #q=x,z,yL0]",
		"add wss://b.example s2 1-8 resync repos=r1 roots=x,y hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]",
		"add wss://b.example s2 1-9 roots=z hist=[#e=z #E=z #q=z]")
	expect(t, "nothing left to consolidate", h.advance(time.Second))
	if h.m.DeferredConsolidations() != 0 {
		t.Fatalf("%d queued", h.m.DeferredConsolidations())
	}
}

// Removed items leave a relay whose minimal set is above the budget: the
// consolidation that drops their live subscriptions is deferred as well.
func TestDeferredRemovalConsolidation(t *testing.T) {
	h := twoRelaysSynced(t)
	h.repo("r2", []string{relayA}, "u")
	h.recompute()
	h.done(relayA, "s1", "1-5")
	expect(t, "consolidate with r2: a merge", h.advance(time.Minute),
		"add wss://a.example s1  live=[#a=r1,r2L0 #A=r1,r2L0 #q=r1,r2L0 k30618#d=r1,r2L0 #e=u,x,yL0 #E=u,x,yL0 #q=u,x,yL0] hist=[]",
		"close wss://a.example s1 live=1-5,1-2 after=L1-1")
	// A removal cannot be merged away: the live set is replaced.
	h.unrepo("r2")
	expect(t, "removal: deferred", h.recompute())
	expect(t, "paced: a round ran at this instant", h.advance(0))
	expect(t, "drain", h.advance(10*time.Millisecond),
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0]")
}
