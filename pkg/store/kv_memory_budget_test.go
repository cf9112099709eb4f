package store

import (
	"context"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// The kv store's badger options follow the memory budget, not badger's
// server-sized defaults (docs/decisions/0030-memory-on-a-small-machine.md).
func TestKVBadgerOptionsFollowTheBudget(t *testing.T) {
	tests := []struct {
		budget                           int64
		memtable, blockCache, indexCache int64
	}{
		{budget: 0, memtable: 8 << 20, blockCache: 12 << 20, indexCache: 6 << 20}, // DefaultKVMemory
		{budget: 96 << 20, memtable: 12 << 20, blockCache: 24 << 20, indexCache: 12 << 20},
		{budget: 16 << 20, memtable: 8 << 20, blockCache: 4 << 20, indexCache: 2 << 20},
		{budget: 1 << 30, memtable: 64 << 20, blockCache: 256 << 20, indexCache: 128 << 20},
	}
	for _, tt := range tests {
		o := kvBadgerOptions(t.TempDir(), tt.budget)
		if o.MemTableSize != tt.memtable || o.BlockCacheSize != tt.blockCache || o.IndexCacheSize != tt.indexCache {
			t.Errorf("budget %d: memtable %d, block cache %d, index cache %d; want %d, %d, %d",
				tt.budget, o.MemTableSize, o.BlockCacheSize, o.IndexCacheSize, tt.memtable, tt.blockCache, tt.indexCache)
		}
		if o.NumMemtables != 2 || o.NumCompactors != 2 || o.DetectConflicts {
			t.Errorf("budget %d: %d memtables, %d compactors, conflicts %v; want 2, 2, false", tt.budget, o.NumMemtables, o.NumCompactors, o.DetectConflicts)
		}
		if worst := int64(o.NumMemtables)*o.MemTableSize + o.BlockCacheSize + o.IndexCacheSize; tt.budget >= 64<<20 && worst > max(tt.budget, DefaultKVMemory) {
			t.Errorf("budget %d: memtables and caches add up to %d", tt.budget, worst)
		}
	}
}

// The smallest budget still opens and stores an event as large as the relay
// accepts (the memtable floor keeps badger's batch above its value
// threshold and above one such event).
func TestKVSmallBudgetOpensAndStoresLargeEvents(t *testing.T) {
	for _, engine := range kvEngines {
		t.Run(engine, func(t *testing.T) { testKVSmallBudget(t, engine) })
	}
}

func testKVSmallBudget(t *testing.T, engine string) {
	s, err := Open("kv+"+engine+"://"+t.TempDir(), WithKVMemory(1<<20))
	if err != nil {
		t.Fatalf("open with a 1 MiB budget: %v", err)
	}
	defer s.Close()
	sk := nostr.GeneratePrivateKey()
	evt := &nostr.Event{Kind: 1621, CreatedAt: nostr.Now(), Content: strings.Repeat("x", 500_000), Tags: nostr.Tags{{"a", "30617:" + strings.Repeat("a", 64) + ":repo"}}}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	res := s.SaveBatch(context.Background(), []*nostr.Event{evt})
	if res[0].Err != nil || !res[0].Stored {
		t.Fatalf("save a 500 kB event: %+v", res[0])
	}
}

// The pebble engine's memtables and block cache follow the same budget
// (docs/decisions/0036-kv-on-pebble.md): at most two memtables, so a budget
// bounds what writes can hold in memory.
func TestKVPebbleOptionsFollowTheBudget(t *testing.T) {
	tests := []struct {
		budget          int64
		memtable, cache int64
	}{
		{budget: 0, memtable: 12 << 20, cache: 24 << 20}, // DefaultKVMemory
		{budget: 96 << 20, memtable: 24 << 20, cache: 48 << 20},
		{budget: 16 << 20, memtable: 4 << 20, cache: 8 << 20},
		{budget: 1 << 30, memtable: 64 << 20, cache: 512 << 20},
	}
	for _, tt := range tests {
		o := kvPebbleOptions(tt.budget)
		if int64(o.MemTableSize) != tt.memtable || o.Cache.MaxSize() != tt.cache {
			t.Errorf("budget %d: memtable %d, cache %d; want %d, %d", tt.budget, o.MemTableSize, o.Cache.MaxSize(), tt.memtable, tt.cache)
		}
		if o.MemTableStopWritesThreshold != 2 {
			t.Errorf("budget %d: %d memtables, want 2", tt.budget, o.MemTableStopWritesThreshold)
		}
		if _, hi := o.CompactionConcurrencyRange(); hi > 2 {
			t.Errorf("budget %d: up to %d compactions, want at most 2", tt.budget, hi)
		}
		if worst := 2*int64(o.MemTableSize) + o.Cache.MaxSize(); (tt.budget == 0 || tt.budget >= 64<<20) && worst > max(tt.budget, DefaultKVMemory) {
			t.Errorf("budget %d: memtables and cache add up to %d", tt.budget, worst)
		}
		o.Cache.Unref()
	}
}
