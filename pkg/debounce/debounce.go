// Package debounce decides when a burst of updates is handled: once the
// updates have been quiet for a quiet period, and no later than a maximum
// wait after the burst's first update. One update alone is handled after
// the quiet period; a stream that never pauses is still handled every
// maximum wait (see docs/decisions/0004-planner-recompute-debounce.md and docs/decisions/0005-discovery-batch-quiet-period.md).
package debounce

import "time"

// Burst is the pending burst of updates. It is pure: the times are passed
// in, so callers arm timers on their injected clock. The zero value is
// not usable; build one with New.
type Burst struct {
	quiet, maxWait time.Duration
	first, last    time.Time // of the pending burst; first is zero when none
}

// New returns a Burst; a maxWait below quiet acts as quiet (the burst is
// then due quiet after its first update).
func New(quiet, maxWait time.Duration) Burst {
	return Burst{quiet: quiet, maxWait: max(maxWait, quiet)}
}

// Updated records an update at now.
func (b *Burst) Updated(now time.Time) {
	if b.first.IsZero() {
		b.first = now
	}
	b.last = now
}

// Pending reports whether a burst is waiting to be handled.
func (b *Burst) Pending() bool { return !b.first.IsZero() }

// Due is when the pending burst must be handled: quiet after its last
// update, capped at maxWait after its first. Zero when nothing is pending.
func (b *Burst) Due() time.Time {
	if b.first.IsZero() {
		return time.Time{}
	}
	due := b.last.Add(b.quiet)
	if limit := b.first.Add(b.maxWait); limit.Before(due) {
		due = limit
	}
	return due
}

// Done records that the pending burst was handled.
func (b *Burst) Done() { b.first, b.last = time.Time{}, time.Time{} }
