package fetcher_test

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// On a relay read with REQ, an items batch's live REQ carries its history:
// the relay gets one REQ for both, every stored event is published as the
// batch's history, the batch reports it, and the REQ stays open for new
// events (docs/decisions/0076-history-in-the-live-req.md). Issue 32. The
// same whether the command lists its live filters or names them by their
// index among the historic ones (live_from_historic), as a planner does for
// a fetcher whose Connected said it reads that.
func TestLiveREQCarriesHistory(t *testing.T) {
	for _, indexed := range []bool{false, true} {
		t.Run(map[bool]string{false: "listed", true: "indexed"}[indexed], func(t *testing.T) {
			testLiveREQCarriesHistory(t, indexed)
		})
	}
}

func testLiveREQCarriesHistory(t *testing.T, indexed bool) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	old := notes(k, 30, 1, 1000)
	r.Add(t, old...)
	cfg := baseConfig("a")
	cfg.DisableNegentropy = true
	e.start(cfg, nil)
	s := e.connectRelay(r.URL)
	if c := e.report(r.URL, func(r *graspv1.FetchReport) bool { return r.GetConnected() != nil }); !c.GetConnected().GetLiveFromHistoric() {
		t.Fatalf("Connected %v does not say the fetcher reads live_from_historic", c.GetConnected())
	}
	before := r.REQs()
	if indexed {
		e.addFiltersIndexed(0, r.URL, s, "b1", kind1, 0)
	} else {
		e.addFilters(0, r.URL, s, "b1", kind1, kind1)
	}
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ ||
		done.GetEventsReceived() != uint64(len(old)) || done.GetPages() != 1 {
		t.Fatalf("batch done %v, want OK by REQ with %d events in 1 page", done, len(old))
	}
	e.waitEvents(old)
	for _, evt := range old {
		if h := e.header(evt.ID); h.Get(bus.HeaderBatch) != "b1" || h.Get(bus.HeaderMode) != "historic" {
			t.Fatalf("history event published with batch %q, mode %q", h.Get(bus.HeaderBatch), h.Get(bus.HeaderMode))
		}
	}
	if n := r.REQs() - before; n != 1 {
		t.Fatalf("%d REQs for the batch's history and live set, want 1", n)
	}
	e.publishedLive(r, k.Note("after the batch", testkit.At(5000)))
	if n := r.REQs() - before; n != 1 {
		t.Fatalf("%d REQs after a live event, want the one", n)
	}
}

// A history as long as the smallest cap relays are assumed to keep
// (RelayMinCap, 40 here) may have been cut by one: it is read again filter
// by filter, and nothing is missed; the live REQ stays open.
func TestLongHistoryReadApartFromLiveREQ(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	old := notes(k, 130, 1, 1000)
	r.Add(t, old...)
	cfg := baseConfig("a")
	cfg.DisableNegentropy = true
	cfg.RelayMinCap = 40
	e.start(cfg, nil)
	s := e.connectRelay(r.URL)
	before := r.REQs()
	e.addFilters(0, r.URL, s, "b1", kind1, kind1)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetEventsReceived() < uint64(len(old)) {
		t.Fatalf("batch done %v, want OK with all %d events", done, len(old))
	}
	e.waitEvents(old)
	// The live REQ asked for 39 (below the assumed cap) and got 39: the
	// history is read apart, with at least one more REQ.
	if n := r.REQs() - before; n < 2 {
		t.Fatalf("%d REQs for 130 events: the live REQ's answer of 39 was taken for the whole history", n)
	}
	fresh := k.Note("after the batch", testkit.At(5000))
	if err := testrelay.Publish(e.ctx, r.Relay.URL, fresh); err != nil {
		t.Fatal(err)
	}
	e.waitEvents([]*nostr.Event{fresh})
}

// A relay whose NIP-11 software is known to cap each filter apart (khatru
// here, as strfry and nostr-rs-relay) lets every filter of the live REQ ask
// up to the cap assumed of relays; an unknown relay's filters share it
// (docs/decisions/0086-history-limits-per-filter.md). Three filters of 20
// events, RelayMinCap 40: known, each asks 39 and the live REQ's answer is
// the whole history; unknown, each asks 13, gets 13 and is read again apart.
func TestLiveREQHistoryLimitPerFilter(t *testing.T) {
	for _, tc := range []struct {
		name, software string // "": khatru's own document
		known          bool
	}{
		{"khatru", "", true},
		{"unknown", "https://example.org/some-relay", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			r := faultrelay.Start(t, testrelay.Options{Software: tc.software})
			var fs []nostr.Filter
			var old []*nostr.Event
			for range 3 {
				k := testkit.NewKey()
				fs = append(fs, nostr.Filter{Kinds: []int{1}, Authors: []string{k.PubKey}})
				old = append(old, notes(k, 20, 1, 1000)...)
			}
			r.Add(t, old...)
			cfg := baseConfig("a")
			cfg.DisableNegentropy = true
			cfg.RelayMinCap = 40
			e.start(cfg, nil)
			s := e.connectRelay(r.URL)
			rec := e.relayLimitsWhere(r.URL, func(rec *graspv1.RelayLimits) bool { return rec.GetNip11At() != 0 })
			if rec.GetSoftware() == "" || tc.software != "" && rec.GetSoftware() != tc.software {
				t.Fatalf("limits record %v: software %q, want the relay's NIP-11 (%q)", rec, rec.GetSoftware(), tc.software)
			}
			before := r.REQs()
			e.addFilters(0, r.URL, s, "b1", fs, fs)
			if done := e.batchDone(r.URL, "b1"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetEventsReceived() < uint64(len(old)) {
				t.Fatalf("batch done %v, want OK with all %d events", done, len(old))
			}
			e.waitEvents(old)
			switch n := r.REQs() - before; {
			case tc.known && n != 1:
				t.Fatalf("%d REQs, want the live REQ alone: each filter's 20 events are under its limit of 39", n)
			case !tc.known && n < 1+len(fs):
				t.Fatalf("%d REQs, want the live REQ and each filter read apart: 13 each cannot be taken for a whole history", n)
			}
		})
	}
}

// On a NIP-77 session the live REQ carries the history of the filters whose
// local set is empty (those an initial sync reads with REQ, decision 0037);
// a filter whose local set holds something is reconciled as before.
func TestLiveREQCarriesHistoryOfEmptyLocalSets(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	held, fresh := testkit.NewKey(), testkit.NewKey()
	heldNotes, freshNotes := notes(held, 20, 1, 1000), notes(fresh, 10, 1, 2000)
	r.Add(t, heldNotes...)
	r.Add(t, freshNotes...)
	e.start(baseConfig("a"), localStore(t, heldNotes[:1]))
	s := e.connectRelay(r.URL)
	fs := []nostr.Filter{{Kinds: []int{1}, Authors: []string{held.PubKey}}, {Kinds: []int{1}, Authors: []string{fresh.PubKey}}}
	before := r.REQs()
	e.addFilters(0, r.URL, s, "b1", fs, fs)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch done %v", done)
	}
	e.waitEvents(append(heldNotes[1:], freshNotes...))
	for _, evt := range freshNotes {
		if h := e.header(evt.ID); h.Get(bus.HeaderBatch) != "b1" {
			t.Fatalf("history event published with batch %q", h.Get(bus.HeaderBatch))
		}
	}
	if n := r.NegOpens(); n != 1 {
		t.Fatalf("%d NEG-OPENs, want 1: the filter whose local set holds an event", n)
	}
	// The live REQ with the empty local set's history, and the id fetch
	// after the reconciliation: no REQ of its own for the second filter.
	if n := r.REQs() - before; n != 2 {
		t.Fatalf("%d REQs, want 2 (the live REQ carrying a history, one id fetch)", n)
	}
}

// live_from_historic names where in the historic filters the live part
// starts: a batch whose first filter is history only (as a catch-up's layer
// 1, already live on the session) keeps the rest live.
func TestLiveFromHistoricOpensTheRest(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	once, kept := testkit.NewKey(), testkit.NewKey()
	old := append(notes(once, 3, 1, 1000), notes(kept, 3, 1, 1000)...)
	r.Add(t, old...)
	cfg := baseConfig("a")
	cfg.DisableNegentropy = true
	e.start(cfg, nil)
	s := e.connectRelay(r.URL)
	fs := []nostr.Filter{{Kinds: []int{1}, Authors: []string{once.PubKey}}, {Kinds: []int{1}, Authors: []string{kept.PubKey}}}
	e.addFiltersIndexed(0, r.URL, s, "b1", fs, 1)
	if done := e.batchDone(r.URL, "b1"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch done %v", done)
	}
	e.waitEvents(old)
	e.publishedLive(r, kept.Note("after the batch", testkit.At(5000)))
}

// publishedLive publishes evt to the relay and waits for the fetcher to
// publish it as a live event.
func (e *env) publishedLive(r *faultrelay.Relay, evt *nostr.Event) {
	e.t.Helper()
	if err := testrelay.Publish(e.ctx, r.Relay.URL, evt); err != nil {
		e.t.Fatal(err)
	}
	e.waitEvents([]*nostr.Event{evt})
	if h := e.header(evt.ID); h.Get(bus.HeaderMode) != "live" {
		e.t.Fatalf("new event published in mode %q, want live", h.Get(bus.HeaderMode))
	}
}
