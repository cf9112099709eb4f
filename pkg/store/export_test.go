package store

import (
	"context"

	"github.com/nbd-wtf/go-nostr"
)

// WithKVTagsV2 makes a new kv directory format v2, with v2's tag keys, as
// the code before format v3 wrote it: for tests that open such a
// directory, and for benchmarks comparing the two layouts in one run.
func WithKVTagsV2() Option { return func(o *options) { o.kvTagsV2 = true } }

// WithKVNoItemKeys makes a kv store write no item keys, as the code before
// them did: for tests of a directory holding events stored by it.
func WithKVNoItemKeys() Option { return func(o *options) { o.kvNoItemKeys = true } }

// WithPostgresTagsAsBefore opens PostgreSQL as the code before decision
// 0058 did: the tag index keeps its pending list (fastupdate on) and the
// store never analyzes the table. For benchmarks measuring the difference.
func WithPostgresTagsAsBefore() Option { return func(o *options) { o.pgTagsAsBefore = true } }

// PostgresWaitAnalyze waits for the PostgreSQL store's ANALYZE in flight, if
// any, and reports how many it has run since it opened.
func PostgresWaitAnalyze(s *Store) int {
	p, ok := s.b.(*pgBackend)
	if !ok {
		return 0
	}
	p.stats.wg.Wait()
	p.stats.mu.Lock()
	defer p.stats.mu.Unlock()
	return p.stats.runs
}

// PostgresItemsPlan is PostgreSQL's plan (EXPLAIN, with ANALYZE and
// BUFFERS if analyze) for Items(f) on a PostgreSQL store, run as Items runs
// it; f must not need splitting.
func PostgresItemsPlan(ctx context.Context, s *Store, f nostr.Filter, analyze bool) (string, error) {
	p, ok := s.b.(*pgBackend)
	if !ok {
		return "", nil
	}
	return p.itemsPlan(ctx, f, analyze)
}

// KVKeys counts the keys of a kv store (every prefix), for benchmarks that
// report store writes per event.
func KVKeys(s *Store) (int, error) {
	k, ok := s.b.(*kv)
	if !ok {
		return 0, nil
	}
	n := 0
	err := k.eng.scanKeys(nil, func([]byte) bool { n++; return true })
	return n, err
}

// ItemsByScan is Items as it was before kv listed items itself: the paged
// scan that decodes every event. The kv item lister is tested and
// benchmarked against it.
func ItemsByScan(ctx context.Context, s *Store, f nostr.Filter) ([]Item, error) {
	f.Limit, f.LimitZero = 0, false
	if f.Search != "" || nostr.GetTheoreticalLimit(f) == 0 {
		return nil, nil
	}
	return s.itemsByScan(ctx, f)
}
