package planner

import (
	"testing"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// restart hands the first machine's persisted records to a new machine of
// the next epoch, over the same index (as a new leader would read them).
func restart(t *testing.T, h *harness, gap time.Duration) *harness {
	var states []*graspv1.RelayState
	for _, s := range h.m.Relays() {
		states = append(states, h.m.Snapshot(s, h.now))
	}
	n := newHarness(t, h.m.rules, h.m.epoch+1)
	n.now = h.now.Add(gap)
	n.alias = h.alias
	for name, needs := range h.repos {
		n.repos[name] = needs
		n.m.ApplyIndex([]IndexChange{n.m.Index().Put("k-"+name, needs)})
	}
	if bad := n.m.Restore(states); bad != 0 {
		t.Fatalf("%d confirmed sets did not match", bad)
	}
	return n
}

func TestRestartResumesSameSession(t *testing.T) {
	h := synced(t, testRules())
	n := restart(t, h, 2*time.Minute)
	expect(t, "restored", n.drain(), "ensure wss://a.example")
	expect(t, "recompute", n.recompute())
	if n.confirmed(relayA) != "r1:x,y" {
		t.Fatalf("confirmed %q", n.confirmed(relayA))
	}
	// The fetcher answers with the session it kept running: its live
	// subscriptions are replaced, history is read from the last sign of life
	// minus the buffer; nothing confirmed is fetched in full again.
	since := h.relay(relayA).LastSeen.Add(-15*time.Minute).Unix() - n.now.Unix()
	expect(t, "resume", n.connect(relayA, "s1"),
		"add wss://a.example s1 2-1 repos=r1 roots=x,y since="+sinceStr(since)+" hist=[k30617,10317 #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]",
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0]")
}

func TestRestartNewSessionIsQuickReconnect(t *testing.T) {
	h := synced(t, testRules())
	n := restart(t, h, time.Minute)
	n.drain()
	// The session ended while no planner ran: the backlog says when.
	n.now = n.now.Add(time.Second)
	lost := n.now
	expect(t, "backlog disconnect", n.disconnect(relayA, "s1"))
	n.now = n.now.Add(time.Minute)
	since := sinceStr(lost.Add(-15*time.Minute).Unix() - n.now.Unix())
	expect(t, "new session", n.connect(relayA, "s2"),
		"add wss://a.example s2 2-1 repos=r1 roots=x,y since="+since+" live=[k30617,10317L0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=x,yL0 #E=x,yL0 #q=x,yL0] hist=[k30617,10317 #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x,y #E=x,y #q=x,y]")
}

func TestRestartForgetsPendingAndStaleBatches(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	h.repo("r1", []string{relayA}, "x")
	h.repo("r2", []string{relayA}, "y")
	h.m.rules.MaxBatchItems = 2 // r1+x, r2+y in separate batches
	h.recompute()
	h.connect(relayA, "s1")
	h.done(relayA, "s1", "1-1")
	h.done(relayA, "s1", "1-2") // r1 confirmed; 1-3 (r2) in flight
	n := restart(t, h, time.Minute)
	n.drain()
	got := n.connect(relayA, "s1")
	// Only r2, whose batch was in flight, is fetched in full again.
	expect(t, "resume", got,
		"add wss://a.example s1 2-1 repos=r1 roots=x since=-960 hist=[k30617,10317 #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x #E=x #q=x]",
		"replace wss://a.example s1 live=[k30617,10317L0 #a=r1,r2L0 #A=r1,r2L0 #q=r1,r2L0 k30618#d=r1,r2L0 #e=x,yL0 #E=x,yL0 #q=x,yL0]",
		"add wss://a.example s1 2-2 repos=r2 roots=y hist=[#a=r2 #A=r2 #q=r2 k30618#d=r2 #e=y #E=y #q=y]")
	// The old planner's batch reports arrive late: ignored.
	expect(t, "old batch", n.done(relayA, "s1", "1-3"))
	if len(n.relay(relayA).Batches) != 2 {
		t.Fatalf("batches %v", n.relay(relayA).Batches)
	}
	if n.confirmed(relayA) != "r1:x" {
		t.Fatalf("confirmed %q", n.confirmed(relayA))
	}
}

func TestRestoreMatchesPartialAndChangedRoots(t *testing.T) {
	h := synced(t, testRules())
	h.repo("r1", []string{relayA}, "x", "y", "z") // z pending: x,y partial
	h.recompute()
	var states []*graspv1.RelayState
	for _, s := range h.m.Relays() {
		states = append(states, h.m.Snapshot(s, h.now))
	}
	if c := states[0].GetConfirmed()[0]; c.GetAllRoots() || len(c.GetRootPrefixes()) != 16 {
		t.Fatalf("partial record %v", c)
	}
	n := newHarness(t, testRules(), 2)
	n.alias = h.alias
	n.repo("r1", []string{relayA}, "x", "y", "z", "v")
	if bad := n.m.Restore(states); bad != 0 {
		t.Fatalf("mismatched %d", bad)
	}
	if n.confirmed(relayA) != "r1:x,y" {
		t.Fatalf("confirmed %q", n.confirmed(relayA))
	}
	// An "all roots" record whose set changed is not trusted.
	m := newHarness(t, testRules(), 2)
	m.alias = h.alias
	m.repo("r1", []string{relayA}, "x", "y")
	full := []*graspv1.RelayState{{RelayUrl: relayA, Confirmed: []*graspv1.ConfirmedRepo{{RepoRef: repoRef("r1"), RepoConfirmed: true, AllRoots: true, RootCount: 2, RootsDigest: 12345}}}}
	if bad := m.m.Restore(full); bad != 1 || m.confirmed(relayA) != "r1:" {
		t.Fatalf("mismatched %d confirmed %q", bad, m.confirmed(relayA))
	}
}
