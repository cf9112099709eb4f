package policy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dgbadger "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore/badger"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

const (
	service = "wss://git.example.com"
	ourHost = "git.example.com"
)

// t0 is the fixed clock of every test.
var t0 = time.Unix(1_750_000_000, 0)

func TestMain(m *testing.M) {
	// eventstore's badger backend logs its migrations on every Init.
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}

// badgerLookup adapts a badger eventstore to policy.Lookup.
type badgerLookup struct{ db *badger.BadgerBackend }

func (l badgerLookup) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	ch, err := l.db.QueryEvents(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("badger query: %w", err)
	}
	var out []*nostr.Event
	for e := range ch {
		out = append(out, e)
	}
	return out, nil
}

// env is a policy over a real store, with a submit helper that stores events
// only when the policy accepts them — the way the relay will build state.
type env struct {
	t  *testing.T
	db *badger.BadgerBackend
	p  *policy.Policy
}

func newEnv(t testing.TB) *env {
	t.Helper()
	db := &badger.BadgerBackend{
		Path: t.TempDir(), MaxLimit: 10000,
		BadgerOptionsModifier: func(o dgbadger.Options) dgbadger.Options { return o.WithLogger(nil) },
	}
	if err := db.Init(); err != nil {
		t.Fatalf("init badger: %v", err)
	}
	t.Cleanup(db.Close)
	return &env{
		db: db,
		p:  &policy.Policy{ServiceURL: service, Store: badgerLookup{db}, Now: func() time.Time { return t0 }},
	}
}

// submit evaluates evt and, if accepted, applies it: deletions remove their
// author's targets, replaceable and addressable events replace older versions.
func (e *env) submit(t testing.TB, evt *nostr.Event) policy.Decision {
	t.Helper()
	ctx := context.Background()
	d := e.p.Evaluate(ctx, evt)
	if !d.Accept {
		return d
	}
	if d.Reason != policy.ReasonAccepted || d.Message != "" {
		t.Fatalf("accepted with reason %q message %q", d.Reason, d.Message)
	}
	if evt.Kind == 5 {
		e.applyDeletion(t, evt)
	}
	var err error
	if nostr.IsReplaceableKind(evt.Kind) || nostr.IsAddressableKind(evt.Kind) {
		err = e.db.ReplaceEvent(ctx, evt)
	} else {
		err = e.db.SaveEvent(ctx, evt)
	}
	if err != nil {
		t.Fatalf("store accepted event: %v", err)
	}
	return d
}

func (e *env) applyDeletion(t testing.TB, del *nostr.Event) {
	t.Helper()
	ctx := context.Background()
	lookup := badgerLookup{e.db}
	for _, tag := range del.Tags {
		if len(tag) < 2 {
			continue
		}
		var f nostr.Filter
		switch tag[0] {
		case "e":
			f = nostr.Filter{IDs: []string{tag[1]}, Limit: 1}
		case "a":
			parts := strings.SplitN(tag[1], ":", 3)
			kind, _ := strconv.Atoi(parts[0])
			until := del.CreatedAt
			f = nostr.Filter{Kinds: []int{kind}, Authors: []string{parts[1]}, Tags: nostr.TagMap{"d": {parts[2]}}, Until: &until, Limit: 10}
		default:
			continue
		}
		found, err := lookup.Query(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range found {
			if target.PubKey == del.PubKey {
				if err := e.db.DeleteEvent(ctx, target); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func (e *env) stored(t testing.TB, id string) bool {
	t.Helper()
	found, err := badgerLookup{e.db}.Query(context.Background(), nostr.Filter{IDs: []string{id}, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return len(found) > 0
}

// user is a key pair that signs test events.
type user struct{ sk, pk string }

func newUser(t testing.TB) user {
	t.Helper()
	sk := nostr.GeneratePrivateKey()
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	return user{sk, pk}
}

// ev signs an event created at t0 + dt.
func (u user) ev(t testing.TB, kind int, dt time.Duration, content string, tags ...nostr.Tag) *nostr.Event {
	t.Helper()
	evt := &nostr.Event{Kind: kind, CreatedAt: nostr.Timestamp(t0.Add(dt).Unix()), Content: content, Tags: nostr.Tags(tags)}
	if evt.Tags == nil {
		evt.Tags = nostr.Tags{}
	}
	if err := evt.Sign(u.sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

func (u user) coord(d string) string { return "30617:" + u.pk + ":" + d }

// announce builds a repository announcement.
func (u user) announce(t testing.TB, d string, dt time.Duration, clone, relays string, maintainers ...string) *nostr.Event {
	t.Helper()
	tags := []nostr.Tag{{"d", d}, {"name", d}}
	if clone != "" {
		tags = append(tags, nostr.Tag{"clone", clone})
	}
	if relays != "" {
		tags = append(tags, nostr.Tag{"relays", relays})
	}
	if len(maintainers) > 0 {
		tags = append(tags, append(nostr.Tag{"maintainers"}, maintainers...))
	}
	return u.ev(t, 30617, dt, "", tags...)
}

// served announces d listing this service in clone and relays.
func (u user) served(t testing.TB, d string, dt time.Duration, maintainers ...string) *nostr.Event {
	return u.announce(t, d, dt, "https://"+ourHost+"/npub1placeholder/"+d+".git", service, maintainers...)
}

func elsewhere(d string) (clone, relays string) {
	return "https://github.com/someone/" + d + ".git", "wss://relay.damus.io"
}

// step is one submission in a scenario and its expected outcome.
type step struct {
	name   string
	evt    *nostr.Event
	reason policy.Reason
}

func run(t *testing.T, e *env, steps []step) {
	t.Helper()
	for _, s := range steps {
		d := e.submit(t, s.evt)
		if d.Reason != s.reason || d.Accept != (s.reason == policy.ReasonAccepted) {
			t.Fatalf("%s: got %+v, want reason %q", s.name, d, s.reason)
		}
		if !d.Accept && !strings.HasPrefix(d.Message, string(prefixFor(d.Reason))) {
			t.Fatalf("%s: message %q lacks prefix %q", s.name, d.Message, prefixFor(d.Reason))
		}
	}
}

func prefixFor(r policy.Reason) string {
	switch r {
	case policy.ReasonDuplicate, policy.ReasonOlderVersion:
		return "duplicate: "
	case policy.ReasonNotListed, policy.ReasonNotMaintainer, policy.ReasonNoReference, policy.ReasonDeleted, policy.ReasonDeleteOthers:
		return "blocked: "
	case policy.ReasonStoreError:
		return "error: "
	default:
		return "invalid: "
	}
}

// TestAcceptanceCases covers the 18 acceptance cases of docs/policy.md. Each
// case starts from a fresh store holding alice's served repository "repo".
func TestAcceptanceCases(t *testing.T) {
	const ok = policy.ReasonAccepted
	tests := []struct {
		name  string
		steps func(t *testing.T, alice, bob, carol, mallory user) []step
	}{
		{"01 announcement listing us in clone and relays", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"bob's own served repo", b.served(t, "other", 0), ok}}
		}},
		{"02 clone elsewhere, relays us", func(t *testing.T, a, b, c, m user) []step {
			clone, _ := elsewhere("repo")
			return []step{
				{"joining the served repo", m.announce(t, "repo", 0, clone, service), policy.ReasonNotListed},
				{"a new repo", m.announce(t, "x", 0, clone, service), policy.ReasonNotMaintainer},
			}
		}},
		{"03 clone us, relays elsewhere", func(t *testing.T, a, b, c, m user) []step {
			_, relays := elsewhere("repo")
			return []step{
				{"joining the served repo", m.announce(t, "repo", 0, "https://"+ourHost+"/npub1x/repo.git", relays), policy.ReasonNotListed},
				{"a new repo", m.announce(t, "x", 0, "https://"+ourHost+"/npub1x/x.git", relays), policy.ReasonNotMaintainer},
			}
		}},
		{"04 announcement by a recursive maintainer listing elsewhere", func(t *testing.T, a, b, c, m user) []step {
			clone, relays := elsewhere("repo")
			return []step{
				{"owner names bob", a.served(t, "repo", time.Second, b.pk), ok},
				{"bob, direct maintainer, names carol", b.announce(t, "repo", 0, clone, relays, a.pk, c.pk), ok},
				{"carol, maintainer through bob", c.announce(t, "repo", 0, clone, relays, a.pk), ok},
				{"mallory, nobody's maintainer", m.announce(t, "repo", 0, clone, relays, a.pk), policy.ReasonNotListed},
			}
		}},
		{"05 issue tagging served repo with a", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"issue", m.ev(t, 1621, 0, "bug", nostr.Tag{"a", a.coord("repo")}), ok}}
		}},
		{"06 comment tagging served repo with A", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"comment", m.ev(t, 1111, 0, "hi", nostr.Tag{"A", a.coord("repo")}, nostr.Tag{"K", "30617"}), ok}}
		}},
		{"07 kind 1 quoting served repo with q", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"note", m.ev(t, 1, 0, "look", nostr.Tag{"q", a.coord("repo")}), ok}}
		}},
		{"08 issue naming unknown repo but quoting an accepted issue", func(t *testing.T, a, b, c, m user) []step {
			issue := a.ev(t, 1621, 0, "root", nostr.Tag{"a", a.coord("repo")})
			return []step{
				{"accepted issue", issue, ok},
				{"issue", m.ev(t, 1621, 0, "dup of", nostr.Tag{"a", m.coord("unknown")}, nostr.Tag{"q", issue.ID}), ok},
			}
		}},
		{"09 comment with E and e on accepted issue", func(t *testing.T, a, b, c, m user) []step {
			issue := a.ev(t, 1621, 0, "root", nostr.Tag{"a", a.coord("repo")})
			return []step{
				{"issue", issue, ok},
				{"comment E", m.ev(t, 1111, 0, "c1", nostr.Tag{"E", issue.ID}, nostr.Tag{"K", "1621"}), ok},
				{"comment e", m.ev(t, 1111, 0, "c2", nostr.Tag{"e", issue.ID}), ok},
			}
		}},
		{"10 kind 1 replying to accepted kind 1", func(t *testing.T, a, b, c, m user) []step {
			note := a.ev(t, 1, 0, "about repo", nostr.Tag{"q", a.coord("repo")})
			return []step{
				{"note", note, ok},
				{"reply", m.ev(t, 1, 0, "reply", nostr.Tag{"e", note.ID, "", "root"}), ok},
			}
		}},
		{"11 forward reference: issue quoting unknown kind 1, then the kind 1", func(t *testing.T, a, b, c, m user) []step {
			note := m.ev(t, 1, 0, "untagged thought", nil...)
			return []step{
				{"issue", a.ev(t, 1621, 0, "see note", nostr.Tag{"a", a.coord("repo")}, nostr.Tag{"q", note.ID}), ok},
				{"note with no tags", note, ok},
			}
		}},
		{"12 comment and kind 1 chains by forward reference", func(t *testing.T, a, b, c, m user) []step {
			root := m.ev(t, 1621, 0, "unknown root", nostr.Tag{"a", m.coord("nowhere")})
			c1 := m.ev(t, 1111, 0, "c1", nostr.Tag{"E", root.ID}, nostr.Tag{"e", root.ID})
			c2 := m.ev(t, 1111, 0, "c2", nostr.Tag{"E", root.ID}, nostr.Tag{"e", c1.ID})
			c3 := m.ev(t, 1111, 0, "c3", nostr.Tag{"A", a.coord("repo")}, nostr.Tag{"e", c2.ID})
			n1 := b.ev(t, 1, 0, "n1")
			n2 := b.ev(t, 1, 0, "n2", nostr.Tag{"e", n1.ID})
			n3 := b.ev(t, 1, 0, "n3", nostr.Tag{"q", n2.ID})
			n4 := b.ev(t, 1, 0, "n4", nostr.Tag{"q", a.coord("repo")}, nostr.Tag{"e", n3.ID})
			return []step{
				{"c1 orphan", c1, policy.ReasonNoReference},
				{"c2 orphan", c2, policy.ReasonNoReference},
				{"c3 anchored", c3, ok},
				{"c2 via c3", c2, ok},
				{"c1 via c2", c1, ok},
				{"root via c1", root, ok},
				{"n1 orphan", n1, policy.ReasonNoReference},
				{"n4 anchored", n4, ok},
				{"n3 via n4 (e)", n3, ok},
				{"n2 via n3 (q)", n2, ok},
				{"n1 via n2 (e)", n1, ok},
			}
		}},
		{"13 issue naming unknown repo only", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"issue", m.ev(t, 1621, 0, "bug", nostr.Tag{"a", m.coord("unknown")}), policy.ReasonNoReference}}
		}},
		{"14 kind 1 with no tags", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"note", m.ev(t, 1, 0, "spam"), policy.ReasonNoReference}}
		}},
		{"15 comment with A on unknown repo", func(t *testing.T, a, b, c, m user) []step {
			return []step{{"comment", m.ev(t, 1111, 0, "hi", nostr.Tag{"A", m.coord("unknown")}), policy.ReasonNoReference}}
		}},
		{"16 state by owner or recursive maintainer, not anyone else", func(t *testing.T, a, b, c, m user) []step {
			clone, relays := elsewhere("repo")
			state := func(u user, dt time.Duration) *nostr.Event {
				return u.ev(t, 30618, dt, "", nostr.Tag{"d", "repo"}, nostr.Tag{"refs/heads/main", strings.Repeat("a", 40)}, nostr.Tag{"HEAD", "ref: refs/heads/main"})
			}
			return []step{
				{"state before its repo's maintainers are known", state(c, 0), policy.ReasonNotMaintainer},
				{"owner names bob", a.served(t, "repo", time.Second, b.pk), ok},
				{"bob names carol", b.announce(t, "repo", 0, clone, relays, c.pk), ok},
				{"owner's state", state(a, 0), ok},
				{"bob's state", state(b, 0), ok},
				{"carol's state (recursive)", state(c, time.Second), ok},
				{"mallory's state", state(m, 0), policy.ReasonNotMaintainer},
				{"state for an identifier nobody serves", m.ev(t, 30618, 0, "", nostr.Tag{"d", "nothing"}), policy.ReasonNotMaintainer},
			}
		}},
		{"17 deletion of another's event refused, of one's own applied", func(t *testing.T, a, b, c, m user) []step {
			issue := a.ev(t, 1621, 0, "bug", nostr.Tag{"a", a.coord("repo")})
			note := m.ev(t, 1, 0, "mine", nostr.Tag{"e", issue.ID})
			return []step{
				{"issue", issue, ok},
				{"mallory's note", note, ok},
				{"mallory deletes alice's issue", m.ev(t, 5, time.Second, "", nostr.Tag{"e", issue.ID}), policy.ReasonDeleteOthers},
				{"mallory deletes alice's repo by coordinate", m.ev(t, 5, time.Second, "", nostr.Tag{"a", a.coord("repo")}), policy.ReasonDeleteOthers},
				{"mallory deletes her own note", m.ev(t, 5, time.Second, "", nostr.Tag{"e", note.ID}, nostr.Tag{"k", "1"}), ok},
				{"deleted note re-sent", note, policy.ReasonDeleted},
				{"issue still there", issue, policy.ReasonDuplicate},
			}
		}},
		{"18 host-confusion announcement", func(t *testing.T, a, b, c, m user) []step {
			evil := ourHost + ".evil.net"
			return []step{
				{"both confused", m.announce(t, "repo", 0, "https://"+evil+"/npub1x/repo.git", "wss://"+evil), policy.ReasonNotListed},
				{"clone confused", m.announce(t, "repo", 0, "https://"+evil+"/npub1x/repo.git", service), policy.ReasonNotListed},
				{"relays confused", m.announce(t, "repo", 0, "https://"+ourHost+"/npub1x/repo.git", "wss://evil.net/"+ourHost), policy.ReasonNotListed},
				{"userinfo trick", m.announce(t, "repo", 0, "https://"+ourHost+"@evil.net/x.git", "wss://"+ourHost+"@evil.net"), policy.ReasonNotListed},
				{"other port", m.announce(t, "repo", 0, "https://"+ourHost+":8443/x.git", "wss://"+ourHost+":8443"), policy.ReasonNotListed},
				{"both confused, new repo", m.announce(t, "x", 0, "https://"+evil+"/npub1x/x.git", "wss://"+evil), policy.ReasonNotMaintainer},
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			alice, bob, carol, mallory := newUser(t), newUser(t), newUser(t), newUser(t)
			if !strings.HasPrefix(tt.name, "04") && !strings.HasPrefix(tt.name, "16") {
				if d := e.submit(t, alice.served(t, "repo", 0)); !d.Accept {
					t.Fatalf("served repo refused: %+v", d)
				}
			}
			run(t, e, tt.steps(t, alice, bob, carol, mallory))
		})
	}
}

func TestRule0Integrity(t *testing.T) {
	alice := newUser(t)
	repoTag := nostr.Tag{"a", alice.coord("repo")}
	tests := []struct {
		name   string
		evt    func() *nostr.Event
		limits policy.Limits
		reason policy.Reason
	}{
		{"valid issue", func() *nostr.Event { return alice.ev(t, 1621, 0, "ok", repoTag) }, policy.Limits{}, policy.ReasonAccepted},
		{"bad id: content changed after signing", func() *nostr.Event {
			evt := alice.ev(t, 1621, 0, "ok", repoTag)
			evt.Content = "tampered"
			return evt
		}, policy.Limits{}, policy.ReasonBadID},
		{"bad id: upper-case id", func() *nostr.Event {
			evt := alice.ev(t, 1621, 0, "ok", repoTag)
			evt.ID = strings.ToUpper(evt.ID)
			return evt
		}, policy.Limits{}, policy.ReasonBadID},
		{"bad id: empty", func() *nostr.Event {
			evt := alice.ev(t, 1621, 0, "ok", repoTag)
			evt.ID = ""
			return evt
		}, policy.Limits{}, policy.ReasonBadID},
		{"bad signature: sig byte altered", func() *nostr.Event {
			evt := alice.ev(t, 1621, 0, "ok", repoTag)
			b := []byte(evt.Sig)
			b[10] = map[bool]byte{true: '1', false: '0'}[b[10] == '0']
			evt.Sig = string(b)
			return evt
		}, policy.Limits{}, policy.ReasonBadSignature},
		{"bad signature: another event's signature", func() *nostr.Event {
			evt := alice.ev(t, 1621, 0, "ok", repoTag)
			evt.Sig = alice.ev(t, 1621, 0, "other", repoTag).Sig
			return evt
		}, policy.Limits{}, policy.ReasonBadSignature},
		{"bad signature: truncated", func() *nostr.Event {
			evt := alice.ev(t, 1621, 0, "ok", repoTag)
			evt.Sig = evt.Sig[:100]
			return evt
		}, policy.Limits{}, policy.ReasonBadSignature},
		{"oversized content", func() *nostr.Event {
			return alice.ev(t, 1617, 0, strings.Repeat("x", 300<<10), repoTag)
		}, policy.Limits{}, policy.ReasonTooLarge},
		{"under a custom size limit", func() *nostr.Event {
			return alice.ev(t, 1617, 0, strings.Repeat("x", 900), repoTag)
		}, policy.Limits{MaxEventBytes: 2000}, policy.ReasonAccepted},
		{"over a custom size limit", func() *nostr.Event {
			return alice.ev(t, 1617, 0, strings.Repeat("x", 2000), repoTag)
		}, policy.Limits{MaxEventBytes: 2000}, policy.ReasonTooLarge},
		{"oversized through tags", func() *nostr.Event {
			tags := []nostr.Tag{repoTag}
			for i := 0; i < 1000; i++ {
				tags = append(tags, nostr.Tag{"t", strings.Repeat("y", 500)})
			}
			return alice.ev(t, 1621, 0, "", tags...)
		}, policy.Limits{}, policy.ReasonTooLarge},
		{"too many tags", func() *nostr.Event {
			tags := []nostr.Tag{repoTag}
			for i := 0; i < 2000; i++ {
				tags = append(tags, nostr.Tag{"t", strconv.Itoa(i)})
			}
			return alice.ev(t, 1621, 0, "", tags...)
		}, policy.Limits{}, policy.ReasonTooManyTags},
		{"tag value too long", func() *nostr.Event {
			return alice.ev(t, 1621, 0, "", repoTag, nostr.Tag{"subject", strings.Repeat("s", 1001)})
		}, policy.Limits{MaxTagValueBytes: 1000}, policy.ReasonTooLarge},
		{"created 10 minutes ahead", func() *nostr.Event { return alice.ev(t, 1621, 10*time.Minute, "", repoTag) }, policy.Limits{}, policy.ReasonAccepted},
		{"created 16 minutes ahead", func() *nostr.Event { return alice.ev(t, 1621, 16*time.Minute, "", repoTag) }, policy.Limits{}, policy.ReasonFuture},
		{"created far in the future", func() *nostr.Event { return alice.ev(t, 1621, 24*365*time.Hour, "", repoTag) }, policy.Limits{}, policy.ReasonFuture},
		{"expired", func() *nostr.Event {
			return alice.ev(t, 1621, -time.Hour, "", repoTag, nostr.Tag{"expiration", strconv.FormatInt(t0.Add(-time.Minute).Unix(), 10)})
		}, policy.Limits{}, policy.ReasonExpired},
		{"expires later", func() *nostr.Event {
			return alice.ev(t, 1621, -time.Hour, "", repoTag, nostr.Tag{"expiration", strconv.FormatInt(t0.Add(time.Minute).Unix(), 10)})
		}, policy.Limits{}, policy.ReasonAccepted},
		{"unparseable expiration ignored", func() *nostr.Event {
			return alice.ev(t, 1621, 0, "", repoTag, nostr.Tag{"expiration", "soon"})
		}, policy.Limits{}, policy.ReasonAccepted},
		{"kind out of range", func() *nostr.Event { return alice.ev(t, 70000, 0, "", repoTag) }, policy.Limits{}, policy.ReasonMalformed},
		{"negative created_at", func() *nostr.Event { return alice.ev(t, 1621, -time.Duration(t0.Unix()+10)*time.Second, "", repoTag) }, policy.Limits{}, policy.ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.p.Limits = tt.limits
			if d := e.submit(t, alice.served(t, "repo", 0)); !d.Accept {
				t.Fatalf("served repo refused: %+v", d)
			}
			evt := tt.evt()
			d := e.submit(t, evt)
			if d.Reason != tt.reason || d.Accept != (tt.reason == policy.ReasonAccepted) {
				t.Fatalf("got %+v, want %q", d, tt.reason)
			}
			if !d.Accept && !strings.HasPrefix(d.Message, prefixFor(d.Reason)) {
				t.Fatalf("message %q lacks prefix %q", d.Message, prefixFor(d.Reason))
			}
			if d.Parkable() {
				t.Fatalf("integrity refusal %q is parkable", d.Reason)
			}
		})
	}
}

// TestEvaluateVerified: EvaluateVerified skips the id and signature checks
// and nothing else, so callers that verified both themselves get the same
// decisions without paying for them twice.
func TestEvaluateVerified(t *testing.T) {
	alice := newUser(t)
	repoTag := nostr.Tag{"a", alice.coord("repo")}
	e := newEnv(t)
	if d := e.submit(t, alice.served(t, "repo", 0)); !d.Accept {
		t.Fatalf("served repo refused: %+v", d)
	}
	tampered := alice.ev(t, 1621, 0, "ok", repoTag)
	tampered.Content = "tampered"
	altered := alice.ev(t, 1621, 0, "altered", repoTag)
	b := []byte(altered.Sig)
	b[10] = map[bool]byte{true: '1', false: '0'}[b[10] == '0']
	altered.Sig = string(b)
	truncated := alice.ev(t, 1621, 0, "truncated", repoTag)
	truncated.Sig = truncated.Sig[:100]
	for _, c := range []struct {
		name               string
		evt                *nostr.Event
		evaluate, verified policy.Reason
	}{
		{"valid", alice.ev(t, 1621, 0, "fine", repoTag), policy.ReasonAccepted, policy.ReasonAccepted},
		{"wrong id: only Evaluate can tell", tampered, policy.ReasonBadID, policy.ReasonAccepted},
		{"size still checked", alice.ev(t, 1617, 0, strings.Repeat("x", 300<<10), repoTag), policy.ReasonTooLarge, policy.ReasonTooLarge},
		{"unanchored still refused", alice.ev(t, 1, 0, "spam"), policy.ReasonNoReference, policy.ReasonNoReference},
		{"malformed signature still refused", truncated, policy.ReasonBadSignature, policy.ReasonBadSignature},
		{"forged signature: only Evaluate can tell", altered, policy.ReasonBadSignature, policy.ReasonAccepted},
	} {
		ctx := context.Background()
		if got := e.p.Evaluate(ctx, c.evt).Reason; got != c.evaluate {
			t.Errorf("%s: Evaluate = %s, want %s", c.name, got, c.evaluate)
		}
		if got := e.p.EvaluateVerified(ctx, c.evt).Reason; got != c.verified {
			t.Errorf("%s: EvaluateVerified = %s, want %s", c.name, got, c.verified)
		}
	}
}

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

// failingLookup is a store that cannot be read.
type failingLookup struct{ err error }

func (f failingLookup) Query(context.Context, nostr.Filter) ([]*nostr.Event, error) {
	return nil, f.err
}

func TestStoreErrorFailsClosed(t *testing.T) {
	alice := newUser(t)
	boom := errors.New("disk on fire")
	p := &policy.Policy{ServiceURL: service, Store: failingLookup{boom}, Now: func() time.Time { return t0 }}
	tests := []struct {
		name string
		evt  *nostr.Event
	}{
		{"issue", alice.ev(t, 1621, 0, "", nostr.Tag{"a", alice.coord("repo")})},
		{"served announcement", alice.served(t, "repo", 0)},
		{"state", alice.ev(t, 30618, 0, "", nostr.Tag{"d", "repo"})},
		{"deletion", alice.ev(t, 5, 0, "", nostr.Tag{"e", strings.Repeat("a", 64)})},
		{"grasp list", alice.ev(t, 10317, 0, "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Evaluate(context.Background(), tt.evt)
			if d.Accept || d.Reason != policy.ReasonStoreError || !strings.HasPrefix(d.Message, "error: ") {
				t.Fatalf("got %+v, want a store-error refusal", d)
			}
			if !errors.Is(d.Err, boom) {
				t.Fatalf("Err = %v, want it to wrap %v", d.Err, boom)
			}
			if strings.Contains(d.Message, boom.Error()) {
				t.Fatalf("message %q leaks the internal error", d.Message)
			}
		})
	}
	// A failure on a later query (not the first) fails closed too.
	e := newEnv(t)
	e.submit(t, alice.served(t, "repo", 0))
	p2 := &policy.Policy{ServiceURL: service, Now: func() time.Time { return t0 }, Store: &flakyLookup{inner: badgerLookup{e.db}, failAt: 2, err: boom}}
	if d := p2.Evaluate(context.Background(), alice.ev(t, 1, 0, "x")); d.Reason != policy.ReasonStoreError {
		t.Fatalf("got %+v, want store error", d)
	}
	if d := (&policy.Policy{ServiceURL: service}).Evaluate(context.Background(), alice.ev(t, 1, 0, "x")); d.Reason != policy.ReasonStoreError {
		t.Fatalf("nil store: got %+v, want store error", d)
	}
}

// flakyLookup fails its failAt-th query (1-based).
type flakyLookup struct {
	inner  policy.Lookup
	failAt int
	n      int
	err    error
}

func (f *flakyLookup) Query(ctx context.Context, flt nostr.Filter) ([]*nostr.Event, error) {
	f.n++
	if f.n == f.failAt {
		return nil, f.err
	}
	return f.inner.Query(ctx, flt)
}

func TestQueriesAreBounded(t *testing.T) {
	e := newEnv(t)
	alice := newUser(t)
	e.submit(t, alice.served(t, "repo", 0))
	rec := &recordingLookup{inner: badgerLookup{e.db}}
	p := &policy.Policy{ServiceURL: service, Store: rec, Now: func() time.Time { return t0 }}
	var tags []nostr.Tag
	for i := 0; i < 1000; i++ {
		tags = append(tags, nostr.Tag{"e", fakeID(i)}, nostr.Tag{"a", alice.coord("r" + strconv.Itoa(i))})
	}
	p.Evaluate(context.Background(), alice.ev(t, 1, 0, "", tags...))
	t.Logf("%d queries", len(rec.filters))
	if len(rec.filters) > 10 {
		t.Errorf("%d queries for one event", len(rec.filters))
	}
	for _, f := range rec.filters {
		if f.Limit <= 0 {
			t.Errorf("filter without limit: %v", f)
		}
		if len(f.IDs) > 100 || len(f.Tags["d"]) > 100 {
			t.Errorf("filter with too many values: %d ids, %d d", len(f.IDs), len(f.Tags["d"]))
		}
	}
}

type recordingLookup struct {
	inner   policy.Lookup
	filters []nostr.Filter
}

func (r *recordingLookup) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	r.filters = append(r.filters, f)
	return r.inner.Query(ctx, f)
}

func TestListsService(t *testing.T) {
	u := newUser(t)
	tests := []struct {
		service       string
		clone, relays string
		want          bool
	}{
		{service, "https://git.example.com/npub1x/r.git", "wss://git.example.com", true},
		{service, "wss://git.example.com", "wss://git.example.com/", true},
		{service, "http://git.example.com/npub1x/r.git", "wss://git.example.com", false}, // port 80 ≠ 443
		{service, "https://git.example.com/npub1x/r.git", "https://git.example.com", false},
		{service, "ssh://git.example.com/r.git", "wss://git.example.com", false},
		{service, "git@git.example.com:r.git", "wss://git.example.com", false},
		{service, "https://example.com/npub1x/r.git", "wss://example.com", false},
		{"ws://127.0.0.1:7777", "http://127.0.0.1:7777/npub1x/r.git", "ws://127.0.0.1:7777", true},
		{"ws://127.0.0.1:7777", "http://127.0.0.1:7778/npub1x/r.git", "ws://127.0.0.1:7777", false},
		{"", "https://git.example.com/npub1x/r.git", "wss://git.example.com", false},
	}
	for _, tt := range tests {
		t.Run(tt.service+" "+tt.clone+" "+tt.relays, func(t *testing.T) {
			p := &policy.Policy{ServiceURL: tt.service}
			evt := u.ev(t, 30617, 0, "", nostr.Tag{"d", "r"}, nostr.Tag{"clone", tt.clone}, nostr.Tag{"relays", tt.relays})
			if got := p.ListsService(evt); got != tt.want {
				t.Fatalf("ListsService = %v, want %v", got, tt.want)
			}
		})
	}
	if (&policy.Policy{ServiceURL: service}).ListsService(nil) {
		t.Fatal("ListsService(nil) = true")
	}
}

func TestDefaultLimits(t *testing.T) {
	l := policy.DefaultLimits()
	if l.MaxEventBytes != 256<<10 || l.MaxTags != 2000 || l.MaxTagValueBytes != 64<<10 || l.MaxFutureSkew != 15*time.Minute {
		t.Fatalf("DefaultLimits() = %+v", l)
	}
}

func TestEvaluateNil(t *testing.T) {
	p := &policy.Policy{ServiceURL: service, Store: failingLookup{errors.New("unused")}}
	if d := p.Evaluate(context.Background(), nil); d.Accept {
		t.Fatal("nil event accepted")
	}
}

func BenchmarkEvaluateIssue(b *testing.B) {
	e := newEnv(b)
	alice, bob := newUser(b), newUser(b)
	e.submit(b, alice.served(b, "repo", 0))
	issue := bob.ev(b, 1621, 0, "it broke", nostr.Tag{"a", alice.coord("repo")}, nostr.Tag{"p", alice.pk}, nostr.Tag{"subject", "crash"})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if d := e.p.Evaluate(ctx, issue); !d.Accept {
			b.Fatalf("refused: %+v", d)
		}
	}
}
