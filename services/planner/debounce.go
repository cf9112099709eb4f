package planner

import "time"

// recomputeDebounce decides when a burst of index updates is recomputed:
// once updates have been quiet for quiet, and no later than maxWait after
// the burst's first update, so a discovery batch is one recompute while a
// stream of updates that never pauses still gets recomputed (see
// docs/decisions.md, "Planner recompute: debounced KV watch"). It is pure:
// the times are passed in.
type recomputeDebounce struct {
	quiet, maxWait time.Duration
	first, last    time.Time // of the pending burst; first is zero when none
}

// newRecomputeDebounce returns a debounce; a maxWait below quiet acts as
// quiet (the recompute then runs quiet after the burst's first update).
func newRecomputeDebounce(quiet, maxWait time.Duration) recomputeDebounce {
	return recomputeDebounce{quiet: quiet, maxWait: max(maxWait, quiet)}
}

// Updated records an index update at now.
func (d *recomputeDebounce) Updated(now time.Time) {
	if d.first.IsZero() {
		d.first = now
	}
	d.last = now
}

// Due is when the pending burst must be recomputed: quiet after its last
// update, capped at maxWait after its first. Zero when nothing is pending.
func (d *recomputeDebounce) Due() time.Time {
	if d.first.IsZero() {
		return time.Time{}
	}
	due := d.last.Add(d.quiet)
	if limit := d.first.Add(d.maxWait); limit.Before(due) {
		due = limit
	}
	return due
}

// Done records that the pending burst was recomputed.
func (d *recomputeDebounce) Done() { d.first, d.last = time.Time{}, time.Time{} }
