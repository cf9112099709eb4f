package planner

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

const (
	relayA = "wss://a.example"
	relayB = "wss://b.example"
)

func TestFreshStart(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x", "y")
	expect(t, "discovered", h.recompute(), "ensure wss://a.example")
	if h.status(relayA) != "CONNECTING" {
		t.Fatalf("status %s", h.status(relayA))
	}
	expect(t, "connected", h.connect(relayA, "s1"),
		"add wss://a.example s1 1-1 L1 live=[k30617,10317L0] hist=[k30617,10317]",
		"add wss://a.example s1 1-2 repos=r1 roots=x,y live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
}

// synced brings relayA to Connected with r1 (roots x, y) confirmed on
// session s1; batches 1-1 (layer 1) and 1-2 (items).
func synced(t *testing.T, rules Rules) *harness {
	h := newHarness(t, rules, 1)
	h.repo("r1", []string{relayA}, "x", "y")
	h.recompute()
	h.connect(relayA, "s1")
	expect(t, "layer 1 done", h.done(relayA, "s1", "1-1"))
	expect(t, "items done", h.done(relayA, "s1", "1-2"))
	if got := h.confirmed(relayA); got != "r1:x,y" {
		t.Fatalf("confirmed %q", got)
	}
	if h.status(relayA) != "SYNCING" {
		t.Fatalf("status %s right after the last batch, want SYNCING until the quiet period passed", h.status(relayA))
	}
	expect(t, "quiet period", h.advance(rules.QuietPeriod))
	if h.status(relayA) != "CONNECTED" {
		t.Fatalf("status %s after the quiet period", h.status(relayA))
	}
	return h
}

func TestSyncingToConnectedNeedsQuietPeriod(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.done(relayA, "s1", "1-1")
	h.done(relayA, "s1", "1-2")
	h.advance(3 * time.Second)
	// A root found in the relay's history arrives in the next discovery
	// batch, inside the quiet period: it gets its own batch, still Syncing.
	h.repo("r1", []string{relayA}, "x", "z")
	expect(t, "new root", h.recompute(),
		"add wss://a.example s1 1-3 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]")
	h.advance(5 * time.Second)
	if h.status(relayA) != "SYNCING" {
		t.Fatalf("status %s with a batch pending", h.status(relayA))
	}
	h.done(relayA, "s1", "1-3")
	h.advance(5 * time.Second)
	if h.status(relayA) != "SYNCING" {
		t.Fatalf("status %s before the quiet period ended", h.status(relayA))
	}
	h.advance(time.Second)
	if h.status(relayA) != "CONNECTED" || h.confirmed(relayA) != "r1:x,z" {
		t.Fatalf("status %s confirmed %s", h.status(relayA), h.confirmed(relayA))
	}
}

func TestQuickReconnect(t *testing.T) {
	h := synced(t, testRules())
	expect(t, "disconnected", h.disconnect(relayA, "s1"))
	if h.status(relayA) != "DISCONNECTED" {
		t.Fatalf("status %s", h.status(relayA))
	}
	h.advance(10 * time.Minute)
	// Discovered while disconnected: no command until the relay is back.
	h.repo("r1", []string{relayA}, "x", "y", "z")
	expect(t, "new root while disconnected", h.recompute())
	// since = disconnected_at − 15 min = now − 25 min, for layer 1 and for
	// the catch-up of confirmed items; the new root gets its full history.
	// One catch-up batch: layer 1 and the confirmed items, live and since.
	expect(t, "reconnected", h.connect(relayA, "s2"),
		"add wss://a.example s2 1-3 repos=r1 roots=x,y since=-1500 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[k30617,10317 #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]",
		"add wss://a.example s2 1-4 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]")
}

func TestLongReconnectStartsFresh(t *testing.T) {
	h := synced(t, testRules())
	h.disconnect(relayA, "s1")
	h.advance(15*time.Minute + time.Second)
	expect(t, "reconnected after 15 min", h.connect(relayA, "s2"),
		"add wss://a.example s2 1-3 L1 live=[k30617,10317L0] hist=[k30617,10317]",
		"add wss://a.example s2 1-4 repos=r1 roots=x,y live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
	if got := h.confirmed(relayA); got != "" {
		t.Fatalf("confirmed state kept across a long disconnect: %q", got)
	}
}

func TestExactlyFifteenMinutesIsQuick(t *testing.T) {
	h := synced(t, testRules())
	h.disconnect(relayA, "s1")
	h.advance(15 * time.Minute)
	expect(t, "reconnected", h.connect(relayA, "s2"),
		"add wss://a.example s2 1-3 repos=r1 roots=x,y since=-1800 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[k30617,10317 #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
}

func TestDailyResync(t *testing.T) {
	h := synced(t, testRules())
	// jitter 0.5: 23 h + 0.5 × 2 h = 24 h after the connect.
	expect(t, "before", h.advance(24*time.Hour-time.Minute))
	expect(t, "daily resync on the running session", h.advance(time.Minute),
		"add wss://a.example s1 1-3 L1 resync hist=[k30617,10317]",
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0]",
		"add wss://a.example s1 1-4 resync repos=r1 roots=x,y hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
	if h.status(relayA) != "SYNCING" || h.confirmed(relayA) != "" {
		t.Fatalf("status %s confirmed %q", h.status(relayA), h.confirmed(relayA))
	}
	h.done(relayA, "s1", "1-3")
	h.done(relayA, "s1", "1-4")
	h.advance(time.Minute)
	if h.status(relayA) != "CONNECTED" || h.confirmed(relayA) != "r1:x,y" {
		t.Fatalf("status %s confirmed %q", h.status(relayA), h.confirmed(relayA))
	}
	if next := h.relay(relayA).NextResync.Sub(h.now); next < 23*time.Hour-2*time.Minute || next > 25*time.Hour {
		t.Fatalf("next resync in %s", next)
	}
}

// The daily resync re-reads what the relay had confirmed in batches marked
// resync, apart from items that were not confirmed yet (their history is
// read for the first time, so what it brings was not missed); the events a
// resync batch reports missed add up in the relay's record, persisted and
// restored, whatever the batch's outcome, and nothing else counts.
func TestDailyResyncCountsMissedEvents(t *testing.T) {
	h := synced(t, testRules())
	h.advance(24*time.Hour - 2*time.Minute)
	h.repo("r1", []string{relayA}, "x", "y", "z")
	h.repo("r2", []string{relayA}, "w")
	expect(t, "new items just before the resync", h.recompute(),
		"add wss://a.example s1 1-3 repos=r2 roots=w,z live=[#a=r2L0 #A=r2L0 #q=r2L0 k30618#d=r2L0 #e=w,zL0 #E=w,zL0 #q=w,zL0] hist=[#a=r2 #A=r2 #q=r2 k30618#d=r2 #e=w,z #E=w,z #q=w,z]")
	expect(t, "daily resync", h.advance(2*time.Minute),
		"add wss://a.example s1 1-4 L1 resync hist=[k30617,10317]",
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1,r2L0 #A=r1,r2L0 #q=r1,r2L0 k30618#d=r1,r2L0 #e=x,w,z,yL0 #E=x,w,z,yL0 #q=x,w,z,yL0]",
		"add wss://a.example s1 1-5 resync repos=r1 roots=x,y hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]",
		"add wss://a.example s1 1-6 repos=r2 roots=w,z hist=[#a=r2 #A=r2 #q=r2 k30618#d=r2 #e=w,z #E=w,z #q=w,z]")
	missed := func(n uint64) *uint64 { return &n }
	h.report(relayA, "s1", &graspv1.BatchDone{BatchId: "1-4", Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK, Missed: missed(1)})
	h.now = h.now.Add(time.Second)
	h.report(relayA, "s1", &graspv1.BatchDone{BatchId: "1-5", Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_FAILED, Error: "boom", Missed: missed(2)})
	// Not a resync batch: what it finds is a first read, never a miss.
	h.report(relayA, "s1", &graspv1.BatchDone{BatchId: "1-6", Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK, Missed: missed(7)})
	s := h.relay(relayA)
	if s.ResyncMissed != 3 || !s.LastMissedAt.Equal(h.now) {
		t.Fatalf("resync missed %d at %v, want 3 at %v", s.ResyncMissed, s.LastMissedAt, h.now)
	}
	st := h.m.Snapshot(s, h.now)
	if st.GetResyncMissed() != 3 || st.GetLastMissedAt() != h.now.Unix() {
		t.Fatalf("persisted %d at %d", st.GetResyncMissed(), st.GetLastMissedAt())
	}
	m2 := NewMachine(testRules(), h.m.Index(), 2, func() float64 { return 0.5 }, nil)
	m2.Restore([]*graspv1.RelayState{st})
	if got := m2.Relays()[s.ID]; got.ResyncMissed != 3 || !got.LastMissedAt.Equal(h.now) {
		t.Fatalf("restored %d at %v", got.ResyncMissed, got.LastMissedAt)
	}
}

func TestDailyResyncDueWhileDisconnected(t *testing.T) {
	h := synced(t, testRules())
	h.advance(23*time.Hour + 55*time.Minute)
	h.disconnect(relayA, "s1")
	h.advance(10 * time.Minute)
	// Due during the outage: the reconnect is a fresh start, not a catch-up.
	expect(t, "reconnect", h.connect(relayA, "s2"),
		"add wss://a.example s2 1-3 L1 live=[k30617,10317L0] hist=[k30617,10317]",
		"add wss://a.example s2 1-4 repos=r1 roots=x,y live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
}

func TestConsolidationNeverWaitsForPending(t *testing.T) {
	rules := testRules()
	rules.MaxLiveFilters = 12
	h := synced(t, rules) // live: base 1 + r1 7 = 8
	h.repo("r1", []string{relayA}, "x", "y", "z")
	expect(t, "11 live filters: within budget", h.recompute(),
		"add wss://a.example s1 1-3 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]")
	// 1-3 is still pending: consolidation includes it and does not wait.
	h.repo("r1", []string{relayA}, "x", "y", "z", "w")
	expect(t, "14 > 12: consolidate", h.recompute(),
		"add wss://a.example s1  live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,w,z,yL0 #E=x,w,z,yL0 #q=x,w,z,yL0] hist=[]",
		"close wss://a.example s1 live=1-3,1-2 after=L1-1",
		"add wss://a.example s1 1-4 roots=w hist=[#e=w #E=w #q=w]")
	if got := h.relay(relayA).LiveFilters; got != 8 {
		t.Fatalf("live filters %d after consolidation, want 8", got)
	}
	h.done(relayA, "s1", "1-3")
	h.done(relayA, "s1", "1-4")
	if got := h.confirmed(relayA); got != "r1:w,x,y,z" {
		t.Fatalf("confirmed %q", got)
	}
}

// TestConsolidationKeepsWhatIsLive: a relay whose minimal set fits its
// budget, pushed over it by a new root, merges the new root with its
// smallest live sets and leaves the rest open: nothing already live in the
// sets it keeps is sent again (decision 0062; before, a ReplaceLive named
// every value the relay had live).
func TestConsolidationKeepsWhatIsLive(t *testing.T) {
	rules := testRules()
	rules.MaxLiveFilters = 14
	h := synced(t, rules) // live: base 1 + r1 (x, y) 7 = 8
	h.repo("r1", []string{relayA}, "x", "y", "z")
	expect(t, "11 live filters", h.recompute(),
		"add wss://a.example s1 1-3 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]")
	h.repo("r1", []string{relayA}, "x", "y", "z", "w")
	expect(t, "14 live filters: at the budget", h.recompute(),
		"add wss://a.example s1 1-4 roots=w live=[#e=wL0 #E=wL0 #q=wL0] hist=[#e=w #E=w #q=w]")
	h.repo("r1", []string{relayA}, "x", "y", "z", "w", "v")
	// 17 > 14: the minimal set is 8, so the goal is 11. The new root
	// merges with the two one-root sets; r1's own set (x, y, the
	// repository) stays open and is not named.
	expect(t, "17 > 14: merge the small sets", h.recompute(),
		"add wss://a.example s1  live=[#e=v,w,zL0 #E=v,w,zL0 #q=v,w,zL0] hist=[]",
		"close wss://a.example s1 live=1-3,1-4 after=L1-1",
		"add wss://a.example s1 1-5 roots=v hist=[#e=v #E=v #q=v]")
	if got := h.relay(relayA).LiveFilters; got != 11 {
		t.Fatalf("live filters %d after the merge, want 11", got)
	}
}

func TestLargeMinimalSetGetsHeadroom(t *testing.T) {
	rules := testRules()
	rules.MaxLiveFilters = 4     // base + one repo's minimal set is already 8
	rules.ConsolidatePerTick = 0 // at once, inside the recompute (deferred: deferred_test.go)
	h := synced(t, rules)
	s := h.relay(relayA)
	room := headroom(s, 4)
	if s.LiveFilters != 8 || room < 2 || room > 3 || h.m.LiveBudget(s) != 8+room {
		t.Fatalf("live %d headroom %d budget %d", s.LiveFilters, room, h.m.LiveBudget(s))
	}
	h.repo("r1", []string{relayA}, "x", "y", "z")
	got := h.recompute()
	if want := 8+3 > 8+room; want != (len(got) == 2) {
		t.Fatalf("11 live filters, budget %d: %q", 8+room, got)
	}
	h.repo("r1", []string{relayA}, "x", "y", "z", "w")
	got = h.recompute()
	// A merge of the tail with the new root (decision 0062).
	if len(got) != 3 || !strings.HasPrefix(got[0], "add wss://a.example s1  live=") || !strings.HasPrefix(got[1], "close wss://a.example s1 live=") {
		t.Fatalf("over budget %d must consolidate: %q", 8+room, got)
	}
}

func TestRemovalWhenTargetsShrink(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.repo("r2", []string{relayA, relayB}, "y")
	h.recompute()
	h.connect(relayA, "s1")
	h.done(relayA, "s1", "1-1")
	h.done(relayA, "s1", "1-2")
	if got := h.confirmed(relayA); got != "r1:x r2:y" {
		t.Fatalf("confirmed %q", got)
	}
	// r2's announcement drops relay A: its items leave A's confirmed state
	// and A's live subscriptions are consolidated without them.
	h.repo("r2", []string{relayB}, "y")
	expect(t, "shrink", h.recompute(),
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=xL0 #E=xL0 #q=xL0]")
	if got := h.confirmed(relayA); got != "r1:x" {
		t.Fatalf("confirmed %q", got)
	}
	// A root that disappears from the index goes too.
	h.repo("r1", []string{relayA})
	expect(t, "root removed", h.recompute(),
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0]")
	if got := h.confirmed(relayA); got != "r1:" {
		t.Fatalf("confirmed %q", got)
	}
	// No repository left: the relay is dropped.
	h.unrepo("r1")
	expect(t, "no repos left", h.recompute(), "drop wss://a.example")
	if h.relay(relayA) != nil {
		t.Fatal("dropped relay still tracked")
	}
}

func TestNeverDropWhileFirstBatchesPending(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.unrepo("r1")
	// Its items leave the live set at once; the connection stays until the
	// first batches end.
	expect(t, "first batches pending", h.recompute(), "replace wss://a.example s1 live=[k30617,10317L0]")
	if h.status(relayA) != "DISCONNECTING" {
		t.Fatalf("status %s", h.status(relayA))
	}
	expect(t, "layer 1 done", h.done(relayA, "s1", "1-1"))
	expect(t, "last batch done", h.done(relayA, "s1", "1-2"), "drop wss://a.example")
	// A relay that is not connected is dropped at once.
	h.repo("r2", []string{relayB}, "y")
	h.recompute()
	h.unrepo("r2")
	expect(t, "connecting relay", h.recompute(), "drop wss://b.example")
}

func TestBootstrapRelay(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.m.SetBootstrap([]string{relayB})
	expect(t, "bootstrap", h.recompute(), "ensure wss://b.example")
	expect(t, "layer 1 only", h.connect(relayB, "s1"),
		"add wss://b.example s1 1-1 L1 live=[k30617,10317L0] hist=[k30617,10317]")
	h.done(relayB, "s1", "1-1")
	h.advance(time.Minute)
	if h.status(relayB) != "CONNECTED" {
		t.Fatalf("status %s", h.status(relayB))
	}
	// It gains a repository, then loses it again: never dropped.
	h.repo("r1", []string{relayB}, "x")
	expect(t, "gains repo", h.recompute(),
		"add wss://b.example s1 1-2 repos=r1 roots=x live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=xL0 #E=xL0 #q=xL0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x #E=x #q=x]")
	h.done(relayB, "s1", "1-2")
	h.unrepo("r1")
	expect(t, "loses repo", h.recompute(),
		"replace wss://b.example s1 live=[k30617,10317L0]")
	if h.relay(relayB) == nil {
		t.Fatal("bootstrap relay dropped")
	}
}

func TestHistoricSyncFailures(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.done(relayA, "s1", "1-1")
	// The failed items leave the live set: the batch's own live set is
	// closed by name (layer 1's stays open).
	expect(t, "failed", h.failed(relayA, "s1", "1-2"), "close wss://a.example s1 live=1-2")
	h.repo("r1", []string{relayA}, "x", "y")
	expect(t, "held after a failure", h.recompute())
	h.advance(time.Minute)
	if h.status(relayA) != "CONNECTED_HISTORIC_SYNC_FAILURES" {
		t.Fatalf("status %s", h.status(relayA))
	}
	// After FailureRetry the missing items are tried again, live and
	// history, their live subscriptions open once.
	expect(t, "retry", h.advance(4*time.Minute),
		"add wss://a.example s1 1-3 repos=r1 roots=x,y live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
	if h.status(relayA) != "SYNCING" {
		t.Fatalf("status %s", h.status(relayA))
	}
	h.done(relayA, "s1", "1-3")
	h.advance(time.Minute)
	if h.status(relayA) != "CONNECTED" || h.confirmed(relayA) != "r1:x,y" {
		t.Fatalf("status %s confirmed %q", h.status(relayA), h.confirmed(relayA))
	}
}

func TestLayer1FailureIsRetriedWithoutSince(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.m.SetBootstrap([]string{relayB})
	h.recompute()
	h.connect(relayB, "s1")
	h.failed(relayB, "s1", "1-1")
	expect(t, "retry", h.advance(5*time.Minute), "add wss://b.example s1 1-2 L1 hist=[k30617,10317]")
}

func TestStaleSessionReportsIgnored(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.disconnect(relayA, "s1")
	h.advance(time.Minute)
	h.connect(relayA, "s2")
	// Late EOSE of the dead session's batch: its subscriptions are gone.
	expect(t, "late batch done", h.done(relayA, "s1", "1-2"))
	expect(t, "late disconnect", h.disconnect(relayA, "s1"))
	expect(t, "unknown batch", h.done(relayA, "s2", "1-2"))
	if h.confirmed(relayA) != "" || h.status(relayA) != "SYNCING" {
		t.Fatalf("stale report changed state: %q %s", h.confirmed(relayA), h.status(relayA))
	}
	// The repeated Connected of the running session changes nothing.
	expect(t, "repeated connected", h.connect(relayA, "s2"))
	h.done(relayA, "s2", "1-3")
	h.done(relayA, "s2", "1-4")
	if h.confirmed(relayA) != "r1:x" {
		t.Fatalf("confirmed %q", h.confirmed(relayA))
	}
}

func TestUnreportedSessionEnd(t *testing.T) {
	h := synced(t, testRules())
	h.advance(2 * time.Minute) // last sign of life of s1 was 2 min + quiet ago
	lastSeen := h.relay(relayA).LastSeen
	// The fetcher died; its successor connects anew. s1 ended unreported.
	got := h.connect(relayA, "s9")
	want := "since=" + sinceStr(lastSeen.Add(-15*time.Minute).Unix()-h.now.Unix())
	if len(got) != 1 || !contains(got[0], want) {
		t.Fatalf("commands %q, want a catch-up with %s", got, want)
	}
}

func TestInterruptedCatchUpKeepsItsSince(t *testing.T) {
	h := synced(t, testRules())
	h.disconnect(relayA, "s1")
	h.advance(5 * time.Minute)
	first := h.now.Add(-20 * time.Minute).Unix()
	h.connect(relayA, "s2") // catch-up from first, never completes
	h.advance(time.Minute)
	h.disconnect(relayA, "s2")
	h.advance(time.Minute)
	got := h.connect(relayA, "s3")
	want := "since=" + sinceStr(first-h.now.Unix())
	if len(got) != 1 || !contains(got[0], want) {
		t.Fatalf("commands %q, want the unfinished catch-up's %s", got, want)
	}
	h.done(relayA, "s3", "1-4")
	if h.relay(relayA).CatchUpSince != 0 {
		t.Fatal("completed catch-up still recorded")
	}
}

func TestHeartbeat(t *testing.T) {
	rules := testRules()
	rules.Heartbeat = 30 * time.Second
	h := newHarness(t, rules, 7)
	h.repo("r1", []string{relayA})
	h.recompute()
	h.advance(0)
	expect(t, "heartbeat", h.advance(30*time.Second), "ensure wss://a.example")
}

// The heartbeat's answers refresh a relay's last sign of life in memory at
// every round but rewrite its persisted record only once seenPersistEvery
// passed since the one persisted: each record holds the relay's confirmed
// state, and rewriting 1,000 of them every minute for one timestamp was
// most of what the planner did at rest.
func TestHeartbeatAnswerPersistsHourly(t *testing.T) {
	h := synced(t, testRules())
	h.m.TakeDirty()
	dirty := func() bool {
		changed, _ := h.m.TakeDirty()
		return len(changed) == 1
	}
	for i := range 3 {
		h.advance(5 * time.Minute)
		h.connect(relayA, "s1")
		if dirty() {
			t.Fatalf("answer %d, %d min after the record was persisted: record rewritten", i+1, 5*(i+1))
		}
		if !h.relay(relayA).LastSeen.Equal(h.now) {
			t.Fatalf("answer %d: last seen %v, want %v", i+1, h.relay(relayA).LastSeen, h.now)
		}
	}
	h.advance(seenPersistEvery)
	h.connect(relayA, "s1")
	if !dirty() {
		t.Fatal("an answer an hour after the record was persisted did not rewrite it")
	}
	if got := h.m.Snapshot(h.relay(relayA), h.now).GetLastSeen(); got != h.now.Unix() {
		t.Fatalf("persisted last seen %d, want %d", got, h.now.Unix())
	}
	h.advance(5 * time.Minute)
	h.connect(relayA, "s1")
	if dirty() {
		t.Fatal("the next answer rewrote the record again")
	}
}

func TestListedAgainWhileDisconnecting(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.unrepo("r1")
	h.recompute()
	if h.status(relayA) != "DISCONNECTING" {
		t.Fatalf("status %s", h.status(relayA))
	}
	h.repo("r2", []string{relayA}, "y")
	h.recompute()
	h.done(relayA, "s1", "1-1")
	h.done(relayA, "s1", "1-2")
	expect(t, "last batch", h.done(relayA, "s1", "1-3"))
	if h.relay(relayA) == nil || h.confirmed(relayA) != "r2:y" {
		t.Fatalf("relay listed again was dropped or lost state: %q", h.confirmed(relayA))
	}
}

func TestLargeReplaceLiveIsSplit(t *testing.T) {
	rules := testRules()
	rules.MaxLiveFilters = 12
	rules.MaxFiltersPerCommand = 3
	h := synced(t, rules)
	h.repo("r1", []string{relayA}, "x", "y", "z")
	h.recompute()
	h.repo("r1", []string{relayA}, "x", "y", "z", "w")
	expect(t, "consolidation (a merge) in parts of 3 filters", h.recompute(),
		"add wss://a.example s1  live=[#a=r1L0 #A=r1L0 #q=r1L0] hist=[]",
		"add wss://a.example s1  live=[k30618#d=r1L0 #e=x,w,z,yL0 #E=x,w,z,yL0] hist=[]",
		"add wss://a.example s1  live=[#q=x,w,z,yL0] hist=[]",
		"close wss://a.example s1 live=1-3,1-2 after=L1-1",
		"add wss://a.example s1 1-4 roots=w hist=[#e=w #E=w #q=w]")
	if got := h.relay(relayA).LiveFilters; got != 8 {
		t.Fatalf("live filters %d", got)
	}
	// A root removed: the live set must lose it, a ReplaceLive.
	h.repo("r1", []string{relayA}, "x", "z", "w")
	expect(t, "replacement in parts of 3 filters", h.recompute(),
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1L0 #A=r1L0]",
		"add wss://a.example s1  live=[#q=r1L0 k30618#d=r1L0 #e=x,w,zL0] hist=[]",
		"add wss://a.example s1  live=[#E=x,w,zL0 #q=x,w,zL0] hist=[]")
}

func TestLiveSubscriptionClosedByRelay(t *testing.T) {
	h := synced(t, testRules())
	closedAt := h.now
	// The fetcher reopens it in 30 s: catch up after that, not before.
	expect(t, "closed", h.report(relayA, "s1", &graspv1.SubscriptionClosed{Live: true, Reason: "error: shutting down idle subscription",
		RetryAt: h.now.Add(30 * time.Second).UnixMilli()}))
	since := sinceStr(closedAt.Add(-15*time.Minute).Unix() - h.now.Add(31*time.Second).Unix())
	expect(t, "reopened", h.advance(31*time.Second),
		"add wss://a.example s1 1-3 repos=r1 roots=x,y since="+since+" hist=[k30617,10317 #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
	h.done(relayA, "s1", "1-3")
	h.advance(time.Minute)
	if h.status(relayA) != "CONNECTED" || h.relay(relayA).CatchUpSince != 0 {
		t.Fatalf("status %s catch-up %d", h.status(relayA), h.relay(relayA).CatchUpSince)
	}
	// Not reopened by the fetcher: the planner replaces the live set now.
	got := h.report(relayA, "s1", &graspv1.SubscriptionClosed{Live: true})
	if len(got) != 2 || !contains(got[0], "1-4 repos=r1 roots=x,y since=-900 hist=[k30617,10317 ") || !contains(got[1], "replace wss://a.example s1 live=") {
		t.Fatalf("commands %q", got)
	}
	// Historic closes are the fetcher's to retry; stale sessions are ignored.
	expect(t, "historic", h.report(relayA, "s1", &graspv1.SubscriptionClosed{BatchId: "1-5"}))
	expect(t, "stale", h.report(relayA, "s0", &graspv1.SubscriptionClosed{Live: true}))
}

func TestRateLimitHoldsNewBatches(t *testing.T) {
	h := synced(t, testRules())
	h.report(relayA, "s1", &graspv1.RateLimited{Message: "rate-limited: slow down", Until: h.now.Add(65 * time.Second).UnixMilli()})
	h.repo("r1", []string{relayA}, "x", "y", "z")
	expect(t, "during cooldown", h.recompute())
	expect(t, "after cooldown", h.advance(65*time.Second),
		"add wss://a.example s1 1-3 roots=z live=[#e=zL0 #E=zL0 #q=zL0] hist=[#e=z #E=z #q=z]")
}

func TestRelistedWhileInFlightGetsANewBatch(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.repo("r2", []string{relayA}, "y")
	h.recompute()
	h.connect(relayA, "s1") // 1-1 layer 1, 1-2 r1+x and r2+y
	h.repo("r2", []string{relayB}, "y")
	h.recompute() // r2 leaves A: its live filters are consolidated away
	h.repo("r2", []string{relayA, relayB}, "y")
	expect(t, "listed again", h.recompute(),
		"add wss://a.example s1 1-3 repos=r2 roots=y live=[#a=r2L0 #A=r2L0 #q=r2L0 k30618#d=r2L0 #e=yL0 #E=yL0 #q=yL0] hist=[#a=r2 #A=r2 #q=r2 k30618#d=r2 #e=y #E=y #q=y]")
	// 1-2 ends: it confirms r1 only; r2 waits for 1-3, whose live is open.
	h.done(relayA, "s1", "1-2")
	if got := h.confirmed(relayA); got != "r1:x" {
		t.Fatalf("confirmed %q", got)
	}
	h.done(relayA, "s1", "1-3")
	if got := h.confirmed(relayA); got != "r1:x r2:y" {
		t.Fatalf("confirmed %q", got)
	}
}

// A batch that keeps failing leaves no live subscription behind: the
// fetcher's live set, followed from the commands (AddFilters adds its live
// filters under its live id, ReplaceLive replaces them all, CloseLive closes
// the named sets), holds after each failure only
// what the planner still counts as live, and each item once after each
// retry, instead of one more copy per failure.
func TestFailedBatchesLeaveNoLiveSubscriptions(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	open := map[string]int{}      // the fetcher's open live subscriptions per item
	sets := map[string][]string{} // the same, per live id
	last := ""                    // the last items batch sent
	follow := func() {
		for _, c := range h.m.Drain() {
			switch {
			case c.GetReplaceLive() != nil:
				clear(sets)
				sets[c.GetReplaceLive().GetLiveId()] = itemsOf(c.GetReplaceLive().GetLiveFilters())
			case c.GetCloseLive() != nil:
				for _, id := range c.GetCloseLive().GetLiveIds() {
					delete(sets, id)
				}
			case c.GetAddFilters() != nil:
				id := c.GetAddFilters().GetLiveId()
				sets[id] = append(sets[id], itemsOf(c.GetAddFilters().Live())...)
				if !c.GetAddFilters().GetLayer1() {
					last = c.GetAddFilters().GetBatchId()
				}
			}
		}
		clear(open)
		for _, items := range sets {
			for _, it := range items {
				open[it]++
			}
		}
	}
	x, y := "root:"+h.rootID("x"), "root:"+h.rootID("y")
	h.repo("r2", []string{relayA}, "y")
	h.m.Recompute(h.now, false)
	h.m.HandleReport(h.now, &graspv1.FetchReport{RelayUrl: relayA, SessionId: "s1", Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}})
	follow()
	h.done(relayA, "s1", "1-1")
	h.done(relayA, "s1", last) // r2 confirmed
	h.repo("r1", []string{relayA}, "x")
	h.m.Recompute(h.now, false)
	follow()
	if open[x] != 1 || open[y] != 1 || open["L1"] != 1 {
		t.Fatalf("before the failures: open %v", open)
	}
	for round := range 3 {
		h.m.HandleReport(h.now, &graspv1.FetchReport{RelayUrl: relayA, SessionId: "s1", Report: &graspv1.FetchReport_BatchDone{BatchDone: &graspv1.BatchDone{
			BatchId: last, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_FAILED, Error: "boom"}}})
		follow()
		if open[x] != 0 || open[y] != 1 || open["L1"] != 1 {
			t.Fatalf("round %d, after the failure: open %v, want layer 1 and y once, x closed", round, open)
		}
		h.now = h.now.Add(h.m.rules.failureHold(h.relay(relayA).Failures))
		h.m.Tick(h.now)
		follow()
		if open[x] != 1 || open[y] != 1 || open["L1"] != 1 {
			t.Fatalf("round %d, after the retry: open %v, want each once", round, open)
		}
	}
}

// A batch's live part is sent as an index into its historic filters only to
// a session whose fetcher said it reads one (Connected.live_from_historic);
// a fetcher from before it (a rolling upgrade) gets the filters listed.
// Either way the live filters are the same, and the indexed command is
// smaller.
func TestLivePartIndexedOnlyForFetchersThatReadIt(t *testing.T) {
	commands := func(connected *graspv1.Connected) []*graspv1.AddFilters {
		h := newHarness(t, testRules(), 1)
		h.repo("r1", []string{relayA}, "x", "y")
		h.recompute()
		h.m.HandleReport(h.now, &graspv1.FetchReport{RelayUrl: relayA, SessionId: "s1", At: h.now.UnixMilli(),
			Report: &graspv1.FetchReport_Connected{Connected: connected}})
		var out []*graspv1.AddFilters
		for _, c := range h.m.Drain() {
			if a := c.GetAddFilters(); a != nil {
				out = append(out, a)
			}
		}
		return out
	}
	listed, indexed := commands(&graspv1.Connected{}), commands(&graspv1.Connected{LiveFromHistoric: true})
	if len(listed) != 2 || len(indexed) != 2 {
		t.Fatalf("%d and %d AddFilters, want layer 1 and items each", len(listed), len(indexed))
	}
	for i := range listed {
		l, x := listed[i], indexed[i]
		if l.LiveFromHistoric != nil || len(l.GetLiveFilters()) == 0 {
			t.Errorf("command %d to an old fetcher: live_from_historic %v, %d live filters listed", i, l.LiveFromHistoric, len(l.GetLiveFilters()))
		}
		if x.LiveFromHistoric == nil || len(x.GetLiveFilters()) != 0 {
			t.Errorf("command %d to a new fetcher: live_from_historic %v, %d live filters listed", i, x.LiveFromHistoric, len(x.GetLiveFilters()))
		}
		a, b := l.Live(), x.Live()
		if len(a) != len(b) || len(a) == 0 {
			t.Fatalf("command %d: %d live filters listed, %d indexed", i, len(a), len(b))
		}
		for j := range a {
			if !proto.Equal(a[j], b[j]) {
				t.Errorf("command %d, live filter %d: %v listed, %v indexed", i, j, a[j], b[j])
			}
		}
		if ls, xs := proto.Size(l), proto.Size(x); xs >= ls {
			t.Errorf("command %d: indexed %d bytes, listed %d", i, xs, ls)
		}
	}
}
