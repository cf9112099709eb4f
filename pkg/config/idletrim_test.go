package config_test

import (
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/config"
)

// A quiet process returns its free heap once per quiet spell: not while it
// allocates, not before it has been quiet for the whole period, not again
// until it has been busy in between.
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
	// Quiet from second 5 (i=5), trimmed 10 s later; busy again at 30–34,
	// quiet from 35, trimmed at 45; never twice in one spell.
	if len(trims) != 2 || trims[0] != 15 || trims[1] != 45 {
		t.Fatalf("trimmed at %v, want [15 45]", trims)
	}
}
