package history_test

import (
	"fmt"
	"testing"

	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/nbd-wtf/go-nostr"
)

// relayPages simulates a relay holding events, answering each page newest
// first, capped at limit, for created_at <= until.
func relayPages(events []*nostr.Event, limit int) func(until *nostr.Timestamp) []*nostr.Event {
	return func(until *nostr.Timestamp) []*nostr.Event {
		var out []*nostr.Event
		for _, e := range events { // events are sorted newest first
			if until != nil && e.CreatedAt > *until {
				continue
			}
			if len(out) == limit {
				break
			}
			out = append(out, e)
		}
		return out
	}
}

var serial int

func mk(timestamps ...int) []*nostr.Event {
	var out []*nostr.Event
	for _, ts := range timestamps {
		serial++
		out = append(out, &nostr.Event{ID: fmt.Sprintf("%04d", serial), CreatedAt: nostr.Timestamp(ts)})
	}
	return out
}

func TestCursor(t *testing.T) {
	same := make([]int, 12)
	for i := range same {
		same[i] = 50
	}
	tests := []struct {
		name      string
		events    []*nostr.Event
		limit     int
		wantFresh int
		maxPages  int
	}{
		{"empty", nil, 5, 0, 2},
		{"one page", mk(10, 9, 8), 5, 3, 3},
		{"exact pages", mk(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 5, 10, 10},
		{"ties across page boundary", mk(10, 9, 9, 9, 9, 9, 8, 7), 6, 8, 10},
		// 5 ties with a page of 3: only the 3 the relay returns are reachable.
		{"ties beyond a page are skipped, not looped on", mk(10, 9, 9, 9, 9, 9, 8, 7), 3, 6, 10},
		// 12 events share one timestamp, page of 5: the relay cannot return
		// more than 5 of them; the read must end anyway.
		{"more ties than a page", append(mk(same...), mk(40, 30)...), 5, 7, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			query := relayPages(tt.events, tt.limit)
			c := &history.Cursor{}
			seen := map[string]bool{}
			pages := 0
			for !c.Done() {
				pages++
				if pages > tt.maxPages+5 {
					t.Fatalf("did not terminate after %d pages", pages)
				}
				for _, e := range c.Next(query(c.Until())) {
					if seen[e.ID] {
						t.Fatalf("event %s returned twice", e.ID)
					}
					seen[e.ID] = true
				}
			}
			if len(seen) != tt.wantFresh {
				t.Fatalf("fresh = %d, want %d", len(seen), tt.wantFresh)
			}
		})
	}
}
