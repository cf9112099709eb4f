package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// Publishing over the websocket: the write policy's cases, refusals with
// their prefixes, deletions, and events a verifier would choke on.

// outcome is what a step expects: accepted, or refused with a prefix.
type outcome string

const accepted outcome = ""

type step struct {
	name string
	evt  *nostr.Event
	want outcome // "" accepted, else the OK message prefix
}

// TestAcceptanceCasesOverWebsocket runs the 18 acceptance cases of
// docs/policy.md through the relay's websocket, each on a fresh relay whose
// store holds alice's served repository "repo" (cases 4 and 16 build it
// themselves).
func TestAcceptanceCasesOverWebsocket(t *testing.T) {
	const blocked outcome = "blocked: "
	elseClone, elseRelays := "https://github.com/someone/repo.git", "wss://relay.damus.io"
	tests := []struct {
		name  string
		steps func(a, b, c, m testkit.Key) []step
	}{
		{"01 announcement listing us", func(a, b, c, m testkit.Key) []step {
			return []step{{"bob's served repo", served(b, "other"), accepted}}
		}},
		{"02 clone elsewhere, relays us", func(a, b, c, m testkit.Key) []step {
			return []step{{"refused", announce(m, "x", elseClone, service), blocked}}
		}},
		{"03 clone us, relays elsewhere", func(a, b, c, m testkit.Key) []step {
			return []step{{"refused", announce(m, "x", testkit.GraspCloneURL(service, m.PubKey, "x"), elseRelays), blocked}}
		}},
		{"04 recursive maintainer listing elsewhere", func(a, b, c, m testkit.Key) []step {
			return []step{
				{"owner names bob", served(a, "team", b.PubKey), accepted},
				{"bob names carol", announce(b, "team", elseClone, elseRelays, a.PubKey, c.PubKey), accepted},
				{"carol", announce(c, "team", elseClone, elseRelays), accepted},
				{"mallory", announce(m, "team", elseClone, elseRelays, a.PubKey), blocked},
			}
		}},
		{"05 issue with a = served repo", func(a, b, c, m testkit.Key) []step {
			return []step{{"issue", m.Issue(testkit.RepoRef(a.PubKey, "repo"), "bug"), accepted}}
		}},
		{"06 comment with A = served repo", func(a, b, c, m testkit.Key) []step {
			return []step{{"comment", m.RepoComment(testkit.RepoRef(a.PubKey, "repo"), "hi"), accepted}}
		}},
		{"07 kind 1 with q = served repo", func(a, b, c, m testkit.Key) []step {
			return []step{{"note", m.Note("look", testkit.WithTags(nostr.Tag{"q", testkit.RepoRef(a.PubKey, "repo")})), accepted}}
		}},
		{"08 issue on unknown repo quoting an accepted issue", func(a, b, c, m testkit.Key) []step {
			issue := a.Issue(testkit.RepoRef(a.PubKey, "repo"), "root")
			return []step{
				{"accepted issue", issue, accepted},
				{"issue", m.Issue(testkit.RepoRef(m.PubKey, "unknown"), "dup", testkit.WithTags(nostr.Tag{"q", issue.ID})), accepted},
			}
		}},
		{"09 comment on accepted issue", func(a, b, c, m testkit.Key) []step {
			issue := a.Issue(testkit.RepoRef(a.PubKey, "repo"), "root")
			return []step{{"issue", issue, accepted}, {"comment", m.Comment(issue, issue, "me too"), accepted}}
		}},
		{"10 kind 1 replying to accepted kind 1", func(a, b, c, m testkit.Key) []step {
			note := a.Note("about", testkit.WithTags(nostr.Tag{"q", testkit.RepoRef(a.PubKey, "repo")}))
			return []step{{"note", note, accepted}, {"reply", m.Note("reply", testkit.WithTags(nostr.Tag{"e", note.ID, "", "root"})), accepted}}
		}},
		{"11 forward reference", func(a, b, c, m testkit.Key) []step {
			note := m.Note("untagged")
			return []step{
				{"issue quoting the note", a.Issue(testkit.RepoRef(a.PubKey, "repo"), "see", testkit.WithTags(nostr.Tag{"q", note.ID})), accepted},
				{"the note", note, accepted},
			}
		}},
		{"12 chains by forward reference", func(a, b, c, m testkit.Key) []step {
			n1 := b.Note("n1")
			n2 := b.Note("n2", testkit.WithTags(nostr.Tag{"e", n1.ID}))
			n3 := b.Note("n3", testkit.WithTags(nostr.Tag{"q", testkit.RepoRef(a.PubKey, "repo")}, nostr.Tag{"e", n2.ID}))
			return []step{
				{"n1 orphan", n1, blocked},
				{"n3 anchored", n3, accepted},
				{"n2 via n3", n2, accepted},
				{"n1 via n2", n1, accepted},
			}
		}},
		{"13 issue on unknown repo only", func(a, b, c, m testkit.Key) []step {
			return []step{{"issue", m.Issue(testkit.RepoRef(m.PubKey, "unknown"), "bug"), blocked}}
		}},
		{"14 kind 1 without tags", func(a, b, c, m testkit.Key) []step {
			return []step{{"note", m.Note("spam"), blocked}}
		}},
		{"15 comment with A = unknown repo", func(a, b, c, m testkit.Key) []step {
			return []step{{"comment", m.RepoComment(testkit.RepoRef(m.PubKey, "unknown"), "hi"), blocked}}
		}},
		{"16 state by owner or recursive maintainer only", func(a, b, c, m testkit.Key) []step {
			refs := map[string]string{"refs/heads/main": testkit.FakeCommit()}
			return []step{
				{"owner names bob", served(a, "team", b.PubKey), accepted},
				{"bob names carol", announce(b, "team", elseClone, elseRelays, c.PubKey), accepted},
				{"owner's state", a.State("team", refs), accepted},
				{"carol's state", c.State("team", refs), accepted},
				{"mallory's state", m.State("team", refs), blocked},
			}
		}},
		{"17 deletions", func(a, b, c, m testkit.Key) []step {
			issue := a.Issue(testkit.RepoRef(a.PubKey, "repo"), "bug")
			note := m.Note("mine", testkit.WithTags(nostr.Tag{"e", issue.ID}))
			return []step{
				{"issue", issue, accepted},
				{"mallory's note", note, accepted},
				{"mallory deletes alice's issue", m.Deletion([]*nostr.Event{issue}), blocked},
				{"mallory deletes her note", m.Deletion([]*nostr.Event{note}), accepted},
				{"deleted note re-sent", note, blocked},
				{"issue still stored (duplicate is OK true)", issue, accepted},
			}
		}},
		{"18 host confusion", func(a, b, c, m testkit.Key) []step {
			evil := ourHost + ".evil.net"
			return []step{
				{"clone and relays on our-host.evil.net", announce(m, "x", "https://"+evil+"/npub1x/x.git", "wss://"+evil), blocked},
				{"clone only", announce(m, "x", "https://"+evil+"/npub1x/x.git", service), blocked},
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, serverOpts{})
			c := dial(t, s.url)
			alice, bob, carol, mallory := testkit.NewKey(), testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
			if ok, msg := c.publish(served(alice, "repo")); !ok {
				t.Fatalf("served repo refused: %s", msg)
			}
			for _, st := range tt.steps(alice, bob, carol, mallory) {
				ok, msg := c.publish(st.evt)
				if ok != (st.want == accepted) || (st.want != accepted && !strings.HasPrefix(msg, string(st.want))) {
					t.Fatalf("%s: OK %v %q, want %v with prefix %q", st.name, ok, msg, st.want == accepted, st.want)
				}
				stored, err := s.store.Has(context.Background(), st.evt.ID)
				if err != nil {
					t.Fatal(err)
				}
				if want := st.want == accepted && st.evt.Kind != 5 || st.evt.Kind == 5 && ok; stored != want && st.name != "issue still stored (duplicate is OK true)" {
					t.Fatalf("%s: stored = %v, want %v", st.name, stored, want)
				}
			}
		})
	}
}

// TestRefusedWithPrefix covers the "done when" refusals: forged signature,
// wrong id, host confusion, and oversized events both under and over the
// websocket message limit (the connection survives the latter).
func TestRefusedWithPrefix(t *testing.T) {
	s := startServer(t, serverOpts{cfg: Config{MaxMessageBytes: 300_000, Limits: policy.Limits{MaxEventBytes: 100_000}}})
	c := dial(t, s.url)
	alice, mallory := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(alice.PubKey, "repo")
	if ok, msg := c.publish(served(alice, "repo")); !ok {
		t.Fatal(msg)
	}
	forged := mallory.Issue(repo, "forged")
	forged.Sig = alice.Issue(repo, "other").Sig
	wrongID := mallory.Issue(repo, "wrong id")
	wrongID.Content = "changed after signing"
	bigPatch := mallory.Issue(repo, "big", testkit.WithContent(strings.Repeat("p", 150_000)))
	hugePatch := mallory.Issue(repo, "huge", testkit.WithContent(strings.Repeat("p", 400_000)))
	evil := ourHost + ".evil.net"

	tests := []struct {
		name   string
		evt    *nostr.Event
		prefix string
	}{
		{"forged signature", forged, "invalid: "},
		{"wrong id", wrongID, "invalid: "},
		{"host confusion", announce(mallory, "repo2", "https://"+evil+"/npub1x/repo2.git", "wss://"+evil), "blocked: "},
		{"event over the event limit", bigPatch, "invalid: event too large"},
		{"event over the message limit", hugePatch, "invalid: event too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, msg := c.publish(tt.evt)
			if ok || !strings.HasPrefix(msg, tt.prefix) {
				t.Fatalf("OK %v %q, want refused with %q", ok, msg, tt.prefix)
			}
			if has, _ := s.store.Has(context.Background(), tt.evt.ID); has {
				t.Fatal("refused event stored")
			}
		})
	}
	// The same connection still works.
	if ok, msg := c.publish(mallory.Issue(repo, "fine")); !ok {
		t.Fatalf("connection unusable after refusals: %s", msg)
	}
}

// TestDeletionsFollowThePolicy: a deletion is applied only once the policy
// accepts it; khatru alone would apply it first.
func TestDeletionsFollowThePolicy(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := dial(t, s.url)
	alice, mallory := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(alice.PubKey, "repo")
	ann := served(alice, "repo")
	issue := mallory.Issue(repo, "bug")
	for _, e := range []*nostr.Event{ann, issue} {
		if ok, msg := c.publish(e); !ok {
			t.Fatal(msg)
		}
	}
	has := func(id string) bool {
		ok, err := s.store.Has(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	future := mallory.Deletion([]*nostr.Event{issue}, testkit.At(nostr.Timestamp(time.Now().Add(time.Hour).Unix())))
	if ok, msg := c.publish(future); ok || !strings.HasPrefix(msg, "invalid: ") {
		t.Fatalf("future deletion: %v %q", ok, msg)
	}
	mixed := mallory.Deletion([]*nostr.Event{issue, ann})
	if ok, msg := c.publish(mixed); ok || !strings.HasPrefix(msg, "blocked: ") {
		t.Fatalf("deletion naming alice's repo: %v %q", ok, msg)
	}
	if !has(issue.ID) || !has(ann.ID) {
		t.Fatal("a refused deletion removed events")
	}
	if ok, msg := c.publish(mallory.Deletion([]*nostr.Event{issue})); !ok {
		t.Fatalf("own deletion refused: %s", msg)
	}
	if has(issue.ID) {
		t.Fatal("accepted deletion not applied")
	}
	if ok, msg := c.publish(issue); ok || !strings.HasPrefix(msg, "blocked: ") {
		t.Fatalf("deleted event re-sent: %v %q", ok, msg)
	}
	// A coordinate deletion by the owner removes the announcement.
	if ok, msg := c.publish(alice.Deletion([]*nostr.Event{ann})); !ok {
		t.Fatalf("owner's deletion refused: %s", msg)
	}
	if has(ann.ID) {
		t.Fatal("announcement not deleted")
	}
}

// TestOversizedKeyOrSignatureRefused: an EVENT or AUTH whose pubkey or
// signature is longer than 64 / 128 hex characters, with a correct id, is
// refused and the relay goes on serving. khatru verifies signatures before
// our hooks, and go-nostr's libsecp256k1 verifier (the default build)
// panics on such an event, which ended the process.
func TestOversizedKeyOrSignatureRefused(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := dial(t, s.url)
	alice := testkit.NewKey()
	repo := testkit.RepoRef(alice.PubKey, "repo")
	if ok, msg := c.publish(served(alice, "repo")); !ok {
		t.Fatal(msg)
	}
	longKey := alice.Issue(repo, "long pubkey")
	longKey.PubKey += "00"
	longKey.ID = longKey.GetID()
	longSig := alice.Issue(repo, "long sig")
	longSig.Sig += "0000"
	for _, tc := range []struct {
		evt  *nostr.Event
		want string
	}{
		{longKey, "invalid: pubkey must be 64"},
		{longSig, "invalid: signature must be 128"},
	} {
		if ok, msg := c.publish(tc.evt); ok || !strings.HasPrefix(msg, tc.want) {
			t.Fatalf("OK %v %q, want refused with %q", ok, msg, tc.want)
		}
	}
	auth := nostr.Event{Kind: 22242, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"relay", s.url}, {"challenge", "x"}}}
	if err := auth.Sign(alice.Secret); err != nil {
		t.Fatal(err)
	}
	auth.PubKey += "00"
	auth.ID = auth.GetID()
	c.write(nostr.AuthEnvelope{Event: auth})
	env, _ := c.next(func(env nostr.Envelope, _ string) bool {
		ok, is := env.(*nostr.OKEnvelope)
		return is && ok.EventID == auth.ID
	})
	if ok := env.(*nostr.OKEnvelope); ok.OK || !strings.HasPrefix(ok.Reason, "invalid: pubkey must be 64") {
		t.Fatalf("AUTH answered %+v, want refused for its pubkey", ok)
	}
	// Still serving, on this connection and to new ones.
	if ok, msg := c.publish(alice.Issue(repo, "fine")); !ok {
		t.Fatalf("relay unusable after refusals: %s", msg)
	}
	if ok, msg := dial(t, s.url).publish(alice.Issue(repo, "fine too")); !ok {
		t.Fatalf("new connection refused: %s", msg)
	}
}
