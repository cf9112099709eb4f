package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestBenchIdleCost syncs a world of many relays (the design's shape: many
// repositories over many relays, a few listed per repository) with graspd
// in its own process, then measures what graspd costs when there is nothing
// to do: CPU-seconds over a minute, collections, goroutines, heap, and the
// wire facts behind them (connections per relay, NIP-77 sessions given up on
// relays without it). The relays (testkit khatru, half with NIP-77, REQ cap
// 500) run in the test process, so graspd's numbers are its own.
// GRASP_BENCH_IDLE=1 enables it; GRASP_BENCH_RELAYS (100), GRASP_BENCH_REPOS
// (1000), GRASP_BENCH_RELAYS_PER_REPO (5), GRASP_BENCH_EVENTS_PER_REPO (10)
// and GRASP_BENCH_IDLE_SECONDS (60) size it; GRASP_BENCH_GRASPD names
// another graspd binary to measure; GRASP_BENCH_PROFILE (a
// directory) keeps graspd's heap, goroutine and CPU profiles at rest.
// docs/measurements/2026-12-04-design-scale-costs-removed.md records the runs.
func TestBenchIdleCost(t *testing.T) {
	if os.Getenv("GRASP_BENCH_IDLE") == "" {
		t.Skip("SKIP: benchmark; run with GRASP_BENCH_IDLE=1")
	}
	bin, err := BuildBinaries()
	if err != nil {
		t.Fatal(err)
	}
	nRelays, repos := benchInt("GRASP_BENCH_RELAYS", 100), benchInt("GRASP_BENCH_REPOS", 1000)
	perRepo, k := benchInt("GRASP_BENCH_EVENTS_PER_REPO", 10), benchInt("GRASP_BENCH_RELAYS_PER_REPO", 5)
	idle := time.Duration(benchInt("GRASP_BENCH_IDLE_SECONDS", 60)) * time.Second
	remotes := make([]*testrelay.Relay, nRelays)
	urls := make([]string, nRelays)
	for i := range remotes {
		remotes[i] = testrelay.Start(t, testrelay.Options{Negentropy: i%2 == 0, MaxLimit: 500})
		StrictTags(remotes[i])
		urls[i] = remotes[i].URL
	}
	ds := GenerateDataset(benchPublicURL, urls, repos, perRepo, k, 1)
	t.Logf("generated %d repos over %d relays (%d each), %d distinct events", repos, nRelays, k, len(ds.Distinct))
	seedRelays(t, remotes, ds)

	relayAddr, metricsAddr := freeAddr(t), freeAddr(t)
	env := BaseEnv(t.TempDir())
	env["GRASP_PUBLIC_URL"] = benchPublicURL
	env["GRASP_RELAY_ADDR"] = relayAddr
	env["GRASP_METRICS_ADDR"] = metricsAddr
	env["GRASP_LOG_LEVEL"] = "warn"
	env["GRASP_PPROF"] = "true"
	// GRASP_BENCH_GRASPD runs another graspd binary (a build of the code
	// before a change) in the same world.
	graspdBin := filepath.Join(bin, "graspd")
	if v := os.Getenv("GRASP_BENCH_GRASPD"); v != "" {
		graspdBin = v
	}
	p := &Proc{
		Name: "graspd", Log: filepath.Join(t.TempDir(), "graspd.log"), HealthURL: "http://" + metricsAddr + "/readyz",
		MetricsAddr: metricsAddr, bin: graspdBin, env: processEnv(env, nil),
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
	began := time.Now()
	cpu0 := procCPUSeconds(p.Pid())
	if err := testrelay.Publish(ctx, "ws://"+relayAddr, ds.Announcements...); err != nil {
		t.Fatalf("publish announcements: %v", err)
	}
	if err := waitAllOnRelay(ctx, "ws://"+relayAddr, IDs(ds.Distinct...)); err != nil {
		t.Fatalf("initial sync: %v; log ends:\n%s", err, Tail(p.Log, 20))
	}
	wall, syncCPU := time.Since(began), procCPUSeconds(p.Pid())-cpu0
	peak := procStatusOf(p.Pid(), "VmHWM")

	// Let the planner's consolidation and the last reports settle, then
	// measure a quiet window.
	time.Sleep(30 * time.Second)
	m0 := map[string]float64{}
	_ = scrapeInto(ctx, metricsAddr, m0)
	c0 := procCPUSeconds(p.Pid())
	time.Sleep(idle)
	c1 := procCPUSeconds(p.Pid())
	m1 := map[string]float64{}
	if err := scrapeInto(ctx, metricsAddr, m1); err != nil {
		t.Fatal(err)
	}
	idleCPU := (c1 - c0) / idle.Seconds()
	gcs := m1["go_gc_duration_seconds_count"] - m0["go_gc_duration_seconds_count"]
	sum := func(m map[string]float64, prefix, must string) float64 {
		var s float64
		for k, v := range m {
			if strings.HasPrefix(k, prefix) && strings.Contains(k, must) {
				s += v
			}
		}
		return s
	}
	conns := sum(m1, "grasp_fetcher_connect_attempts_total{", `result="ok"`)
	fallbacks := sum(m1, "grasp_fetcher_negentropy_fallbacks_total{", "")
	liveSubs := sum(m1, "grasp_fetcher_live_subscriptions{", "")
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("| %d repos × %d relays (%d each), %d events | sync %s, %.0f cpu-s | peak %d MB | idle %.1f %% of a core, %.0f GCs/min | RSS %d MB, heap in use %.0f MB | %.0f goroutines | %.0f connections, %.0f NIP-77 fallbacks, %.0f live subs | load %s |\n",
		repos, nRelays, k, len(ds.Distinct), wall.Round(time.Second), syncCPU, peak>>20, 100*idleCPU, gcs*60/idle.Seconds(),
		procStatusOf(p.Pid(), "VmRSS")>>20, m1["go_memstats_heap_inuse_bytes"]/(1<<20), m1["go_goroutines"],
		conns, fallbacks, liveSubs, strings.TrimSpace(string(load)))
	if dir := os.Getenv("GRASP_BENCH_PROFILE"); dir != "" {
		for name, path := range map[string]string{"heap.pprof": "/debug/pprof/heap", "goroutine.txt": "/debug/pprof/goroutine?debug=1",
			"cpu.pprof": "/debug/pprof/profile?seconds=30", "metrics.txt": "/metrics"} {
			if err := fetchTo(ctx, "http://"+metricsAddr+path, filepath.Join(dir, name)); err != nil {
				t.Logf("profile %s: %v", name, err)
			}
		}
	}
}

// procCPUSeconds is the user and system CPU time of a process so far.
func procCPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// fetchTo saves what url serves to path.
func fetchTo(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
