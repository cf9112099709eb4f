package store

import (
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	dgbadger "github.com/dgraph-io/badger/v4"
)

// DefaultKVMemory is the kv store's memory budget when none is given: small
// enough that graspd fits a small VPS with room for the pipeline around it
// (docs/decisions/0030-memory-on-a-small-machine.md). 48 MiB since
// 2026-12-06: a 1M-event store on a warm page cache reads as fast as with
// 96 MiB, within the runs' spread, for 16–56 MB less resident memory
// (docs/decisions/0074-store-budget-48mib.md).
const DefaultKVMemory int64 = 48 << 20

// kvBadgerOptions are badger's options for the kv store, sized from a memory
// budget instead of badger's defaults, which assume a large server: five
// 64 MiB memtables (each an arena allocated whole, plus its write-ahead log
// mapped beside it), a 256 MiB block cache, every table's index and Bloom
// filter held in memory without bound, and four compactors each building
// tables in buffers of up to twice the table size. The budget is split:
//
//   - memtables: 2 of budget/8 each (8–64 MiB): one taking writes while the
//     other is flushed. Smaller memtables mean more, smaller level-0 tables and
//     more compaction, not lost writes;
//   - block cache: budget/4 (decompressed blocks, the read path's cache);
//   - index cache: budget/8, bounding the tables' indexes and Bloom filters
//     kept in memory (reads of tables whose index was evicted load it again);
//   - 2 compactors, badger's minimum (one of them prioritises level 0).
//
// Values are never stored in the value log (every event is far below
// badger's 1 MiB value threshold), so its files are kept small too.
func kvBadgerOptions(dir string, budget int64) dgbadger.Options {
	if budget <= 0 {
		budget = DefaultKVMemory
	}
	// At least 8 MiB: badger allows 15 % of a memtable in one batch and
	// refuses to open when that is below its 1 MiB value threshold; 8 MiB
	// also keeps one event of the relay's largest message with its index
	// keys within one batch.
	memtable := min(max(budget/8, 8<<20), 64<<20)
	return dgbadger.DefaultOptions(dir).
		WithLogger(nil).
		WithDetectConflicts(false).
		WithMemTableSize(memtable).
		WithNumMemtables(2).
		WithNumLevelZeroTables(4).
		WithNumLevelZeroTablesStall(12).
		WithBlockCacheSize(budget / 4).
		WithIndexCacheSize(budget / 8).
		WithNumCompactors(2).
		WithValueLogFileSize(64 << 20)
}

// kvPebbleFormat is the on-disk format new pebble directories are written
// in, named rather than pebble.FormatNewest so that upgrading the library
// never rewrites an operator's directory into a format the previous binary
// cannot read.
const kvPebbleFormat = pebble.FormatValueSeparation

// kvPebbleOptions are pebble's options for the kv store, sized from the same
// memory budget as badger's (kvBadgerOptions). Pebble reads its tables with
// ordinary reads into its own block cache, not through memory mappings, so
// the budget bounds what it keeps resident:
//
//   - memtables: at most 2 of budget/4 each (4–64 MiB): one taking writes
//     while the other is flushed; writes wait rather than queue a third.
//     12 MiB each at the default budget, as at the earlier 96 MiB default:
//     with 6 MiB a bulk sync ran ~10 % slower
//     (docs/decisions/0074-store-budget-48mib.md);
//   - block cache: budget/2, holding data blocks and the tables' index and
//     filter blocks alike (badger keeps those two apart);
//   - at most 2 concurrent compactions (one normally, a second when level
//     0 falls behind); pebble's compactions stream through small buffers;
//   - Bloom filters (10 bits per key) on every level, so a point read of an
//     absent key skips tables, as badger's per-table filters do.
//
// Cache is a fresh cache the caller unreferences once the database holds it.
func kvPebbleOptions(budget int64) *pebble.Options {
	if budget <= 0 {
		budget = DefaultKVMemory
	}
	memtable := min(max(budget/4, 4<<20), 64<<20)
	o := &pebble.Options{
		Cache:                       pebble.NewCache(budget / 2),
		MemTableSize:                uint64(memtable),
		MemTableStopWritesThreshold: 2,
		CompactionConcurrencyRange:  func() (int, int) { return 1, 2 },
		FormatMajorVersion:          kvPebbleFormat,
		Logger:                      kvPebbleLogger{},
	}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	return o
}
