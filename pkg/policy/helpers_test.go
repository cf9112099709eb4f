package policy_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

func TestReferencesAndCoordinate(t *testing.T) {
	a, b := newUser(t), newUser(t)
	id := b.ev(t, 1, 0, "x").ID
	tests := []struct {
		name   string
		evt    *nostr.Event
		ids    []string
		coords []string
		coord  string
	}{
		{"issue names its repo", b.ev(t, 1621, 0, "", nostr.Tag{"a", a.coord("repo")}), nil, []string{a.coord("repo")}, ""},
		{"comment names root and parent once", b.ev(t, 1111, 0, "", nostr.Tag{"E", id}, nostr.Tag{"e", id}, nostr.Tag{"A", a.coord("r")}),
			[]string{id}, []string{a.coord("r")}, ""},
		{"q holds either", b.ev(t, 1, 0, "", nostr.Tag{"q", id}, nostr.Tag{"q", a.coord("r")}), []string{id}, []string{a.coord("r")}, ""},
		{"malformed and non-anchoring skipped", b.ev(t, 1, 0, "", nostr.Tag{"e", "xyz"}, nostr.Tag{"a", "10317:" + a.pk + ":"}, nostr.Tag{"p", id}), nil, nil, ""},
		{"announcement has a coordinate", a.served(t, "repo", 0), nil, nil, a.coord("repo")},
		{"replaceable coordinate has an empty d", a.ev(t, 10317, 0, ""), nil, nil, "10317:" + a.pk + ":"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, coords := policy.References(tt.evt)
			if !slices.Equal(ids, tt.ids) || !slices.Equal(coords, tt.coords) {
				t.Fatalf("References = %v %v, want %v %v", ids, coords, tt.ids, tt.coords)
			}
			c, ok := policy.Coordinate(tt.evt)
			if c != tt.coord || ok != (tt.coord != "") {
				t.Fatalf("Coordinate = %q %v, want %q", c, ok, tt.coord)
			}
		})
	}
	if ids, coords := policy.References(nil); ids != nil || coords != nil {
		t.Fatal("References(nil) not empty")
	}
}

func TestDeletionFiltersAndDeletes(t *testing.T) {
	e := newEnv(t)
	a, m := newUser(t), newUser(t)
	ann := a.served(t, "repo", 0)
	newer := a.served(t, "repo", 2*time.Minute)
	issue := m.ev(t, 1621, 0, "", nostr.Tag{"a", a.coord("repo")})
	note := m.ev(t, 1, 0, "", nostr.Tag{"e", issue.ID})
	alien := a.ev(t, 1621, 0, "alice's", nostr.Tag{"a", a.coord("repo")})
	for _, evt := range []*nostr.Event{ann, issue, note, alien} {
		if d := e.submit(t, evt); !d.Accept {
			t.Fatalf("setup: %+v", d)
		}
	}
	tests := []struct {
		name    string
		del     *nostr.Event
		deletes []string // ids removed from the store
	}{
		{"own ids", m.ev(t, 5, time.Minute, "", nostr.Tag{"e", issue.ID}, nostr.Tag{"e", note.ID}), []string{issue.ID, note.ID}},
		{"another's id is not a target", m.ev(t, 5, time.Minute, "", nostr.Tag{"e", alien.ID}), nil},
		{"own coordinate up to the deletion", a.ev(t, 5, time.Minute, "", nostr.Tag{"a", a.coord("repo")}), []string{ann.ID}},
		{"another's coordinate is not a target", m.ev(t, 5, time.Minute, "", nostr.Tag{"a", a.coord("repo")}), nil},
		{"coordinate deletion older than the version", a.ev(t, 5, -time.Minute, "", nostr.Tag{"a", a.coord("repo")}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, f := range policy.DeletionFilters(tt.del) {
				if f.Limit <= 0 {
					t.Fatalf("filter without limit: %v", f)
				}
				found, err := badgerLookup{e.db}.Query(context.Background(), f)
				if err != nil {
					t.Fatal(err)
				}
				for _, target := range found {
					if policy.Deletes(tt.del, target) {
						got = append(got, target.ID)
					}
				}
			}
			slices.Sort(got)
			want := slices.Clone(tt.deletes)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("targets %v, want %v", got, want)
			}
		})
	}
	if policy.Deletes(a.ev(t, 5, time.Hour, "", nostr.Tag{"a", a.coord("repo")}), newer) != true {
		t.Fatal("coordinate deletion after a version does not delete it")
	}
	if policy.Deletes(a.ev(t, 5, time.Minute, "", nostr.Tag{"a", a.coord("repo")}), newer) {
		t.Fatal("coordinate deletion removes a newer version")
	}
	if policy.Deletes(m.ev(t, 5, 0, "", nostr.Tag{"e", issue.ID}), m.ev(t, 5, 0, "", nostr.Tag{"e", strings.Repeat("a", 64)})) {
		t.Fatal("a deletion deleted a deletion")
	}
	if policy.DeletionFilters(issue) != nil {
		t.Fatal("filters for a non-deletion")
	}
}

// BenchmarkEvaluate measures one evaluation per event shape against a real
// (badger) store holding a served repository and an issue.
func BenchmarkEvaluate(b *testing.B) {
	e := newEnv(b)
	alice, bob := newUser(b), newUser(b)
	e.submit(b, alice.served(b, "repo", 0, bob.pk))
	issue := bob.ev(b, 1621, 0, "it broke", nostr.Tag{"a", alice.coord("repo")})
	e.submit(b, issue)
	forged := bob.ev(b, 1621, 0, "forged", nostr.Tag{"a", alice.coord("repo")})
	forged.Sig = issue.Sig
	clone, relays := elsewhere("repo")
	cases := []struct {
		name   string
		evt    *nostr.Event
		accept bool
	}{
		{"issue-by-repo", bob.ev(b, 1621, 0, "new", nostr.Tag{"a", alice.coord("repo")}), true},
		{"comment-by-root-id", bob.ev(b, 1111, 0, "c", nostr.Tag{"E", issue.ID}, nostr.Tag{"e", issue.ID}, nostr.Tag{"K", "1621"}), true},
		{"served-announcement", alice.served(b, "other", 0), true},
		{"maintainer-announcement", bob.announce(b, "repo", 0, clone, relays, alice.pk), true},
		{"state-by-maintainer", bob.ev(b, 30618, 0, "", nostr.Tag{"d", "repo"}, nostr.Tag{"HEAD", "ref: refs/heads/main"}), true},
		{"orphan-refused", bob.ev(b, 1, 0, "spam"), false},
		{"forged-refused", forged, false},
	}
	ctx := context.Background()
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if d := e.p.Evaluate(ctx, c.evt); d.Accept != c.accept {
					b.Fatalf("got %+v", d)
				}
			}
		})
	}
}
