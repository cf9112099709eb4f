package fetcher

import (
	"fmt"
	"testing"
	"time"
)

// The memory of acknowledged ids holds at most its size, forgets the oldest
// first and forgets everything after its TTL.
func TestRecentIDsBoundedAndExpiring(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	r := newRecentIDs(4, time.Minute)
	key := func(i int) recentKey { return recentKeyOf(fmt.Sprintf("id%d:sig", i)) }
	for i := range 10 {
		r.add(key(i), now)
	}
	if n := r.len(); n != 4 {
		t.Fatalf("%d ids remembered, want 4", n)
	}
	for i := range 10 {
		if got, want := r.has(key(i), now), i >= 6; got != want {
			t.Fatalf("id %d remembered: %v, want %v", i, got, want)
		}
	}
	// Adding a remembered id again renews it and keeps the count.
	r.add(key(6), now.Add(50*time.Second))
	if n := r.len(); n != 4 {
		t.Fatalf("%d ids remembered after a renewal, want 4", n)
	}
	if r.has(key(7), now.Add(time.Minute)) {
		t.Fatal("an id older than the TTL is still remembered")
	}
	if !r.has(key(6), now.Add(time.Minute)) {
		t.Fatal("a renewed id was forgotten")
	}
	if newRecentIDs(0, time.Minute).has(key(1), now) {
		t.Fatal("a memory of size 0 remembers")
	}
}
