package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	dgbadger "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/eventstore/badger"

	"github.com/grasp-sync/grasp-sync/pkg/store/badgerlock"
	"github.com/nbd-wtf/go-nostr"
)

// embedded adapts one of eventstore's single-process backends and adds what
// they do not guarantee themselves (docs/dependencies.md): LMDB stores the
// same id twice and sqlite3's ReplaceEvent keeps the newest arrival, so
// every write here is check-then-write under a lock striped by id or
// replaceable key. One process only: badger locks its directory; lmdb and
// sqlite3 do not, and two processes on them lose writes.
type embedded struct {
	name string
	es   eventstore.Store
	lim  queryLimits
	// maxLimit is the most events one backend query may return.
	maxLimit int
	// binaryCaps: badger and lmdb share eventstore's binary encoding, which
	// caps content at 65,535 bytes and more; checked before writing so the
	// caller gets ErrUnstorable instead of an opaque failure.
	binaryCaps bool
	// deleteMu serialises deletes where the backend's delete path is not
	// safe for concurrent use (badger: an unsynchronised package counter).
	deleteMu *sync.Mutex
	locks    stripes
	// batchWriters is how many writes insertBatch keeps in flight: 1 for
	// backends with one writer lock (lmdb, sqlite3), more for badger,
	// which commits concurrent transactions together.
	batchWriters int
	// inflight counts backend queries being read, so close waits for them.
	inflight sync.WaitGroup
	// closeGrace is how long close waits after the last query was read
	// before closing the backend. lmdb's query goroutine closes its channel
	// inside its read transaction and ends the transaction after that; an
	// environment closed in between crashes the process (SIGSEGV in
	// mdb_txn_commit, seen under -race). There is no hook to wait on.
	closeGrace time.Duration
}

// cgoBackends holds the openers of backends that need cgo (lmdb, sqlite3);
// files built only with cgo register them.
var cgoBackends = map[string]func(path string, o options) (*embedded, error){}

func openEmbedded(scheme, path string, o options) (*embedded, error) {
	if path == "" {
		return nil, fmt.Errorf("store %s://: empty path", scheme)
	}
	if scheme == "badger" {
		return openBadger(path, o)
	}
	open, ok := cgoBackends[scheme]
	if !ok {
		return nil, fmt.Errorf("store %s://%s: this binary was built without cgo, which %s needs (build with CGO_ENABLED=1)", scheme, path, scheme)
	}
	return open(path, o)
}

func openBadger(dir string, o options) (*embedded, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store badger://%s: %w", dir, err)
	}
	b := &badger.BadgerBackend{
		Path:     dir,
		MaxLimit: o.maxLimit,
		BadgerOptionsModifier: func(opts dgbadger.Options) dgbadger.Options {
			return opts.WithLogger(nil) // badger's INFO lines are not structured; errors surface as errors
		},
	}
	if err := b.Init(); err != nil {
		return nil, fmt.Errorf("open badger store %s: %w", dir, err)
	}
	return &embedded{name: "badger", es: b, maxLimit: o.maxLimit, binaryCaps: true, deleteMu: &badgerlock.Mu, batchWriters: 8,
		// Badger answers one index scan per id or author; bounded so one
		// query's fan-out stays modest.
		lim: queryLimits{IDs: 500, Authors: 500},
	}, nil
}

func (e *embedded) limits() queryLimits { return e.lim }

func (e *embedded) close() error {
	e.inflight.Wait()
	if e.closeGrace > 0 {
		time.Sleep(e.closeGrace)
	}
	e.es.Close()
	return nil
}

// checkBinary reports why eventstore's binary encoding cannot hold evt.
func checkBinary(evt *nostr.Event) error {
	switch {
	case len(evt.Content) > math.MaxUint16:
		return fmt.Errorf("%w: content is %d bytes, more than %d", ErrUnstorable, len(evt.Content), math.MaxUint16)
	case evt.Kind < 0 || evt.Kind > math.MaxUint16:
		return fmt.Errorf("%w: kind %d out of range", ErrUnstorable, evt.Kind)
	case evt.CreatedAt > math.MaxUint32:
		return fmt.Errorf("%w: created_at %d out of range", ErrUnstorable, evt.CreatedAt)
	case len(evt.Tags) > math.MaxUint16:
		return fmt.Errorf("%w: %d tags", ErrUnstorable, len(evt.Tags))
	}
	for _, t := range evt.Tags {
		if len(t) > math.MaxUint8 {
			return fmt.Errorf("%w: a tag with %d items", ErrUnstorable, len(t))
		}
		for _, item := range t {
			if len(item) > math.MaxUint16 {
				return fmt.Errorf("%w: a tag item of %d bytes", ErrUnstorable, len(item))
			}
		}
	}
	return nil
}

// drain collects a backend result channel. It always reads to the end:
// badger's and lmdb's query goroutines do not watch ctx and would block
// forever on an abandoned channel.
func drain(ch chan *nostr.Event) []*nostr.Event {
	var out []*nostr.Event
	for evt := range ch {
		out = append(out, evt)
	}
	return out
}

func (e *embedded) query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	e.inflight.Add(1)
	defer e.inflight.Done()
	ch, err := e.es.QueryEvents(ctx, f)
	if err != nil {
		return nil, err
	}
	return drain(ch), ctx.Err()
}

func (e *embedded) has(ctx context.Context, id string) (bool, error) {
	evts, err := e.query(ctx, nostr.Filter{IDs: []string{id}, Limit: 1})
	return len(evts) > 0, err
}

func (e *embedded) insert(ctx context.Context, evt *nostr.Event) (bool, error) {
	if e.binaryCaps {
		if err := checkBinary(evt); err != nil {
			return false, err
		}
	}
	mu := e.locks.lock(evt.ID)
	defer mu.Unlock()
	if has, err := e.has(ctx, evt.ID); err != nil || has {
		return false, err
	}
	return e.save(ctx, evt)
}

// insertBatch stores regular events with distinct ids. eventstore's
// backends have no multi-event write, so what is shared is the rest: the
// stripes of all ids are taken once, and which ids are stored already is
// one lookup per chunk of ids instead of one per event.
func (e *embedded) insertBatch(ctx context.Context, evts []*nostr.Event) []SaveResult {
	res := make([]SaveResult, len(evts))
	todo := make([]int, 0, len(evts))
	for n, evt := range evts {
		if e.binaryCaps {
			if err := checkBinary(evt); err != nil {
				res[n].Err = err
				continue
			}
		}
		todo = append(todo, n)
	}
	if len(todo) == 0 {
		return res
	}
	ids := make([]string, len(todo))
	for k, n := range todo {
		ids[k] = evts[n].ID
	}
	unlock := e.locks.lockAll(ids)
	defer unlock()
	have, err := e.storedIDs(ctx, ids)
	if err != nil {
		for _, n := range todo {
			res[n].Err = fmt.Errorf("look up stored ids: %w", err)
		}
		return res
	}
	var missing []int
	for _, n := range todo {
		if !have[evts[n].ID] {
			missing = append(missing, n)
		}
	}
	// Several writes in flight at once: badger's single writer then
	// commits them as one group (one value-log write, one wake-up) instead
	// of one at a time.
	var wg sync.WaitGroup
	writers := min(max(e.batchWriters, 1), len(missing))
	for w := range writers {
		wg.Go(func() {
			for k := w; k < len(missing); k += writers {
				n := missing[k]
				if err := ctx.Err(); err != nil {
					res[n].Err = err
					continue
				}
				if err := e.es.SaveEvent(ctx, evts[n]); err != nil {
					if !errors.Is(err, eventstore.ErrDupEvent) {
						res[n].Err = err
					}
					continue
				}
				res[n].Stored = true
			}
		})
	}
	wg.Wait()
	return res
}

// storedIDs returns which of ids are stored, in queries of at most the
// backend's id limit.
func (e *embedded) storedIDs(ctx context.Context, ids []string) (map[string]bool, error) {
	have := make(map[string]bool)
	chunk := len(ids)
	if e.lim.IDs > 0 {
		chunk = e.lim.IDs
	}
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(start+chunk, len(ids))]
		found, err := e.query(ctx, nostr.Filter{IDs: part, Limit: len(part)})
		if err != nil {
			return nil, err
		}
		for _, evt := range found {
			have[evt.ID] = true
		}
	}
	return have, nil
}

// maxIndexedTagLen is the longest tag value badger and lmdb index; a filter
// on a longer value finds nothing there.
const maxIndexedTagLen = 100

// versions returns every stored version of evt's replaceable key. The d tag
// narrows the lookup only when the backend indexes it (badger and lmdb skip
// empty values and values over 100 bytes); otherwise all of the author's
// events of that kind are read and compared by key.
func (e *embedded) versions(ctx context.Context, evt *nostr.Event) ([]*nostr.Event, error) {
	f := nostr.Filter{Kinds: []int{evt.Kind}, Authors: []string{evt.PubKey}, Limit: e.maxLimit}
	if d := evt.Tags.GetD(); nostr.IsAddressableKind(evt.Kind) && d != "" && len(d) <= maxIndexedTagLen {
		f.Tags = nostr.TagMap{"d": {d}}
	}
	all, err := e.query(ctx, f)
	if err != nil {
		return nil, err
	}
	return sameKey(evt, all), nil
}

func (e *embedded) replace(ctx context.Context, evt *nostr.Event) (bool, error) {
	if e.binaryCaps {
		if err := checkBinary(evt); err != nil {
			return false, err
		}
	}
	mu := e.locks.lock(ReplaceKey(evt))
	defer mu.Unlock()
	if has, err := e.has(ctx, evt.ID); err != nil || has {
		return false, err
	}
	return replaceVersions(ctx, evt, e.versions, e.save, e.delete)
}

// save writes evt with the backend, a duplicate being not stored.
func (e *embedded) save(ctx context.Context, evt *nostr.Event) (bool, error) {
	if err := e.es.SaveEvent(ctx, evt); err != nil {
		if errors.Is(err, eventstore.ErrDupEvent) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func (e *embedded) delete(ctx context.Context, evt *nostr.Event) error {
	if e.deleteMu != nil {
		e.deleteMu.Lock()
		defer e.deleteMu.Unlock()
	}
	return e.es.DeleteEvent(ctx, evt)
}
