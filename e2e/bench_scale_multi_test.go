package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
)

// The multi-process rows of `make bench-scale` (issue 31, "Done when"):
// the same world through the five services on PostgreSQL under the
// shipped auth.conf, as
//
//   - single-node (mode "multi"): one NATS node, one fetcher, one ingester;
//   - replicas: one NATS node with 2 fetchers and 2 ingesters, so what a
//     second replica of each costs per event is measured apart from what
//     a replicated cluster costs;
//   - cluster: a 3-node NATS cluster (R3 streams and buckets, the production
//     overlay's cluster block, natsauth.go) with 2 fetchers and 2 ingesters;
//   - faults: the cluster again, and when a third of the events are stored
//     the busiest fetcher and the NATS node leading JetStream's meta group
//     are killed with SIGKILL; neither is started again, so the rest of the
//     sync runs on two NATS nodes and one fetcher, which must take the dead
//     one's shards over once their leases expire (GRASP_FETCHER_LEASE_TTL).
//
// GRASP_BENCH_SCALE_MULTIPROC=0 skips all three; GRASP_BENCH_SCALE_MULTIPROC_ROWS
// picks some (comma-separated: single-node, replicas, cluster, faults;
// default all).
// Every row also reports each process's CPU-seconds per 1,000 events
// ("bench cpu:"), PostgreSQL's backends of the deployment's database among
// them.

// multiRun is one multi-process row: its mode, the deployment's shape and
// whether the faults strike.
type multiRun struct {
	Mode  string
	Opts  DeploymentOptions
	Fault bool
}

// multiRowNames are GRASP_BENCH_SCALE_MULTIPROC_ROWS's names, in run order.
var multiRowNames = []string{"single-node", "replicas", "cluster", "faults"}

// pickMultiRuns parses GRASP_BENCH_SCALE_MULTIPROC_ROWS (empty or "all":
// every row) into the runs on PostgreSQL at pg, in multiRowNames' order.
func pickMultiRuns(t *testing.T, v, pg string) []multiRun {
	want := multiRowNames
	if v != "" && v != "all" {
		want = nil
		for _, n := range strings.Split(v, ",") {
			n = strings.TrimSpace(n)
			if !slices.Contains(multiRowNames, n) {
				t.Fatalf("GRASP_BENCH_SCALE_MULTIPROC_ROWS: %q is not one of %s", n, strings.Join(multiRowNames, ", "))
			}
			want = append(want, n)
		}
	}
	cluster := DeploymentOptions{PostgresURL: pg, Auth: true, NATSNodes: 3, Fetchers: 2, Ingesters: 2}
	var out []multiRun
	for _, n := range multiRowNames {
		if !slices.Contains(want, n) {
			continue
		}
		switch n {
		case "single-node":
			out = append(out, multiRun{Mode: "multi", Opts: DeploymentOptions{PostgresURL: pg, Auth: true}})
		case "replicas":
			out = append(out, multiRun{Mode: "replicas", Opts: DeploymentOptions{PostgresURL: pg, Auth: true, Fetchers: 2, Ingesters: 2}})
		case "cluster":
			out = append(out, multiRun{Mode: "cluster", Opts: cluster})
		case "faults":
			out = append(out, multiRun{Mode: "faults", Opts: cluster, Fault: true})
		}
	}
	return out
}

// cpuMeter reads the CPU-seconds of named processes while a world syncs.
// A process is read every sample, so one killed mid-sync keeps what it
// used until its last reading; a name may cover several processes (the
// PostgreSQL backends), each counted from its first reading or, for those
// present at the start, from then.
type cpuMeter struct {
	procs func() map[int]string // pid → name, now
	// pgDB lists the PostgreSQL backends of the deployment's database
	// (nil: no PostgreSQL).
	pgDB   *sql.DB
	pgPids []int
	pgNext time.Time
	base   map[int]float64
	last   map[int]float64
	name   map[int]string
}

func newCPUMeter(procs func() map[int]string, pgDB *sql.DB) *cpuMeter {
	return &cpuMeter{procs: procs, pgDB: pgDB, base: map[int]float64{}, last: map[int]float64{}, name: map[int]string{}}
}

// start takes the baseline: what every process used before the sync.
func (c *cpuMeter) start(ctx context.Context) {
	c.sample(ctx)
	for pid, v := range c.last {
		c.base[pid] = v
	}
}

// sample reads every process once (the PostgreSQL backends are listed
// again at most every 2 s).
func (c *cpuMeter) sample(ctx context.Context) {
	pids := c.procs()
	if c.pgDB != nil {
		if time.Now().After(c.pgNext) {
			c.pgNext = time.Now().Add(2 * time.Second)
			if ps, err := pgBackends(ctx, c.pgDB); err == nil {
				c.pgPids = ps
			}
		}
		for _, pid := range c.pgPids {
			pids[pid] = "postgres"
		}
	}
	for pid, name := range pids {
		if v := procCPU(pid); v > 0 {
			c.last[pid] = v
			c.name[pid] = name
		}
	}
}

// close ends the meter's PostgreSQL connection.
func (c *cpuMeter) close() {
	if c.pgDB != nil {
		_ = c.pgDB.Close()
	}
}

// seconds is each name's CPU-seconds since start.
func (c *cpuMeter) seconds() map[string]float64 {
	out := map[string]float64{}
	for pid, v := range c.last {
		out[c.name[pid]] += v - c.base[pid]
	}
	return out
}

// pgBackends lists the backends serving the database db is connected to
// (sessions and autovacuum workers), without db's own.
func pgBackends(ctx context.Context, db *sql.DB) ([]int, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := db.QueryContext(qctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return nil, fmt.Errorf("list PostgreSQL backends: %w", err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		out = append(out, pid)
	}
	return out, rows.Err()
}

// cpuOrder is the order of a "bench cpu:" line: services in data-flow
// order, then NATS and PostgreSQL.
func cpuOrder(cpu map[string]float64) []string {
	rank := func(n string) int {
		for i, p := range []string{"graspd", "relay", "discovery", "planner", "fetcher", "ingester", "nats", "postgres"} {
			if strings.HasPrefix(n, p) {
				return i
			}
		}
		return 99
	}
	names := make([]string, 0, len(cpu))
	for n := range cpu {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if a, b := rank(names[i]), rank(names[j]); a != b {
			return a < b
		}
		return names[i] < names[j]
	})
	return names
}

// cpuLine renders CPU-seconds per 1,000 events per process.
func cpuLine(r scaleResult) string {
	var parts []string
	for _, n := range cpuOrder(r.CPU) {
		parts = append(parts, fmt.Sprintf("%s %.3f", n, 1000*r.CPU[n]/float64(max(r.Stored, 1))))
	}
	total := cpuSum(r.CPU)
	return fmt.Sprintf("%s; all %.3f CPU-s per 1,000 events (%.0f CPU-s over %.0f s for %d events)",
		strings.Join(parts, ", "), 1000*total/float64(max(r.Stored, 1)), total, r.AllSecs, r.Stored)
}

// perK sums the CPU-seconds per 1,000 events of the processes whose name
// begins with prefix (every replica of a service).
func perK(r scaleResult, prefix string) float64 {
	var s float64
	for n, v := range r.CPU {
		if strings.HasPrefix(n, prefix) {
			s += v
		}
	}
	return 1000 * s / float64(max(r.Stored, 1))
}

// faultResult is what the faults row did and found.
type faultResult struct {
	// When it struck: stored events and seconds into the sync.
	AtStored float64 `json:"at_stored"`
	AtSecs   float64 `json:"at_s"`
	// Fetcher and NATSNode are the processes killed (SIGKILL); neither is
	// started again. Survivor is the other fetcher.
	Fetcher  string `json:"fetcher"`
	NATSNode string `json:"nats_node"`
	Survivor string `json:"survivor"`
	// Shards the killed fetcher held, how many of them the survivor
	// acquired, and when the first and the last was acquired, from the kill.
	Shards            []int   `json:"shards"`
	TakenOver         int     `json:"taken_over"`
	FirstTakeoverSecs float64 `json:"first_takeover_s"`
	LastTakeoverSecs  float64 `json:"last_takeover_s"`
	// The store afterwards: rows, distinct ids, rows whose id is one of the
	// world's events or announcements, and how many those are.
	Rows        int    `json:"rows"`
	DistinctIDs int    `json:"distinct_ids"`
	WorldStored int    `json:"world_stored"`
	WorldIDs    int    `json:"world_ids"`
	StoreErr    string `json:"store_err,omitempty"`
	// Permission lines in any log (NATS nodes and services): the NATS
	// refusals (PermissionDenials) and any other line saying "permission".
	Denials     int      `json:"denials"`
	Permission  int      `json:"permission_lines"`
	DenialLines []string `json:"denial_lines,omitempty"`
	killedAt    time.Time
}

// strikeFaults kills the busiest fetcher and the NATS node leading the
// JetStream meta group (SIGKILL, not started again) and returns what it
// did; the shards the fetcher held are read off its log first.
func strikeFaults(t *testing.T, d *Deployment) *faultResult {
	f := busiestFetcher(t, d)
	fr := &faultResult{Fetcher: f.Name, Shards: heldShards(f.Log)}
	for _, o := range d.Fetchers {
		if o != f {
			fr.Survivor = o.Name
		}
	}
	node := metaLeader(d)
	fr.NATSNode = node.Name
	fr.killedAt = time.Now()
	if err := f.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := node.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("faults: killed %s (held shards %v) and %s (JetStream meta leader) with SIGKILL; neither restarted", f.Name, fr.Shards, node.Name)
	return fr
}

// metaLeader is the NATS node leading JetStream's meta group (as a node's
// /jsz says), or the second node when none says.
func metaLeader(d *Deployment) *Proc {
	for _, p := range d.NATS {
		base := strings.TrimSuffix(p.HealthURL, "/healthz")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/jsz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			continue
		}
		var jsz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		cancel()
		if err != nil || jsz.Meta.Leader == "" {
			continue
		}
		for _, n := range d.NATS {
			if n.Name == jsz.Meta.Leader {
				return n
			}
		}
	}
	return d.NATS[min(1, len(d.NATS)-1)]
}

// shardLogLine is the part of a fetcher's "shard acquired" and "shard
// released" lines (services/fetcher, gainShard and loseShard) read here.
type shardLogLine struct {
	Time  time.Time `json:"time"`
	Msg   string    `json:"msg"`
	Shard *int      `json:"shard"`
}

// shardEvents calls fn for every shard acquired or released in a
// fetcher's log, in order.
func shardEvents(path string, fn func(l shardLogLine, acquired bool)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var l shardLogLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Shard == nil {
			continue
		}
		switch l.Msg {
		case "shard acquired":
			fn(l, true)
		case "shard released":
			fn(l, false)
		}
	}
}

// heldShards is the shards a fetcher's log says it holds now.
func heldShards(path string) []int {
	held := map[int]bool{}
	shardEvents(path, func(l shardLogLine, acquired bool) { held[*l.Shard] = acquired })
	var out []int
	for s, h := range held {
		if h {
			out = append(out, s)
		}
	}
	sort.Ints(out)
	return out
}

// measureTakeover reads the survivor's log for the first acquisition of
// each of the killed fetcher's shards after the kill.
func (fr *faultResult) measureTakeover(survivorLog string) {
	first := map[int]time.Time{}
	shardEvents(survivorLog, func(l shardLogLine, acquired bool) {
		if !acquired || l.Time.Before(fr.killedAt) || !slices.Contains(fr.Shards, *l.Shard) {
			return
		}
		if _, ok := first[*l.Shard]; !ok {
			first[*l.Shard] = l.Time
		}
	})
	fr.TakenOver = len(first)
	for _, at := range first {
		secs := at.Sub(fr.killedAt).Seconds()
		if fr.FirstTakeoverSecs == 0 || secs < fr.FirstTakeoverSecs {
			fr.FirstTakeoverSecs = secs
		}
		fr.LastTakeoverSecs = max(fr.LastTakeoverSecs, secs)
	}
}

// anyPermission matches any log line mentioning a permission, beyond the
// refusals permissionDenial names.
var anyPermission = regexp.MustCompile(`(?i)permission`)

// checkLogs counts permission lines in every log of the deployment.
func (fr *faultResult) checkLogs(d *Deployment) {
	denials := d.PermissionDenials()
	fr.Denials = len(denials)
	fr.DenialLines = firstN(denials, 10)
	for _, p := range d.Procs() {
		f, err := os.Open(p.Log)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			if anyPermission.MatchString(sc.Text()) {
				fr.Permission++
				if fr.Denials == 0 && len(fr.DenialLines) < 10 {
					fr.DenialLines = append(fr.DenialLines, p.Name+": "+sc.Text())
				}
			}
		}
		f.Close()
	}
}

// checkStore counts the deployment's stored events: every row, distinct
// ids, and the rows that are the world's ids.
func (fr *faultResult) checkStore(ctx context.Context, storeURL string, ids []string) {
	fr.WorldIDs = len(ids)
	db, err := sql.Open("postgres", storeURL)
	if err != nil {
		fr.StoreErr = err.Error()
		return
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = db.QueryRowContext(qctx, `SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE id = ANY($1)) FROM grasp_event`,
		pq.Array(ids)).Scan(&fr.Rows, &fr.DistinctIDs, &fr.WorldStored)
	if err != nil {
		fr.StoreErr = fmt.Sprintf("count stored events: %v", err)
	}
}

// printMultiRows prints the rows of the cluster and faults modes.
func printMultiRows(r scaleResult, all []scaleResult, row func(what, measured, target string, ok bool)) {
	row("complete", fmt.Sprintf("%d of %d in %.0fs", r.Stored, r.Events, r.AllSecs), "complete", r.Complete)
	var base *scaleResult
	for i := range all {
		if all[i].World == r.World && all[i].Mode == "multi" && all[i].Complete {
			base = &all[i]
		}
	}
	if r.Mode == "cluster" || r.Mode == "replicas" {
		growth := "CPU per 1,000 events per service, 1 → 2 replicas"
		if r.Mode == "cluster" {
			growth += " (and 1 → 3 NATS nodes)"
		}
		if base != nil {
			row("events/s vs the single-node multi-process row", fmt.Sprintf("%.0f vs %.0f = %.2f×", r.EventsPS, base.EventsPS, r.EventsPS/base.EventsPS),
				"≥ 0.8×", r.Complete && r.EventsPS >= 0.8*base.EventsPS)
			bf, bi, cf, ci := perK(*base, "fetcher"), perK(*base, "ingester"), perK(r, "fetcher"), perK(r, "ingester")
			row(growth, fmt.Sprintf("fetcher %.3f → %.3f s (%+.0f %%), ingester %.3f → %.3f s (%+.0f %%)", bf, cf, 100*(cf/bf-1), bi, ci, 100*(ci/bi-1)),
				"growth ≤ 10 %", r.Complete && cf <= 1.1*bf && ci <= 1.1*bi)
		} else {
			row("events/s", fmt.Sprintf("%.0f", r.EventsPS), "≥ 0.8× the single-node multi-process row (not complete in this invocation)", false)
			row(growth, fmt.Sprintf("fetcher %.3f s, ingester %.3f s", perK(r, "fetcher"), perK(r, "ingester")),
				"growth ≤ 10 % from the single-node row (not complete in this invocation)", false)
		}
		return
	}
	fr := r.Fault
	if fr == nil {
		row("faults", "never struck (the sync ended before a third was stored)", "kill -9 of a NATS node and a fetcher mid-sync", false)
		return
	}
	row("faults struck", fmt.Sprintf("kill -9 of %s and %s (meta leader) at %.0f of %d stored, %.0fs in; neither restarted", fr.Fetcher, fr.NATSNode, fr.AtStored, r.Events, fr.AtSecs),
		"mid-sync", fr.AtStored < float64(r.Events))
	once := fr.StoreErr == "" && fr.Rows == fr.DistinctIDs && fr.WorldStored == fr.WorldIDs && fr.Rows == fr.WorldIDs
	measured := fmt.Sprintf("%d rows, %d distinct ids, %d of the world's %d events and announcements", fr.Rows, fr.DistinctIDs, fr.WorldStored, fr.WorldIDs)
	if fr.StoreErr != "" {
		measured = fr.StoreErr
	}
	row("every event stored exactly once", measured, "rows = distinct ids = the world's", once)
	row("permission errors (every log)", fmt.Sprintf("%d NATS refusals, %d lines saying \"permission\"", fr.Denials, fr.Permission), "0", fr.Denials == 0 && fr.Permission == 0)
	moved := fmt.Sprintf("%d of %s's %d shards acquired by %s, first %.1fs, last %.1fs after the kill", fr.TakenOver, fr.Fetcher, len(fr.Shards), fr.Survivor, fr.FirstTakeoverSecs, fr.LastTakeoverSecs)
	row("shards moved", moved, "all within 30 s", len(fr.Shards) > 0 && fr.TakenOver == len(fr.Shards) && fr.LastTakeoverSecs <= 30)
	// No target: what the faults cost against the same deployment unharmed.
	for i := range all {
		if all[i].World == r.World && all[i].Mode == "cluster" && all[i].Complete {
			fmt.Printf("bench note: %s faults: %.0f events/s vs %.0f of the cluster row without faults (%.2f×)\n", r.World, r.EventsPS, all[i].EventsPS, r.EventsPS/all[i].EventsPS)
		}
	}
}

// TestFaultShardLog: the killed fetcher's shards are those its log
// acquired and did not release; the takeover is timed from the kill to the
// survivor's first acquisition of each, ignoring shards that did not move
// and acquisitions before the kill.
func TestFaultShardLog(t *testing.T) {
	dir := t.TempDir()
	kill := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	line := func(at time.Duration, msg string, shard int) string {
		return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":%q,"shard":%d}`, kill.Add(at).Format(time.RFC3339Nano), msg, shard)
	}
	dead := strings.Join([]string{line(-time.Minute, "shard acquired", 1), line(-time.Minute, "shard acquired", 2),
		line(-time.Minute, "shard acquired", 3), `{"msg":"not json`, line(-30*time.Second, "shard released", 2),
		line(-time.Second, "relay connected", 4)}, "\n")
	survivor := strings.Join([]string{line(-50*time.Second, "shard acquired", 2), line(-5*time.Second, "shard acquired", 1),
		line(-4*time.Second, "shard released", 1), line(12*time.Second, "shard acquired", 1),
		line(20500*time.Millisecond, "shard acquired", 3), line(25*time.Second, "shard acquired", 5),
		line(40*time.Second, "shard acquired", 1)}, "\n")
	deadLog, survivorLog := dir+"/dead.log", dir+"/survivor.log"
	if err := os.WriteFile(deadLog, []byte(dead), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(survivorLog, []byte(survivor), 0o644); err != nil {
		t.Fatal(err)
	}
	fr := &faultResult{Shards: heldShards(deadLog), killedAt: kill}
	if !slices.Equal(fr.Shards, []int{1, 3}) {
		t.Fatalf("held shards %v, want [1 3]", fr.Shards)
	}
	fr.measureTakeover(survivorLog)
	if fr.TakenOver != 2 || fr.FirstTakeoverSecs != 12 || fr.LastTakeoverSecs != 20.5 {
		t.Errorf("takeover: %d shards, first %.1fs, last %.1fs; want 2, 12s, 20.5s", fr.TakenOver, fr.FirstTakeoverSecs, fr.LastTakeoverSecs)
	}
}

// TestShardLossesTellRebalancing: the bench's "shard or lease losses" row
// counts a shard a fetcher lost (lease expired, taken over, gone) and a
// leader's lost lease once each, and counts apart the shards handed over on
// purpose when a replica joins or one stops, as the fetcher's own
// grasp_fetcher_shard_releases_total labels them.
func TestShardLossesTellRebalancing(t *testing.T) {
	dir := t.TempDir()
	lines := []string{
		`{"level":"INFO","msg":"shard acquired","shard":1}`,
		`{"level":"INFO","msg":"shard released","shard":1,"reason":"rebalanced to another replica"}`,
		`{"level":"INFO","msg":"shard released","shard":2,"reason":"rebalanced to another replica"}`,
		`{"level":"INFO","msg":"shard released","shard":3,"reason":"fetcher stopping"}`,
		`{"level":"WARN","msg":"shard lease lost","shard":4,"reason":"lease taken over by another replica","err":"wrong last sequence"}`,
		`{"level":"INFO","msg":"shard released","shard":4,"reason":"lease taken over by another replica"}`,
		`{"level":"WARN","msg":"shard lease not renewed before it could expire; releasing the shard","shard":5}`,
		`{"level":"INFO","msg":"shard released","shard":5,"reason":"lease not renewed before it could expire"}`,
		`{"level":"WARN","msg":"lease lost: renewal refused","err":"wrong last sequence"}`,
		`{"level":"INFO","msg":"relay disconnected","relay":"ws://x"}`,
	}
	path := dir + "/fetcher-0.log"
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, warns, _, losses, moves, disconnects := scanLogs([]string{path})
	if losses != 3 || moves != 3 || disconnects != 1 || warns != 3 {
		t.Errorf("losses %d, moves %d, disconnects %d, warnings %d; want 3 lost (shards 4 and 5, a leader), 3 handed over (1, 2, 3), 1, 3",
			losses, moves, disconnects, warns)
	}
}
