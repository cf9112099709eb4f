// Package rejected remembers events the write policy refused for good, so
// that NIP-77 reconciliation counts them as already held and does not fetch
// them again from every relay at every resync (docs/sync.md, "The local
// set": what the store holds plus what the policy has already rejected).
//
// Only refusals that hold for every copy of an event with that id belong
// here: never bad ids or bad signatures (a forged copy must not hide the real
// event), never store errors, never refusals that parking may still turn
// into acceptances. Announcements and states refused because their author
// maintains none of our repositories are here although that may change: the
// planner then fetches them again explicitly with REQ, which does not consult
// this bucket (docs/decisions/0022-remembered-refusals-revived.md). The ingester adds;
// fetchers read through a Cache that follows the bucket.
package rejected

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

// entry is what is kept of a rejected event: enough to match sync filters
// (kind, author, time, tags), not its content.
type entry struct {
	Kind      int             `json:"kind"`
	PubKey    string          `json:"pubkey"`
	CreatedAt nostr.Timestamp `json:"created_at"`
	Tags      nostr.Tags      `json:"tags"`
	Reason    string          `json:"reason"`
}

// Add records a refused event under its id.
func Add(ctx context.Context, kv jetstream.KeyValue, evt *nostr.Event, reason string) error {
	data, err := json.Marshal(entry{Kind: evt.Kind, PubKey: evt.PubKey, CreatedAt: evt.CreatedAt, Tags: evt.Tags, Reason: reason})
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, evt.ID, data); err != nil {
		return fmt.Errorf("record rejected %s: %w", evt.ID, err)
	}
	return nil
}

// Reason returns why the event id was refused, found false when it is not
// recorded (graspctl explain).
func Reason(ctx context.Context, kv jetstream.KeyValue, id string) (reason string, found bool, err error) {
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read rejected %s: %w", id, err)
	}
	var en entry
	if err := json.Unmarshal(e.Value(), &en); err != nil {
		return "", false, fmt.Errorf("decode rejected %s: %w", id, err)
	}
	return en.Reason, true, nil
}

// Open returns the bucket (created by bus.Setup).
func Open(ctx context.Context, b *bus.Bus) (jetstream.KeyValue, error) {
	kv, err := b.JS.KeyValue(ctx, b.Names.RejectedBucket())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", b.Names.RejectedBucket(), err)
	}
	return kv, nil
}

// Cache is an in-memory copy of the bucket, kept current by a watch. Its
// size is bounded by the bucket's own limits.
type Cache struct {
	mu      sync.RWMutex
	entries map[string]nostr.Event
	ready   chan struct{}
}

// NewCache returns an empty cache; Run fills it.
func NewCache() *Cache {
	return &Cache{entries: map[string]nostr.Event{}, ready: make(chan struct{})}
}

// Run follows the bucket until ctx is done.
func (c *Cache) Run(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch rejected events: %w", err)
	}
	defer w.Stop()
	readyOnce := sync.OnceFunc(func() { close(c.ready) })
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("rejected-events watch ended")
			}
			if e == nil {
				readyOnce()
				continue
			}
			c.apply(e)
		}
	}
}

func (c *Cache) apply(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.entries, e.Key())
		return
	}
	var en entry
	if json.Unmarshal(e.Value(), &en) != nil {
		return
	}
	c.entries[e.Key()] = nostr.Event{ID: e.Key(), Kind: en.Kind, PubKey: en.PubKey, CreatedAt: en.CreatedAt, Tags: en.Tags}
}

// Len is how many rejected events are known.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// Items returns the rejected events matching f, as a NIP-77 local set. It
// waits (bounded by ctx) until the initial contents are loaded, so a
// reconciliation never starts from a half-read set.
func (c *Cache) Items(ctx context.Context, f nostr.Filter) ([]negsync.Item, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.Limit, f.LimitZero = 0, false
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []negsync.Item
	for id, e := range c.entries {
		if f.Matches(&e) {
			out = append(out, negsync.Item{ID: id, CreatedAt: e.CreatedAt})
		}
	}
	return out, nil
}

// Forget deletes the remembered refusals for which match reports true (given
// the event's kind, author, tags and the refusal's reason) and returns how
// many it deleted. It reads the bucket once, as it stands when called. It is
// how a configuration change that makes refused events acceptable (an
// archive whitelist entry, GRASP-05) revives them: once forgotten they are
// no longer in the NIP-77 local set, so the next reconciliation of layer 1
// fetches them again. Deleting is idempotent, so every ingester replica may
// run it.
func Forget(ctx context.Context, kv jetstream.KeyValue, match func(kind int, pubkey string, tags nostr.Tags, reason string) bool) (int, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, fmt.Errorf("watch rejected events: %w", err)
	}
	defer w.Stop()
	var doomed []string
	for e := range w.Updates() {
		if e == nil {
			break
		}
		var en entry
		if json.Unmarshal(e.Value(), &en) != nil {
			continue
		}
		if match(en.Kind, en.PubKey, en.Tags, en.Reason) {
			doomed = append(doomed, e.Key())
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, key := range doomed {
		if err := kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return n, fmt.Errorf("forget rejected %s: %w", key, err)
		}
		n++
	}
	return n, nil
}
