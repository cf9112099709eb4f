package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/nbd-wtf/go-nostr"
)

// stripes are the embedded backends' write locks: one of 64 mutexes per id
// or replaceable key, so writes of one key are check-then-write without a
// global lock.
type stripes [64]sync.Mutex

func (s *stripes) index(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(s)))
}

// lock locks key's stripe and returns it.
func (s *stripes) lock(key string) *sync.Mutex {
	mu := &s[s.index(key)]
	mu.Lock()
	return mu
}

// lockAll locks the stripes of keys, each once and in index order (so
// concurrent batches cannot deadlock), and returns the unlock.
func (s *stripes) lockAll(keys []string) func() {
	var want [len(s)]bool
	for _, k := range keys {
		want[s.index(k)] = true
	}
	for n := range want {
		if want[n] {
			s[n].Lock()
		}
	}
	return func() {
		for n := range want {
			if want[n] {
				s[n].Unlock()
			}
		}
	}
}

// replaceVersions stores replaceable evt if it supersedes every stored
// version of its key and then removes those versions. The caller holds the
// key's stripe. Not the backends' own ReplaceEvent: badger's and lmdb's look
// old versions up through an index that misses empty and long d values,
// sqlite3's matches d by substring. Save first, then remove what it
// supersedes: a crash in between leaves two versions, which the next write
// to the key cleans up, never none.
func replaceVersions(ctx context.Context, evt *nostr.Event,
	versions func(context.Context, *nostr.Event) ([]*nostr.Event, error),
	insert func(context.Context, *nostr.Event) (bool, error),
	remove func(context.Context, *nostr.Event) error,
) (bool, error) {
	old, err := versions(ctx, evt)
	if err != nil {
		return false, fmt.Errorf("read stored versions: %w", err)
	}
	for _, v := range old {
		if v.ID == evt.ID || !Supersedes(evt, v) {
			return false, nil
		}
	}
	stored, err := insert(ctx, evt)
	if err != nil || !stored {
		return false, err
	}
	for _, v := range old {
		if err := remove(ctx, v); err != nil {
			return true, fmt.Errorf("remove superseded version %s: %w", v.ID, err)
		}
	}
	return true, nil
}
