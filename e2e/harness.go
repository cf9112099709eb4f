package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd/graspdtest"
)

// Env is a set of GRASP_* variables for one graspd.
type Env map[string]string

// BaseEnv is what every scenario starts from: random ports, a private data
// directory, the test relays on 127.0.0.1 allowlisted, and the slow
// production timings (5 s batch window, 5 s backoff, 6 s quiet period)
// shortened so scenarios take seconds. Each scenario overrides what it tests.
func BaseEnv(dataDir string) Env {
	return Env{
		"GRASP_DATA_DIR":                  dataDir,
		"GRASP_NATS_LISTEN":               "",
		"GRASP_RELAY_ADDR":                "127.0.0.1:0",
		"GRASP_METRICS_ADDR":              "127.0.0.1:0",
		"GRASP_RELAY_ALLOWLIST":           "127.0.0.1",
		"GRASP_DISCOVERY_BATCH_WINDOW":    "300ms",
		"GRASP_SHARDS":                    "4",
		"GRASP_PLANNER_QUIET_PERIOD":      "1s",
		"GRASP_PLANNER_RECOMPUTE_DELAY":   "100ms",
		"GRASP_PLANNER_FAILURE_RETRY":     "2s",
		"GRASP_PLANNER_FAILURE_RETRY_MAX": "5s",
		"GRASP_FETCHER_BACKOFF_BASE":      "300ms",
		"GRASP_FETCHER_BACKOFF_MAX":       "2s",
		"GRASP_FETCHER_LEASE_TTL":         "3s",
		"GRASP_DISCOVERY_BACKOFF_BASE":    "200ms",
		"GRASP_DISCOVERY_BACKOFF_MAX":     "1s",
	}
}

// StartGraspd starts graspd with env (on top of the process environment)
// and runs it until stop is called or the test ends (stop is idempotent).
// The log goes to logw at level (nil: discarded).
func StartGraspd(t testing.TB, env Env, logw io.Writer, level string) (app Graspd, stop func()) {
	t.Helper()
	for k, v := range env {
		// A test restores the variables when it ends; a program (the demo)
		// just sets them.
		if tt, ok := t.(*testing.T); ok {
			tt.Setenv(k, v)
		} else if err := os.Setenv(k, v); err != nil {
			t.Fatalf("setenv %s: %v", k, err)
		}
	}
	var log *slog.Logger
	if logw != nil {
		log = obs.NewLogger(logw, level)
	}
	a, stop := graspdtest.Start(t, log)
	return Graspd{a}, stop
}

// CountStored reports how many of ids the app's store holds.
func CountStored(ctx context.Context, app Target, ids []string) (int, error) {
	n := 0
	for _, id := range ids {
		ok, err := app.Store().Has(ctx, id)
		if err != nil {
			return n, fmt.Errorf("store has %s: %w", id, err)
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// IDs returns the ids of evts.
func IDs(evts ...*nostr.Event) []string {
	ids := make([]string, len(evts))
	for i, e := range evts {
		ids[i] = e.ID
	}
	return ids
}

// WaitStored polls the store until every id is stored or ctx ends, and
// returns how many were stored. Polling (not a fake clock) is right here:
// the scenarios run real services on the real clock.
func WaitStored(ctx context.Context, app Target, ids []string) (int, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := CountStored(context.Background(), app, ids)
		if err != nil || n == len(ids) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, nil
		case <-tick.C:
		}
	}
}

// Metrics returns every sample of app's services as "name{labels}" →
// value (labels as printed by the Prometheus text format).
func Metrics(ctx context.Context, app Target) (map[string]float64, error) {
	return app.Metrics(ctx)
}

// MetricSum sums the samples of metric name whose labels contain every
// substring in match (e.g. `relay="ws://127.0.0.1:1234"`).
func MetricSum(m map[string]float64, name string, match ...string) float64 {
	var sum float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, s := range match {
			if !strings.Contains(k, s) {
				ok = false
				break
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// RelayConnected reports whether the fetcher holds a session to relayURL.
func RelayConnected(ctx context.Context, app Target, relayURL string) (bool, error) {
	m, err := Metrics(ctx, app)
	if err != nil {
		return false, err
	}
	return MetricSum(m, "grasp_fetcher_relay_connected", `relay="`+relayURL+`"`) > 0, nil
}

// RelayStatus is the planner's status of relayURL (grasp_planner_relay_status:
// 3 is Connected and synced), -1 when it does not track the relay.
func RelayStatus(m map[string]float64, relayURL string) float64 {
	v, ok := m[`grasp_planner_relay_status{relay="`+relayURL+`"}`]
	if !ok {
		return -1
	}
	return v
}

// StatusConnected is grasp_planner_relay_status's Connected (synced) value.
const StatusConnected = 3

// Quiescent reports whether every relay in urls is Connected and every
// historic batch the planner started has ended (confirmed, failed, or
// abandoned with its session).
func Quiescent(m map[string]float64, urls []string) bool {
	for _, u := range urls {
		if RelayStatus(m, u) != StatusConnected {
			return false
		}
	}
	return allBatchesEnded(m)
}

// allBatchesEnded reports whether the planner started a historic batch and
// every one it started has ended.
func allBatchesEnded(m map[string]float64) bool {
	started := MetricSum(m, "grasp_planner_batches_total", `event="started"`)
	return started > 0 && batchesEnded(m) >= started
}

func batchesEnded(m map[string]float64) float64 {
	var n float64
	for _, ev := range []string{"confirmed", "failed", "abandoned"} {
		n += MetricSum(m, "grasp_planner_batches_total", `event="`+ev+`"`)
	}
	return n
}

// WaitQuiescent polls until Quiescent has held for hold, or ctx ends.
func WaitQuiescent(ctx context.Context, app Target, urls []string, hold time.Duration) error {
	return waitHeld(ctx, app, urls, hold, Quiescent)
}

// waitHeld polls app's metrics until quiet has held for hold, or ctx ends;
// the error then says where the sync stood at the last reading.
func waitHeld(ctx context.Context, app Target, urls []string, hold time.Duration, quiet func(map[string]float64, []string) bool) error {
	return pollHeld(ctx, app.Metrics, urls, hold, 100*time.Millisecond, quiet)
}

// pollHeld is waitHeld over any source of metrics (a Target's, or a
// process's /metrics read by a benchmark), polled every interval.
func pollHeld(ctx context.Context, metrics func(context.Context) (map[string]float64, error), urls []string,
	hold, interval time.Duration, quiet func(map[string]float64, []string) bool) error {
	var since time.Time
	var last map[string]float64
	for {
		m, err := metrics(ctx)
		if err == nil {
			last = m
		}
		if err == nil && quiet(m, urls) {
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) >= hold {
				return nil
			}
		} else {
			since = time.Time{}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not quiescent: %w (last: %s)", ctx.Err(), progress(last, urls))
		case <-time.After(interval):
		}
	}
}

// progress summarises metrics m for a timeout message: each relay's
// status, the planner's batches and the ingesters' backlog.
func progress(m map[string]float64, urls []string) string {
	if m == nil {
		return "no metrics read"
	}
	var st []string
	for _, u := range urls {
		st = append(st, fmt.Sprintf("%s=%v", u, RelayStatus(m, u)))
	}
	return fmt.Sprintf("relay status %s; batches started %v confirmed %v failed %v abandoned %v; ingester pending %v ack pending %v",
		strings.Join(st, " "), MetricSum(m, "grasp_planner_batches_total", `event="started"`),
		MetricSum(m, "grasp_planner_batches_total", `event="confirmed"`), MetricSum(m, "grasp_planner_batches_total", `event="failed"`),
		MetricSum(m, "grasp_planner_batches_total", `event="abandoned"`),
		MetricSum(m, "grasp_ingester_consumer_pending"), MetricSum(m, "grasp_ingester_consumer_ack_pending"))
}

// PeakRSS is this process's peak resident set size in bytes (VmHWM), 0 where
// /proc is not available.
func PeakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// StrictTags makes relay r answer tag filters exactly. khatru v0.19.1 over
// eventstore badger matches a stored read of a coordinate whatever the tag
// letter ({"#A": [x]} also returns events tagged ["a", x]), in REQs and in
// NIP-77 sessions alike, so every layer-2 event comes back once per tag
// letter; root ids keep their letter (docs/dependencies.md, "eventstore v0.17.2").
// Real relays of that build behave so; the benchmark measures both. Call it
// right after testrelay.Start, before any client connects.
func StrictTags(r *testrelay.Relay) {
	hooks := r.Khatru.QueryEvents
	for i, q := range hooks {
		hooks[i] = func(ctx context.Context, f nostr.Filter) (chan *nostr.Event, error) {
			in, err := q(ctx, f)
			if err != nil || len(f.Tags) == 0 {
				return in, err
			}
			out := make(chan *nostr.Event)
			go func() {
				defer close(out)
				for evt := range in {
					if !f.Matches(evt) {
						continue
					}
					select {
					case out <- evt:
					case <-ctx.Done():
						for range in {
						}
						return
					}
				}
			}()
			return out, nil
		}
	}
}
