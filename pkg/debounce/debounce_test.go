package debounce

import (
	"testing"
	"time"
)

// A burst is due once updates have been quiet for the quiet period, and no
// later than the maximum wait after its first update.
func TestBurstDue(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
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
		{"discovery: one announcement", 150 * time.Millisecond, 5 * time.Second, []int{0}, 150},
		{"discovery: a sustained stream is one batch per window", 150 * time.Millisecond, 5 * time.Second, []int{0, 100, 200, 4900, 5000, 5100}, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.quiet, tc.maxWait)
			if b.Pending() || !b.Due().IsZero() {
				t.Fatalf("due %v before any update", b.Due())
			}
			for _, u := range tc.updates {
				b.Updated(ms(u))
			}
			if !b.Pending() {
				t.Fatal("not pending after updates")
			}
			if got := b.Due(); !got.Equal(ms(tc.due)) {
				t.Fatalf("due at %s, want %dms", got.Sub(t0), tc.due)
			}
			b.Done()
			if b.Pending() || !b.Due().IsZero() {
				t.Fatalf("due %v after the burst was handled", b.Due())
			}
			b.Updated(ms(9000))
			if got := b.Due(); !got.Equal(ms(9000).Add(tc.quiet)) {
				t.Fatalf("next burst due at %s", got.Sub(t0))
			}
		})
	}
}
