//go:build cgo

package store

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fiatjaf/eventstore/lmdb"
	"github.com/fiatjaf/eventstore/sqlite3"
)

// The lmdb and sqlite3 backends link C libraries, so they exist only in cgo
// builds; a pure-Go build still has badger and PostgreSQL.
func init() {
	cgoBackends["lmdb"] = openLMDB
	cgoBackends["sqlite3"] = openSQLite3
}

func openLMDB(dir string, o options) (*embedded, error) {
	b := &lmdb.LMDBBackend{Path: dir, MaxLimit: o.maxLimit}
	if err := b.Init(); err != nil {
		return nil, fmt.Errorf("open lmdb store %s: %w", dir, err)
	}
	return &embedded{name: "lmdb", es: b, maxLimit: o.maxLimit, binaryCaps: true, closeGrace: 50 * time.Millisecond,
		lim: queryLimits{IDs: 500, Authors: 500}}, nil
}

func openSQLite3(file string, o options) (*embedded, error) {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return nil, fmt.Errorf("store sqlite3://%s: %w", file, err)
	}
	b := &sqlite3.SQLite3Backend{
		// WAL lets readers run beside the writer; the busy timeout makes
		// concurrent writers wait instead of failing with SQLITE_BUSY.
		DatabaseURL: "file:" + file + "?_journal_mode=WAL&_busy_timeout=10000&_synchronous=NORMAL",
		QueryLimit:  o.maxLimit,
	}
	if err := b.Init(); err != nil {
		return nil, fmt.Errorf("open sqlite3 store %s: %w", file, err)
	}
	// eventstore's sqlite3 fails whole queries over these counts.
	return &embedded{name: "sqlite3", es: b, maxLimit: o.maxLimit,
		lim: queryLimits{IDs: 500, Authors: 500, Kinds: 10, TagValues: 10}}, nil
}
