package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestBenchGraspdMemory measures graspd's own peak RSS during the initial
// sync of the benchmark's world. TestBenchEndToEnd runs graspd inside the
// test process beside the five relays and the dataset, so its memory cannot
// be told apart there; here graspd is the real binary in a child process and
// its VmHWM is read from /proc/<pid>/status when every event is stored.
// GRASP_BENCH=1 enables it; GRASP_BENCH_REPOS, GRASP_BENCH_EVENTS_PER_REPO
// scale it like TestBenchEndToEnd; GRASP_BENCH_MEMORY_LIMIT and
// GRASP_BENCH_STORE_MEMORY are passed to graspd as GRASP_MEMORY_LIMIT and
// GRASP_STORE_MEMORY, GRASP_BENCH_STORE (a scheme) as GRASP_STORE_URL; GOMEMLIMIT=off in the
// environment runs graspd without its default soft limit. GRASP_BENCH_PROFILE (a directory) keeps
// graspd's heap profile nearest the peak. It prints the row; docs/performance.md, "Memory", records
// the measured runs.
func TestBenchGraspdMemory(t *testing.T) {
	if os.Getenv("GRASP_BENCH") == "" {
		t.Skip("SKIP: benchmark; run with GRASP_BENCH=1 (make bench)")
	}
	bin, err := BuildBinaries()
	if err != nil {
		t.Fatal(err)
	}
	repos, perRepo := benchInt("GRASP_BENCH_REPOS", 1000), benchInt("GRASP_BENCH_EVENTS_PER_REPO", 50)
	remotes := make([]*testrelay.Relay, 5)
	urls := make([]string, len(remotes))
	for i := range remotes {
		remotes[i] = testrelay.Start(t, testrelay.Options{Negentropy: true, MaxLimit: 500})
		StrictTags(remotes[i])
		urls[i] = remotes[i].URL
	}
	ds := GenerateDataset(benchPublicURL, urls, repos, perRepo, 2, 1)
	t.Logf("generated %d repos, %d distinct events", repos, len(ds.Distinct))
	seedRelays(t, remotes, ds)

	relayAddr, metricsAddr := freeAddr(t), freeAddr(t)
	env := BaseEnv(t.TempDir())
	env["GRASP_PUBLIC_URL"] = benchPublicURL
	env["GRASP_SHARDS"] = "16"
	env["GRASP_RELAY_ADDR"] = relayAddr
	env["GRASP_METRICS_ADDR"] = metricsAddr
	env["GRASP_LOG_LEVEL"] = "warn"
	if v := os.Getenv("GRASP_BENCH_MEMORY_LIMIT"); v != "" {
		env["GRASP_MEMORY_LIMIT"] = v
	}
	if v := os.Getenv("GRASP_BENCH_STORE_MEMORY"); v != "" {
		env["GRASP_STORE_MEMORY"] = v
	}
	// GRASP_BENCH_STORE names the embedded store's scheme (kv+pebble,
	// kv+badger) to compare engines; unset, graspd's default.
	if v := os.Getenv("GRASP_BENCH_STORE"); v != "" {
		env["GRASP_STORE_URL"] = v + "://" + filepath.Join(t.TempDir(), "events")
	}
	// GRASP_BENCH_PROFILE (a directory) asks graspd for its profiles
	// (GRASP_PPROF) and keeps the heap profile taken nearest the peak RSS.
	profDir := os.Getenv("GRASP_BENCH_PROFILE")
	if profDir != "" {
		env["GRASP_PPROF"] = "true"
	}
	p := &Proc{
		Name: "graspd", Log: filepath.Join(t.TempDir(), "graspd.log"), HealthURL: "http://" + metricsAddr + "/readyz",
		MetricsAddr: metricsAddr, bin: filepath.Join(bin, "graspd"), env: processEnv(env, nil),
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Kill() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	own := "ws://" + relayAddr
	if profDir != "" {
		// Stopped and waited for before the test returns: it logs through t.
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { defer close(done); keepPeakProfile(ctx, stop, p.Pid(), metricsAddr, profDir, t) }()
		defer func() { close(stop); <-done }()
	}
	began := time.Now()
	if err := testrelay.Publish(ctx, own, ds.Announcements...); err != nil {
		t.Fatalf("publish announcements: %v", err)
	}
	if err := waitAllOnRelay(ctx, own, IDs(ds.Distinct...)); err != nil {
		t.Fatalf("initial sync: %v; log ends:\n%s", err, Tail(p.Log, 20))
	}
	wall := time.Since(began)
	limit := env["GRASP_MEMORY_LIMIT"]
	if v := os.Getenv("GOMEMLIMIT"); limit == "" && v != "" {
		limit = "unset, GOMEMLIMIT=" + v
	} else if limit == "" {
		limit = "unset: graspd's default"
	}
	peak := procStatusOf(p.Pid(), "VmHWM")
	fmt.Printf("| graspd peak RSS, initial sync of %d events (own process) | %d MB | ≤ 256 MB | %s |\n",
		len(ds.Distinct), peak>>20, metOrGap(peak, 256<<20))
	t.Logf("graspd (pid %d): %d events in %s, peak RSS %d MiB, RSS now %d MiB (anon %d, file %d), GRASP_MEMORY_LIMIT=%q GRASP_STORE_MEMORY=%q GRASP_STORE_URL=%q",
		p.Pid(), len(ds.Distinct), wall.Round(time.Second), peak>>20, procStatusOf(p.Pid(), "VmRSS")>>20,
		procStatusOf(p.Pid(), "RssAnon")>>20, procStatusOf(p.Pid(), "RssFile")>>20, limit, env["GRASP_STORE_MEMORY"], env["GRASP_STORE_URL"])
	// Where the memory is, for the next round of cuts.
	m := map[string]float64{}
	if err := scrapeInto(ctx, metricsAddr, m); err == nil {
		for _, k := range []string{"go_gc_duration_seconds_count"} {
			t.Logf("graspd %s %.0f", k, m[k])
		}
		for _, k := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_heap_sys_bytes", "go_memstats_heap_released_bytes", "go_memstats_stack_inuse_bytes", "go_memstats_next_gc_bytes"} {
			if v, ok := m[k]; ok {
				t.Logf("graspd %s %.0f MiB", k, v/(1<<20))
			}
		}
	}
}

// keepPeakProfile polls the process's RSS and, each time it passes the
// highest seen by 4 MiB, saves graspd's heap profile and metrics to dir
// (heap.pprof, metrics.txt), so what is left there is what the heap held
// nearest the peak.
func keepPeakProfile(ctx context.Context, stop <-chan struct{}, pid int, addr, dir string, t *testing.T) {
	var top int64
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		rss := procStatusOf(pid, "VmRSS")
		if rss < top+4<<20 {
			continue
		}
		top = rss
		saveURL(ctx, "http://"+addr+"/debug/pprof/heap", filepath.Join(dir, "heap.pprof"))
		saveURL(ctx, "http://"+addr+"/metrics", filepath.Join(dir, "metrics.txt"))
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		_ = os.WriteFile(filepath.Join(dir, "status.txt"), b, 0o644)
		b, _ = os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		_ = os.WriteFile(filepath.Join(dir, "smaps_rollup.txt"), b, 0o644)
		t.Logf("profile at RSS %d MiB", rss>>20)
	}
}

// metOrGap says whether measured is within target, or by how much not.
func metOrGap(measured, target int64) string {
	if measured <= target {
		return "met"
	}
	return fmt.Sprintf("gap: %d MB over", (measured-target)>>20)
}

// seedRelays stores each relay's share of the dataset in its store.
func seedRelays(t *testing.T, remotes []*testrelay.Relay, ds *Dataset) {
	t.Helper()
	var g errgroup.Group
	for i, r := range remotes {
		g.Go(func() error {
			for _, e := range ds.PerRelay[i] {
				if err := r.Store.SaveEvent(context.Background(), e); err != nil {
					return fmt.Errorf("seed %s: %w", r.URL, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("seed: %v", err)
	}
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// waitAllOnRelay polls the relay at url until it returns every id, asking
// by id in pages over one connection.
func waitAllOnRelay(ctx context.Context, url string, ids []string) error {
	r, err := nostr.RelayConnect(ctx, url)
	if err != nil {
		return err
	}
	defer r.Close()
	left := ids
	for {
		var next []string
		for chunk := range slices.Chunk(left, 200) {
			qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			got, err := r.QuerySync(qctx, nostr.Filter{IDs: chunk, Limit: len(chunk)})
			cancel()
			if err != nil {
				return err
			}
			have := make(map[string]bool, len(got))
			for _, e := range got {
				have[e.ID] = true
			}
			for _, id := range chunk {
				if !have[id] {
					next = append(next, id)
				}
			}
		}
		left = next
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d events missing: %w", len(left), len(ids), ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// procStatusOf reads a kB field of /proc/<pid>/status in bytes (0 if gone).
func procStatusOf(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// saveURL writes what a GET of url answers to path, best effort: a profile
// or metrics page the benchmark keeps beside its results, never a reason
// to fail the run.
func saveURL(ctx context.Context, url, path string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err == nil {
		_ = os.WriteFile(path, b, 0o644)
	}
}
