package syncstatus

import (
	"fmt"
	"time"
)

// ProgressLine is one sync progress summary: the planner's view of the
// relays (syncstatus.Progress) plus events stored by the ingester and the
// storing rate since the previous line.
type ProgressLine struct {
	Progress
	EventsStored float64
	RatePerSec   float64
}

// NextProgress computes the line for a snapshot taken at now, given the
// ingester's accepted-event counter then and at the previous line. It
// returns ok=false when no relay is Syncing: nothing long is running, so
// nothing is logged.
func NextProgress(p Progress, stored, prevStored float64, now, prev time.Time) (ProgressLine, bool) {
	if p.Syncing == 0 {
		return ProgressLine{}, false
	}
	l := ProgressLine{Progress: p, EventsStored: stored}
	if dt := now.Sub(prev).Seconds(); dt > 0 && !prev.IsZero() && stored >= prevStored {
		l.RatePerSec = (stored - prevStored) / dt
	}
	return l, true
}

// Attrs are the line's slog attributes.
func (l ProgressLine) Attrs() []any {
	return []any{"relays", l.Relays, "connected", l.Connected, "syncing", l.Syncing,
		"batches_pending", l.PendingBatches, "roots_pending", l.PendingRoots,
		"events_stored", int64(l.EventsStored), "events_per_sec", fmt.Sprintf("%.1f", l.RatePerSec)}
}

// String renders the line as graspd logs it (key=value pairs), for
// graspctl status --watch.
func (l ProgressLine) String() string {
	a := l.Attrs()
	s := "sync progress:"
	for i := 0; i+1 < len(a); i += 2 {
		s += fmt.Sprintf(" %v=%v", a[i], a[i+1])
	}
	return s
}
