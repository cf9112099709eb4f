package discovery

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// IndexWriter keeps the grasp_repo_index bucket equal to a RepoSyncIndex
// while writing only what changed: it remembers the content last written
// under each key (without updated_at, which changes on every write).
type IndexWriter struct {
	kv    jetstream.KeyValue
	clock clock.Clock
	// written holds the SHA-256 of the deterministic encoding of each key's
	// entry, with updated_at cleared, as last written or found in the
	// bucket; the zero sum marks an entry to rewrite (undecodable). A sum,
	// not the encoding: an entry names every root of its repository (~3.3
	// KB for 50 roots), and the writer only compares (docs/measurements/2026-12-04-design-scale-memory.md).
	written map[string]contentSum
}

// contentSum is the SHA-256 of an entry's content; the zero value is no
// content.
type contentSum [sha256.Size]byte

// NewIndexWriter returns a writer for kv; call Load before the first Sync.
func NewIndexWriter(kv jetstream.KeyValue, clk clock.Clock) *IndexWriter {
	return &IndexWriter{kv: kv, clock: clk, written: map[string]contentSum{}}
}

// content is what an entry is compared by: everything but updated_at.
func content(e *graspv1.RepoSyncNeeds) (contentSum, error) {
	c := proto.CloneOf(e)
	c.UpdatedAt = 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return contentSum{}, err
	}
	return sha256.Sum256(b), nil
}

// Load reads the bucket's current entries (one watch, not a get per key)
// and returns the repositories they name, which the caller must Sync so that
// entries of repositories no longer hosted are removed. Keys that are neither
// a repository nor the reserved bootstrap key are deleted at once.
func (w *IndexWriter) Load(ctx context.Context) ([]nip34.RepoRef, error) {
	watcher, err := w.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read index bucket: %w", err)
	}
	defer func() { _ = watcher.Stop() }()
	w.written = map[string]contentSum{}
	var refs []nip34.RepoRef
	var junk []string
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read index bucket: %w", ctx.Err())
		case e = <-watcher.Updates():
		}
		if e == nil {
			break // the initial values are done
		}
		switch ref, ok := nip34.ParseKey(e.Key()); {
		case e.Key() == bus.BootstrapRelaysKey:
			w.written[e.Key()] = sha256.Sum256(e.Value())
		case !ok:
			junk = append(junk, e.Key())
		default:
			var v graspv1.RepoSyncNeeds
			if proto.Unmarshal(e.Value(), &v) == nil {
				if c, err := content(&v); err == nil {
					w.written[e.Key()] = c
				}
			}
			if _, seen := w.written[e.Key()]; !seen {
				w.written[e.Key()] = contentSum{} // undecodable: rewritten by Sync
			}
			refs = append(refs, ref)
		}
	}
	for _, key := range junk {
		if err := w.kv.Delete(ctx, key); err != nil {
			return nil, fmt.Errorf("delete stray key %s: %w", key, err)
		}
	}
	return refs, nil
}

// Sync makes the bucket's entry for ref equal to entry (nil: no entry) and
// reports whether it wrote anything.
func (w *IndexWriter) Sync(ctx context.Context, ref nip34.RepoRef, entry *graspv1.RepoSyncNeeds) (bool, error) {
	key := ref.Key()
	if entry == nil {
		if _, ok := w.written[key]; !ok {
			return false, nil
		}
		if err := w.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, fmt.Errorf("delete %s (%s): %w", key, ref, err)
		}
		delete(w.written, key)
		return true, nil
	}
	c, err := content(entry)
	if err != nil {
		return false, fmt.Errorf("encode %s: %w", ref, err)
	}
	if prev, ok := w.written[key]; ok && prev != (contentSum{}) && prev == c {
		return false, nil
	}
	stamped := proto.CloneOf(entry)
	stamped.UpdatedAt = w.clock.Now().Unix()
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(stamped)
	if err != nil {
		return false, fmt.Errorf("encode %s: %w", ref, err)
	}
	if _, err := w.kv.Put(ctx, key, data); err != nil {
		return false, fmt.Errorf("put %s (%s): %w", key, ref, err)
	}
	w.written[key] = c
	return true, nil
}

// SyncBootstrap publishes the bootstrap relays under bus.BootstrapRelaysKey
// (always, an empty list included, so the planner reads a definite value)
// and reports whether it wrote.
func (w *IndexWriter) SyncBootstrap(ctx context.Context, relays []string) (bool, error) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(&graspv1.BootstrapRelays{Relays: slices.Clone(relays)})
	if err != nil {
		return false, fmt.Errorf("encode bootstrap relays: %w", err)
	}
	sum := sha256.Sum256(data)
	if prev, ok := w.written[bus.BootstrapRelaysKey]; ok && prev == sum {
		return false, nil
	}
	if _, err := w.kv.Put(ctx, bus.BootstrapRelaysKey, data); err != nil {
		return false, fmt.Errorf("put %s: %w", bus.BootstrapRelaysKey, err)
	}
	w.written[bus.BootstrapRelaysKey] = sum
	return true, nil
}
