package policy_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

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
