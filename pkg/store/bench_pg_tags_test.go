package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// BenchmarkPostgresTagLookups is issue 31's measurement of the fetcher's
// NIP-77 local-set statement (Items of 100 `#e` values) while a bulk sync
// fills PostgreSQL from empty (decision 0058). Per variant it loads
// GRASP_STORE_BENCH_N NIP-34-shaped events (default 100,000) in batches of
// 64 through SaveBatch and, at 1k, 10k and 100k rows, stops to time the
// statement (median of 15) and print its EXPLAIN (ANALYZE, BUFFERS). It
// reports the write rate and the CPU the PostgreSQL backends of the run
// used while writing (from /proc, so PostgreSQL must run on this machine; 0
// otherwise), both without the checkpoints' queries. Variants:
//   - before: the GIN index with its pending list, never analyzed (the
//     code before decision 0058);
//   - gin-nopending: the store as it is: fastupdate off, ANALYZE by the
//     store as the table doubles;
//   - tagtable: a tag table (tag, event id) with a B-tree instead of the
//     GIN index, filled by a trigger in the insert's statement, analyzed
//     at the same points (the layout the embedded store keys; emulated
//     here, not implemented in the store).
//
// Run one at a time (it needs GRASP_TEST_POSTGRES_URL):
//
//	GRASP_STORE_BENCH_PG=1 go test -run '^$' -bench BenchmarkPostgresTagLookups -benchtime 1x -timeout 1h ./store/
func BenchmarkPostgresTagLookups(b *testing.B) {
	if os.Getenv("GRASP_STORE_BENCH_PG") != "1" {
		b.Skip("SKIP: set GRASP_STORE_BENCH_PG=1 (and GRASP_TEST_POSTGRES_URL) to run the PostgreSQL tag-lookup measurement")
	}
	n := 100_000
	if v := os.Getenv("GRASP_STORE_BENCH_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	variants := []string{"before", "gin-nopending", "tagtable"}
	if v := os.Getenv("GRASP_STORE_BENCH_PG_VARIANTS"); v != "" {
		variants = strings.Split(v, ",")
	}
	for _, variant := range variants {
		b.Run(variant, func(b *testing.B) { pgTagLookupRun(b, variant, n) })
	}
}

func pgTagLookupRun(b *testing.B, variant string, n int) {
	url, schema := pgSchema(b)
	app := "grasp_bench_" + schema
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	url += sep + "application_name=" + app
	var opts []store.Option
	if variant != "gin-nopending" {
		opts = append(opts, store.WithPostgresTagsAsBefore())
	}
	s, err := store.Open(url, append(opts, store.WithPostgresSchema(schema))...)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("postgres", url)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	table := pq.QuoteIdentifier(schema) + ".grasp_event"
	tags := pq.QuoteIdentifier(schema) + ".grasp_tag"
	mustExec := func(q string) {
		if _, err := db.Exec(q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	var stmt string
	if variant == "tagtable" {
		mustExec(`DROP INDEX ` + pq.QuoteIdentifier(schema) + `.grasp_event_tags`)
		mustExec(`CREATE TABLE ` + tags + ` (tag text NOT NULL, id text NOT NULL, PRIMARY KEY (tag, id))`)
		mustExec(`CREATE FUNCTION ` + pq.QuoteIdentifier(schema) + `.grasp_tag_fill() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO ` + tags + ` (tag, id) SELECT DISTINCT t.v, n.id FROM new_rows n, unnest(n.tagvalues) AS t(v); RETURN NULL; END $$`)
		mustExec(`CREATE TRIGGER grasp_tag_fill AFTER INSERT ON ` + table + ` REFERENCING NEW TABLE AS new_rows
			FOR EACH STATEMENT EXECUTE FUNCTION ` + pq.QuoteIdentifier(schema) + `.grasp_tag_fill()`)
		stmt = `SELECT id, created_at FROM ` + table + ` WHERE id IN (SELECT id FROM ` + tags + ` WHERE tag = ANY($1::text[])) ORDER BY created_at DESC, id`
	}
	// The tag table's variant is analyzed as the store analyzes its table:
	// when the rows inserted since reach the rows then, from 1,000.
	var analyzedAt int

	ctx := context.Background()
	c := newCorpus(max(10, n/500)) // as fill: 200 repositories at 100k, so roots come early
	checkpoints := []int{1_000, 10_000, 100_000}
	rng := rand.New(rand.NewPCG(3, 4))
	var writeTime, writeCPU time.Duration
	loaded := 0
	for _, cp := range checkpoints {
		if cp > n {
			break
		}
		start, cpu0 := time.Now(), pgBackendsCPU(b, db, app)
		for loaded < cp {
			batch := make([]*nostr.Event, 0, 64)
			for range min(64, cp-loaded) {
				batch = append(batch, c.next())
			}
			for _, r := range s.SaveBatch(ctx, batch) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
			loaded += len(batch)
			if variant == "tagtable" && loaded-analyzedAt >= max(analyzedAt, 1000) {
				mustExec(`ANALYZE ` + table + ` (id, pubkey, created_at, kind, rkey, tagvalues)`)
				mustExec(`ANALYZE ` + tags)
				analyzedAt = loaded
			}
		}
		writeTime += time.Since(start)
		writeCPU += pgBackendsCPU(b, db, app) - cpu0
		cpu := writeCPU
		rate := float64(loaded) / writeTime.Seconds()

		// 100 root ids, as the fetcher's local set for a chunk of roots
		// (most stored, so each matches its replies and statuses).
		vals := make([]string, 0, 100)
		for _, i := range rng.Perm(len(c.roots))[:min(100, len(c.roots))] {
			vals = append(vals, "e:"+c.roots[i])
		}
		var times []time.Duration
		var matched int
		for range 15 {
			t0 := time.Now()
			if variant == "tagtable" {
				matched = countRows(b, db, stmt, vals)
			} else {
				items, err := s.Items(ctx, nostr.Filter{Tags: nostr.TagMap{"e": stripE(vals)}})
				if err != nil {
					b.Fatal(err)
				}
				matched = len(items)
			}
			times = append(times, time.Since(t0))
		}
		slices.Sort(times)
		var analyzes int
		if variant == "gin-nopending" {
			analyzes = store.PostgresWaitAnalyze(s)
		}
		// The store's own statement as the store runs it; the tag table's
		// as the benchmark emulates it.
		plan, err := store.PostgresItemsPlan(ctx, s, nostr.Filter{Tags: nostr.TagMap{"e": stripE(vals)}}, true)
		if err != nil {
			b.Fatal(err)
		}
		if variant == "tagtable" {
			plan = explain(b, db, stmt, vals)
		}
		plan = "    " + strings.ReplaceAll(plan, "\n", "\n    ")
		fmt.Printf("pgtags %s @%d: query median %.2f ms (min %.2f, max %.2f), %d items; writes %.0f events/s; PostgreSQL backends CPU while writing %.2f s (%.1f ms per 1,000 events); store ANALYZEs %d\n",
			variant, loaded, ms(times[len(times)/2]), ms(times[0]), ms(times[len(times)-1]), matched, rate, cpu.Seconds(),
			cpu.Seconds()*1e6/float64(loaded), analyzes)
		fmt.Printf("pgtags %s @%d plan:\n%s\n", variant, loaded, plan)
		b.ReportMetric(ms(times[len(times)/2]), fmt.Sprintf("ms-query@%d", cp))
		b.ReportMetric(rate, fmt.Sprintf("events/s@%d", cp))
	}
	b.ReportMetric(writeCPU.Seconds(), "pg-write-cpu-s")
}

// countRows runs the tag table's statement (the store cannot: it has no
// such table) and reads its rows as Items would.
func countRows(tb testing.TB, db *sql.DB, stmt string, vals []string) int {
	rows, err := db.Query(stmt, pq.Array(vals))
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id string
		var ts int64
		if err := rows.Scan(&id, &ts); err != nil {
			tb.Fatal(err)
		}
		n++
	}
	return n
}

func stripE(vals []string) []string {
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = strings.TrimPrefix(v, "e:")
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// explain runs EXPLAIN (ANALYZE, BUFFERS) of stmt.
func explain(tb testing.TB, db *sql.DB, stmt string, vals []string) string {
	rows, err := db.Query(`EXPLAIN (ANALYZE, BUFFERS) `+stmt, pq.Array(vals))
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			tb.Fatal(err)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

// pgBackendsCPU sums user and system CPU of the PostgreSQL backends whose
// application_name is app (this run's connections; ANALYZE runs in them
// too), read from /proc/<pid>/stat. Connections closed meanwhile are lost;
// the pool keeps its idle ones for 5 minutes, longer than a run.
func pgBackendsCPU(tb testing.TB, db *sql.DB, app string) time.Duration {
	rows, err := db.Query(`SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var total time.Duration
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			tb.Fatal(err)
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		// After the command: state is field 3, utime 14 and stime 15.
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
	}
	return total
}
