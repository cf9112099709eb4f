package graspd_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/graspd/graspdtest"
)

// TestAnnouncementToHistoryLatency measures, through a whole graspd with
// its default batching (discovery window, planner debounce), the wait a
// user feels between announcing a repository to our relay and the first
// event of its history being stored: once for a repository on a remote
// relay the fetcher is already connected to, once on a relay new to it
// (which adds the connection). It asserts that the history arrives, and
// only logs the time (docs/measurements/2026-12-02-announcement-to-history.md),
// with the first moment each log message appeared as a breakdown.
func TestAnnouncementToHistoryLatency(t *testing.T) {
	t.Setenv("GRASP_DATA_DIR", t.TempDir())
	t.Setenv("GRASP_NATS_LISTEN", "")
	t.Setenv("GRASP_RELAY_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_RELAY_ALLOWLIST", "127.0.0.1")
	t.Setenv("GRASP_SHARDS", "4")
	t.Setenv("GRASP_SERVICES", strings.Join(graspd.AllServices, ","))
	stages := &firstSeen{}
	app, _ := graspdtest.Start(t, slog.New(stages))

	warm := testrelay.Start(t, testrelay.Options{})
	// Warm up: the first repository brings every service up to steady state
	// (discovery caught up, planner leading, fetcher connected to warm).
	measure(t, app, stages, warm, "warm-up")
	measure(t, app, stages, warm, "new repository, connected relay")
	measure(t, app, stages, testrelay.Start(t, testrelay.Options{}), "new repository, new relay")
}

// measure announces a repository listing us and remote, whose issue only
// remote holds, and logs how long after the announcement was stored (our
// relay's OK) the issue was stored.
func measure(t *testing.T, app *graspd.App, stages *firstSeen, remote *testrelay.Relay, what string) {
	t.Helper()
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	name := fmt.Sprintf("latency-%d", time.Now().UnixNano())
	ann := owner.Announcement(name,
		[]string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, name)},
		[]string{app.PublicURL(), remote.URL}, nil)
	issue := contributor.Issue(testkit.RepoRef(owner.PubKey, name), "history")
	remote.Add(t, issue)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	stages.reset(start)
	if err := testrelay.Publish(ctx, app.RelayURL(), ann); err != nil {
		t.Fatalf("%s: publish announcement: %v", what, err)
	}
	stored := time.Now()
	for {
		ok, err := app.Store().Has(ctx, issue.ID)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: history not stored within 30 s of the announcement", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(stored)
	// Issue 17 §3's row, collected by make bench: the first batch must start
	// within 1 s; this is later still (the first event stored).
	fmt.Printf("bench row: %s: announcement stored → first history event stored in %s (target: first batch within 1 s) — %s\n",
		what, took.Round(time.Millisecond), map[bool]string{true: "met", false: "NOT MET"}[took <= time.Second])
	t.Logf("%s: announcement stored → first history event stored in %s; first log lines since the publish began:\n%s",
		what, took.Round(time.Millisecond), stages.report(time.Since(start)))
}

// firstSeen is a slog handler that records when each message was first
// logged after the last reset, as a breakdown of where the wait goes.
type firstSeen struct {
	mu    sync.Mutex
	since time.Time
	seen  map[string]time.Duration
}

func (f *firstSeen) reset(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.since, f.seen = now, map[string]time.Duration{}
}

func (f *firstSeen) report(until time.Duration) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	type line struct {
		at  time.Duration
		msg string
	}
	var lines []line
	for msg, at := range f.seen {
		if at <= until {
			lines = append(lines, line{at, msg})
		}
	}
	slices.SortFunc(lines, func(a, b line) int { return int(a.at - b.at) })
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "  +%-8s %s\n", l.at.Round(time.Millisecond), l.msg)
	}
	return b.String()
}

func (f *firstSeen) Enabled(context.Context, slog.Level) bool { return true }

func (f *firstSeen) Handle(_ context.Context, r slog.Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil || r.Time.Before(f.since) {
		return nil
	}
	if _, ok := f.seen[r.Message]; !ok {
		f.seen[r.Message] = r.Time.Sub(f.since)
	}
	return nil
}

func (f *firstSeen) WithAttrs([]slog.Attr) slog.Handler { return f }
func (f *firstSeen) WithGroup(string) slog.Handler      { return f }
