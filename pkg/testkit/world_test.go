package testkit

import (
	"slices"
	"testing"
)

// TestWorldDeterministic: the same spec signs the same ids; every event
// is on 2–3 of its repository's 5 relays; counts follow the spec.
func TestWorldDeterministic(t *testing.T) {
	spec := WorldSpec{Repos: 20, Relays: 12, RootsPerRepo: 4, CommentsPerRoot: 1, Seed: 7}
	a, b := GenerateWorld(spec), GenerateWorld(spec)
	if len(a.Events) != 20*(spec.EventsPerRepo()-1) {
		t.Fatalf("%d events, want %d", len(a.Events), 20*(spec.EventsPerRepo()-1))
	}
	ids := map[string]bool{}
	for i, e := range a.Events {
		if e.Event.ID != b.Events[i].Event.ID || !slices.Equal(e.Relays, b.Events[i].Relays) {
			t.Fatalf("event %d differs between two generations", i)
		}
		if ok, err := e.Event.CheckSignature(); !ok || err != nil {
			t.Fatalf("event %d: bad signature (%v)", i, err)
		}
		ids[e.Event.ID] = true
		if n := len(e.Relays); n < 2 || n > 3 {
			t.Errorf("event %d on %d relays", i, n)
		}
	}
	if len(ids) != len(a.Events) {
		t.Errorf("%d distinct ids for %d events", len(ids), len(a.Events))
	}
	urls := make([]string, spec.Relays)
	for i := range urls {
		urls[i] = "ws://127.0.0.1:" + string(rune('a'+i))
	}
	anns := a.Announcements("ws://127.0.0.1:1", urls)
	if len(anns) != 20 || len(anns[3].Tags.Find("relays")) != 1+1+5 {
		t.Errorf("announcement relays tag %v", anns[3].Tags.Find("relays"))
	}
}
