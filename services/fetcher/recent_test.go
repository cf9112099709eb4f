package fetcher_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// The same event read from a second relay moments after the stream
// acknowledged the first copy is not published again (the stream would drop
// it as a duplicate); a copy with another signature is, and so is a copy read
// once the memory of the first has expired.
func TestCopiesAlreadyPublishedAreSkipped(t *testing.T) {
	e := newEnv(t)
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r1 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r2 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r3 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r4 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r1.Add(t, evts...)
	r2.Add(t, evts...)
	r4.Add(t, evts...)
	// r3 holds the same events, one of them with another signature.
	forged := *evts[7]
	forged.Sig = strings.Repeat("ab", 64)
	r3.Add(t, append(append([]*nostr.Event{}, evts[:7]...), append([]*nostr.Event{&forged}, evts[8:]...)...)...)
	rf := e.start(baseConfig("a"), localStore(t, nil))

	read := func(r *faultrelay.Relay, batch string) {
		t.Helper()
		s := e.connectRelay(r.URL)
		e.addFilters(0, r.URL, s, batch, kind1, nil)
		done := e.batchDone(r.URL, batch)
		if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetEventsReceived() != uint64(len(evts)) {
			t.Fatalf("batch %s done %v", batch, done)
		}
	}
	copies := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.copies
	}
	read(r1, "b1")
	e.waitEvents(evts)
	if n := copies(); n != len(evts) {
		t.Fatalf("%d copies published from the first relay, want %d", n, len(evts))
	}
	read(r2, "b2")
	if n := copies(); n != len(evts) {
		t.Fatalf("%d copies published after the second relay, want %d: its copies were published again", n, len(evts))
	}
	if n := metric(t, rf.reg, "grasp_fetcher_events_already_published_total", nil); n != float64(len(evts)) {
		t.Fatalf("already published: %v, want %d", n, len(evts))
	}
	read(r3, "b3")
	e.waitFor("the other signature's copy", func() bool { return copies() > len(evts) })
	if n := copies(); n != len(evts)+1 {
		t.Fatalf("%d copies published after the third relay, want %d: only the other signature's", n, len(evts)+1)
	}
	// Past the memory's lifetime, copies are published again (and the
	// stream's duplicate window decides).
	e.clock.Advance(time.Minute)
	read(r4, "b4")
	e.waitFor("copies published again", func() bool { return copies() >= 2*len(evts)+1 })
	if n := copies(); n != 2*len(evts)+1 {
		t.Fatalf("%d copies published after the memory expired, want %d", n, 2*len(evts)+1)
	}
}

// lagLocalSet is a local set whose store catches up late: once armed, the
// first lookup by id still misses the events in later, and every lookup
// after it finds them (the ingester stored them meanwhile).
type lagLocalSet struct {
	held  fetcher.LocalSet
	mu    sync.Mutex
	armed bool
	later map[string]*nostr.Event
}

func (l *lagLocalSet) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	items, err := l.held.Items(ctx, f)
	if err != nil || len(f.IDs) == 0 {
		return items, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed {
		l.armed = false
		return items, nil
	}
	if l.later == nil {
		return items, nil
	}
	for _, id := range f.IDs {
		if evt, ok := l.later[id]; ok {
			items = append(items, negsync.Item{ID: evt.ID, CreatedAt: evt.CreatedAt})
		}
	}
	return items, nil
}

// Ids a reconciliation names whose events another relay's copy brought
// moments ago are asked for last, and not at all when the store holds them
// by then.
func TestReconciledIDsJustPublishedAreAskedLast(t *testing.T) {
	e := newEnv(t)
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r1 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r2 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r1.Add(t, evts...)
	r2.Add(t, evts...)
	local := &lagLocalSet{held: localStore(t, evts[:10])}
	e.start(baseConfig("a"), local)

	s1 := e.connectRelay(r1.URL)
	e.addFilters(0, r1.URL, s1, "b1", kind1, nil)
	if done := e.batchDone(r1.URL, "b1"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetEventsReceived() != 30 {
		t.Fatalf("batch b1 done %v", done)
	}
	e.waitEvents(evts[10:])
	// The ingester stores b1's events while b2 reconciles.
	local.mu.Lock()
	local.armed = true
	local.later = map[string]*nostr.Event{}
	for _, evt := range evts[10:] {
		local.later[evt.ID] = evt
	}
	local.mu.Unlock()
	s2 := e.connectRelay(r2.URL)
	e.addFilters(0, r2.URL, s2, "b2", kind1, nil)
	done := e.batchDone(r2.URL, "b2")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY {
		t.Fatalf("batch b2 done %v", done)
	}
	if n := done.GetEventsReceived(); n != 0 {
		t.Fatalf("b2 fetched %d events the store held by the time they were asked for", n)
	}
}

// An id deferred because another copy was published moments ago is still
// fetched when the store does not hold it (the ingester refused that copy).
func TestReconciledIDsJustPublishedButNotStoredAreFetched(t *testing.T) {
	e := newEnv(t)
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r1 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r2 := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	r1.Add(t, evts...)
	r2.Add(t, evts...)
	e.start(baseConfig("a"), localStore(t, evts[:10]))
	s1 := e.connectRelay(r1.URL)
	e.addFilters(0, r1.URL, s1, "b1", kind1, nil)
	if done := e.batchDone(r1.URL, "b1"); done.GetEventsReceived() != 30 {
		t.Fatalf("batch b1 done %v", done)
	}
	s2 := e.connectRelay(r2.URL)
	e.addFilters(0, r2.URL, s2, "b2", kind1, nil)
	done := e.batchDone(r2.URL, "b2")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || done.GetEventsReceived() != 30 {
		t.Fatalf("batch b2 done %v: the 30 ids not stored must be fetched", done)
	}
}
