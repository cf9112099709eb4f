// Package graspdtest runs a whole graspd inside a test: the one place that
// knows how to start it, run it in the background and stop it cleanly, used
// by graspd's own tests, graspctl's and the end-to-end suite.
package graspdtest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/services/graspd"
)

// StopTimeout bounds how long stopping graspd may take before the test
// fails.
const StopTimeout = 20 * time.Second

// Start loads graspd's configuration from the environment (set it with
// t.Setenv first), starts graspd and runs it until the test ends. log may
// be nil: graspd then logs at info level into a bounded buffer that is
// printed only if the test fails, so a flaky failure carries its own
// evidence. stop ends it earlier; it is idempotent
// and also runs at cleanup, failing the test if Run returned an error or
// did not return within StopTimeout.
func Start(t testing.TB, log *slog.Logger) (app *graspd.App, stop func()) {
	t.Helper()
	cfg, err := graspd.LoadConfigs()
	if err != nil {
		t.Fatalf("graspd config: %v", err)
	}
	if log == nil {
		buf := &tailBuffer{max: 1 << 20}
		log = obs.NewLogger(buf, "info")
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("graspd log (last %d bytes):\n%s", buf.max, buf.String())
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	app, err = graspd.Start(ctx, cfg, log)
	if err != nil {
		cancel()
		t.Fatalf("graspd start: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("graspd Run: %v", err)
				}
			case <-time.After(StopTimeout):
				t.Errorf("graspd did not stop within %s", StopTimeout)
			}
			app.Close()
		})
	}
	t.Cleanup(stop)
	return app, stop
}

// tailBuffer keeps the last max bytes written to it (whole writes; one
// slog record is one write).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
