package policy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

func TestStatefulRules(t *testing.T) {
	const ok = policy.ReasonAccepted
	tests := []struct {
		name  string
		steps func(t *testing.T, alice, mallory user) []step
	}{
		{"duplicate", func(t *testing.T, a, m user) []step {
			issue := m.ev(t, 1621, 0, "bug", nostr.Tag{"a", a.coord("repo")})
			return []step{{"first", issue, ok}, {"again", issue, policy.ReasonDuplicate}}
		}},
		{"announcement versions", func(t *testing.T, a, m user) []step {
			v2 := a.served(t, "repo", 2*time.Second)
			return []step{
				{"older version refused", a.served(t, "repo", -time.Hour), policy.ReasonOlderVersion},
				{"same version re-sent", a.served(t, "repo", 0), policy.ReasonDuplicate},
				{"newer version accepted", v2, ok},
				{"the replaced version is now older", a.served(t, "repo", time.Second), policy.ReasonOlderVersion},
			}
		}},
		{"owner may move the repo away (owner exception)", func(t *testing.T, a, m user) []step {
			clone, relays := elsewhere("repo")
			return []step{
				{"newer version listing elsewhere", a.announce(t, "repo", time.Minute, clone, relays), ok},
				{"then nobody is served: states refused", a.ev(t, 30618, time.Minute, "", nostr.Tag{"d", "repo"}), policy.ReasonNotMaintainer},
			}
		}},
		{"replaceable older version", func(t *testing.T, a, m user) []step {
			return []step{
				{"grasp list", m.ev(t, 10317, 0, "", nostr.Tag{"g", service}), ok},
				{"older grasp list", m.ev(t, 10317, -time.Minute, "", nostr.Tag{"g", service}), policy.ReasonOlderVersion},
				{"newer grasp list", m.ev(t, 10317, time.Minute, ""), ok},
			}
		}},
		{"deleted event re-sent", func(t *testing.T, a, m user) []step {
			issue := m.ev(t, 1621, 0, "bug", nostr.Tag{"a", a.coord("repo")})
			return []step{
				{"issue", issue, ok},
				{"deletion", m.ev(t, 5, time.Second, "", nostr.Tag{"e", issue.ID}), ok},
				{"re-sent", issue, policy.ReasonDeleted},
			}
		}},
		{"deletion before its target", func(t *testing.T, a, m user) []step {
			issue := m.ev(t, 1621, 0, "bug", nostr.Tag{"a", a.coord("repo")})
			return []step{
				{"deletion of an unknown own event", m.ev(t, 5, time.Second, "", nostr.Tag{"e", issue.ID}), ok},
				{"target arrives", issue, policy.ReasonDeleted},
			}
		}},
		{"coordinate deletion covers versions up to its time", func(t *testing.T, a, m user) []step {
			return []step{
				{"owner deletes the repo", a.ev(t, 5, time.Minute, "", nostr.Tag{"a", a.coord("repo")}), ok},
				{"old version re-sent", a.served(t, "repo", 0), policy.ReasonDeleted},
				{"version from before the deletion", a.served(t, "repo", 30*time.Second), policy.ReasonDeleted},
				{"version at the deletion's time", a.served(t, "repo", time.Minute), policy.ReasonDeleted},
				{"newer version after the deletion", a.served(t, "repo", 2*time.Minute), ok},
			}
		}},
		{"deletion of another's event that is not stored", func(t *testing.T, a, m user) []step {
			note := a.ev(t, 1, 0, "unrelated")
			return []step{
				// Accepted (nothing to attribute, and it can only ever
				// remove mallory's own events) but it must not anchor.
				{"mallory deletes an unknown id", m.ev(t, 5, 0, "", nostr.Tag{"e", note.ID}), ok},
				{"the note arrives: not deleted, still unanchored", note, policy.ReasonNoReference},
			}
		}},
		{"deletions and grasp lists do not anchor", func(t *testing.T, a, m user) []step {
			note := m.ev(t, 1, 0, "spam")
			list := m.ev(t, 10317, 0, "", nostr.Tag{"e", note.ID})
			return []step{
				{"grasp list tagging spam", list, ok},
				{"spam tagged by the list", note, policy.ReasonNoReference},
				{"spam replying to the list", m.ev(t, 1, 0, "spam", nostr.Tag{"e", list.ID}), policy.ReasonNoReference},
				{"spam quoting the list", m.ev(t, 1, 0, "spam", nostr.Tag{"q", "10317:" + m.pk + ":"}), policy.ReasonNoReference},
			}
		}},
		{"bad identifiers", func(t *testing.T, a, m user) []step {
			bad := func(tags ...nostr.Tag) *nostr.Event {
				return a.ev(t, 30617, 0, "", append(tags, nostr.Tag{"clone", "https://" + ourHost + "/x.git"}, nostr.Tag{"relays", service})...)
			}
			return []step{
				{"no d", bad(), policy.ReasonBadIdentifier},
				{"empty d", bad(nostr.Tag{"d", ""}), policy.ReasonBadIdentifier},
				{"dot", bad(nostr.Tag{"d", "."}), policy.ReasonBadIdentifier},
				{"dot dot", bad(nostr.Tag{"d", ".."}), policy.ReasonBadIdentifier},
				{"slash", bad(nostr.Tag{"d", "a/b"}), policy.ReasonBadIdentifier},
				{"backslash", bad(nostr.Tag{"d", `a\b`}), policy.ReasonBadIdentifier},
				{"NUL", bad(nostr.Tag{"d", "a\x00b"}), policy.ReasonBadIdentifier},
				{"d tag without value", bad(nostr.Tag{"d"}), policy.ReasonBadIdentifier},
				{"dots inside are fine", bad(nostr.Tag{"d", "a..b.c"}), ok},
				{"state with bad d", a.ev(t, 30618, 0, "", nostr.Tag{"d", "../x"}), policy.ReasonBadIdentifier},
			}
		}},
		{"multi-value clone and relays tags", func(t *testing.T, a, m user) []step {
			return []step{{"announcement", m.ev(t, 30617, 0, "",
				nostr.Tag{"d", "multi"},
				nostr.Tag{"clone", "https://github.com/m/multi.git", "https://GIT.example.com/npub1x/multi.git"},
				nostr.Tag{"relays", "wss://relay.damus.io", "not a url", "wss://git.example.com/"},
			), ok}}
		}},
		{"maintainer cycle", func(t *testing.T, a, m user) []step {
			b, c := newUser(t), newUser(t)
			clone, relays := elsewhere("cyc")
			return []step{
				{"owner", a.served(t, "cyc", 0, b.pk), ok},
				{"b names c", b.announce(t, "cyc", 0, clone, relays, c.pk, a.pk), ok},
				{"c names b (cycle)", c.announce(t, "cyc", 0, clone, relays, b.pk), ok},
				{"outsider", m.announce(t, "cyc", 0, clone, relays, b.pk, c.pk), policy.ReasonNotListed},
				{"c's state", c.ev(t, 30618, 0, "", nostr.Tag{"d", "cyc"}), ok},
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			alice, mallory := newUser(t), newUser(t)
			if d := e.submit(t, alice.served(t, "repo", 0)); !d.Accept {
				t.Fatalf("served repo refused: %+v", d)
			}
			run(t, e, tt.steps(t, alice, mallory))
		})
	}
}

func TestCoordinateDeletionRemovesAnnouncement(t *testing.T) {
	e := newEnv(t)
	alice := newUser(t)
	ann := alice.served(t, "repo", 0)
	e.submit(t, ann)
	if d := e.submit(t, alice.ev(t, 5, time.Minute, "", nostr.Tag{"a", alice.coord("repo")})); !d.Accept {
		t.Fatalf("own coordinate deletion refused: %+v", d)
	}
	if e.stored(t, ann.ID) {
		t.Fatal("deleted announcement still stored")
	}
}

func TestMissing(t *testing.T) {
	e := newEnv(t)
	alice, bob, mallory := newUser(t), newUser(t), newUser(t)
	e.submit(t, alice.served(t, "repo", 0))
	if d := e.submit(t, alice.served(t, "team", 0, bob.pk)); !d.Accept {
		t.Fatalf("team repo refused: %+v", d)
	}
	unknownID := mallory.ev(t, 1, 0, "x").ID

	tests := []struct {
		name     string
		evt      *nostr.Event
		reason   policy.Reason
		missing  []string // must all be in Missing
		parkable bool
	}{
		{"13 orphan issue names the repo", mallory.ev(t, 1621, 0, "bug", nostr.Tag{"a", mallory.coord("unknown")}),
			policy.ReasonNoReference, []string{mallory.coord("unknown")}, true},
		{"comment names root id and repo", mallory.ev(t, 1111, 0, "c", nostr.Tag{"E", unknownID}, nostr.Tag{"A", mallory.coord("unknown")}, nostr.Tag{"e", unknownID}),
			policy.ReasonNoReference, []string{mallory.coord("unknown"), unknownID}, true},
		{"no tags: nothing named, still parkable (forward reference)", mallory.ev(t, 1, 0, "x"),
			policy.ReasonNoReference, nil, true},
		{"malformed references are not listed", mallory.ev(t, 1, 0, "x", nostr.Tag{"e", "abc"}, nostr.Tag{"a", "30617:zz:repo"}, nostr.Tag{"q", strings.ToUpper(unknownID)}, nostr.Tag{"e"}),
			policy.ReasonNoReference, nil, true},
		{"state without any announcement waits for the author's", bob.ev(t, 30618, 0, "", nostr.Tag{"d", "later"}),
			policy.ReasonNotMaintainer, []string{bob.coord("later")}, true},
		{"state by a non-maintainer waits for their own announcement", bob.ev(t, 30618, 0, "", nostr.Tag{"d", "repo"}),
			policy.ReasonNotMaintainer, []string{bob.coord("repo")}, true},
		{"maintainer announcement before the owner's", bob.announce(t, "later", 0, "https://github.com/b/later.git", "wss://relay.damus.io", alice.pk),
			policy.ReasonNotMaintainer, []string{alice.coord("later")}, true},
		{"not listed, no repo, no maintainers named: not parkable", mallory.announce(t, "solo", 0, "https://github.com/m/solo.git", "wss://relay.damus.io"),
			policy.ReasonNotMaintainer, nil, false},
		{"not listed, served repo, every maintainer announced: not parkable", mallory.announce(t, "repo", 0, "https://github.com/m/repo.git", "wss://relay.damus.io", alice.pk),
			policy.ReasonNotListed, nil, false},
		{"not listed while a maintainer's announcement is missing", mallory.announce(t, "team", 0, "https://github.com/m/team.git", "wss://relay.damus.io"),
			policy.ReasonNotListed, []string{bob.coord("team")}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := e.p.Evaluate(context.Background(), tt.evt)
			if d.Accept || d.Reason != tt.reason {
				t.Fatalf("got %+v, want %q", d, tt.reason)
			}
			for _, m := range tt.missing {
				if !slices.Contains(d.Missing, m) {
					t.Errorf("Missing %v lacks %s", d.Missing, m)
				}
			}
			if tt.missing == nil && len(d.Missing) > 0 {
				t.Errorf("Missing = %v, want none", d.Missing)
			}
			if d.Parkable() != tt.parkable {
				t.Errorf("Parkable() = %v, want %v", d.Parkable(), tt.parkable)
			}
			for _, m := range d.Missing {
				if !strings.Contains(d.Message, m) && tt.reason == policy.ReasonNoReference && m == d.Missing[0] {
					t.Errorf("message %q does not name %s", d.Message, m)
				}
			}
		})
	}

	// The parked maintainer announcement is accepted once the owner's arrives.
	bobAnn := bob.announce(t, "later", 0, "https://github.com/b/later.git", "wss://relay.damus.io", alice.pk)
	if d := e.submit(t, alice.served(t, "later", 0, bob.pk)); !d.Accept {
		t.Fatalf("owner refused: %+v", d)
	}
	if d := e.submit(t, bobAnn); !d.Accept {
		t.Fatalf("re-evaluated maintainer announcement refused: %+v", d)
	}
}

func TestMissingIsBounded(t *testing.T) {
	e := newEnv(t)
	m := newUser(t)
	var tags []nostr.Tag
	for i := 0; i < 1500; i++ {
		tags = append(tags, nostr.Tag{"e", fakeID(i)})
	}
	d := e.p.Evaluate(context.Background(), m.ev(t, 1, 0, "many", tags...))
	if d.Reason != policy.ReasonNoReference {
		t.Fatalf("got %+v", d.Reason)
	}
	if len(d.Missing) == 0 || len(d.Missing) > 100 {
		t.Fatalf("len(Missing) = %d, want 1..100", len(d.Missing))
	}
}

// fakeID returns a well-formed event id nothing has: references to unknown
// events need no signed event behind them (signing thousands is slow).
func fakeID(i int) string {
	sum := sha256.Sum256([]byte("fake-" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:])
}
