package store_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/lib/pq"
	"github.com/nbd-wtf/go-nostr"
)

// Environment of the writer helper process (the standard re-exec pattern:
// the test binary runs itself with -test.run naming the helper).
const (
	helperEnv       = "GRASP_STORE_HELPER_WRITER"
	helperURLEnv    = "GRASP_STORE_HELPER_URL"
	helperSchemaEnv = "GRASP_STORE_HELPER_SCHEMA"
	helperSKEnv     = "GRASP_STORE_HELPER_SK"
	helperParityEnv = "GRASP_STORE_HELPER_PARITY"
)

const (
	twoProcVersions = 300 // announcement versions in all, half per process
	twoProcNotes    = 200 // regular events both processes write
)

// twoProcEvents is what a writer process writes: the versions of one
// announcement whose created_at has its parity, shuffled, and every shared
// note. Events are derived from the key, so both processes agree on ids.
func twoProcEvents(t testing.TB, sk string, parity int) (versions, notes []*nostr.Event) {
	for i := range twoProcVersions {
		if i%2 == parity {
			versions = append(versions, signed(t, sk, 30617, nostr.Timestamp(1_700_000_000+i),
				nostr.Tags{{"d", "contested"}, {"clone", "https://git.example/contested.git"}}, ""))
		}
	}
	rand.Shuffle(len(versions), func(i, j int) { versions[i], versions[j] = versions[j], versions[i] })
	for i := range twoProcNotes {
		notes = append(notes, signed(t, sk, 1621, nostr.Timestamp(1_700_000_000+i), nostr.Tags{{"a", "30617:x:contested"}}, fmt.Sprintf("issue %d", i)))
	}
	return versions, notes
}

// TestHelperWriter is not a test: it is the body of the writer processes
// TestPostgresTwoProcessesOneVersion starts, and returns at once otherwise.
func TestHelperWriter(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	parity, _ := strconv.Atoi(os.Getenv(helperParityEnv))
	s, err := store.Open(os.Getenv(helperURLEnv), store.WithPostgresSchema(os.Getenv(helperSchemaEnv)))
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	defer s.Close()
	versions, notes := twoProcEvents(t, os.Getenv(helperSKEnv), parity)
	ctx := context.Background()
	storedNotes := 0
	// Alternate: a version, a note, so both kinds of writes overlap the
	// other process's.
	for i := 0; i < len(versions) || i < len(notes); i++ {
		if i < len(versions) {
			if _, err := s.Save(ctx, versions[i]); err != nil {
				fmt.Println("ERROR", err)
				os.Exit(2)
			}
		}
		if i < len(notes) {
			ok, err := s.Save(ctx, notes[i])
			if err != nil {
				fmt.Println("ERROR", err)
				os.Exit(2)
			}
			if ok {
				storedNotes++
			}
		}
	}
	fmt.Println("STORED_NOTES", storedNotes)
}

// TestPostgresTwoProcessesOneVersion: two processes write, concurrently,
// interleaved versions of one announcement and the same set of issues to one
// PostgreSQL. Exactly the newest version must remain, each issue once, and
// each issue reported stored by exactly one of the two processes.
func TestPostgresTwoProcessesOneVersion(t *testing.T) {
	url, schema := pgSchema(t)
	// Create the schema first so the processes race on writes, not DDL
	// (concurrent DDL is covered by the advisory lock; this keeps the test
	// about the writes).
	s, err := store.Open(url, store.WithPostgresSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sk := nostr.GeneratePrivateKey()

	var wg sync.WaitGroup
	stored := make([]int, 2)
	errs := make([]error, 2)
	for parity := range 2 {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$", "-test.count=1")
			cmd.Env = append(os.Environ(), helperEnv+"=1", helperURLEnv+"="+url, helperSchemaEnv+"="+schema,
				helperSKEnv+"="+sk, helperParityEnv+"="+strconv.Itoa(parity))
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[parity] = fmt.Errorf("writer %d: %v\n%s", parity, err, out)
				return
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if n, ok := strings.CutPrefix(sc.Text(), "STORED_NOTES "); ok {
					stored[parity], _ = strconv.Atoi(n)
					return
				}
			}
			errs[parity] = fmt.Errorf("writer %d printed no result:\n%s", parity, out)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	ctx := context.Background()
	got, err := s.Query(ctx, nostr.Filter{Kinds: []int{30617}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].CreatedAt != nostr.Timestamp(1_700_000_000+twoProcVersions-1) {
		t.Fatalf("announcement versions left = %d (first created_at %v), want exactly the newest", len(got), got)
	}
	if ok, err := got[0].CheckSignature(); !ok || err != nil {
		t.Fatalf("stored version fails its signature: %v", err)
	}
	if stored[0]+stored[1] != twoProcNotes {
		t.Fatalf("processes reported %d + %d issues stored, want %d in total (each exactly once)", stored[0], stored[1], twoProcNotes)
	}
	// Count rows in the table itself, not through the store's dedup.
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT id) FROM `+pq.QuoteIdentifier(schema)+`.grasp_event`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != twoProcNotes+1 || distinct != rows {
		t.Fatalf("rows = %d (%d distinct ids), want %d issues + 1 announcement", rows, distinct, twoProcNotes)
	}
}

// TestPostgresConcurrentOpen: two stores opening one empty schema at once
// both succeed (schema creation is serialised by an advisory lock).
func TestPostgresConcurrentOpen(t *testing.T) {
	url, schema := pgSchema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			s, err := store.Open(url, store.WithPostgresSchema(schema))
			if err != nil {
				errs <- err
				return
			}
			s.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestPostgresKindIndexUpgrade: a database created before the kind index
// took id (grasp_event_kind on (kind, created_at DESC)) gets
// grasp_event_kind_created at its next open and loses the old index; opening
// again changes nothing; kinds-only queries (one ordered scan per kind,
// merged) keep their answers, newest first, ties by id.
func TestPostgresKindIndexUpgrade(t *testing.T) {
	url, schema, db, _ := pgOldTable(t, func(table string) string {
		return `CREATE INDEX grasp_event_kind ON ` + table + ` (kind, created_at DESC)`
	})
	indexes := func() []string {
		rows, err := db.Query(`SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND indexname LIKE 'grasp_event_kind%' ORDER BY 1`, schema)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	sk := nostr.GeneratePrivateKey()
	var evts []*nostr.Event
	for i := range 40 {
		// Pairs share a second, so the tie on id is exercised.
		evts = append(evts, signed(t, sk, []int{1621, 1617, 1111, 5}[i%4], nostr.Timestamp(1_700_000_000+i/2), nil, fmt.Sprint("e", i)))
	}
	for open := range 2 {
		s, err := store.Open(url, store.WithPostgresSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		if got := indexes(); len(got) != 1 || got[0] != "grasp_event_kind_created" {
			t.Fatalf("open %d: kind indexes %v, want [grasp_event_kind_created]", open, got)
		}
		if open == 0 {
			for _, r := range s.SaveBatch(context.Background(), evts) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
		}
		for _, f := range []nostr.Filter{
			{Kinds: []int{1621}, Limit: 5},
			{Kinds: []int{1617, 1621, 1111}, Limit: 7},
			{Kinds: []int{5, 1111}, Limit: 100},
			{Kinds: []int{1621, 1617}, Since: ptr(nostr.Timestamp(1_700_000_004)), Until: ptr(nostr.Timestamp(1_700_000_012)), Limit: 100},
		} {
			got, err := s.Query(context.Background(), f)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, e := range newestByID(evts) {
				if f.Matches(e) && len(want) < f.Limit {
					want = append(want, e.ID)
				}
			}
			if g := ids(got); !slices.Equal(g, want) {
				t.Fatalf("%s:\n got %v\nwant %v", f, g, want)
			}
		}
		s.Close()
	}
}

func ptr[T any](v T) *T { return &v }

// newestByID orders events newest first, ties by id (the order every
// backend answers in).
func newestByID(evts []*nostr.Event) []*nostr.Event {
	out := slices.Clone(evts)
	slices.SortFunc(out, func(a, b *nostr.Event) int {
		if a.CreatedAt != b.CreatedAt {
			return int(b.CreatedAt - a.CreatedAt)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// TestPostgresTagIndexUpkeep (decision 0058): a tag index created before
// the decision, with its pending list on, has fastupdate off after the next
// open, and opening again changes nothing; the store analyzes a table never
// analyzed when it opens, and again once its inserts have doubled the
// table; the local-set statement (Items of 100 #e values) then reads the
// GIN index, not the whole table.
func TestPostgresTagIndexUpkeep(t *testing.T) {
	url, schema, db, table := pgOldTable(t, func(table string) string {
		return `CREATE INDEX grasp_event_tags ON ` + table + ` USING gin (tagvalues)`
	})
	fastupdate := func() string {
		var opts []string
		if err := db.QueryRow(`SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`,
			pq.QuoteIdentifier(schema)+".grasp_event_tags").Scan(pq.Array(&opts)); err != nil {
			t.Fatal(err)
		}
		return strings.Join(opts, ",")
	}
	reltuples := func() float64 {
		var n float64
		if err := db.QueryRow(`SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := fastupdate(); got != "" {
		t.Fatalf("old index options %q, want none", got)
	}
	ctx := context.Background()
	c := newCorpus(10)
	for open := range 2 {
		s, err := store.Open(url, store.WithPostgresSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		if got := fastupdate(); got != "fastupdate=off" {
			t.Fatalf("open %d: tag index options %q, want fastupdate=off", open, got)
		}
		if open == 1 {
			s.Close()
			break
		}
		if runs := store.PostgresWaitAnalyze(s); runs != 1 || reltuples() != 0 {
			t.Fatalf("after opening a table never analyzed: %d ANALYZEs, reltuples %v; want 1 and 0", runs, reltuples())
		}
		const n = 2_500
		for from := 0; from < n; from += 64 {
			var batch []*nostr.Event
			for range min(64, n-from) {
				batch = append(batch, c.next())
			}
			for _, r := range s.SaveBatch(ctx, batch) {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
		}
		// Inserts past 1,000 start one ANALYZE, and past 2,000 (twice
		// the rows then) another, unless the first was still running.
		if runs := store.PostgresWaitAnalyze(s); runs < 2 || reltuples() < 1000 {
			t.Fatalf("after %d inserts: %d ANALYZEs, reltuples %v; want ≥ 2 and ≥ 1000", n, runs, reltuples())
		}
		f := nostr.Filter{Tags: nostr.TagMap{"e": c.roots[:100]}}
		plan, err := store.PostgresItemsPlan(ctx, s, f, false)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(plan, "Bitmap Index Scan on grasp_event_tags") || strings.Contains(plan, "Seq Scan") {
			t.Fatalf("local-set statement's plan does not read the tag index:\n%s", plan)
		}
		items, err := s.Items(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(items) < 100 {
			t.Fatalf("Items of 100 roots' replies: %d items, want at least the replies of each", len(items))
		}
		s.Close()
	}
}

// pgOldTable creates, in a schema of its own, the events table as an older
// graspd left it, with the one index index returns (given the table's
// qualified name), for tests of what the next open changes.
func pgOldTable(t *testing.T, index func(table string) string) (url, schema string, db *sql.DB, table string) {
	t.Helper()
	url, schema = pgSchema(t)
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	table = pq.QuoteIdentifier(schema) + ".grasp_event"
	for _, q := range []string{
		`CREATE SCHEMA ` + pq.QuoteIdentifier(schema),
		`CREATE TABLE ` + table + ` (id text PRIMARY KEY, pubkey text NOT NULL, created_at bigint NOT NULL,
			kind integer NOT NULL, rkey text UNIQUE, tagvalues text[] NOT NULL, raw text NOT NULL)`,
		index(table),
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return url, schema, db, table
}
