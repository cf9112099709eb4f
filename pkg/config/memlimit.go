package config

import (
	"context"
	"math"
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
// explicit limit is taken as given (docs/decisions/0039-default-soft-memory-limit.md).
func ApplyDefaultMemoryLimit(ctx context.Context, limit, def ByteSize) (inForce int64, source string) {
	if limit > 0 || os.Getenv("GOMEMLIMIT") != "" || def <= 0 {
		return ApplyMemoryLimit(limit)
	}
	debug.SetMemoryLimit(int64(def))
	go GuardMemoryLimit(ctx, int64(def), time.Second)
	return int64(def), "default"
}

// MemorySample is what GuardedMemoryLimit needs of the runtime, from
// runtime/metrics.
type MemorySample struct {
	// Live is the live heap as of the last collection (/gc/heap/live).
	Live int64
	// Other is the memory the soft limit counts besides heap objects:
	// /memory/classes/total less the heap's objects, free and released
	// pages (goroutine stacks, runtime metadata, fragmentation in spans in
	// use).
	Other int64
	// Allocated is the heap allocated since the process started
	// (/gc/heap/allocs), so the guard sees when the process is quiet.
	Allocated uint64
}

// IdleTrim decides when a process that went quiet returns its free heap to
// the system (debug.FreeOSMemory): once per quiet spell, once it has
// allocated no more than 1/32 of its live heap a second on average over the
// last Quiet. Between collections the heap holds up to the collector's goal
// (about twice the live heap), and the runtime keeps that memory while
// nothing allocates, so an idle graspd held ~60 MB of garbage at the
// design's target world (docs/measurements/2026-12-04-design-scale-memory.md).
// One collection per quiet spell costs nothing measurable. The average, not
// each second: a graspd at rest allocates ~0.85 MB a second in bursts (a
// /metrics scrape is one), and a rule that every second be quiet was seldom
// met for 10 s in a row (docs/measurements/2026-12-06-issue32-idle-memory.md).
type IdleTrim struct {
	// Quiet is how long the process must be quiet first.
	Quiet time.Duration

	first   time.Time    // the first Observe
	window  []allocation // the allocations of the last Quiet, oldest first
	quiet   bool         // as of the last Observe
	trimmed bool         // in this quiet spell
}

// allocation is what was allocated in the interval that ended at at.
type allocation struct {
	at    time.Time
	bytes uint64
}

// maxWindow bounds IdleTrim's window whatever the sampling interval.
const maxWindow = 1024

// Observe takes what was allocated over the last interval (and the live
// heap) at now, and reports whether to trim now.
func (t *IdleTrim) Observe(now time.Time, allocated uint64, interval time.Duration, live int64) bool {
	if t.first.IsZero() {
		t.first = now.Add(-interval)
	}
	t.window = append(t.window, allocation{now, allocated})
	drop := 0
	for drop < len(t.window) && (!t.window[drop].at.After(now.Add(-t.Quiet)) || len(t.window)-drop > maxWindow) {
		drop++
	}
	t.window = append(t.window[:0], t.window[drop:]...)
	var sum float64
	for _, a := range t.window {
		sum += float64(a.bytes)
	}
	t.quiet = now.Sub(t.first) >= t.Quiet && sum <= float64(live)/32*t.Quiet.Seconds()
	if !t.quiet {
		t.trimmed = false
		return false
	}
	if !t.trimmed {
		t.trimmed = true
		return true
	}
	return false
}

// Resting reports whether the process was quiet (see IdleTrim) as of the
// last Observe.
func (t *IdleTrim) Resting() bool { return t.quiet }

// RestingGCPercent is the collector's goal (GOGC) GuardMemoryLimit keeps
// while the process rests (IdleTrim.Resting): garbage of half the live heap
// between collections instead of as much again. At rest graspd's heap goal
// was GOGC=100's, about twice the live heap (111 MiB for ~55 MiB live in
// the target world), and the runtime keeps a tenth more than the goal in
// pages: ~139 MiB of Go heap resident for ~63 MB live
// (docs/measurements/2026-12-06-issue32-idle-memory.md). A lower soft limit
// at rest did not lower the goal (the limit counts ~80 MiB besides heap
// objects) and cost more collector CPU for 8 MB. At rest graspd allocates
// ~0.85 MB a second, so half the live heap lasts ~30 s between collections.
const RestingGCPercent = 50

// idleTrimAfter is how long graspd must be quiet before its free heap is
// returned (IdleTrim) and RestingGCPercent applies.
// (A variable so that tests need not wait 10 s.)
var idleTrimAfter = 10 * time.Second

// GuardedMemoryLimit is the soft limit GuardMemoryLimit keeps for a base
// limit: the base, or, when more, the memory besides heap objects plus
// half as much again as the live heap, times boost (≥ 1). The heap may then
// always grow by at least half of what is live before a collection — at
// most about twice the collections of GOGC=100. The memory besides heap
// objects must be counted because the soft limit counts it: without it, at
// rest with 1,500 goroutines, the heap could grow by almost nothing and the
// collector took 83 % of graspd's CPU (docs/decisions/0039-default-soft-memory-limit.md).
func GuardedMemoryLimit(base int64, s MemorySample, boost float64) int64 {
	want := float64(s.Other) + float64(s.Live)*1.5*max(boost, 1)
	if want >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return max(base, int64(want))
}

// Collector CPU shares (of GOMAXPROCS × wall time, the idle mark workers'
// time left out) at which the guard backs off (raises its boost) and
// relaxes (halves it). 25 % is what the collector's dedicated workers take
// while a collection runs; a busy sync's collections, back to back with
// allocations assisting them, took more for two seconds in most upper-world
// syncs on a faster box, and backing off then lifted the heap's goal to
// twice the live heap (peaks 491–569 MB against 407–437 MB at 35 %, for 5 %
// fewer events a second; docs/measurements/2026-12-07-issue32-span-slack.md).
// Over 35 % for two seconds is thrash (a first try at 10 % lifted the limit
// during a sync and let the heap reach 333 MB;
// docs/measurements/2026-12-04-design-scale-costs-removed.md).
const (
	gcBackOffShare = 0.35
	gcRelaxShare   = 0.05
	maxBoost       = 8
	boostStep      = 1.25
)

// NextBoost is the guard's boost after an interval in which the collector
// used gcShare of the CPU available, the interval before it prevShare: a
// quarter more (up to 8) when the collector took more than 35 % in both,
// halved (down to 1) when it took less than 5 %, so a limit that still
// makes the collector run back to back (memory besides the heap grew faster
// than measured) is lifted within seconds, and returns when quiet. Two
// seconds, and a quarter, not one second and double: one such second comes
// with the live heap's growth at the start of a sync, and doubling then
// lifted the target world's peak from ~350 to 460–490 MB
// (docs/measurements/2026-12-06-issue32-local-set-reads.md); a collector
// that keeps running back to back has its limit doubled within five
// seconds.
func NextBoost(boost, gcShare, prevShare float64) float64 {
	switch {
	case gcShare > gcBackOffShare && prevShare > gcBackOffShare:
		return min(max(boost, 1)*boostStep, maxBoost)
	case gcShare < gcRelaxShare:
		return max(boost/2, 1)
	}
	return max(boost, 1)
}

var guardMetrics = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
	"/cpu/classes/gc/total:cpu-seconds",
	"/cpu/classes/total:cpu-seconds",
	"/gc/heap/allocs:bytes",
	"/cpu/classes/gc/mark/idle:cpu-seconds",
}

// readGuardMetrics reads the runtime's memory and the collector's CPU (less
// its idle mark workers'); ok is false on a runtime without one of the
// metrics.
func readGuardMetrics(samples []metrics.Sample) (s MemorySample, gcCPU, allCPU float64, ok bool) {
	metrics.Read(samples)
	u := make([]int64, 5)
	for i := range 5 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return s, 0, 0, false
		}
		u[i] = int64(samples[i].Value.Uint64())
	}
	for i := 5; i < 7; i++ {
		if samples[i].Value.Kind() != metrics.KindFloat64 {
			return s, 0, 0, false
		}
	}
	if samples[7].Value.Kind() != metrics.KindUint64 || samples[8].Value.Kind() != metrics.KindFloat64 {
		return s, 0, 0, false
	}
	s = MemorySample{Live: u[0], Other: max(u[1]-u[2]-u[3]-u[4], 0), Allocated: samples[7].Value.Uint64()}
	// The collector's idle mark workers run only on processors that had
	// nothing else to do: that time is taken from no one, so it does not
	// count as the collector's share (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
	gc := samples[5].Value.Float64() - samples[8].Value.Float64()
	return s, max(gc, 0), samples[6].Value.Float64(), true
}

// GuardMemoryLimit keeps the runtime's soft limit at GuardedMemoryLimit,
// reading the runtime's memory and the collector's CPU every interval until
// ctx is done. Once the process has been quiet for a while (IdleTrim) it
// returns the free heap to the system and lowers the collector's goal to
// RestingGCPercent until the process is busy again (an explicit GOGC below
// it, or off, is left as it is).
func GuardMemoryLimit(ctx context.Context, base int64, interval time.Duration) {
	samples := make([]metrics.Sample, len(guardMetrics))
	for i, n := range guardMetrics {
		samples[i].Name = n
	}
	cur, boost, prevShare := base, 1.0, 0.0
	s0, gc0, all0, ok := readGuardMetrics(samples)
	if !ok {
		return // a runtime without the metrics: keep the base
	}
	trim := IdleTrim{Quiet: idleTrimAfter}
	// The collector's goal as the process set it (GOGC); off (negative)
	// is left alone.
	gcPercent := debug.SetGCPercent(100)
	debug.SetGCPercent(gcPercent)
	inForce := gcPercent
	defer func() {
		if inForce != gcPercent {
			debug.SetGCPercent(gcPercent)
		}
	}()
	allocated := s0.Allocated
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, gc1, all1, _ := readGuardMetrics(samples)
		if all1 > all0 {
			share := (gc1 - gc0) / (all1 - all0)
			boost = NextBoost(boost, share, prevShare)
			prevShare = share
		}
		gc0, all0 = gc1, all1
		now := time.Now()
		doTrim := trim.Observe(now, s.Allocated-allocated, interval, s.Live)
		if gcPercent > 0 {
			// At rest the collector's goal, not the limit, decides what
			// the heap keeps: see RestingGCPercent.
			want := gcPercent
			if trim.Resting() {
				want = min(gcPercent, RestingGCPercent)
			}
			if want != inForce {
				debug.SetGCPercent(want)
				inForce = want
			}
		}
		if doTrim {
			debug.FreeOSMemory()
		}
		allocated = s.Allocated
		// A change of less than 1/16 is not worth a new limit: the
		// estimate moves with every allocation.
		if want := GuardedMemoryLimit(base, s, boost); want > cur || want < cur-cur/16 {
			debug.SetMemoryLimit(want)
			cur = want
		}
	}
}
