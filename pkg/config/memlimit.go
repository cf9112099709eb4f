package config

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// ApplyDefaultMemoryLimit is ApplyMemoryLimit for a process with a default:
// when neither limit nor GOMEMLIMIT is set, def becomes the soft limit
// (source "default") and keeps it only while the live heap is small enough
// for it not to make the collector thrash: GuardMemoryLimit raises it with
// the live heap. GOMEMLIMIT=off is the way to run without any limit. An
// explicit limit is taken as given (docs/decisions.md, "A default soft
// memory limit for graspd").
func ApplyDefaultMemoryLimit(ctx context.Context, limit, def ByteSize) (inForce int64, source string) {
	if limit > 0 || os.Getenv("GOMEMLIMIT") != "" || def <= 0 {
		return ApplyMemoryLimit(limit)
	}
	debug.SetMemoryLimit(int64(def))
	go GuardMemoryLimit(ctx, int64(def), time.Second)
	return int64(def), "default"
}

// GuardedMemoryLimit is the soft limit GuardMemoryLimit keeps for a base
// limit and a live heap: the base, or half as much again as the live heap
// when that is more. Between collections the heap may then always grow by
// at least half of what is live, so the collector runs at most about twice
// as often as without a limit (GOGC=100 lets it grow by all of it), instead
// of continuously once the live heap reaches the base.
func GuardedMemoryLimit(base, live int64) int64 {
	return max(base, live+live/2)
}

// GuardMemoryLimit keeps the runtime's soft limit at
// GuardedMemoryLimit(base, live heap), reading the live heap (as of the
// last collection) every interval until ctx is done.
func GuardMemoryLimit(ctx context.Context, base int64, interval time.Duration) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	cur := base
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return // a runtime without the metric: keep the base
		}
		if want := GuardedMemoryLimit(base, int64(sample[0].Value.Uint64())); want != cur {
			debug.SetMemoryLimit(want)
			cur = want
		}
	}
}
