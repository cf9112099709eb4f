package loadgen

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Load saturates the test's own process the way a big sync does (issue 23:
// one process with embedded NATS, every core busy), for tests of what must
// hold up under load — leases, leadership. Each part runs until Stop or the
// end of the test.
type Load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// Published counts the flood's stored messages.
	Published atomic.Int64
}

// Start starts the load: cpuPerCore spinning goroutines per core, and
// floodWorkers goroutines publishing 1 KiB messages to a memory stream of
// their own on nc as fast as the server stores them (0: no flood).
func Start(t testing.TB, cpuPerCore int, nc *nats.Conn, floodWorkers int) *Load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{cancel: cancel}
	t.Cleanup(l.Stop)
	for range cpuPerCore * runtime.GOMAXPROCS(0) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			x := uint64(1)
			for ctx.Err() == nil {
				for range 10_000 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		}()
	}
	if floodWorkers > 0 {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		name := "FLOOD_" + strings.NewReplacer("/", "_", " ", "_", ".", "_").Replace(t.Name())
		subject := "flood." + strings.ToLower(name)
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
			Storage: jetstream.MemoryStorage, MaxBytes: 32 << 20, Discard: jetstream.DiscardOld}); err != nil {
			t.Fatalf("loadgen: flood stream: %v", err)
		}
		payload := []byte(strings.Repeat("x", 1024))
		for range floodWorkers {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for ctx.Err() == nil {
					pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := js.Publish(pctx, subject, payload)
					cancel()
					if err == nil {
						l.Published.Add(1)
					}
				}
			}()
		}
	}
	return l
}

// Stop ends the load and waits for its goroutines.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
}
