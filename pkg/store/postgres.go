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
	if err := p.createSchema(ctx, o.pgSchema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store %s: create schema: %s", where, oneLine(err))
	}
	return p, nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func (p *pgBackend) createSchema(ctx context.Context, schema string) error {
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
		`CREATE INDEX IF NOT EXISTS grasp_event_tags ON `+t+` USING gin (tagvalues)`,
	)
	for _, q := range ddl {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (p *pgBackend) close() error { return p.db.Close() }

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
	for _, part := range parts {
		where, args := p.where(part)
		rows, err := p.db.QueryContext(ctx, `SELECT id, created_at FROM `+p.table+where+` ORDER BY created_at DESC, id`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var it Item
			var ts int64
			if err := rows.Scan(&it.ID, &ts); err != nil {
				rows.Close()
				return nil, err
			}
			it.CreatedAt = nostr.Timestamp(ts)
			out = append(out, it)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	// Parts split ids only, so they are disjoint; restore one global order.
	if len(parts) > 1 {
		sortItems(out)
	}
	return out, nil
}
