package planner

import (
	"strings"
	"testing"
	"time"
)

// TestArchiveAuthorsInLayer1: with archive authors set, layer 1 also asks
// for their relay lists (10002), in the layer-1 batch, in a catch-up's
// first part and in the live set, and the live budget counts it.
func TestArchiveAuthorsInLayer1(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	bob := strings.Repeat("b0", 32)
	h.alias[bob] = "bob"
	h.m.SetArchiveAuthors([]string{bob})
	h.repo("r1", []string{relayA}, "x")
	expect(t, "discovered", h.recompute(), "ensure wss://a.example")
	expect(t, "connected", h.connect(relayA, "s1"),
		"add wss://a.example s1 1-1 L1 live=[k30617,10317L0 k10002@bobL0] hist=[k30617,10317 k10002@bob]",
		"add wss://a.example s1 1-2 repos=r1 roots=x live=[#a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=xL0 #E=xL0 #q=xL0] hist=[#a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x #E=x #q=x]")
	if got, want := h.m.minimalSize(h.relay(relayA), nil), 2+7; got != want {
		t.Fatalf("minimal live set %d, want %d (two layer-1 filters)", got, want)
	}
	expect(t, "layer 1 done", h.done(relayA, "s1", "1-1"))
	expect(t, "items done", h.done(relayA, "s1", "1-2"))
	expect(t, "disconnected", h.disconnect(relayA, "s1"))
	h.advance(time.Minute)
	expect(t, "reconnected", h.connect(relayA, "s2"),
		"add wss://a.example s2 1-3 repos=r1 roots=x since=-960 live=[k30617,10317L0 k10002@bobL0 #a=r1L0 #A=r1L0 #q=r1L0 k30618#d=r1L0 #e=xL0 #E=xL0 #q=xL0] hist=[k30617,10317 k10002@bob #a=r1 #A=r1 #q=r1 k30618#d=r1 #e=x #E=x #q=x]")
}
