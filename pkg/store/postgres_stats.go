package store

import (
	"context"
	"sync"
	"time"
)

// pgStats keeps the planner's statistics of the table fresh while it grows
// (decision 0058): the store runs ANALYZE itself, in the background, each
// time the rows it inserted since the last one reach the rows the table
// held then (and at least pgAnalyzeMin), so a table filled from empty is
// analyzed at about 1k, 2k, 4k, … rows — a bounded number of times, never
// per write. Autovacuum cannot be relied on for this: it may be off (it is
// on the test box) and, on, it looks at a table once a minute, while a bulk
// sync fills it in seconds. Several processes each count their own writes,
// so with k writers the table is analyzed at most each (k+1)× growth.
type pgStats struct {
	mu      sync.Mutex
	off     bool  // as before decision 0058 (benchmarks)
	base    int64 // rows at the last ANALYZE (pg_class.reltuples)
	since   int64 // rows this process inserted since
	running bool
	runs    int
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// pgAnalyzeMin is the fewest inserted rows that start an ANALYZE: below it
// a table is small enough that any plan is fast.
const pgAnalyzeMin = 1000

// pgAnalyzeTimeout bounds one background ANALYZE (it samples 30,000 rows
// at the default statistics target, well under a second).
const pgAnalyzeTimeout = 5 * time.Minute

// wrote counts rows this process inserted and starts an ANALYZE when they
// reach the rows the table held at the last one (pgStats).
func (p *pgBackend) wrote(n int) {
	if n == 0 || p.stats.off {
		return
	}
	p.stats.mu.Lock()
	defer p.stats.mu.Unlock()
	p.stats.since += int64(n)
	if !p.stats.running && p.stats.since >= max(p.stats.base, pgAnalyzeMin) {
		p.analyzeLocked()
	}
}

// analyzeLocked runs ANALYZE in the background; p.stats.mu is held. It
// takes SHARE UPDATE EXCLUSIVE, which writers and readers do not wait for.
// The raw JSON is left out: nothing filters on it, and sampling it would
// read 30,000 events' text.
func (p *pgBackend) analyzeLocked() {
	p.stats.running = true
	from := p.stats.since
	p.stats.wg.Add(1)
	go func() {
		defer p.stats.wg.Done()
		ctx, cancel := context.WithTimeout(p.stats.ctx, pgAnalyzeTimeout)
		defer cancel()
		rows := float64(-1)
		_, err := p.db.ExecContext(ctx, `ANALYZE `+p.table+` (id, pubkey, created_at, kind, rkey, tagvalues)`)
		if err == nil {
			err = p.db.QueryRowContext(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, p.table).Scan(&rows)
		}
		p.stats.mu.Lock()
		defer p.stats.mu.Unlock()
		p.stats.running = false
		if err != nil {
			return // the next growth tries again
		}
		p.stats.runs++
		// At least what this process has seen inserted: ANALYZE by a role
		// that does not own the table only warns and leaves reltuples as
		// it was, and a stale base would start one every 1,000 rows.
		p.stats.base = max(int64(rows), p.stats.base+from)
		p.stats.since -= from
	}()
}
