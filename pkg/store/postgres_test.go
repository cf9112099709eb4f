package store_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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
