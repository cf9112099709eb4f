// Package store is grasp-sync's event store: a small layer over an event
// backend that gives every writer (the own relay for client events, the
// ingester for synced ones) the same semantics whatever the backend: one copy
// per event id, one version per replaceable or addressable key (also with
// several writer processes on PostgreSQL), queries split to fit backend
// limits, and complete result sets for negentropy (Items).
//
// Backends: the embedded eventstore backends (badger, and lmdb and sqlite3
// when built with cgo) for one process, and PostgreSQL, which this package
// talks to directly, for several processes and Kubernetes.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/fiatjaf/eventstore"
	"github.com/nbd-wtf/go-nostr"
)

// DefaultQueryLimit is the most events one query returns when the filter
// sets no limit or a larger one. Badger allocates O(limit) per query (see
// docs/dependencies.md), so this is set deliberately; complete reads page
// (Items, negentropy queries).
const DefaultQueryLimit = 100_000

// DefaultScheme is the embedded backend a plain directory opens: kv on the
// engine the directory holds, pebble for a new one. Chosen by measurement:
// see docs/decisions/0006-embedded-store-kv.md and docs/decisions/0036-kv-on-pebble.md.
const DefaultScheme = "kv"

// ErrUnstorable marks an event the backend cannot hold (for example content
// over 65,535 bytes in badger and lmdb). Callers refuse such an event rather
// than retry it.
var ErrUnstorable = errors.New("event cannot be stored by this backend")

// Item is one stored event as negentropy sees it: id and timestamp.
type Item struct {
	ID        string
	CreatedAt nostr.Timestamp
}

// backend is what the Store needs from a storage engine. Implementations
// guarantee nothing beyond what is written here; the Store adds splitting,
// limits and paging.
type backend interface {
	// insert stores a regular event unless its id is stored.
	insert(ctx context.Context, evt *nostr.Event) (bool, error)
	// replace stores a replaceable or addressable event when it supersedes
	// the stored version of its key (Supersedes), removing that version.
	replace(ctx context.Context, evt *nostr.Event) (bool, error)
	// query returns up to f.Limit (always > 0) events matching f, newest
	// first; f fits limits(). Results may include false positives: the
	// Store filters them.
	query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error)
	delete(ctx context.Context, evt *nostr.Event) error
	limits() queryLimits
	close() error
}

// itemLister is implemented by backends that can list every matching item
// in one pass without a query limit (PostgreSQL; kv, without decoding
// events); others are paged.
type itemLister interface {
	items(ctx context.Context, f nostr.Filter) ([]Item, error)
}

// heldChecker is implemented by backends that can tell which ids are
// stored without reading the events (kv: the id keys only).
type heldChecker interface {
	held(ctx context.Context, ids []string) ([]string, error)
}

// Option configures Open.
type Option func(*options)

type options struct {
	pgSchema string
	maxLimit int
	kvMemory int64
	// kvTagsV2 makes a new kv store write format v2's tag keys (tests:
	// a directory as the code before format v3 wrote it).
	kvTagsV2 bool
	// kvNoItemKeys makes a kv store write no item keys, as the code before
	// them did (tests).
	kvNoItemKeys bool
	// pgTagsAsBefore leaves PostgreSQL's tag index and statistics as the
	// code before decision 0058 did (benchmarks measure the difference).
	pgTagsAsBefore bool
}

// WithPostgresSchema keeps the PostgreSQL store's tables in this schema
// (created if missing) instead of the connection's default, so several
// deployments or test runs can share one database.
func WithPostgresSchema(schema string) Option { return func(o *options) { o.pgSchema = schema } }

// WithKVMemory sizes the kv store's own memory (memtables, block and index
// caches) from a budget in bytes; zero or less means DefaultKVMemory. See
// kvPebbleOptions and kvBadgerOptions for how the budget is split.
func WithKVMemory(bytes int64) Option { return func(o *options) { o.kvMemory = bytes } }

// WithMaxQueryLimit overrides DefaultQueryLimit.
func WithMaxQueryLimit(n int) Option { return func(o *options) { o.maxLimit = n } }

// Store holds events. It is safe for concurrent use.
type Store struct {
	b        backend
	url      string
	kind     string
	maxLimit int
}

// Open opens the store named by rawURL:
//   - "postgres://…" or "postgresql://…": PostgreSQL (several processes);
//   - "kv://<dir>": the store's own layout (one process) on the engine the
//     directory holds, pebble for a new one; "kv+pebble://<dir>" and
//     "kv+badger://<dir>" name the engine and refuse a directory of the
//     other;
//   - "badger://<dir>", "lmdb://<dir>", "sqlite3://<file>": that eventstore
//     backend (one process; lmdb and sqlite3 need a cgo build);
//   - a plain directory path: the embedded DefaultScheme.
func Open(rawURL string, opts ...Option) (*Store, error) {
	o := options{maxLimit: DefaultQueryLimit}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxLimit <= 0 {
		return nil, fmt.Errorf("store: max query limit %d must be positive", o.maxLimit)
	}
	if rawURL == "" {
		return nil, errors.New("store: empty store URL")
	}
	scheme, rest := DefaultScheme, rawURL
	if i := strings.Index(rawURL, "://"); i > 0 {
		scheme, rest = rawURL[:i], rawURL[i+3:]
	}
	var (
		b   backend
		err error
	)
	switch scheme {
	case "postgres", "postgresql":
		b, err = openPostgres(rawURL, o)
	case "kv", "kv+" + kvBadger, "kv+" + kvPebble:
		var k *kv
		if k, err = openKV(rest, strings.TrimPrefix(strings.TrimPrefix(scheme, "kv"), "+"), o); err == nil {
			b, scheme = k, "kv+"+k.eng.name()
		}
	case "badger", "lmdb", "sqlite3":
		b, err = openEmbedded(scheme, rest, o)
	default:
		return nil, fmt.Errorf("store %s: unknown scheme %q (want postgres, kv, kv+pebble, kv+badger, badger, lmdb, sqlite3 or a directory)", Redact(rawURL), scheme)
	}
	if err != nil {
		return nil, err
	}
	return &Store{b: b, url: rawURL, kind: scheme, maxLimit: o.maxLimit}, nil
}

// Redact hides the password of a database URL so it can be logged.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i := strings.LastIndex(raw, "@"); i > 0 {
			if j := strings.Index(raw, "://"); j > 0 && j < i {
				return raw[:j+3] + "…" + raw[i:]
			}
		}
		return raw
	}
	if _, has := u.User.Password(); u.User != nil && has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// Backend names the backend in use ("kv+pebble", "kv+badger", "badger",
// "postgres", …): for kv the engine the directory was found to hold.
func (s *Store) Backend() string { return s.kind }

// Close releases the backend.
func (s *Store) Close() {
	_ = s.b.close()
}

// Save stores an event: regular events once per id; replaceable and
// addressable events only when they supersede the stored version of their
// key, which they replace. stored is false for a duplicate, an older version
// or an equal-timestamp version with a higher id.
func (s *Store) Save(ctx context.Context, evt *nostr.Event) (stored bool, err error) {
	if IsReplaceable(evt.Kind) {
		stored, err = s.b.replace(ctx, evt)
	} else {
		stored, err = s.b.insert(ctx, evt)
	}
	if err != nil {
		return false, fmt.Errorf("save %s (kind %d) in %s store: %w", evt.ID, evt.Kind, s.kind, err)
	}
	return stored, nil
}

// SaveResult is what SaveBatch did with one event: what Save would have
// returned for it.
type SaveResult struct {
	// Stored is Save's stored: false for a duplicate, an older version or
	// an error.
	Stored bool
	// Err is Save's error for this event (ErrUnstorable, or why the backend
	// failed). Events of one batch may fail together (PostgreSQL writes a
	// batch in one statement) or alone (embedded backends).
	Err error
}

// batchInserter is implemented by backends that store several regular
// events in fewer round trips than one insert each. The events have
// distinct ids; results are per event, in order.
type batchInserter interface {
	insertBatch(ctx context.Context, evts []*nostr.Event) []SaveResult
}

// SaveBatch stores evts with the effect of calling Save on each, in order,
// and returns one result per event: the same id/duplicate and
// replaceable-version semantics, so a later copy of an id in the batch is a
// duplicate and of two versions of one key the Supersedes winner is kept.
// Regular events are written together (PostgreSQL: one multi-row INSERT per
// chunk; badger: one id lookup for the batch, then the writes), which is
// what makes it cheaper than Save per event; replaceable and addressable
// events, rare and order-sensitive, go through Save one by one.
//
// It is not atomic: on an error some events may be stored (their result
// says so) and others not. Callers retry the failed ones, by themselves if
// one bad event must not hold up the rest.
func (s *Store) SaveBatch(ctx context.Context, evts []*nostr.Event) []SaveResult {
	res := make([]SaveResult, len(evts))
	first := make(map[string]int, len(evts)) // id → position of its first copy
	var regular []*nostr.Event
	var at []int
	for n, evt := range evts {
		if IsReplaceable(evt.Kind) {
			continue
		}
		if _, dup := first[evt.ID]; dup {
			continue
		}
		first[evt.ID] = n
		regular = append(regular, evt)
		at = append(at, n)
	}
	if len(regular) > 0 {
		var out []SaveResult
		if bi, ok := s.b.(batchInserter); ok {
			out = bi.insertBatch(ctx, regular)
		} else {
			out = make([]SaveResult, len(regular))
			for k, evt := range regular {
				out[k].Stored, out[k].Err = s.b.insert(ctx, evt)
			}
		}
		for k, r := range out {
			if r.Err != nil {
				r.Stored = false
				r.Err = fmt.Errorf("save %s (kind %d) in %s store: %w", regular[k].ID, regular[k].Kind, s.kind, r.Err)
			}
			res[at[k]] = r
		}
	}
	for n, evt := range evts {
		if IsReplaceable(evt.Kind) {
			res[n].Stored, res[n].Err = s.Save(ctx, evt)
		} else if f := first[evt.ID]; f != n {
			// A later copy: a duplicate of the first, or as failed as it.
			res[n] = SaveResult{Err: res[f].Err}
		}
	}
	return res
}

// Delete removes one event.
func (s *Store) Delete(ctx context.Context, evt *nostr.Event) error {
	if err := s.b.delete(ctx, evt); err != nil {
		return fmt.Errorf("delete %s from %s store: %w", evt.ID, s.kind, err)
	}
	return nil
}

// Has reports whether an event with this id is stored.
func (s *Store) Has(ctx context.Context, id string) (bool, error) {
	evts, err := s.Query(ctx, nostr.Filter{IDs: []string{id}, Limit: 1})
	return len(evts) > 0, err
}

// Held returns those of ids whose events are stored, each once, in no
// particular order: what Items(Filter{IDs: ids}) lists, without reading
// the events where the backend can (kv). It is how the fetcher asks which
// of the ids a reconciliation found missing it holds after all.
func (s *Store) Held(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if hc, ok := s.b.(heldChecker); ok {
		out, err := hc.held(ctx, ids)
		if err != nil {
			return nil, fmt.Errorf("held ids from %s store: %w", s.kind, err)
		}
		return out, nil
	}
	items, err := s.Items(ctx, nostr.Filter{IDs: ids})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out, nil
}

// Query returns the events matching f, newest first: at most f.Limit, and at
// most the store's max query limit (DefaultQueryLimit) whatever f asks.
// Filters with more values than the backend accepts are split and merged.
func (s *Store) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	raw, err := s.queryRaw(ctx, f, s.effectiveLimit(f))
	if err != nil {
		return nil, err
	}
	return matching(raw, f), nil
}

func (s *Store) effectiveLimit(f nostr.Filter) int {
	limit := f.Limit
	if limit <= 0 || limit > s.maxLimit {
		limit = s.maxLimit
	}
	if tl := nostr.GetTheoreticalLimit(f); tl > 0 && tl < limit {
		limit = tl
	}
	return limit
}

// queryRaw runs f with limit through the backend, split to fit its limits,
// and returns what the backend returned (possibly with false positives), so
// that paging can tell a full page from a short one.
func (s *Store) queryRaw(ctx context.Context, f nostr.Filter, limit int) ([]*nostr.Event, error) {
	if f.LimitZero || f.Search != "" || nostr.GetTheoreticalLimit(f) == 0 {
		return nil, nil // nothing stored matches: a live-only REQ, or full-text search we do not offer
	}
	for k, v := range f.Tags {
		if len(v) == 0 {
			return nil, fmt.Errorf("query %s: tag #%s has no values", f, k)
		}
	}
	lim := s.b.limits()
	if lim.IDs <= 0 || lim.IDs > s.maxLimit {
		lim.IDs = s.maxLimit // an id chunk must be answerable in full by one query
	}
	parts, err := splitFilter(f, lim)
	if err != nil {
		return nil, fmt.Errorf("query %s store: %w", s.kind, err)
	}
	results := make([][]*nostr.Event, 0, len(parts))
	for _, p := range parts {
		// A part never asks for more than it can match: backends that cap
		// large limits (sqlite3) would otherwise truncate an id chunk.
		p.Limit = limit
		if tl := nostr.GetTheoreticalLimit(p); tl > 0 && tl < limit {
			p.Limit = tl
		}
		r, err := s.b.query(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("query %s store with %s: %w", s.kind, p, err)
		}
		results = append(results, r)
	}
	if len(results) == 1 {
		return results[0], ctx.Err()
	}
	return mergeResults(results, limit), ctx.Err()
}

// matching drops events that do not match f: backends with coarse indexes
// (sqlite3 matches tag values by substring) return false positives.
func matching(evts []*nostr.Event, f nostr.Filter) []*nostr.Event {
	out := evts[:0]
	for _, e := range evts {
		if f.Matches(e) {
			out = append(out, e)
		}
	}
	return out
}

// QueryEvents streams the events matching f (khatru's query hook shape).
// In a negentropy session (eventstore.SetNegentropy, which khatru sets) the
// result is complete, not capped by any query limit, so NIP-77 clients
// reconcile against everything we hold.
func (s *Store) QueryEvents(ctx context.Context, f nostr.Filter) (chan *nostr.Event, error) {
	ch := make(chan *nostr.Event)
	send := func(evts []*nostr.Event) bool {
		for _, e := range evts {
			select {
			case ch <- e:
			case <-ctx.Done():
				return false
			}
		}
		return true
	}
	if eventstore.IsNegentropySession(ctx) {
		go func() {
			defer close(ch)
			_ = s.scan(ctx, f, func(page []*nostr.Event) bool { return send(page) })
		}()
		return ch, nil
	}
	evts, err := s.Query(ctx, f)
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(ch)
		send(evts)
	}()
	return ch, nil
}

// Items returns the id and timestamp of EVERY stored event matching f
// (f.Limit is ignored), newest first: the local set of a NIP-77
// reconciliation, which must not be truncated by a query limit. On the kv
// store it may also list an event whose tag value's index hash equals an
// asked value's (decision 0077): an extra item in a local set only names an
// event the relay is not asked for; Query checks every event.
func (s *Store) Items(ctx context.Context, f nostr.Filter) ([]Item, error) {
	f.Limit, f.LimitZero = 0, false
	if f.Search != "" || nostr.GetTheoreticalLimit(f) == 0 {
		return nil, nil
	}
	if il, ok := s.b.(itemLister); ok {
		items, err := il.items(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("items of %s from %s store: %w", f, s.kind, err)
		}
		return items, nil
	}
	return s.itemsByScan(ctx, f)
}

// itemsByScan is Items through the paged scan, every event decoded: for
// backends without an itemLister.
func (s *Store) itemsByScan(ctx context.Context, f nostr.Filter) ([]Item, error) {
	var items []Item
	err := s.scan(ctx, f, func(page []*nostr.Event) bool {
		for _, e := range page {
			items = append(items, Item{ID: e.ID, CreatedAt: e.CreatedAt})
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("items of %s from %s store: %w", f, s.kind, err)
	}
	return items, nil
}

// scanPageSize is how many events one page of a complete scan reads.
const scanPageSize = 5_000

// scan hands every event matching f to yield, newest first, one page at a
// time, paging with until. It terminates even when more events than a page
// share one created_at: that timestamp is then read whole (up to the store's
// max query limit, beyond which it fails rather than return a short set).
func (s *Store) scan(ctx context.Context, f nostr.Filter, yield func([]*nostr.Event) bool) error {
	f.Limit, f.LimitZero = 0, false
	// A page is well under the max query limit so a second holding more
	// than a page can still be read whole.
	page := max(1, min(scanPageSize, s.maxLimit/4))
	seen := make(map[string]struct{})
	emit := func(raw []*nostr.Event) bool {
		var out []*nostr.Event
		for _, e := range matching(raw, f) {
			if _, dup := seen[e.ID]; !dup {
				seen[e.ID] = struct{}{}
				out = append(out, e)
			}
		}
		return len(out) == 0 || yield(out)
	}
	if len(f.IDs) > 0 {
		// An id list is bounded by itself: one (split) query reads it whole.
		// No paging: backends answer id lookups without honouring until.
		raw, err := s.queryRaw(ctx, f, len(f.IDs))
		if err != nil {
			return err
		}
		emit(raw)
		return nil
	}
	var since nostr.Timestamp
	if f.Since != nil {
		since = *f.Since
	}
	until := f.Until
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		pf := f
		pf.Until = until
		raw, err := s.queryRaw(ctx, pf, page)
		if err != nil {
			return err
		}
		if !emit(raw) {
			return nil
		}
		if len(raw) < page {
			return nil
		}
		oldest := raw[len(raw)-1].CreatedAt
		if raw[0].CreatedAt == oldest {
			// A whole page at one timestamp: read that second completely.
			at := oldest
			all, err := s.queryRaw(ctx, nostr.Filter{IDs: f.IDs, Kinds: f.Kinds, Authors: f.Authors, Tags: f.Tags, Since: &at, Until: &at}, s.maxLimit)
			if err != nil {
				return err
			}
			if len(all) >= s.maxLimit {
				return fmt.Errorf("more than %d events share created_at %d; raise the max query limit", s.maxLimit, at)
			}
			if !emit(all) {
				return nil
			}
		}
		// Events at exactly `oldest` not yet seen are re-read by the next
		// page (seen drops the repeats) unless that second was read whole.
		next := oldest
		if raw[0].CreatedAt == oldest {
			if oldest == 0 || oldest <= since {
				return nil
			}
			next = oldest - 1
		}
		if until != nil && next >= *until && raw[0].CreatedAt != oldest {
			// A full page that did not move back in time: the backend
			// ignored until. Fail rather than loop or return a short set.
			return fmt.Errorf("paging %s made no progress at until=%d", f, next)
		}
		until = &next
	}
}
