package store_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/lib/pq"
	"github.com/nbd-wtf/go-nostr"
)

// backendCase names one backend the semantic tests run against and how to
// open a fresh, isolated store on it.
type backendCase struct {
	name string
	// binaryCaps: content over 65,535 bytes is refused (badger, lmdb).
	binaryCaps bool
	// longTagsQueryable: tag values over 100 bytes can be queried.
	longTagsQueryable bool
	// exact: queries honour every filter field and the limit exactly. Not
	// eventstore's badger, lmdb and sqlite3: their tag indexes confuse
	// letters, skip empty values or match substrings, and the false
	// positives they return count against the limit before the Store
	// drops them, so a limited query can come back short.
	exact bool
	open  func(t testing.TB, opts ...store.Option) *store.Store
}

func embeddedCase(scheme string, binaryCaps, longTags bool) backendCase {
	return backendCase{name: scheme, binaryCaps: binaryCaps, longTagsQueryable: longTags, exact: strings.HasPrefix(scheme, "kv"),
		open: func(t testing.TB, opts ...store.Option) *store.Store {
			t.Helper()
			path := t.TempDir()
			if scheme == "sqlite3" {
				path = filepath.Join(path, "events.db")
			}
			s, err := store.Open(scheme+"://"+path, opts...)
			if err != nil && strings.Contains(err.Error(), "without cgo") {
				t.Skipf("SKIP: %s needs a cgo build: %v", scheme, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			return s
		}}
}

func postgresCase() backendCase {
	return backendCase{name: "postgres", longTagsQueryable: true, exact: true,
		open: func(t testing.TB, opts ...store.Option) *store.Store {
			t.Helper()
			url, schema := pgSchema(t)
			s, err := store.Open(url, append(opts, store.WithPostgresSchema(schema))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			return s
		}}
}

// allBackends is every backend: kv (on pebble and on badger) and badger
// always, lmdb and sqlite3 in cgo builds, PostgreSQL when
// GRASP_TEST_POSTGRES_URL is set.
func allBackends() []backendCase {
	return []backendCase{
		embeddedCase("kv+pebble", false, true),
		embeddedCase("kv+badger", false, true),
		embeddedCase("badger", true, false),
		embeddedCase("lmdb", true, false),
		embeddedCase("sqlite3", false, true),
		postgresCase(),
	}
}

// pgURL returns the test database or skips visibly.
func pgURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("GRASP_TEST_POSTGRES_URL")
	if url == "" {
		t.Skip("SKIP: GRASP_TEST_POSTGRES_URL is not set (CI sets it to postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	return url
}

// pgSchema reserves a schema unique to this test, dropped when it ends, so
// parallel runs on one shared database never see each other's rows.
func pgSchema(t testing.TB) (url, schema string) {
	t.Helper()
	url = pgURL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "grasp_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		db, err := sql.Open("postgres", url)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer db.Close()
		if _, err := db.Exec(`DROP SCHEMA IF EXISTS ` + pq.QuoteIdentifier(schema) + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return url, schema
}

// signed makes a real signed event.
func signed(t testing.TB, sk string, kind int, ts nostr.Timestamp, tags nostr.Tags, content string) *nostr.Event {
	t.Helper()
	evt := &nostr.Event{Kind: kind, CreatedAt: ts, Tags: tags, Content: content}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

func ids(evts []*nostr.Event) []string {
	out := make([]string, len(evts))
	for i, e := range evts {
		out[i] = e.ID
	}
	return out
}
