package fetcher_test

import (
	"fmt"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A relay without NIP-77 (khatru with it off) is sent one NEG-OPEN in all:
// batches started together wait for the first one's verdict instead of each
// sending theirs, and the refusal outlives the session, so the batches of
// the next connection go straight to REQ+EOSE. Issue 23 counted 93–509
// NEG-OPENs to such relays in one sync.
func TestNoNIP77IsRememberedAcrossSessions(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: false})
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r.Add(t, evts...)
	// Something held for every batch: NIP-77 would be used if the relay
	// had it.
	e.start(baseConfig("a"), localStore(t, evts[:1]))
	s1 := e.connectRelay(r.URL)
	for i := range 4 {
		e.addFilters(0, r.URL, s1, fmt.Sprintf("b%d", i), kind1, nil)
	}
	for i := range 4 {
		if d := e.batchDone(r.URL, fmt.Sprintf("b%d", i)); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK ||
			d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ || d.GetFallbackReason() == "" {
			t.Fatalf("batch b%d: %v", i, d)
		}
	}
	e.waitEvents(evts[1:])
	if n := r.NegOpens(); n != 1 {
		t.Fatalf("%d NEG-OPENs for four batches started together, want 1", n)
	}
	// A new connection: the refusal is remembered.
	r.Set(faultrelay.Faults{DropAfterEvents: 1})
	e.addFilters(0, r.URL, s1, "drop", kind1, nil)
	e.report(r.URL, disconnected(s1))
	r.Set(faultrelay.Faults{})
	s2 := e.reconnect(r.URL, s1)
	e.addFilters(0, r.URL, s2, "again", []nostr.Filter{{Kinds: []int{1}, Authors: []string{k.PubKey}}}, nil)
	if d := e.batchDone(r.URL, "again"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ {
		t.Fatalf("batch on the new session: %v", d)
	}
	if n := r.NegOpens(); n != 1 {
		t.Fatalf("%d NEG-OPENs after a reconnect, want still 1", n)
	}
}

// A relay that speaks NIP-77 but refuses one filter (strfry's NEG-ERR
// "blocked: too many query results") is not taken for one without it: the
// next session reconciles again.
func TestNIP77FilterRefusalIsNotRemembered(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r.Add(t, evts...)
	r.Set(faultrelay.Faults{NegOpenAnswer: "NEG-ERR", NegOpenText: "blocked: too many query results"})
	e.start(baseConfig("a"), localStore(t, evts[:1]))
	s1 := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s1, "b1", kind1, nil)
	if d := e.batchDone(r.URL, "b1"); d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ {
		t.Fatalf("batch %v", d)
	}
	r.Set(faultrelay.Faults{DropAfterEvents: 1})
	e.addFilters(0, r.URL, s1, "drop", kind1, nil)
	e.report(r.URL, disconnected(s1))
	r.Set(faultrelay.Faults{})
	s2 := e.reconnect(r.URL, s1)
	e.addFilters(0, r.URL, s2, "b2", kind1, nil)
	if d := e.batchDone(r.URL, "b2"); d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY {
		t.Fatalf("batch on the new session: %v, want NIP-77 again", d)
	}
}
