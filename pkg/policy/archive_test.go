package policy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

func (u user) npub(t testing.TB) string {
	t.Helper()
	n, err := nip19.EncodePublicKey(u.pk)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// archStep is one submission of an archive case: its expected reason and,
// for accepted events, whether the relay would treat it as about an
// archived repository (Policy.ArchiveOnly).
type archStep struct {
	name     string
	evt      *nostr.Event
	reason   policy.Reason
	archived bool
}

// TestArchiveCases covers the archive (GRASP-05) cases of docs/policy.md.
// Alice serves "repo" (listing us); bob is the archived maintainer, named by
// the whitelist each case builds; mallory publishes the same layouts.
func TestArchiveCases(t *testing.T) {
	const ok = policy.ReasonAccepted
	clone, relays := elsewhere("repo")
	state := func(t *testing.T, u user, d string, dt time.Duration) *nostr.Event {
		return u.ev(t, 30618, dt, "", nostr.Tag{"d", d}, nostr.Tag{"HEAD", "ref: refs/heads/main"})
	}
	tests := []struct {
		name     string
		archive  func(alice, bob, carol user) string // GRASP_ARCHIVE_WHITELIST
		all      bool
		steps    func(t *testing.T, alice, bob, carol, mallory user) []archStep
		readOnly bool
	}{
		{"A1 npub: every repository of that maintainer, nobody else's", func(a, b, c user) string { return b.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's repo elsewhere", b.announce(t, "tool", 0, clone, relays), ok, true},
					{"bob's other repo", b.announce(t, "lib", 0, clone, relays), ok, true},
					{"mallory, same layout", m.announce(t, "tool2", 0, clone, relays), policy.ReasonNotMaintainer, false},
					{"mallory, same identifier as bob's", m.announce(t, "tool", 0, clone, relays), policy.ReasonNotListed, false},
				}
			}, true},
		{"A2 npub/identifier: that repository only", func(a, b, c user) string { return b.npub(t) + "/tool" }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's tool", b.announce(t, "tool", 0, clone, relays), ok, true},
					{"bob's lib", b.announce(t, "lib", 0, clone, relays), policy.ReasonNotMaintainer, false},
					{"mallory's tool", m.announce(t, "tool", 0, clone, relays), policy.ReasonNotListed, false},
				}
			}, true},
		{"A3 identifier: that identifier from any author", func(a, b, c user) string { return "tool" }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's tool", b.announce(t, "tool", 0, clone, relays), ok, true},
					{"mallory's tool", m.announce(t, "tool", 0, clone, relays), ok, true},
					{"mallory's lib", m.announce(t, "lib", 0, clone, relays), policy.ReasonNotMaintainer, false},
				}
			}, true},
		{"A4 GRASP_ARCHIVE_ALL: every announcement", func(a, b, c user) string { return "" }, true,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's tool", b.announce(t, "tool", 0, clone, relays), ok, true},
					{"mallory's anything", m.announce(t, "x", 0, clone, relays), ok, true},
					{"mallory joins alice's repo", m.announce(t, "repo", 0, clone, relays), ok, true},
					{"bad identifier still refused", m.announce(t, "../x", 0, clone, relays), policy.ReasonBadIdentifier, false},
				}
			}, true},
		{"A5 a repository that lists us is hosted whatever the whitelist says", func(a, b, c user) string { return b.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's served repo", b.served(t, "tool", 0), ok, false},
					{"issue on it", m.ev(t, 1621, 0, "bug", nostr.Tag{"a", b.coord("tool")}), ok, false},
					{"bob's state of it", state(t, b, "tool", 0), ok, false},
					{"alice's served repo", a.served(t, "repo", time.Second), ok, false},
				}
			}, true},
		{"A6 maintainer of alice's hosted repo stays a maintainer (order: listed, maintainer, archive)", func(a, b, c user) string { return b.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"alice names bob", a.served(t, "repo", time.Second, b.pk), ok, false},
					{"bob's repo elsewhere", b.announce(t, "repo", 0, clone, relays, a.pk), ok, false},
					{"bob's state", state(t, b, "repo", 0), ok, false},
					{"issue on bob's coordinate", m.ev(t, 1621, 0, "bug", nostr.Tag{"a", b.coord("repo")}), ok, false},
				}
			}, true},
		{"A7 states and maintainers of an archived repository", func(a, b, c user) string { return b.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"carol's state before", state(t, c, "tool", 0), policy.ReasonNotMaintainer, false},
					{"bob's tool naming carol", b.announce(t, "tool", 0, clone, relays, c.pk), ok, true},
					{"bob's state", state(t, b, "tool", 0), ok, true},
					{"carol's announcement (maintainer)", c.announce(t, "tool", 0, clone, relays, b.pk), ok, true},
					{"carol's state", state(t, c, "tool", time.Second), ok, true},
					{"mallory's state", state(t, m, "tool", 0), policy.ReasonNotMaintainer, false},
					{"mallory's announcement", m.announce(t, "tool", 0, clone, relays), policy.ReasonNotListed, false},
				}
			}, true},
		{"A8 events about an archived repository are accepted and are archive-only", func(a, b, c user) string { return b.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				issue := m.ev(t, 1621, 0, "bug", nostr.Tag{"a", b.coord("tool")})
				hostedIssue := m.ev(t, 1621, 0, "bug", nostr.Tag{"a", a.coord("repo")})
				return []archStep{
					{"issue before the announcement", m.ev(t, 1621, 0, "early", nostr.Tag{"a", b.coord("tool")}), policy.ReasonNoReference, false},
					{"bob's tool", b.announce(t, "tool", 0, clone, relays), ok, true},
					{"issue (a)", issue, ok, true},
					{"comment on it (E)", m.ev(t, 1111, 0, "c", nostr.Tag{"E", issue.ID}, nostr.Tag{"K", "1621"}), ok, true},
					{"status on it (e)", b.ev(t, 1632, 0, "", nostr.Tag{"e", issue.ID, "", "root"}), ok, true},
					{"kind 1 quoting the repo", m.ev(t, 1, 0, "look", nostr.Tag{"q", b.coord("tool")}), ok, true},
					{"issue on both repositories", m.ev(t, 1621, 0, "both", nostr.Tag{"a", a.coord("repo")}, nostr.Tag{"a", b.coord("tool")}), ok, true},
					{"issue on alice's hosted repo", hostedIssue, ok, false},
					{"comment on the hosted issue", m.ev(t, 1111, 0, "c", nostr.Tag{"E", hostedIssue.ID}), ok, false},
					{"bob's deletion is about no repository", b.ev(t, 5, time.Second, "", nostr.Tag{"a", b.coord("tool")}), ok, false},
					{"grasp list", b.ev(t, 10317, 0, "", nostr.Tag{"g", "wss://x.example"}), ok, false},
				}
			}, true},
		{"A9 one identifier, hosted by alice and archived from bob", func(a, b, c user) string { return b.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's own repo", b.announce(t, "repo", 0, clone, relays), ok, true},
					{"alice's state (hosted)", state(t, a, "repo", 0), ok, false},
					{"bob's state (archived)", state(t, b, "repo", 0), ok, true},
				}
			}, true},
		{"A11 relay lists (10002) of named maintainers, and they anchor nothing", func(a, b, c user) string { return b.npub(t) + "/tool," + c.npub(t) }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				bobs := b.ev(t, 10002, 0, "", nostr.Tag{"r", "wss://bob.example"})
				return []archStep{
					{"bob's relay list (npub/identifier)", bobs, ok, false},
					{"carol's relay list (npub)", c.ev(t, 10002, 0, "", nostr.Tag{"r", "wss://carol.example"}), ok, false},
					{"mallory's relay list", m.ev(t, 10002, 0, "", nostr.Tag{"r", "wss://m.example"}), policy.ReasonNoReference, false},
					{"a note tagging bob's relay list", m.ev(t, 1, 0, "spam", nostr.Tag{"e", bobs.ID}), policy.ReasonNoReference, false},
				}
			}, true},
		{"A10 nothing archived: the 18 cases unchanged", func(a, b, c user) string { return "" }, false,
			func(t *testing.T, a, b, c, m user) []archStep {
				return []archStep{
					{"bob's repo elsewhere", b.announce(t, "tool", 0, clone, relays), policy.ReasonNotMaintainer, false},
					{"bob joins alice's", b.announce(t, "repo", 0, clone, relays), policy.ReasonNotListed, false},
				}
			}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			alice, bob, carol, mallory := newUser(t), newUser(t), newUser(t), newUser(t)
			w, err := policy.ParseArchiveWhitelist(tt.archive(alice, bob, carol))
			if err != nil {
				t.Fatal(err)
			}
			e.p.Archive = policy.Archive{Whitelist: w, All: tt.all}
			if e.p.Archive.Enabled() != tt.readOnly {
				t.Fatalf("Enabled = %v", e.p.Archive.Enabled())
			}
			if d := e.submit(t, alice.served(t, "repo", 0)); !d.Accept {
				t.Fatalf("served repo refused: %+v", d)
			}
			for _, s := range tt.steps(t, alice, bob, carol, mallory) {
				// ArchiveOnly is asked before the event is stored, as
				// the relay does.
				var ref string
				var archived bool
				if d := e.p.Evaluate(context.Background(), s.evt); d.Accept {
					ref, archived, err = e.p.ArchiveOnly(context.Background(), s.evt)
					if err != nil {
						t.Fatalf("%s: ArchiveOnly: %v", s.name, err)
					}
				}
				d := e.submit(t, s.evt)
				if d.Reason != s.reason || d.Accept != (s.reason == policy.ReasonAccepted) {
					t.Fatalf("%s: got %+v, want reason %q", s.name, d, s.reason)
				}
				if !d.Accept && !strings.HasPrefix(d.Message, prefixFor(d.Reason)) {
					t.Fatalf("%s: message %q lacks prefix %q", s.name, d.Message, prefixFor(d.Reason))
				}
				if archived != s.archived {
					t.Fatalf("%s: ArchiveOnly = %v (%s), want %v", s.name, archived, ref, s.archived)
				}
				if archived && !strings.HasPrefix(ref, "30617:") {
					t.Fatalf("%s: ArchiveOnly names %q, not a repository", s.name, ref)
				}
			}
		})
	}
}

func TestParseArchiveWhitelist(t *testing.T) {
	bob := newUser(t)
	npub := bob.npub(t)
	tests := []struct {
		name    string
		in      string
		err     string // substring of the error; empty: valid
		pinned  [][2]string
		open    [][2]string
		none    [][2]string
		pubkeys int
	}{
		{"empty", "", "", nil, nil, [][2]string{{bob.pk, "x"}}, 0},
		{"blanks and spaces", " , ,", "", nil, nil, [][2]string{{bob.pk, "x"}}, 0},
		{"npub", npub, "", [][2]string{{bob.pk, "a"}, {bob.pk, "b"}}, nil, [][2]string{{strings.Repeat("0", 64), "a"}}, 1},
		{"npub/identifier", " " + npub + "/tool ", "", [][2]string{{bob.pk, "tool"}}, nil, [][2]string{{bob.pk, "lib"}}, 1},
		{"identifier", "tool", "", nil, [][2]string{{bob.pk, "tool"}, {strings.Repeat("0", 64), "tool"}}, [][2]string{{bob.pk, "lib"}}, 0},
		{"mixed", npub + "/tool,lib", "", [][2]string{{bob.pk, "tool"}}, [][2]string{{bob.pk, "lib"}}, [][2]string{{bob.pk, "x"}}, 1},
		{"bad npub checksum", badChecksum(npub), "not a valid npub", nil, nil, nil, 0},
		{"npub with bad identifier", npub + "/..", "not a valid repository identifier", nil, nil, nil, 0},
		{"nsec is no npub", "npub1xyz", "not a valid npub", nil, nil, nil, 0},
		{"bad identifier", "..", "neither", nil, nil, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := policy.ParseArchiveWhitelist(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a := policy.Archive{Whitelist: w}
			for _, c := range tt.pinned {
				if got := a.Match(c[0], c[1]); got != policy.ArchivePinned {
					t.Errorf("Match(%s) = %v, want pinned", c[1], got)
				}
			}
			for _, c := range tt.open {
				if got := a.Match(c[0], c[1]); got != policy.ArchiveOpen {
					t.Errorf("Match(%s) = %v, want open", c[1], got)
				}
			}
			for _, c := range tt.none {
				if got := a.Match(c[0], c[1]); got != policy.ArchiveNone {
					t.Errorf("Match(%s) = %v, want none", c[1], got)
				}
			}
			if got := len(w.Pubkeys()); got != tt.pubkeys {
				t.Errorf("Pubkeys = %d, want %d", got, tt.pubkeys)
			}
			if again, err := policy.ParseArchiveWhitelist(w.String()); err != nil || again.String() != w.String() {
				t.Errorf("String does not round-trip: %q → %q, %v", w.String(), again.String(), err)
			}
		})
	}
	all := policy.Archive{All: true}
	if all.Match(bob.pk, "x") != policy.ArchiveOpen || !strings.Contains(all.Curation(), "every") {
		t.Fatalf("ARCHIVE_ALL: %v %q", all.Match(bob.pk, "x"), all.Curation())
	}
	if (policy.Archive{}).Curation() != "" {
		t.Fatal("curation without archive")
	}
}

// An invalid npub in GRASP_ARCHIVE_WHITELIST stops start-up with one line
// naming the variable.
func TestArchiveWhitelistFromEnvironment(t *testing.T) {
	bob := newUser(t)
	t.Setenv("GRASP_ARCHIVE_WHITELIST", bob.npub(t)+", tool")
	t.Setenv("GRASP_ARCHIVE_ALL", "false")
	var a policy.Archive
	if err := config.Load(&a); err != nil {
		t.Fatal(err)
	}
	if a.Match(bob.pk, "x") != policy.ArchivePinned || a.Match(strings.Repeat("1", 64), "tool") != policy.ArchiveOpen {
		t.Fatalf("loaded %s", a)
	}
	t.Setenv("GRASP_ARCHIVE_WHITELIST", "npub1notakey,tool")
	err := config.Load(&policy.Archive{})
	if err == nil || !strings.HasPrefix(err.Error(), `GRASP_ARCHIVE_WHITELIST="npub1notakey,tool": `) ||
		!strings.Contains(err.Error(), "not a valid npub") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v, want one line naming GRASP_ARCHIVE_WHITELIST and the bad npub", err)
	}
}

// badChecksum changes the last character of a bech32 string to another
// one, which breaks its checksum (a fixed replacement is no change when the
// key's npub happens to end with it: one key in 32).
func badChecksum(s string) string {
	last := "q"
	if strings.HasSuffix(s, last) {
		last = "p"
	}
	return s[:len(s)-1] + last
}
