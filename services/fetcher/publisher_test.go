package fetcher_test

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestHistoricPagesTravelInBatches: a page's events reach the events stream
// in batch messages of at most PublishBatch events (docs/decisions/0053-events-travel-in-batches.md), each event once with the batch's headers;
// PublishBatch 1 (the switch back) publishes one message per event.
func TestHistoricPagesTravelInBatches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch int
		// most is the largest number of messages the 300 events may take.
		most int
	}{{"default", 0, 300/64 + 4}, {"one per event", 1, 300}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			r := faultrelay.Start(t, testrelay.Options{})
			evts := notes(testkit.NewKey(), 300, 3, 1000)
			r.Add(t, evts...)
			cfg := baseConfig("a")
			cfg.PublishBatch = tc.batch
			e.start(cfg, nil)
			s := e.connectRelay(r.URL)
			e.addFilters(0, r.URL, s, "b1", kind1, nil)
			if done := e.batchDone(r.URL, "b1"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
				t.Fatalf("batch done %v", done)
			}
			e.waitEvents(evts)
			e.mu.Lock()
			copies, msgs := e.copies, e.messages
			e.mu.Unlock()
			if copies != len(evts) {
				t.Errorf("%d event copies published, want each of the %d once", copies, len(evts))
			}
			if msgs > tc.most || (tc.batch == 1 && msgs != len(evts)) {
				t.Errorf("%d messages for %d events, want at most %d", msgs, len(evts), tc.most)
			}
			if h := e.header(evts[150].ID); h.Get("Grasp-Relay") != r.URL || h.Get("Grasp-Session") != s ||
				h.Get("Grasp-Batch") != "b1" || h.Get("Grasp-Mode") != "historic" {
				t.Errorf("headers %v", h)
			}
		})
	}
}

// TestOverlappingFiltersPublishEachEventOnce: a batch whose filters both
// answer the same events (as a repository's layers do: one event can match
// several) publishes each event once, though a batch message's Nats-Msg-Id
// no longer lets the stream drop the second copy; the refusal of a bolt-on
// target must not be asked twice (e2e TestBoltOnTargetRefusalsVisible).
func TestOverlappingFiltersPublishEachEventOnce(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	evts := notes(k, 40, 1, 1000)
	r.Add(t, evts...)
	e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b1", []nostr.Filter{{Kinds: []int{1}}, {Kinds: []int{1}, Authors: []string{k.PubKey}}}, nil)
	if done := e.batchDone(r.URL, "b1"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch done %v", done)
	}
	e.waitEvents(evts)
	e.mu.Lock()
	copies := e.copies
	e.mu.Unlock()
	if copies != len(evts) {
		t.Fatalf("%d event copies published for %d events matched by both filters, want each once", copies, len(evts))
	}
}
