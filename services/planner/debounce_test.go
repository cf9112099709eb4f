package planner

import (
	"testing"
	"time"
)

// The recompute is due once updates have been quiet for the quiet period,
// and no later than the maximum wait after the burst's first update.
func TestRecomputeDebounceDue(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name           string
		quiet, maxWait time.Duration
		updates        []int // ms after t0
		due            int
	}{
		{"one update", 250 * time.Millisecond, time.Second, []int{0}, 250},
		{"a burst that pauses", 250 * time.Millisecond, time.Second, []int{0, 10, 200, 400}, 650},
		{"updates that never pause", 250 * time.Millisecond, time.Second, []int{0, 200, 400, 600, 800, 1000}, 1000},
		{"maximum below the quiet period", 250 * time.Millisecond, 100 * time.Millisecond, []int{0, 200}, 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newRecomputeDebounce(tc.quiet, tc.maxWait)
			if !d.Due().IsZero() {
				t.Fatalf("due %v before any update", d.Due())
			}
			for _, u := range tc.updates {
				d.Updated(ms(u))
			}
			if got := d.Due(); !got.Equal(ms(tc.due)) {
				t.Fatalf("due at %s, want %dms", got.Sub(t0), tc.due)
			}
			d.Done()
			if !d.Due().IsZero() {
				t.Fatalf("due %v after the recompute", d.Due())
			}
			d.Updated(ms(5000))
			if got := d.Due(); !got.Equal(ms(5000).Add(tc.quiet)) {
				t.Fatalf("next burst due at %s", got.Sub(t0))
			}
		})
	}
}
