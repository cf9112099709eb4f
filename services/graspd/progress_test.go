package graspd

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

func TestNextProgress(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	syncing := syncstatus.Progress{Relays: 3, Connected: 1, Syncing: 2, PendingBatches: 5}
	for _, tc := range []struct {
		name              string
		p                 syncstatus.Progress
		stored, prevStore float64
		now, prev         time.Time
		ok                bool
		rate              float64
	}{
		{"nothing syncing: no line", syncstatus.Progress{Relays: 2, Connected: 2}, 100, 50, t0.Add(10 * time.Second), t0, false, 0},
		{"first line has no rate", syncing, 100, 0, t0, time.Time{}, true, 0},
		{"rate over the interval", syncing, 300, 100, t0.Add(10 * time.Second), t0, true, 20},
		{"counter reset: no rate", syncing, 10, 100, t0.Add(10 * time.Second), t0, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, ok := syncstatus.NextProgress(tc.p, tc.stored, tc.prevStore, tc.now, tc.prev)
			if ok != tc.ok || (ok && (l.RatePerSec != tc.rate || l.EventsStored != tc.stored || l.Progress != tc.p)) {
				t.Errorf("NextProgress = %+v, %v; want ok %v rate %v", l, ok, tc.ok, tc.rate)
			}
		})
	}
}

// runProgress logs one line per interval while a relay is Syncing, with
// the stored-events rate from the ingester's count, and nothing once sync
// is done.
func TestRunProgressLogsWhileSyncing(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var stored atomic.Int64
	var logs testkit.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	var mu sync.Mutex
	status := "Syncing"
	reads := make(chan struct{}, 10)
	read := func(context.Context) (*syncstatus.Snapshot, error) {
		mu.Lock()
		defer mu.Unlock()
		defer func() { reads <- struct{}{} }()
		return &syncstatus.Snapshot{Relays: []syncstatus.Relay{{URL: "wss://a", Status: status, PendingBatches: 3}}}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runProgress(ctx, clk, log, stored.Load, read) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// armed waits until runProgress has finished an iteration and armed
	// its next timer.
	armed := func() {
		for clk.Waiters() == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	tick := func() {
		t.Helper()
		armed()
		clk.Advance(ProgressInterval)
		select {
		case <-reads:
		case <-time.After(5 * time.Second):
			t.Fatal("progress did not read the status after the interval")
		}
	}
	tick()
	armed()
	stored.Add(50)
	tick()
	mu.Lock()
	status = "Connected"
	mu.Unlock()
	tick()
	armed() // the third read has been logged (or not) once the timer is re-armed
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d progress lines, want 2 (two ticks while Syncing):\n%s", len(lines), logs.String())
	}
	for _, want := range []string{"syncing=1", "batches_pending=3", "events_stored=50", "events_per_sec=5.0"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("second line %q lacks %s", lines[1], want)
		}
	}
}
