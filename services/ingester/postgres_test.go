package ingester_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// postgresStores returns a function opening connection pools to one
// PostgreSQL store in a schema of its own (dropped at the end), or skips the
// test when GRASP_TEST_POSTGRES_URL is not set.
func postgresStores(t testing.TB) func() *store.Store {
	t.Helper()
	url := os.Getenv("GRASP_TEST_POSTGRES_URL")
	if url == "" {
		t.Skip("SKIP: GRASP_TEST_POSTGRES_URL is not set (CI sets it to postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "grasp_ingester_test_" + hex.EncodeToString(b[:])
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
	return func() *store.Store {
		st, err := store.Open(url, store.WithPostgresSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
}

// newPostgresEnv is newEnv with the store on PostgreSQL (the test's view
// and the ingesters' default one pool), or skips as postgresStores.
func newPostgresEnv(t testing.TB) *env {
	t.Helper()
	open := postgresStores(t)
	e := newEnv(t)
	st := open()
	e.store, e.raw = st, st
	return e
}

// TestTwoReplicasOnPostgres: two replicas, each with its own connection
// pool to one PostgreSQL store (as two processes would have), share the
// stream; every event is stored exactly once.
func TestTwoReplicasOnPostgres(t *testing.T) {
	open := postgresStores(t)
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	e.raw = open() // the test's own view of the shared store
	a := e.start(t, fastConfig(), open())
	bb := e.start(t, fastConfig(), open())
	e.waitPulling(t, fastConfig().Consumer, 2) // both share the work only if both pull
	e.publish(t, w.deliveries)
	e.waitDrained(t, w.accepted, 2*time.Minute)
	e.assertExactly(t, w.accepted)
	sa, sb := a.ing.Stats(), bb.ing.Stats()
	if sa.Consumed == 0 || sb.Consumed == 0 {
		t.Errorf("a replica did no work: consumed %d and %d", sa.Consumed, sb.Consumed)
	}
	if got := sa.Stored + sb.Stored; got != int64(len(w.accepted)) {
		t.Errorf("stored by both replicas = %d, want %d (each event exactly once)", got, len(w.accepted))
	}
}
