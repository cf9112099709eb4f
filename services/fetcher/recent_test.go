package fetcher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// The same event read from a second relay moments after the stream
// acknowledged the first copy is not published again (the stream would drop
// it as a duplicate); a copy with another signature is, and so is a copy read
// once the memory of the first has expired.
func TestCopiesAlreadyPublishedAreSkipped(t *testing.T) {
	e := newEnv(t)
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r1 := testkit.StartFaultRelay(t, testkit.RelayOptions{Negentropy: true})
	r2 := testkit.StartFaultRelay(t, testkit.RelayOptions{Negentropy: true})
	r3 := testkit.StartFaultRelay(t, testkit.RelayOptions{Negentropy: true})
	r4 := testkit.StartFaultRelay(t, testkit.RelayOptions{Negentropy: true})
	r1.Add(t, evts...)
	r2.Add(t, evts...)
	r4.Add(t, evts...)
	// r3 holds the same events, one of them with another signature.
	forged := *evts[7]
	forged.Sig = strings.Repeat("ab", 64)
	r3.Add(t, append(append([]*nostr.Event{}, evts[:7]...), append([]*nostr.Event{&forged}, evts[8:]...)...)...)
	rf := e.start(baseConfig("a"), localStore(t, nil))

	read := func(r *testkit.FaultRelay, batch string) {
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
