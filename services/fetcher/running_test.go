package fetcher_test

import (
	"context"
	"sync"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// stallQueries makes r's queries wait until release is closed (or the
// query's context ends); entered is closed when the first one arrives.
func stallQueries(r *testrelay.Relay) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var inOnce, outOnce sync.Once
	r.Khatru.QueryEvents = append([]func(context.Context, nostr.Filter) (chan *nostr.Event, error){
		func(ctx context.Context, _ nostr.Filter) (chan *nostr.Event, error) {
			inOnce.Do(func() { close(in) })
			select {
			case <-out:
			case <-ctx.Done():
			}
			ch := make(chan *nostr.Event)
			close(ch)
			return ch, nil
		}}, r.Khatru.QueryEvents...)
	return in, func() { outOnce.Do(func() { close(out) }) }
}

// A batch waits for a turn when MaxRunningBatches batches are running on
// other relays, and runs once one ends; with a turn free it runs at once.
func TestRunningBatchesBoundedAcrossRelays(t *testing.T) {
	for _, tc := range []struct {
		name    string
		running int
		waits   bool
	}{
		{"one turn: the second relay's batch waits", 1, true},
		{"two turns: it runs beside the stalled one", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			slow, fast := testrelay.Start(t, testrelay.Options{}), testrelay.Start(t, testrelay.Options{})
			evts := notes(testkit.NewKey(), 20, 1, 1000)
			fast.Add(t, evts...)
			entered, release := stallQueries(slow)
			t.Cleanup(release)

			cfg := baseConfig("f")
			cfg.MaxRunningBatches = tc.running
			f := e.start(cfg, nil)
			e.addFilters(0, slow.URL, e.connectRelay(slow.URL), "slow", kind1, nil)
			<-entered
			e.addFilters(0, fast.URL, e.connectRelay(fast.URL), "fast", kind1, nil)

			if tc.waits {
				e.waitFor("the fast relay's batch waiting", func() bool {
					return metric(t, f.reg, "grasp_fetcher_batches_waiting", nil) == 1
				})
				if n := e.eventCount(); n != 0 {
					t.Fatalf("%d events published while the only turn is held by the stalled batch", n)
				}
				release()
			}
			e.batchDone(fast.URL, "fast")
			e.waitEvents(evts)
			release()
			e.batchDone(slow.URL, "slow")
			if n := metric(t, f.reg, "grasp_fetcher_batches_waiting", nil); n != 0 {
				t.Fatalf("batches waiting %v after both ended", n)
			}
		})
	}
}
