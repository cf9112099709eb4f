package planner

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// natsMaxPayload is NATS's default maximum message size: a command above
// it cannot be published, and the planner's term fails on it every time.
const natsMaxPayload = 1 << 20

// A relay with a design-size history (5,000 confirmed roots) reconnects
// quickly: its catch-up names every confirmed item, live and historic. It
// must go out in commands NATS accepts (it was one ~2 MB command, "nats:
// maximum payload exceeded", retried forever), and the catch-up must end
// only when all of its parts have.
func TestCatchUpOfALargeRelayFitsNATSPayload(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	var roots []string
	for i := range 5000 {
		roots = append(roots, fmt.Sprintf("root%d", i))
	}
	h.repo("r1", []string{relayA}, roots...)
	h.recompute()
	h.connect(relayA, "s1")
	for len(h.relay(relayA).Batches) > 0 {
		h.done(relayA, "s1", h.relay(relayA).Batches[0].ID)
	}
	h.advance(h.m.rules.QuietPeriod)
	if h.status(relayA) != "CONNECTED" {
		t.Fatalf("status %s", h.status(relayA))
	}
	h.disconnect(relayA, "s1")
	h.advance(time.Minute)
	h.m.HandleReport(h.now, &graspv1.FetchReport{RelayUrl: relayA, SessionId: "s2", At: h.now.UnixMilli(),
		Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}})
	cmds := h.m.Drain()
	var catchUps []string
	for _, c := range cmds {
		if n := proto.Size(c); n > natsMaxPayload {
			t.Errorf("%s command of %d bytes, over NATS's %d", commandName(c), n, natsMaxPayload)
		}
		if a := c.GetAddFilters(); a != nil && a.Since != nil {
			catchUps = append(catchUps, a.GetBatchId())
		}
	}
	if len(catchUps) < 2 {
		t.Fatalf("catch-up in %d commands", len(catchUps))
	}
	s := h.relay(relayA)
	since := s.CatchUpSince
	if since == 0 {
		t.Fatal("no catch-up pending")
	}
	for i, id := range catchUps {
		h.done(relayA, "s2", id)
		if last := i == len(catchUps)-1; (s.CatchUpSince == 0) != last {
			t.Fatalf("after %d of %d catch-up parts: CatchUpSince %d", i+1, len(catchUps), s.CatchUpSince)
		}
	}
}

// A failed part of a catch-up makes the whole catch-up start over after the
// hold, even when the other parts succeed.
func TestCatchUpPartFailureRestartsIt(t *testing.T) {
	rules := testRules()
	h := synced(t, rules)       // r1 with roots x, y
	h.m.rules.MaxBatchItems = 2 // three items: a catch-up in two parts
	h.disconnect(relayA, "s1")
	h.advance(time.Minute)
	got := h.connect(relayA, "s2")
	if len(got) != 2 {
		t.Fatalf("catch-up commands %q", got)
	}
	s := h.relay(relayA)
	first, second := s.Batches[0].ID, s.Batches[1].ID
	h.failed(relayA, "s2", first)
	h.done(relayA, "s2", second)
	if s.CatchUpSince == 0 {
		t.Fatal("catch-up ended although a part failed")
	}
	again := h.advance(rules.FailureRetry)
	if len(again) != 2 || !contains(again[0], "since=") || !contains(again[0], "k30617,10317") {
		t.Fatalf("after the hold %q", again)
	}
}
