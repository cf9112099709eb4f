package config_test

import (
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

// A quiet process returns its free heap once per quiet spell: not while it
// allocates, not before the last whole period was quiet, not again until it
// has been busy in between.
func TestIdleTrimOncePerQuietSpell(t *testing.T) {
	const live = 64 << 20 // quiet: under 2 MiB a second
	tr := config.IdleTrim{Quiet: 10 * time.Second}
	at := time.Unix(0, 0)
	step := func(allocated uint64) bool {
		at = at.Add(time.Second)
		return tr.Observe(at, allocated, time.Second, live)
	}
	var trims []int
	for i := range 60 {
		alloc := uint64(1 << 20)
		if i < 5 || (i >= 30 && i < 35) {
			alloc = 50 << 20 // syncing
		}
		if step(alloc) {
			trims = append(trims, i)
		}
	}
	// Quiet from second 5 (i=5): the last 10 s are quiet at i=14; busy
	// again at 30–34, quiet from 35, trimmed at 44; never twice in one
	// spell.
	if len(trims) != 2 || trims[0] != 14 || trims[1] != 44 {
		t.Fatalf("trimmed at %v, want [14 44]", trims)
	}
}

// The process rests once the last whole period was quiet, and stops
// resting at a busy second until it has left the period.
func TestIdleTrimResting(t *testing.T) {
	const live = 64 << 20
	tr := config.IdleTrim{Quiet: 10 * time.Second}
	at := time.Unix(0, 0)
	for i := range 30 {
		alloc := uint64(1 << 20)
		if i == 20 {
			alloc = 50 << 20
		}
		at = at.Add(time.Second)
		tr.Observe(at, alloc, time.Second, live)
		// Observed from second 0; the first whole period ends at i=9;
		// the busy second (i=20) is in the last 10 s until i=29.
		if want := i >= 9 && i < 20; tr.Resting() != want {
			t.Fatalf("second %d: resting %v, want %v", i, tr.Resting(), want)
		}
	}
}

// At rest graspd allocates in bursts (a /metrics scrape is one): a process
// under 1/32 of its live heap a second on average is quiet, even though
// some seconds are over.
func TestIdleTrimQuietOnAverage(t *testing.T) {
	const live = 64 << 20 // quiet: 2 MiB a second on average
	tr := config.IdleTrim{Quiet: 10 * time.Second}
	at := time.Unix(0, 0)
	trims := 0
	for i := range 60 {
		alloc := uint64(1 << 20)
		if i%5 == 0 {
			alloc = 5 << 20 // a scrape: 5 MiB in one second, 1.8 MiB a second on average
		}
		at = at.Add(time.Second)
		if tr.Observe(at, alloc, time.Second, live) {
			trims++
		}
	}
	if trims != 1 || !tr.Resting() {
		t.Fatalf("%d trims, resting %v; want 1 trim and resting", trims, tr.Resting())
	}
}
