package fetcher

import (
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// firstPage keeps what comes before the first EOSE, up to its bound, as
// history; everything after EOSE, or after the batch stopped waiting, is
// live; an answer past the bound or without EOSE is not the whole history.
func TestFirstPage(t *testing.T) {
	evt := func(id string) *nostr.Event { return &nostr.Event{ID: id} }
	cases := []struct {
		name      string
		run       func(p *firstPage) []bool // add results
		wantN     int
		wantWhole bool
	}{
		{"answer then EOSE", func(p *firstPage) []bool {
			out := []bool{p.add(evt("a")), p.add(evt("b"))}
			p.eose()
			return append(out, p.add(evt("live")))
		}, 2, true},
		{"empty answer", func(p *firstPage) []bool { p.eose(); return []bool{p.add(evt("live"))} }, 0, true},
		{"past the bound", func(p *firstPage) []bool {
			out := []bool{p.add(evt("a")), p.add(evt("b")), p.add(evt("c"))}
			p.eose()
			return out
		}, 2, false},
		{"no EOSE", func(p *firstPage) []bool { return []bool{p.add(evt("a"))} }, 1, false},
	}
	want := map[string][]bool{
		"answer then EOSE": {true, true, false},
		"empty answer":     {false},
		"past the bound":   {true, true, true},
		"no EOSE":          {true},
	}
	for _, c := range cases {
		p := newFirstPage(2)
		got := c.run(p)
		evts, whole := p.take()
		if len(evts) != c.wantN || whole != c.wantWhole {
			t.Errorf("%s: %d events, whole %v; want %d, %v", c.name, len(evts), whole, c.wantN, c.wantWhole)
		}
		for i := range got {
			if got[i] != want[c.name][i] {
				t.Errorf("%s: add #%d kept as history: %v, want %v", c.name, i, got[i], want[c.name][i])
			}
		}
		if p.add(evt("late")) {
			t.Errorf("%s: an event after take kept as history", c.name)
		}
	}
}
