package fetcher_test

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// addBatch sends an AddFilters with a since (0: none) and the resync mark.
func (e *env) addBatch(url, session, batch string, hist []nostr.Filter, since int64, resync bool) {
	e.t.Helper()
	add := &graspv1.AddFilters{BatchId: batch, HistoricFilters: filters.ToProtos(hist), Resync: resync}
	if since != 0 {
		add.Since = &since
	}
	e.send(0, &graspv1.FetchCommand{RelayUrl: url, SessionId: session, Command: &graspv1.FetchCommand_AddFilters{AddFilters: add}})
}

// backdatedWorld is a relay's history for the catch-up tests: 100 old
// events we hold, 5 events we lack published with an old created_at (as a
// syncer or client republishing history does) and 5 new ones we lack, all
// kind 1.
type backdatedWorld struct {
	held, backdated, recent []*nostr.Event
	since                   int64 // between the back-dated and the new ones
}

func newBackdatedWorld(r *faultrelay.Relay) (backdatedWorld, func(t *testing.T)) {
	k := testkit.NewKey()
	w := backdatedWorld{held: notes(k, 100, 1, 1000), since: 100_000}
	for i := range 5 {
		w.backdated = append(w.backdated, k.Note("republished history", testkit.At(nostr.Timestamp(1500+i))))
		w.recent = append(w.recent, k.Note("new", testkit.At(nostr.Timestamp(w.since+10+int64(i)))))
	}
	return w, func(t *testing.T) {
		r.Add(t, w.held...)
		r.Add(t, w.backdated...)
		r.Add(t, w.recent...)
	}
}

// A catch-up's since bounds REQ reads only. On a NIP-77 relay the
// reconciliation covers the whole filter, so the events published during
// the gap with an old created_at arrive with the new ones, and nothing we
// hold is downloaded again; on a relay without NIP-77 the REQ keeps since
// and the back-dated events are left to the daily resync; a fetcher whose
// local set holds refusals only keeps since on NIP-77 too (reconciling
// against it would download the relay's whole history).
func TestCatchUpSinceBoundsOnlyREQ(t *testing.T) {
	for _, c := range []struct {
		name          string
		negentropy    bool
		refusalsOnly  bool
		remembered    bool // the relay refused NIP-77 in an earlier session
		wantBackdated bool
		wantMethod    graspv1.SyncMethod
	}{
		{"NIP-77 relay", true, false, false, true, graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY},
		{"REQ-only relay", false, false, false, false, graspv1.SyncMethod_SYNC_METHOD_REQ},
		// No NEG-OPEN is sent to a relay that refused it before (nip77.go):
		// its catch-up is a REQ read and keeps since all the same.
		{"REQ-only relay, refusal remembered", false, false, true, false, graspv1.SyncMethod_SYNC_METHOD_REQ},
		// The refusals hold nothing since then: an empty local set is read
		// with REQ (docs/decisions/0037-initial-sync-req-when-local-set-empty.md).
		{"NIP-77 relay, local set of refusals only", true, true, false, false, graspv1.SyncMethod_SYNC_METHOD_REQ},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			r := faultrelay.Start(t, testrelay.Options{Negentropy: c.negentropy})
			w, fill := newBackdatedWorld(r)
			fill(t)
			local := localStore(t, w.held)
			if c.refusalsOnly {
				// What the policy refused: one event, the store not at all.
				local = localStore(t, w.held[:1])
			}
			e.startWith(baseConfig("a"), func(f *fetcher.Fetcher) {
				if c.refusalsOnly {
					f.WithRefusalsLocalSet(local)
				} else {
					f.WithLocalSet(local)
				}
			})
			s := e.connectRelay(r.URL)
			if c.remembered {
				// A first session learns that the relay has no NIP-77.
				e.addBatch(r.URL, s, "probe", kind1, w.since, false)
				if d := e.batchDone(r.URL, "probe"); d.GetFallbackReason() == "" {
					t.Fatalf("probe batch did not fall back: %v", d)
				}
				e.waitEvents(w.recent)
				r.Set(faultrelay.Faults{DropAfterEvents: 1})
				e.addBatch(r.URL, s, "drop", kind1, w.since, false)
				e.report(r.URL, disconnected(s))
				r.Set(faultrelay.Faults{})
				s = e.reconnect(r.URL, s)
			}
			e.addBatch(r.URL, s, "catch-up", kind1, w.since, false)
			done := e.batchDone(r.URL, "catch-up")
			if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != c.wantMethod {
				t.Fatalf("batch done %v", done)
			}
			t.Logf("%s: %d events, %d bytes, %d pages", c.name, done.GetEventsReceived(), done.GetBytesReceived(), done.GetPages())
			e.waitEvents(w.recent)
			want := len(w.recent)
			if c.wantBackdated {
				want += len(w.backdated)
				e.waitEvents(w.backdated)
			} else {
				for _, evt := range w.backdated {
					if e.has(evt.ID) {
						t.Fatalf("back-dated event %s read through since on a %s", evt.ID, c.name)
					}
				}
			}
			if got := int(done.GetEventsReceived()); got != want || e.eventCount() != want {
				t.Fatalf("received %d, published %d; want %d (what we lacked, nothing held downloaded again)", got, e.eventCount(), want)
			}
			if done.Missed != nil {
				t.Fatalf("a catch-up reported missed events: %d", done.GetMissed())
			}
		})
	}
}

// A daily resync's batch counts the events it publishes that the local set
// lacked (BatchDone.missed), each once however many of its filters return
// it, whether it reconciles or pages with REQ; other batches and a fetcher
// that cannot tell report none.
func TestResyncBatchCountsMissedEvents(t *testing.T) {
	for _, c := range []struct {
		name         string
		negentropy   bool
		refusalsOnly bool
		resync       bool
		want         *uint64
	}{
		{"NIP-77 relay", true, false, true, ptr(10)},
		{"REQ-only relay", false, false, true, ptr(10)},
		{"not a resync batch", true, false, false, nil},
		{"local set of refusals only", true, true, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			r := faultrelay.Start(t, testrelay.Options{Negentropy: c.negentropy})
			w, fill := newBackdatedWorld(r)
			fill(t)
			local := localStore(t, w.held)
			e.startWith(baseConfig("a"), func(f *fetcher.Fetcher) {
				if c.refusalsOnly {
					f.WithRefusalsLocalSet(local)
				} else {
					f.WithLocalSet(local)
				}
			})
			s := e.connectRelay(r.URL)
			// Two filters returning the same events: each is counted once.
			both := append([]nostr.Filter{{Kinds: []int{1}, Authors: []string{w.held[0].PubKey}}}, kind1...)
			e.addBatch(r.URL, s, "resync", both, 0, c.resync)
			done := e.batchDone(r.URL, "resync")
			if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
				t.Fatalf("batch done %v", done)
			}
			e.waitEvents(append(w.backdated, w.recent...))
			switch {
			case c.want == nil && done.Missed != nil:
				t.Fatalf("missed = %d, want unset", done.GetMissed())
			case c.want != nil && (done.Missed == nil || done.GetMissed() != *c.want):
				t.Fatalf("missed = %v, want %d (method %s, received %d)", done.Missed, *c.want, done.GetMethod(), done.GetEventsReceived())
			}
		})
	}
}

func ptr(n uint64) *uint64 { return &n }
