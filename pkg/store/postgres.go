package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/nbd-wtf/go-nostr"
)

// pgBackend stores events in PostgreSQL through its own schema rather than
// eventstore's postgresql backend, whose ReplaceEvent is query → delete →
// save under an in-process mutex (several processes leave several versions)
// and whose queries fail over 500 ids or 10 tag values. Here:
//   - one row per id (primary key) and one row per replaceable key (unique
//     rkey), written by single INSERT … ON CONFLICT statements, so
//     concurrent writers in any number of processes converge on the
//     Supersedes winner without explicit locks;
//   - the event is kept as its JSON (text), so content with NUL or any size
//     round-trips; tag values are indexed as "k:v" (hashed when long) in a
//     GIN-indexed array, so every single-letter tag is queryable exactly.
type pgBackend struct {
	db    *sql.DB
	table string // schema-qualified, quoted
	stats pgStats
}

// pgConnectTimeout bounds how long Open waits for PostgreSQL.
const pgConnectTimeout = 10 * time.Second

// pgLockSchema is the advisory lock key under which the schema is created:
// CREATE … IF NOT EXISTS is not safe when two processes start at once.
const pgLockSchema = 0x67726173_70737400 // "graspst\0"

func openPostgres(raw string, o options) (*pgBackend, error) {
	where := Redact(raw)
	db, err := sql.Open("postgres", raw)
	if err != nil {
		return nil, fmt.Errorf("store %s: %v", where, err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	db.SetConnMaxIdleTime(5 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), pgConnectTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store %s: PostgreSQL unreachable: %s", where, oneLine(err))
	}
	p := &pgBackend{db: db, table: pq.QuoteIdentifier("grasp_event")}
	if o.pgSchema != "" {
		p.table = pq.QuoteIdentifier(o.pgSchema) + "." + p.table
	}
	if err := p.createSchema(ctx, o.pgSchema, !o.pgTagsAsBefore); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store %s: create schema: %s", where, oneLine(err))
	}
	p.stats.off = o.pgTagsAsBefore
	p.stats.ctx, p.stats.cancel = context.WithCancel(context.Background())
	if !p.stats.off {
		// reltuples is -1 for a table never analyzed (PostgreSQL 14 on):
		// analyze it now, as a store a bulk sync left unanalyzed (issue
		// 31: a sequential scan per local-set statement) needs.
		var rows float64
		if err := db.QueryRowContext(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, p.table).Scan(&rows); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("store %s: read table statistics: %s", where, oneLine(err))
		}
		p.stats.mu.Lock()
		p.stats.base = int64(max(rows, 0))
		if rows < 0 {
			p.analyzeLocked()
		}
		p.stats.mu.Unlock()
	}
	return p, nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func (p *pgBackend) createSchema(ctx context.Context, schema string, tagsPerDecision0058 bool) error {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgLockSchema)); err != nil {
		return err
	}
	var ddl []string
	if schema != "" {
		ddl = append(ddl, `CREATE SCHEMA IF NOT EXISTS `+pq.QuoteIdentifier(schema))
	}
	t := p.table
	ddl = append(ddl,
		`CREATE TABLE IF NOT EXISTS `+t+` (
			id         text    PRIMARY KEY,
			pubkey     text    NOT NULL,
			created_at bigint  NOT NULL,
			kind       integer NOT NULL,
			rkey       text    UNIQUE, -- sha256 of ReplaceKey; NULL for regular events
			tagvalues  text[]  NOT NULL,
			raw        text    NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS grasp_event_created ON `+t+` (created_at DESC, id)`,
		// A kind's events in the order queries return them, so a
		// kinds-only query is an ordered index scan per kind, merged
		// (kindsQuery). It replaces grasp_event_kind (kind, created_at
		// DESC), which left the tie on id to a sort and, with kind =
		// ANY(…), read every event of the kinds to sort them:
		// docs/measurements/2026-12-04-postgres-hot-statements.md. A
		// database created before gets it at its next start (built under
		// the schema lock, blocking writes while it is built).
		`CREATE INDEX IF NOT EXISTS grasp_event_kind_created ON `+t+` (kind, created_at DESC, id)`,
		`DROP INDEX IF EXISTS `+p.index("grasp_event_kind"),
		`CREATE INDEX IF NOT EXISTS grasp_event_pubkey ON `+t+` (pubkey, kind, created_at DESC)`,
	)
	if !tagsPerDecision0058 {
		ddl = append(ddl, `CREATE INDEX IF NOT EXISTS grasp_event_tags ON `+t+` USING gin (tagvalues)`)
	} else {
		// Without a pending list (fastupdate off) every insert puts its
		// tag values in the index's tree at once, so a lookup never
		// reads a pending list that only VACUUM merges: 101 ms per
		// local-set statement at 102,000 rows with it, 1–3 ms without
		// (issue 31; decision 0058).
		ddl = append(ddl, `CREATE INDEX IF NOT EXISTS grasp_event_tags ON `+t+` USING gin (tagvalues) WITH (fastupdate = off)`)
	}
	for _, q := range ddl {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	if tagsPerDecision0058 {
		if err := p.tagIndexWithoutPendingList(ctx, tx); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// tagIndexWithoutPendingList turns fastupdate off on a tag index created
// before decision 0058 and merges the pending list it holds (which
// fastupdate = off leaves as it is). Only when the index has it on: the
// ALTER needs the table's owner and a lock, which a start-up that changes
// nothing should not.
func (p *pgBackend) tagIndexWithoutPendingList(ctx context.Context, tx *sql.Tx) error {
	idx := p.index("grasp_event_tags")
	var off bool
	if err := tx.QueryRowContext(ctx, `SELECT coalesce('fastupdate=off' = ANY(reloptions), false) FROM pg_class WHERE oid = $1::regclass`, idx).Scan(&off); err != nil {
		return err
	}
	if off {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `ALTER INDEX `+idx+` SET (fastupdate = off)`); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `SELECT gin_clean_pending_list($1::regclass)`, idx)
	return err
}

func (p *pgBackend) close() error {
	p.stats.cancel()
	p.stats.wg.Wait()
	return p.db.Close()
}

// PostgreSQL takes arrays, so only id lists are chunked, to keep single
// statements of sane size.
func (p *pgBackend) limits() queryLimits { return queryLimits{IDs: 10_000} }

// maxUniqueRetries bounds retries of a write that lost a race on a unique
// index other than its ON CONFLICT arbiter (the same replaceable event
// inserted by two writers at once); the retry then takes the conflict path.
const maxUniqueRetries = 5

func isUniqueViolation(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == "23505"
}

func (p *pgBackend) write(ctx context.Context, q string, evt *nostr.Event, rkey any) (bool, error) {
	raw, err := json.Marshal(evt)
	if err != nil {
		return false, fmt.Errorf("encode: %w", err)
	}
	for attempt := 0; ; attempt++ {
		var id string
		err := p.db.QueryRowContext(ctx, q, evt.ID, evt.PubKey, int64(evt.CreatedAt), evt.Kind, rkey,
			pq.Array(tagIndexValues(evt.Tags)), string(raw)).Scan(&id)
		switch {
		case err == nil:
			p.wrote(1)
			return true, nil
		case errors.Is(err, sql.ErrNoRows):
			return false, nil // duplicate id, or not newer than the stored version
		case isUniqueViolation(err) && attempt < maxUniqueRetries:
			continue
		default:
			return false, err
		}
	}
}

func (p *pgBackend) insert(ctx context.Context, evt *nostr.Event) (bool, error) {
	return p.write(ctx, `INSERT INTO `+p.table+` (id, pubkey, created_at, kind, rkey, tagvalues, raw)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING RETURNING id`, evt, nil)
}

// pgBatchRows bounds the rows of one multi-row INSERT: 6 parameters each,
// well under PostgreSQL's 65,535 parameters per statement.
const pgBatchRows = 500

// insertBatch stores regular events with distinct ids in one multi-row
// INSERT … ON CONFLICT (id) DO NOTHING per chunk: one round trip and one
// commit instead of one per event. RETURNING names the rows written, so
// duplicates are told apart. A failing statement fails its whole chunk.
func (p *pgBackend) insertBatch(ctx context.Context, evts []*nostr.Event) []SaveResult {
	// Rows in id order: concurrent batches that share ids then take their
	// row locks in one order, where any other order can deadlock (seen:
	// "pq: deadlock detected" with overlapping batches in reverse order).
	order := make([]int, len(evts))
	for n := range order {
		order[n] = n
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(evts[a].ID, evts[b].ID) })
	res := make([]SaveResult, len(evts))
	for start := 0; start < len(order); start += pgBatchRows {
		at := order[start:min(start+pgBatchRows, len(order))]
		part := make([]*nostr.Event, len(at))
		for k, n := range at {
			part[k] = evts[n]
		}
		stored, err := p.insertRows(ctx, part)
		p.wrote(len(stored))
		for _, n := range at {
			res[n] = SaveResult{Stored: stored[evts[n].ID], Err: err}
		}
	}
	return res
}

func (p *pgBackend) insertRows(ctx context.Context, evts []*nostr.Event) (map[string]bool, error) {
	var q strings.Builder
	q.WriteString(`INSERT INTO ` + p.table + ` (id, pubkey, created_at, kind, rkey, tagvalues, raw) VALUES `)
	args := make([]any, 0, 7*len(evts))
	for k, evt := range evts {
		raw, err := json.Marshal(evt)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", evt.ID, err)
		}
		if k > 0 {
			q.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&q, "($%d, $%d, $%d, $%d, NULL, $%d, $%d)", n+1, n+2, n+3, n+4, n+5, n+6)
		args = append(args, evt.ID, evt.PubKey, int64(evt.CreatedAt), evt.Kind, pq.Array(tagIndexValues(evt.Tags)), string(raw))
	}
	q.WriteString(` ON CONFLICT (id) DO NOTHING RETURNING id`)
	rows, err := p.db.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	stored := make(map[string]bool, len(evts))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		stored[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return stored, nil
}

// replace is one statement: insert the version, or, when the key holds one,
// overwrite it only if this event supersedes it (newer, or same second and
// lower id). The unique rkey makes PostgreSQL serialise writers of one key,
// in any process.
func (p *pgBackend) replace(ctx context.Context, evt *nostr.Event) (bool, error) {
	sum := sha256.Sum256([]byte(ReplaceKey(evt)))
	return p.write(ctx, `INSERT INTO `+p.table+` AS t (id, pubkey, created_at, kind, rkey, tagvalues, raw)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (rkey) DO UPDATE SET id = excluded.id, created_at = excluded.created_at,
			tagvalues = excluded.tagvalues, raw = excluded.raw
		WHERE excluded.created_at > t.created_at OR (excluded.created_at = t.created_at AND excluded.id < t.id)
		RETURNING id`, evt, hex.EncodeToString(sum[:]))
}

func (p *pgBackend) delete(ctx context.Context, evt *nostr.Event) error {
	_, err := p.db.ExecContext(ctx, `DELETE FROM `+p.table+` WHERE id = $1`, evt.ID)
	return err
}

// where renders f's conditions (not its limit).
func (p *pgBackend) where(f nostr.Filter) (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if len(f.IDs) > 0 {
		add("id = ANY($%d)", pq.Array(f.IDs))
	}
	if len(f.Authors) > 0 {
		add("pubkey = ANY($%d)", pq.Array(f.Authors))
	}
	if len(f.Kinds) > 0 {
		kinds := make([]int64, len(f.Kinds))
		for i, k := range f.Kinds {
			kinds[i] = int64(k)
		}
		add("kind = ANY($%d)", pq.Array(kinds))
	}
	for k, vals := range f.Tags {
		idx := make([]string, len(vals))
		for i, v := range vals {
			idx[i] = tagIndexValue(k, v)
		}
		add("tagvalues && $%d::text[]", pq.Array(idx))
	}
	if f.Since != nil {
		add("created_at >= $%d", int64(*f.Since))
	}
	if f.Until != nil {
		add("created_at <= $%d", int64(*f.Until))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// index is the schema-qualified, quoted name of one of the table's indexes
// (an index lives in its table's schema).
func (p *pgBackend) index(name string) string {
	if i := strings.LastIndexByte(p.table, '.'); i >= 0 {
		return p.table[:i+1] + pq.QuoteIdentifier(name)
	}
	return pq.QuoteIdentifier(name)
}

// pgMergeKinds bounds the kinds a kinds-only query is split into (one
// ordered index scan each); a longer list reads through kind = ANY(…).
const pgMergeKinds = 16

// kindsQuery renders a filter of kinds and at most since and until (no ids,
// authors or tags) so that PostgreSQL reads each kind's newest events from
// grasp_event_kind_created and merges them (Merge Append), reading about
// f.Limit rows. With kind = ANY(…) it reads every event of the kinds
// through a bitmap and sorts them all (docs/measurements/2026-12-04-postgres-hot-statements.md). ok is false for other filters.
func (p *pgBackend) kindsQuery(f nostr.Filter) (q string, args []any, ok bool) {
	kinds := slices.Compact(slices.Sorted(slices.Values(f.Kinds)))
	if len(kinds) == 0 || len(kinds) > pgMergeKinds || len(f.IDs) > 0 || len(f.Authors) > 0 || len(f.Tags) > 0 {
		return "", nil, false
	}
	args = []any{f.Limit}
	var bounds string
	if f.Since != nil {
		args = append(args, int64(*f.Since))
		bounds += fmt.Sprintf(" AND created_at >= $%d", len(args))
	}
	if f.Until != nil {
		args = append(args, int64(*f.Until))
		bounds += fmt.Sprintf(" AND created_at <= $%d", len(args))
	}
	branch := func(cols string, kind int) string {
		args = append(args, kind)
		return fmt.Sprintf(`SELECT %s FROM %s WHERE kind = $%d%s ORDER BY created_at DESC, id LIMIT $1`,
			cols, p.table, len(args), bounds)
	}
	if len(kinds) == 1 {
		return branch("raw", kinds[0]), args, true
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = "(" + branch("raw, created_at, id", k) + ")"
	}
	return `SELECT raw FROM (` + strings.Join(parts, " UNION ALL ") + `) AS per_kind ORDER BY created_at DESC, id LIMIT $1`, args, true
}

func (p *pgBackend) query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	q, args, ok := p.kindsQuery(f)
	if !ok {
		var where string
		where, args = p.where(f)
		args = append(args, f.Limit)
		q = fmt.Sprintf(`SELECT raw FROM %s%s ORDER BY created_at DESC, id LIMIT $%d`, p.table, where, len(args))
	}
	rows, err := p.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*nostr.Event
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return nil, err
		}
		evt := new(nostr.Event)
		if err := json.Unmarshal(raw, evt); err != nil {
			return nil, fmt.Errorf("decode stored event: %w", err)
		}
		out = append(out, evt)
	}
	return out, rows.Err()
}

// items lists every match in one statement: no limit, rows streamed.
func (p *pgBackend) items(ctx context.Context, f nostr.Filter) ([]Item, error) {
	parts, err := splitFilter(f, p.limits())
	if err != nil {
		return nil, err
	}
	var out []Item
	sorted := true
	for _, part := range parts {
		q, args, ordered := p.itemsStatement(part)
		sorted = sorted && ordered
		err := p.read(ctx, p.tagRead(part), q, args, func(rows *sql.Rows) error {
			var it Item
			var ts int64
			if err := rows.Scan(&it.ID, &ts); err != nil {
				return err
			}
			it.CreatedAt = nostr.Timestamp(ts)
			out = append(out, it)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	// Parts split ids only, so they are disjoint; restore one global order.
	if len(parts) > 1 || !sorted {
		sortItems(out)
	}
	return out, nil
}

// tagRead tells whether f is read as decision 0058 reads tag lookups: with
// sequential scans priced out and no ORDER BY (see read).
func (p *pgBackend) tagRead(f nostr.Filter) bool { return len(f.Tags) > 0 && !p.stats.off }

// itemsStatement renders items' statement for f; ordered tells whether it
// returns the items in their order. A tag lookup is sorted here rather than
// by PostgreSQL: an ORDER BY makes a walk of grasp_event_created, reading
// every event, look cheaper than the tag index to the planner when the
// table is small (decision 0058), and the sort is no cheaper there.
func (p *pgBackend) itemsStatement(f nostr.Filter) (q string, args []any, ordered bool) {
	where, args := p.where(f)
	q = `SELECT id, created_at FROM ` + p.table + where
	if p.tagRead(f) {
		return q, args, false
	}
	return q + ` ORDER BY created_at DESC, id`, args, true
}

// itemsPlan is PostgreSQL's plan for items(f) (one part), as items runs it.
func (p *pgBackend) itemsPlan(ctx context.Context, f nostr.Filter, analyze bool) (string, error) {
	q, args, _ := p.itemsStatement(f)
	explain := `EXPLAIN `
	if analyze {
		explain = `EXPLAIN (ANALYZE, BUFFERS) `
	}
	var lines []string
	err := p.read(ctx, p.tagRead(f), explain+q, args, func(rows *sql.Rows) error {
		var l string
		err := rows.Scan(&l)
		lines = append(lines, l)
		return err
	})
	return strings.Join(lines, "\n"), err
}

// read runs q and calls row for each row. A statement on tag values runs
// with sequential scans priced out (SET LOCAL, in its own read-only
// transaction: three more round trips on a local connection, well under a
// millisecond): PostgreSQL prices a sequential scan's `tagvalues && $1` as
// one operator call per row, where with the local set's 100 values it is a
// hundred comparisons, so from a few thousand rows to a few tens of
// thousands it chooses the scan — 100–300 ms at 10,000 rows where the GIN
// index takes a few (decision 0058). enable_seqscan = off is a price, not a
// ban: a filter no index serves still runs.
func (p *pgBackend) read(ctx context.Context, tags bool, q string, args []any, row func(*sql.Rows) error) error {
	var rows *sql.Rows
	var err error
	if tags && !p.stats.off {
		var tx *sql.Tx
		if tx, err = p.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}); err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // read-only: rolling back is committing
		if _, err = tx.ExecContext(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, q, args...)
	} else {
		rows, err = p.db.QueryContext(ctx, q, args...)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
