package fetcher_test

import (
	"context"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// localStore is a real event store holding evts, as the fetcher's local set.
func localStore(t *testing.T, evts []*nostr.Event) fetcher.LocalSet {
	t.Helper()
	s, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for _, e := range evts {
		if _, err := s.Save(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	return fetcher.UnionLocalSet{fetcher.StoreLocalSet{Store: s}}
}

// connect sends EnsureConnected and returns the new session.
func (e *env) connectRelay(url string) string {
	e.t.Helper()
	e.ensure(url)
	return e.connected(url).GetSessionId()
}

// NIP-77 fetches exactly what the local set lacks, with headers, and the
// batch reports the negentropy method.
func TestHistoricNegentropyFetchesOnlyMissing(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	evts := notes(testkit.NewKey(), 300, 3, 1000)
	r.Add(t, evts...)
	f := e.start(baseConfig("a"), localStore(t, evts[:200]))
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b1", kind1, nil)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY {
		t.Fatalf("batch done %v", done)
	}
	if done.GetEventsReceived() != 100 || e.eventCount() != 100 {
		t.Fatalf("received %d, published %d; want the 100 missing", done.GetEventsReceived(), e.eventCount())
	}
	e.waitEvents(evts[200:])
	h := e.header(evts[250].ID)
	if h.Get("Grasp-Relay") != r.URL || h.Get("Grasp-Session") != s || h.Get("Grasp-Batch") != "b1" || h.Get("Grasp-Mode") != "historic" {
		t.Fatalf("headers %v", h)
	}
	if got := metric(t, f.reg, "grasp_fetcher_events_received_total", map[string]string{"relay": r.URL, "mode": "historic"}); got != 100 {
		t.Fatalf("events received metric %v", got)
	}
}

// Every way a relay refuses NIP-77 falls back to REQ+EOSE for the session:
// all events still arrive, the batch says why, and the next batch of the
// session does not try NIP-77 again.
func TestNegentropyFallback(t *testing.T) {
	for name, faults := range map[string]faultrelay.Faults{
		"NEG-ERR":      {NegOpenAnswer: "NEG-ERR", NegOpenText: "blocked: too many query results"},
		"NEG-ERROR":    {NegOpenAnswer: "NEG-ERROR", NegOpenText: "invalid limit 0"},
		"NOTICE":       {NegOpenAnswer: "NOTICE", NegOpenText: "ERROR: bad msg: negentropy disabled"},
		"timeout":      {NegOpenAnswer: "SILENT"},
		"ids withheld": {WithholdIDs: true},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
			evts := notes(testkit.NewKey(), 40, 1, 1000)
			r.Add(t, evts...)
			r.Set(faults)
			// One event held: with an empty local set NIP-77 is not tried.
			e.start(baseConfig("a"), localStore(t, evts[:1]))
			s := e.connectRelay(r.URL)
			e.addFilters(0, r.URL, s, "b1", kind1, nil)
			done := e.batchDone(r.URL, "b1")
			if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ || done.GetFallbackReason() == "" {
				t.Fatalf("batch done %v", done)
			}
			e.waitEvents(evts[1:])
			opens := r.NegOpens()
			e.addFilters(0, r.URL, s, "b2", []nostr.Filter{{Kinds: []int{1}, Authors: []string{evts[0].PubKey}}}, nil)
			if d := e.batchDone(r.URL, "b2"); d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ {
				t.Fatalf("second batch %v", d)
			}
			if r.NegOpens() != opens {
				t.Fatalf("NIP-77 tried again in the same session (%d NEG-OPENs, then %d)", opens, r.NegOpens())
			}
		})
	}
}

// A relay that caps REQ pages and holds more events with one created_at
// than a page: REQ+EOSE terminates, gets every event with its own
// timestamp and reports the batch INCOMPLETE (one kind, no list to split
// the crowded second by), while NIP-77, which is not capped, gets them all:
// an initial sync (nothing held) reads with REQ first and reconciles when
// REQ cannot read the crowded second.
func TestPaginationTerminatesWithEqualCreatedAt(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	k := testkit.NewKey()
	same := notes(k, 30, 30, 5000)  // 30 events at one second
	spread := notes(k, 40, 1, 1000) // 40 events, one per second
	r.Add(t, same...)
	r.Add(t, spread...)
	r.Set(faultrelay.Faults{PageCap: 7, NegOpenAnswer: "NEG-ERR", NegOpenText: "no"})
	cfg := baseConfig("a")
	cfg.RelayMinCap = 5
	e.start(cfg, nil)
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "req", kind1, nil)
	done := e.batchDone(r.URL, "req")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_INCOMPLETE || done.GetIncompleteSlices() != 1 {
		t.Fatalf("batch %v", done)
	}
	e.waitEvents(spread)
	if done.GetPages() < 8 {
		t.Fatalf("%d pages for 70 events capped at 7", done.GetPages())
	}

	// The same relay with NIP-77: every event, the tied ones included.
	r.Set(faultrelay.Faults{PageCap: 7})
	e2 := newEnv(t)
	e2.start(cfg, nil)
	s2 := e2.connectRelay(r.URL)
	e2.addFilters(0, r.URL, s2, "neg", kind1, nil)
	if d := e2.batchDone(r.URL, "neg"); d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY || d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch %v", d)
	}
	e2.waitEvents(append(same, spread...))
}

// khatru v0.19.1 on badger ignores the tag letter: it answers a NIP-77
// session for {"#A": [repo]} with the events tagged ["a", repo]. Our local
// set for #A rightly lacks them, so reconciliation names them as needed;
// the fetcher must notice it holds them already and not fetch them again.
// The local set being empty for #A, the first batch of the session reads
// with REQ (an initial sync's shortcut), gets the a-tagged events, drops
// them as not matching and so learns the relay matches tags loosely: from
// then on the session reconciles even an empty local set.
func TestNegentropyNeedsWeHoldAreNotFetched(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	k := testkit.NewKey()
	repo := testkit.RepoRef(k.PubKey, "r")
	var issues []*nostr.Event
	for i := range 30 {
		issues = append(issues, k.Issue(repo, "issue", testkit.At(nostr.Timestamp(1000+i))))
	}
	r.Add(t, issues...)
	e.start(baseConfig("a"), localStore(t, issues))
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b0", []nostr.Filter{{Tags: nostr.TagMap{"A": {repo}}}}, nil)
	if d := e.batchDone(r.URL, "b0"); d.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ || e.eventCount() != 0 {
		t.Fatalf("first batch %v, published %d; want REQ and none published (none matches #A)", d, e.eventCount())
	}
	e.addFilters(0, r.URL, s, "b1", []nostr.Filter{{Tags: nostr.TagMap{"A": {repo}}}}, nil)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY {
		t.Fatalf("batch done %v", done)
	}
	if done.GetEventsReceived() != 0 || e.eventCount() != 0 {
		t.Fatalf("received %d, published %d; want none: every needed id is already held", done.GetEventsReceived(), e.eventCount())
	}
}

// An initial sync: with nothing held for the filter, reconciling would only
// list every id to fetch them all by id afterwards, so the batch reads with
// REQ+EOSE and sends no NEG-OPEN; once something is held, NIP-77 is used
// (docs/decisions/0037-initial-sync-req-when-local-set-empty.md).
func TestEmptyLocalSetReadsWithREQ(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	k := testkit.NewKey()
	evts := notes(k, 120, 2, 1000)
	r.Add(t, evts...)
	e.start(baseConfig("a"), localStore(t, nil))
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b1", kind1, nil)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_REQ || done.GetFallbackReason() != "" {
		t.Fatalf("batch done %v", done)
	}
	if n := r.NegOpens(); n != 0 {
		t.Fatalf("%d NEG-OPENs for a filter the local set holds nothing of", n)
	}
	if done.GetEventsReceived() != uint64(len(evts)) {
		t.Fatalf("received %d of %d", done.GetEventsReceived(), len(evts))
	}
	e.waitEvents(evts)
}
