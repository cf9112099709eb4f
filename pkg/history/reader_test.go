package history_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

// simRelay answers REQs from a fixed set the way relays do: newest first,
// ties in id order, at most cap events per filter.
type simRelay struct {
	events      []*nostr.Event
	cap         int
	reqs        int
	ignoreUntil bool
}

func (s *simRelay) page(_ context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	s.reqs++
	if s.ignoreUntil && f.Since == nil {
		f.Until = nil
	}
	var out []*nostr.Event
	for _, e := range s.events {
		if f.Matches(e) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt != out[j].CreatedAt {
			return out[i].CreatedAt > out[j].CreatedAt
		}
		return out[i].ID < out[j].ID
	})
	n := s.cap
	if f.Limit > 0 && f.Limit < n {
		n = f.Limit
	}
	return out[:min(n, len(out))], nil
}

func (s *simRelay) all(ctx context.Context, f nostr.Filter, _ []string) ([]*nostr.Event, error) {
	cp := *s
	cp.cap = 1 << 30
	f.Limit = 0 // NIP-77 has no cap
	return cp.page(ctx, f)
}

type ev struct {
	at   nostr.Timestamp
	kind int
	tag  string
}

var simSerial int

func sim(specs ...[]ev) []*nostr.Event {
	var out []*nostr.Event
	for _, spec := range specs {
		for _, s := range spec {
			simSerial++
			out = append(out, &nostr.Event{ID: fmt.Sprintf("%064x", simSerial), CreatedAt: s.at, Kind: s.kind,
				Tags: nostr.Tags{{"a", s.tag}}})
		}
	}
	return out
}

// spread makes n events at second at, cycling over kinds and tag values.
func spread(n int, at nostr.Timestamp, kinds []int, tags []string) []ev {
	out := make([]ev, n)
	for i := range out {
		out[i] = ev{at, kinds[i%len(kinds)], tags[i%len(tags)]}
	}
	return out
}

func vals(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("30617:%064x:repo%d", i, i)
	}
	return out
}

func TestReaderCrowdedSeconds(t *testing.T) {
	kinds := []int{1617, 1618, 1619, 1621, 1630, 1631, 1632, 1633, 1111, 1}
	tests := []struct {
		name           string
		events         []*nostr.Event
		filter         nostr.Filter
		nip77          string // "", "ok" or "unsupported"
		short          bool
		want           int
		wantIncomplete int
	}{
		{"tag list split into halves", sim(spread(1000, 50, []int{1621}, vals(20)), spread(30, 40, []int{1621}, vals(20)), spread(3, 60, []int{1}, vals(1))),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(20)}}, "", false, 1033, 0},
		{"kinds split into halves", sim(spread(900, 50, kinds, vals(1)), spread(250, 49, kinds, vals(1))),
			nostr.Filter{Kinds: kinds, Tags: nostr.TagMap{"a": vals(1)}}, "", true, 1150, 0},
		{"a single value cannot be split", sim(spread(300, 50, []int{1621}, vals(1)), spread(5, 10, []int{1621}, vals(1))),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(1)}}, "", false, 105, 1},
		{"only the crowded value is incomplete", sim(spread(300, 50, []int{1621}, vals(1)), spread(40, 50, []int{1621}, vals(3)[1:])),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(3)}}, "", true, 140, 1},
		{"NIP-77 reads the second", sim(spread(1000, 50, []int{1621}, vals(1)), spread(5, 10, []int{1621}, vals(1))),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(1)}}, "ok", false, 1005, 0},
		{"NIP-77 unsupported: split", sim(spread(1000, 50, []int{1621}, vals(20))),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(20)}}, "unsupported", true, 1000, 0},
		{"exactly a cap in one second is read apart", sim(spread(100, 50, []int{1621}, vals(2)), spread(7, 49, []int{1621}, vals(2))),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(2)}}, "", true, 107, 0},
		{"second 0", sim(spread(300, 0, []int{1621}, vals(4))),
			nostr.Filter{Tags: nostr.TagMap{"a": vals(4)}}, "", false, 300, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			relay := &simRelay{events: tt.events, cap: 100}
			rd := &history.Reader{Page: relay.page, Full: 100, MaxPages: 1000, ShortPageEnds: tt.short}
			seconds := 0
			switch tt.nip77 {
			case "ok":
				rd.Second = func(ctx context.Context, f nostr.Filter, have []string) ([]*nostr.Event, error) {
					seconds++
					return relay.all(ctx, f, have)
				}
			case "unsupported":
				rd.Second = func(context.Context, nostr.Filter, []string) ([]*nostr.Event, error) {
					seconds++
					return nil, &negsync.UnsupportedError{Reason: "NOTICE: unknown envelope label"}
				}
			}
			got := map[string]bool{}
			f := tt.filter
			f.Limit = 500
			st, err := rd.Read(context.Background(), f, func(evts []*nostr.Event) error {
				for _, e := range evts {
					if got[e.ID] {
						t.Errorf("event %s delivered twice", e.ID)
					}
					got[e.ID] = true
				}
				return nil
			})
			if tt.wantIncomplete > 0 {
				var inc *history.IncompleteError
				if !errors.As(err, &inc) || !errors.Is(err, history.ErrIncomplete) {
					t.Fatalf("err = %v, want an IncompleteError", err)
				}
				if len(inc.Slices) != tt.wantIncomplete {
					t.Errorf("incomplete slices %v, want %d", inc.Slices, tt.wantIncomplete)
				}
				for _, s := range inc.Slices {
					if s.Since == nil || s.Until == nil || *s.Since != *s.Until {
						t.Errorf("incomplete slice %v is not one second", s)
					}
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want || st.Events != tt.want {
				t.Fatalf("read %d (stats %d) of %d events, want %d; %d REQs", len(got), st.Events, len(tt.events), tt.want, relay.reqs)
			}
			if tt.nip77 == "unsupported" && seconds != 1 {
				t.Errorf("NIP-77 asked %d times, want once per read", seconds)
			}
			t.Logf("%d events in %d REQs, %d crowded seconds", len(got), st.Pages, st.Seconds)
		})
	}
}

func TestSplit(t *testing.T) {
	tests := []struct {
		name string
		f    nostr.Filter
		ok   bool
		a, b nostr.Filter
	}{
		{"nothing to split", nostr.Filter{Kinds: []int{1621}, Tags: nostr.TagMap{"a": {"x"}}}, false, nostr.Filter{}, nostr.Filter{}},
		{"no lists", nostr.Filter{}, false, nostr.Filter{}, nostr.Filter{}},
		{"tag values", nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"e": {"1", "2", "3"}}}, true,
			nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"e": {"1"}}}, nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"e": {"2", "3"}}}},
		{"kinds when longest", nostr.Filter{Kinds: []int{1, 2, 3, 4}, Tags: nostr.TagMap{"d": {"x", "y"}}}, true,
			nostr.Filter{Kinds: []int{1, 2}, Tags: nostr.TagMap{"d": {"x", "y"}}}, nostr.Filter{Kinds: []int{3, 4}, Tags: nostr.TagMap{"d": {"x", "y"}}}},
		{"authors", nostr.Filter{Kinds: []int{30617}, Authors: []string{"p", "q"}}, true,
			nostr.Filter{Kinds: []int{30617}, Authors: []string{"p"}}, nostr.Filter{Kinds: []int{30617}, Authors: []string{"q"}}},
		{"ids", nostr.Filter{IDs: []string{"i", "j", "k"}}, true, nostr.Filter{IDs: []string{"i"}}, nostr.Filter{IDs: []string{"j", "k"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := tt.f.String()
			a, b, ok := history.Split(tt.f)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if tt.f.String() != orig {
				t.Errorf("Split changed its input: %s", tt.f)
			}
			if !ok {
				return
			}
			if !nostr.FilterEqual(a, tt.a) || !nostr.FilterEqual(b, tt.b) {
				t.Errorf("split %s = %s + %s, want %s + %s", tt.f, a, b, tt.a, tt.b)
			}
		})
	}
}

func TestCrowdedSecond(t *testing.T) {
	at := func(ts ...nostr.Timestamp) []*nostr.Event {
		var out []*nostr.Event
		for _, x := range ts {
			out = append(out, &nostr.Event{CreatedAt: x})
		}
		return out
	}
	tests := []struct {
		name    string
		page    []*nostr.Event
		full    int
		want    nostr.Timestamp
		crowded bool
	}{
		{"empty", nil, 3, 0, false},
		{"short", at(5, 5), 3, 0, false},
		{"full in one second", at(5, 5, 5), 3, 5, true},
		{"full over two seconds", at(6, 5, 5), 3, 0, false},
		{"longer than full", at(9, 9, 9, 9), 3, 9, true},
	}
	for _, tt := range tests {
		got, crowded := history.CrowdedSecond(tt.page, tt.full)
		if got != tt.want || crowded != tt.crowded {
			t.Errorf("%s: CrowdedSecond = %d, %v; want %d, %v", tt.name, got, crowded, tt.want, tt.crowded)
		}
	}
}

// A relay that ignores until on pages sends the crowded second again after
// it was read: the read stops with an error instead of reading it forever.
func TestReaderRelayIgnoringUntil(t *testing.T) {
	relay := &simRelay{events: sim(spread(300, 50, []int{1621}, vals(4)), spread(10, 40, []int{1621}, vals(4))), cap: 100, ignoreUntil: true}
	rd := &history.Reader{Page: relay.page, Full: 100, MaxPages: 1000}
	_, err := rd.Read(context.Background(), nostr.Filter{Tags: nostr.TagMap{"a": vals(4)}, Limit: 500}, func([]*nostr.Event) error { return nil })
	if !errors.Is(err, history.ErrIgnoresUntil) {
		t.Fatalf("err = %v, want ErrIgnoresUntil", err)
	}
	if relay.reqs > 20 {
		t.Errorf("%d REQs before giving up", relay.reqs)
	}
}

// distinct makes n events one second apart, the newest at second at.
func distinct(n int, at nostr.Timestamp, tag string) []ev {
	out := make([]ev, n)
	for i := range out {
		out[i] = ev{at - nostr.Timestamp(i), 1621, tag}
	}
	return out
}

// A relay may cap below Full: a short page ends the read only when the
// relay has returned a larger page (Cap); otherwise one more page is asked.
// reqs is the REQ count of the read, so the extra page is visible.
func TestReaderRelayCapsBelowFull(t *testing.T) {
	tag := vals(1)
	tests := []struct {
		name     string
		events   []*nostr.Event
		relayCap int
		known    int // largest page seen before the read
		want     int
		reqs     int
	}{
		{"230 over distinct seconds, cap 50", sim(distinct(230, 1000, tag[0])), 50, 0, 230, 5},
		{"cap 50 already seen", sim(distinct(230, 1000, tag[0])), 50, 50, 230, 5},
		{"cap 7", sim(distinct(30, 1000, tag[0])), 7, 0, 30, 5},
		{"short page, cap unknown: one more page", sim(distinct(30, 1000, tag[0])), 500, 0, 30, 2},
		{"short page, larger cap seen: no extra page", sim(distinct(30, 1000, tag[0])), 500, 31, 30, 1},
		{"short page in one second, cap unknown: one more page", sim(spread(30, 1000, []int{1621}, tag)), 500, 0, 30, 2},
		{"crowded second below Full, older events exist", sim(spread(80, 1000, []int{1621}, vals(4)), distinct(10, 900, tag[0])), 50, 0, 90, 0},
		{"empty", nil, 50, 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			relay := &simRelay{events: tt.events, cap: tt.relayCap}
			c := &history.Cap{}
			c.Observe(tt.known)
			rd := &history.Reader{Page: relay.page, Full: 100, MaxPages: 1000, ShortPageEnds: true, Cap: c}
			got := map[string]bool{}
			st, err := rd.Read(context.Background(), nostr.Filter{Tags: nostr.TagMap{"a": vals(4)}, Limit: 500}, func(evts []*nostr.Event) error {
				for _, e := range evts {
					if got[e.ID] {
						t.Errorf("event %s delivered twice", e.ID)
					}
					got[e.ID] = true
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want {
				t.Fatalf("read %d of %d events in %d REQs", len(got), tt.want, relay.reqs)
			}
			if tt.reqs > 0 && relay.reqs != tt.reqs {
				t.Errorf("%d REQs, want %d", relay.reqs, tt.reqs)
			}
			if c.Known() < min(tt.relayCap, len(tt.events)) {
				t.Errorf("cap known %d, relay returned pages of %d", c.Known(), min(tt.relayCap, len(tt.events)))
			}
			t.Logf("%d events in %d REQs (%d crowded seconds)", len(got), st.Pages, st.Seconds)
		})
	}
}

// Discovery's reads (no ShortPageEnds, no shared Cap) on a relay capping at
// 50, below Full: a second of 80 events followed by older ones is read
// completely, because the older page proves the relay stopped at its cap.
// A read whose oldest second is crowded that way stays a guess.
func TestReaderCrowdedSecondBelowFullWithoutShortPages(t *testing.T) {
	tests := []struct {
		name   string
		events []*nostr.Event
		want   int
	}{
		{"older events follow", sim(spread(80, 1000, []int{1621}, vals(4)), distinct(10, 900, vals(1)[0])), 90},
		{"newer and older events around", sim(distinct(20, 2000, vals(1)[0]), spread(80, 1000, []int{1621}, vals(4)), distinct(10, 900, vals(1)[0])), 110},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			relay := &simRelay{events: tt.events, cap: 50}
			rd := &history.Reader{Page: relay.page, Full: 100, MaxPages: 1000}
			got := map[string]bool{}
			st, err := rd.Read(context.Background(), nostr.Filter{Tags: nostr.TagMap{"a": vals(4)}, Limit: 500}, func(evts []*nostr.Event) error {
				for _, e := range evts {
					got[e.ID] = true
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want || st.Events != tt.want {
				t.Fatalf("read %d (stats %d) of %d events in %d REQs", len(got), st.Events, tt.want, relay.reqs)
			}
			t.Logf("%d events in %d REQs, %d crowded seconds", len(got), st.Pages, st.Seconds)
		})
	}
}

// A relay sends a subscription what is stored while it answers, before its
// EOSE (khatru and nostr-rs-relay register the subscription's listener with
// the query). Events synced from elsewhere carry old created_at values: such
// an event older than the page's answer must not move the next page's until
// below events not yet read. In make bench-scale's cluster row, discovery's
// whole-history read mid-sync returned 1,831 of ~30,000 stored events this
// way (docs/decisions/0069-history-pages-ignore-broadcasts.md).
func TestReaderPageWithBroadcastOlderEvents(t *testing.T) {
	tag := vals(1)
	for _, limit := range []int{500, 100} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			events := sim(distinct(2000, 5000, tag[0]))
			relay := &simRelay{events: events, cap: limit}
			pages := 0
			// Every page also carries the three oldest stored events, as
			// if they had just been stored and broadcast, ahead of the
			// answer.
			oldest := func() []*nostr.Event {
				out := slices.Clone(events)
				sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
				return out[:3]
			}()
			page := func(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
				evts, err := relay.page(ctx, f)
				pages++
				// What the relay broadcasts matches the subscription's
				// filter (its until included), like what it answers.
				var sent []*nostr.Event
				for _, e := range oldest {
					if f.Matches(e) {
						sent = append(sent, e)
					}
				}
				return append(sent, evts...), err
			}
			got := map[string]bool{}
			rd := &history.Reader{Page: page, Full: 100, MaxPages: 1000}
			if _, err := rd.Read(context.Background(), nostr.Filter{Tags: nostr.TagMap{"a": tag}, Limit: limit}, func(evts []*nostr.Event) error {
				for _, e := range evts {
					got[e.ID] = true
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(events) {
				t.Fatalf("read %d of %d events in %d REQs", len(got), len(events), pages)
			}
		})
	}
}

func TestAnswer(t *testing.T) {
	at := func(ts ...nostr.Timestamp) []*nostr.Event {
		out := make([]*nostr.Event, len(ts))
		for i, x := range ts {
			out[i] = &nostr.Event{ID: fmt.Sprint(i), CreatedAt: x}
		}
		return out
	}
	times := func(evts []*nostr.Event) []nostr.Timestamp {
		out := make([]nostr.Timestamp, len(evts))
		for i, e := range evts {
			out[i] = e.CreatedAt
		}
		return out
	}
	tests := []struct {
		name  string
		page  []*nostr.Event
		limit int
		want  []nostr.Timestamp
	}{
		{"within the limit", at(9, 8, 1), 3, []nostr.Timestamp{9, 8, 1}},
		{"no limit", at(9, 8, 1, 7), 0, []nostr.Timestamp{9, 8, 1, 7}},
		{"an older broadcast dropped", at(9, 1, 8, 7), 3, []nostr.Timestamp{9, 8, 7}},
		{"ties at the cut kept in page order", at(9, 5, 5, 5, 1), 3, []nostr.Timestamp{9, 5, 5}},
		{"a newer broadcast kept, the answer's oldest dropped", at(20, 9, 8, 7), 3, []nostr.Timestamp{20, 9, 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := times(history.Answer(tt.page, tt.limit)); !slices.Equal(got, tt.want) {
				t.Errorf("Answer = %v, want %v", got, tt.want)
			}
		})
	}
}
