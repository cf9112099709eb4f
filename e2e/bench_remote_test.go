package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/syncbaseline"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestBenchRemote is `make bench`'s initial sync with the remote relays in
// a process of their own, as they are on other machines in a deployment
// (issue 24 §3; docs/measurements/2026-12-04-relays-in-own-process.md). TestBenchEndToEnd runs the relays, graspd and the baseline
// in one process, so neither side's CPU can be told apart from the relays'.
//
// Per kind of relay, a relay farm (e2e/cmd/relayfarm: 5 relays, 500 events
// per REQ filter) is seeded once with the world; then graspd (the `make
// build` binary on its shipped defaults, its own process) syncs it, timed
// from publishing the announcements until its ingesters stored every
// event; then the baseline (syncbaseline.Sync in e2e/cmd/syncbaseline,
// its own process) syncs the same relays into a fresh store. For each it
// reports wall-clock events/s and the CPU-seconds of its process
// (/proc/<pid>/stat utime+stime over the timed interval) per 1,000 events,
// and prints the targets as "bench row:" lines. The kinds: NIP-77 relays
// answering tag filters exactly, and plain khatru relays (no NIP-77, tag
// filters matched by value whatever the letter).
//
// GRASP_BENCH=1 enables it; GRASP_BENCH_REPOS and
// GRASP_BENCH_EVENTS_PER_REPO scale the world as for TestBenchEndToEnd
// (default 1,000 × 50); GRASP_BENCH_REMOTE_KINDS=nip77,khatru picks kinds;
// GRASP_BENCH_REMOTE_GRASPD, GRASP_BENCH_REMOTE_FARM and
// GRASP_BENCH_REMOTE_BASELINE name prebuilt binaries (make bench passes
// bin/graspd, bin/relayfarm and bin/syncbaseline; otherwise they are built);
// GRASP_BENCH_PROFILE=DIR keeps a CPU profile of graspd's first seconds of
// each sync there (profileRemote).
func TestBenchRemote(t *testing.T) {
	if os.Getenv("GRASP_BENCH") == "" {
		t.Skip("SKIP: benchmark; run with GRASP_BENCH=1 (make bench)")
	}
	repos, perRepo := benchInt("GRASP_BENCH_REPOS", 1000), benchInt("GRASP_BENCH_EVENTS_PER_REPO", 50)
	graspd := scaleBin(t, "GRASP_BENCH_REMOTE_GRASPD", "graspd")
	farmBin := scaleBin(t, "GRASP_BENCH_REMOTE_FARM", "relayfarm")
	baseBin := scaleBin(t, "GRASP_BENCH_REMOTE_BASELINE", "syncbaseline")
	// TestBenchEndToEnd's world shape: every repository lists 2 of the 5
	// relays and each of its events is on both; half roots, half comments.
	// With the announcement and the repository state, perRepo events per
	// repository in all.
	spec := testkit.WorldSpec{
		Repos: repos, Relays: 5, RelaysPerRepo: 2, CopiesMin: 2, CopiesMax: 2,
		RootsPerRepo: max(1, (perRepo-2)/2), CommentsPerRoot: 1, Contributors: 20, Seed: 24,
	}
	began := time.Now()
	w := testkit.GenerateWorld(spec)
	t.Logf("world %s: %d events (and %d announcements) signed in %s; graspd %s, relayfarm %s, syncbaseline %s; %d CPUs, load %s",
		spec, len(w.Events), len(w.Repos), time.Since(began).Round(time.Millisecond), graspd, farmBin, baseBin, runtime.NumCPU(), loadAvg())
	var results []remoteResult
	for _, k := range pickRemoteKinds(t, os.Getenv("GRASP_BENCH_REMOTE_KINDS")) {
		t.Run(k.name, func(t *testing.T) {
			r := runRemoteKind(t, k, w, graspd, farmBin, baseBin)
			results = append(results, r)
			printRemoteRows(r)
		})
	}
	t.Log("\n" + renderRemoteTable(results))
}

// remoteKind is a kind of remote relay the benchmark syncs from.
type remoteKind struct {
	key, name string
	farm      testrelay.FarmOptions
}

// remoteKinds are issue 24's two kinds: NIP-77 relays and plain-khatru,
// REQ-capped ones.
var remoteKinds = []remoteKind{
	{"nip77", "NIP-77 relays (tag-exact, 500 per REQ)", testrelay.FarmOptions{Relays: 5, NegentropyFraction: 1, MaxLimit: 500}},
	{"khatru", "plain khatru relays (REQ only, tag-letter quirk, 500 per REQ)", testrelay.FarmOptions{Relays: 5, IgnoreTagLetterFraction: 1, MaxLimit: 500}},
}

// pickRemoteKinds parses GRASP_BENCH_REMOTE_KINDS (empty: all).
func pickRemoteKinds(t *testing.T, v string) []remoteKind {
	if v == "" {
		return remoteKinds
	}
	var out []remoteKind
	for _, key := range strings.Split(v, ",") {
		found := false
		for _, k := range remoteKinds {
			if k.key == strings.TrimSpace(key) {
				out, found = append(out, k), true
			}
		}
		if !found {
			t.Fatalf("GRASP_BENCH_REMOTE_KINDS: %q is not a kind (nip77, khatru)", key)
		}
	}
	return out
}

// remoteSide is what one syncer (graspd or the baseline) measured.
type remoteSide struct {
	Wall time.Duration
	// CPU is the syncing process's CPU-seconds over the timed interval;
	// FarmCPU the relay farm's over the same interval.
	CPU, FarmCPU float64
	// Sent is what the farm sent during it (EVENT messages: every copy).
	Sent int64
	// Verified counts signature checks (the ingesters', the baseline's).
	Verified float64
}

// remoteResult is one kind's run.
type remoteResult struct {
	kind                string
	events, onRelays    int
	pipeline, baseline  remoteSide
	loadStart, loadEnd  string
	logErrors, logWarns int
}

func (s remoteSide) rate(events int) float64 { return float64(events) / s.Wall.Seconds() }

func (s remoteSide) cpuPerK(events int) float64 { return 1000 * s.CPU / float64(events) }

// runRemoteKind seeds a farm of the kind's relays and syncs it with graspd,
// then with the baseline.
func runRemoteKind(t *testing.T, k remoteKind, w *testkit.World, graspd, farmBin, baseBin string) remoteResult {
	res := remoteResult{kind: k.name, events: len(w.Events), loadStart: loadAvg()}
	dir := t.TempDir()
	farm := startFarmWith(t, farmBin, filepath.Join(dir, "relayfarm.log"), k.farm)
	farmPid := farm.cmd.Process.Pid
	res.onRelays = farm.seed(t, w)
	t.Logf("farm of %d relays seeded with %d copies of %d events", k.farm.Relays, res.onRelays, res.events)

	// The pipeline: graspd as shipped, in its own process.
	tgt := startSingle(t, graspd, filepath.Join(dir, "graspd-data"), "", filepath.Join(dir, "graspd.log"), "")
	defer tgt.stop()
	anns := w.Announcements(tgt.relay, farm.urls)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s0, f0, c0 := farm.stats(t), procCPU(farmPid), tgt.cpu()
	began := time.Now()
	profiled := profileRemote(ctx, tgt, k.name)
	if err := testrelay.Publish(ctx, tgt.relay, anns...); err != nil {
		t.Fatalf("publish announcements: %v", err)
	}
	if err := waitStoredCounter(ctx, tgt, float64(res.events)); err != nil {
		t.Fatalf("pipeline initial sync: %v; log ends:\n%s", err, Tail(tgt.logs[0], 20))
	}
	res.pipeline.Wall = time.Since(began)
	res.pipeline.CPU, res.pipeline.FarmCPU = tgt.cpu()-c0, procCPU(farmPid)-f0
	if line := <-profiled; line != "" { // after the readings: a profile longer than the sync ends idle
		t.Log(line)
	}
	res.pipeline.Sent = totals(s0, farm.stats(t)).EventsSent
	if m, err := tgt.metrics(ctx); err == nil {
		res.pipeline.Verified = MetricSum(m, "grasp_ingester_verified_total")
	}
	// The counter is the ingesters'; ask the relay for every id once
	// (after the timed interval).
	ids := make([]string, len(w.Events))
	for i, e := range w.Events {
		ids[i] = e.Event.ID
	}
	if err := waitAllOnRelay(ctx, tgt.relay, ids); err != nil {
		t.Fatalf("pipeline: the stored counter reached the world's size but the relay lacks events: %v", err)
	}
	// The log up to here: the sync and the check, not the shutdown.
	var top map[string]int
	res.logErrors, res.logWarns, top, _, _, _ = scanLogs(tgt.logs)
	t.Logf("graspd log during the sync: %d ERROR, %d WARN, most frequent %v", res.logErrors, res.logWarns, top)
	tgt.stop()
	t.Logf("pipeline: %d events in %s (%.0f/s), graspd CPU %.2fs (%.2fs per 1,000), farm CPU %.2fs, farm sent %d events, verified %.0f",
		res.events, res.pipeline.Wall.Round(time.Millisecond), res.pipeline.rate(res.events), res.pipeline.CPU,
		res.pipeline.cpuPerK(res.events), res.pipeline.FarmCPU, res.pipeline.Sent, res.pipeline.Verified)

	// The baseline: the same relays, in its own process.
	res.baseline = runBaselineProc(t, ctx, baseBin, dir, w, farm)
	t.Logf("baseline: %d events in %s (%.0f/s), CPU %.2fs (%.2fs per 1,000), farm CPU %.2fs, farm sent %d events, verified %.0f",
		res.events, res.baseline.Wall.Round(time.Millisecond), res.baseline.rate(res.events), res.baseline.CPU,
		res.baseline.cpuPerK(res.events), res.baseline.FarmCPU, res.baseline.Sent, res.baseline.Verified)
	res.loadEnd = loadAvg()
	return res
}

// profileRemote, when GRASP_BENCH_PROFILE names a directory, takes a CPU
// profile of graspd over the first GRASP_BENCH_PROFILE_SECONDS (default 5)
// of its sync and says on the channel how many events its ingesters stored
// meanwhile, so the profile's seconds can be read as µs per event
// (docs/measurements/2026-12-04-issue24-hot-path.md). Without it the
// channel has an empty line at once.
func profileRemote(ctx context.Context, tgt *scaleTarget, kind string) <-chan string {
	done := make(chan string, 1)
	dir := os.Getenv("GRASP_BENCH_PROFILE")
	if dir == "" {
		done <- ""
		return done
	}
	secs := benchInt("GRASP_BENCH_PROFILE_SECONDS", 5)
	stored := func() float64 {
		m, err := tgt.metrics(ctx)
		if err != nil {
			return -1
		}
		return MetricSum(m, "grasp_ingester_stored_total")
	}
	go func() {
		before := stored()
		path := filepath.Join(dir, "graspd-"+kind+".cpu.pprof")
		saveURL(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", tgt.procs[0].MetricsAddr, secs), path)
		done <- fmt.Sprintf("CPU profile %s: %d s, %.0f events stored meanwhile", path, secs, stored()-before)
	}()
	return done
}

// waitStoredCounter polls graspd's metrics every 200 ms until its
// ingesters stored want events (the relay's announcements are not synced:
// they are not on the remotes), or ctx ends, or a process exits.
func waitStoredCounter(ctx context.Context, tgt *scaleTarget, want float64) error {
	var stored float64
	for {
		if m, err := tgt.metrics(ctx); err == nil {
			if stored = MetricSum(m, "grasp_ingester_stored_total"); stored >= want {
				return nil
			}
		}
		for _, p := range tgt.procs {
			if !p.Running() {
				return fmt.Errorf("%s exited with %.0f of %.0f events stored", p.Name, stored, want)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%.0f of %.0f events stored: %w", stored, want, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// runBaselineProc runs e2e/cmd/syncbaseline against the farm's relays,
// reading its CPU (and the farm's) right before telling it to start and
// right after it reports the sync done, then has it check every id.
func runBaselineProc(t *testing.T, ctx context.Context, bin, dir string, w *testkit.World, farm *farmProc) remoteSide {
	relays := make([]syncbaseline.Relay, len(farm.urls))
	for i, u := range farm.urls {
		relays[i].URL = u
	}
	for r, rel := range w.RepoRelays {
		for _, i := range rel {
			relays[i].Repos = append(relays[i].Repos, w.Repos[r])
		}
	}
	plan, idsPath := filepath.Join(dir, "baseline-plan.json"), filepath.Join(dir, "baseline-ids.txt")
	b, err := json.Marshal(relays)
	if err != nil {
		t.Fatal(err)
	}
	var ids strings.Builder
	for _, e := range w.Events {
		ids.WriteString(e.Event.ID + "\n")
	}
	if err := os.WriteFile(plan, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(idsPath, []byte(ids.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "syncbaseline.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, bin, "-plan", plan, "-ids", idsPath, "-store", filepath.Join(dir, "baseline-events"))
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	out := bufio.NewReader(stdout)
	var step struct {
		Ready    bool    `json:"ready"`
		Synced   bool    `json:"synced"`
		WallS    float64 `json:"wall_s"`
		Verified int64   `json:"verified"`
		Missing  *int    `json:"missing"`
		Error    string  `json:"error"`
	}
	read := func(what string) {
		line, err := out.ReadBytes('\n')
		if err != nil || json.Unmarshal(line, &step) != nil || step.Error != "" {
			t.Fatalf("syncbaseline, waiting for %s: %v %s %s; log: %s", what, err, line, step.Error, Tail(logPath, 10))
		}
	}
	read("ready")
	pid := cmd.Process.Pid
	s0, f0, c0 := farm.stats(t), procCPU(farm.cmd.Process.Pid), procCPU(pid)
	if _, err := io.WriteString(stdin, "start\n"); err != nil {
		t.Fatal(err)
	}
	read("the sync")
	var side remoteSide
	side.CPU, side.FarmCPU = procCPU(pid)-c0, procCPU(farm.cmd.Process.Pid)-f0
	side.Wall = time.Duration(step.WallS * float64(time.Second))
	side.Verified = float64(step.Verified)
	side.Sent = totals(s0, farm.stats(t)).EventsSent
	if _, err := io.WriteString(stdin, "check\n"); err != nil {
		t.Fatal(err)
	}
	read("the check")
	if step.Missing == nil {
		t.Fatalf("syncbaseline: no count of missing events")
	}
	if *step.Missing != 0 {
		t.Fatalf("baseline incomplete: %d of %d events missing", *step.Missing, len(w.Events))
	}
	_ = stdin.Close()
	exited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("syncbaseline: %v; log: %s", err, Tail(logPath, 10))
	}
	return side
}

// printRemoteRows prints a kind's targets as "bench row:" lines.
func printRemoteRows(r remoteResult) {
	p, b := r.pipeline, r.baseline
	ratio := p.rate(r.events) / b.rate(r.events)
	fmt.Printf("bench row: initial sync, relays in their own process, %s, %d events: pipeline (graspd) %.0f events/s, baseline (syncbaseline) %.0f events/s = %.2f× (target ≥ 1.5×) — %s\n",
		r.kind, r.events, p.rate(r.events), b.rate(r.events), ratio, met(ratio >= 1.5))
	cpu := p.cpuPerK(r.events) / b.cpuPerK(r.events)
	fmt.Printf("bench row: CPU-s per 1,000 synced events, relays in their own process, %s: pipeline (graspd) %.2f, baseline (syncbaseline) %.2f = %.2f× (target ≤ 1.0×) — %s\n",
		r.kind, p.cpuPerK(r.events), b.cpuPerK(r.events), cpu, met(cpu <= 1.0))
}

// renderRemoteTable renders the runs as a markdown table for
// docs/performance.md.
func renderRemoteTable(rs []remoteResult) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Machine: %s, %d CPUs, %s, %s UTC.\n\n", host, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, "| relays | events (copies on the relays) | syncer | wall | events/s | CPU-s per 1,000 events | relays' CPU-s per 1,000 events | events the relays sent per event | signatures checked per event | load start → end |\n")
	fmt.Fprintf(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		for _, s := range []struct {
			name string
			side remoteSide
		}{{"pipeline (graspd)", r.pipeline}, {"baseline (syncbaseline)", r.baseline}} {
			n := float64(r.events)
			fmt.Fprintf(&b, "| %s | %d (%d) | %s | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %s → %s |\n",
				r.kind, r.events, r.onRelays, s.name, s.side.Wall.Round(10*time.Millisecond), s.side.rate(r.events),
				s.side.cpuPerK(r.events), 1000*s.side.FarmCPU/n, float64(s.side.Sent)/n, s.side.Verified/n, r.loadStart, r.loadEnd)
		}
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "\n%s: pipeline/baseline %.2f× events/s, %.2f× CPU per event; graspd log: %d ERROR, %d WARN.",
			r.kind, r.pipeline.rate(r.events)/r.baseline.rate(r.events), r.pipeline.cpuPerK(r.events)/r.baseline.cpuPerK(r.events), r.logErrors, r.logWarns)
	}
	b.WriteString("\n")
	return b.String()
}
