package store

import dgbadger "github.com/dgraph-io/badger/v4"

// DefaultKVMemory is the kv store's memory budget when none is given: small
// enough that graspd fits a small VPS with room for the pipeline around it
// (docs/decisions.md, "Memory on a small machine").
const DefaultKVMemory int64 = 96 << 20

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
