package testrelay_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestGraspRelayPolicy drives the stand-in's GRASP policy over a websocket:
// what it accepts, what it refuses and why, and that order matters (no
// forward references).
func TestGraspRelayPolicy(t *testing.T) {
	t.Parallel()
	ctx := timeout(t)
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{NoRateLimit: true})
	c := dial(t, g.URL)

	owner, maint, stranger := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	clone := []string{testkit.GraspCloneURL(g.URL, owner.PubKey, "repo")}
	repo := testkit.RepoRef(owner.PubKey, "repo")
	ann := owner.Announcement("repo", clone, []string{g.URL}, []string{maint.PubKey})
	issue := stranger.Issue(repo, "bug")
	comment := owner.Comment(issue, issue, "thanks")
	early := stranger.Issue(repo, "sent before the announcement")
	earlyReply := owner.Comment(early, early, "reply to an issue sent too early")

	steps := []struct {
		name   string
		evt    *nostr.Event
		ok     bool
		prefix string
	}{
		{"issue before its repository", early, false, "blocked:"},
		{"announcement listing another relay", owner.Announcement("other", nil, []string{"wss://relay.example.com"}, nil), false, "blocked:"},
		{"announcement listing the relay only in clone", owner.Announcement("other2", []string{g.HTTPURL + "/x.git"}, []string{"wss://relay.example.com"}, nil), false, "blocked:"},
		{"announcement listing the relay", ann, true, ""},
		{"same announcement again", ann, true, ""},
		{"announcement on a look-alike host", owner.Announcement("evil", nil, []string{strings.Replace(g.URL, "127.0.0.1", "127.0.0.1.evil.net", 1)}, nil), false, "blocked:"},
		{"comment before its root", comment, false, "blocked:"},
		{"issue tagging the repository", issue, true, ""},
		{"comment after its root", comment, true, ""},
		{"comment on a refused issue", earlyReply, false, "blocked:"},
		{"state by the owner", owner.State("repo", map[string]string{"refs/heads/main": testkit.FakeCommit()}), true, ""},
		{"state by a maintainer", maint.State("repo", map[string]string{"refs/heads/main": testkit.FakeCommit()}), true, ""},
		{"state by a stranger", stranger.State("repo", map[string]string{"refs/heads/main": testkit.FakeCommit()}), false, "blocked:"},
		{"note without tags", stranger.Note("hello"), false, "blocked:"},
		{"grasp list", stranger.GraspList([]string{g.URL}), true, ""},
		{"status of the issue", owner.Status(testkit.KindStatusClosed, issue), true, ""},
	}
	for _, s := range steps {
		ok, reason, err := c.Send(ctx, s.evt)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if ok != s.ok || !strings.HasPrefix(reason, s.prefix) {
			t.Errorf("%s: OK %v %q, want %v %q…", s.name, ok, reason, s.ok, s.prefix)
		}
	}

	st := g.Stats()
	want := testrelay.GraspStats{Accepted: 7, Duplicates: 1, Refused: map[string]int{
		testrelay.GraspRefusedNotListed:     3,
		testrelay.GraspRefusedNotMaintainer: 1,
		testrelay.GraspRefusedNoReference:   4,
	}}
	if fmt.Sprint(st) != fmt.Sprint(want) {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	for _, evt := range []*nostr.Event{early, earlyReply} {
		if has, err := g.Has(ctx, evt.ID); err != nil || has {
			t.Errorf("refused event %s stored=%v (%v)", evt.ID, has, err)
		}
		if msg, refused := g.Refusal(evt.ID); !refused || !strings.HasPrefix(msg, "blocked:") {
			t.Errorf("Refusal(%s) = %q, %v", evt.ID, msg, refused)
		}
	}
	if msg, refused := g.Refusal(ann.ID); refused {
		t.Errorf("accepted announcement has a refusal %q", msg)
	}
}

// TestGraspRelayPublicURL: with PublicURL set, announcements must list that
// address, not the one clients dial.
func TestGraspRelayPublicURL(t *testing.T) {
	t.Parallel()
	ctx := timeout(t)
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{NoRateLimit: true, PublicURL: "wss://git.example.com"})
	c := dial(t, g.URL)
	k := testkit.NewKey()
	for _, tc := range []struct {
		relays []string
		ok     bool
	}{
		{[]string{g.URL}, false},
		{[]string{"wss://git.example.com"}, true},
		{[]string{"wss://git.example.com:443/"}, true},
		{[]string{"ws://git.example.com"}, false}, // port 80
	} {
		ok, reason, err := c.Send(ctx, k.Announcement(testkit.FakeCommit()[:8], nil, tc.relays, nil))
		if err != nil {
			t.Fatal(err)
		}
		if ok != tc.ok {
			t.Errorf("relays %v: OK %v %q, want %v", tc.relays, ok, reason, tc.ok)
		}
	}
}

// dial connects to url for the rest of the test.
func dial(t *testing.T, url string) *testrelay.Conn {
	t.Helper()
	c, err := testrelay.Dial(timeout(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// repoSet returns an announcement of a repository on g and n issues for it.
func repoSet(g *testrelay.GraspRelay, k testkit.Key, n int) (*nostr.Event, []*nostr.Event) {
	d := "repo-" + testkit.FakeCommit()[:8]
	ann := k.Announcement(d, nil, []string{g.URL}, nil)
	var issues []*nostr.Event
	for i := range n {
		issues = append(issues, k.Issue(testkit.RepoRef(k.PubKey, d), fmt.Sprintf("issue %d", i)))
	}
	return ann, issues
}

// sendAll sends evts on c and returns the OK answers' reasons, "" for OK true.
func sendAll(t *testing.T, c *testrelay.Conn, evts []*nostr.Event) []string {
	t.Helper()
	ctx := timeout(t)
	out := make([]string, len(evts))
	for i, evt := range evts {
		ok, reason, err := c.Send(ctx, evt)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			out[i] = reason
			if reason == "" {
				out[i] = "(refused without reason)"
			}
		}
	}
	return out
}

// TestGraspRelayRateLimit: a burst of 15 events per client address, then 3
// every 3 minutes (the defaults, on an injected clock); every EVENT costs,
// duplicates included; another address has its own budget.
func TestGraspRelayRateLimit(t *testing.T) {
	t.Parallel()
	ctx := timeout(t)
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{Clock: clk})
	c := dial(t, g.URL)

	k := testkit.NewKey()
	ann, issues := repoSet(g, k, 20)
	evts := append([]*nostr.Event{ann}, issues...)

	got := sendAll(t, c, evts[:16])
	for i, r := range got[:15] {
		if r != "" {
			t.Errorf("event %d of the burst refused: %q", i, r)
		}
	}
	if got[15] != testrelay.RateLimitedReason {
		t.Errorf("16th event: %q, want %q", got[15], testrelay.RateLimitedReason)
	}
	if msg, _ := g.Refusal(evts[15].ID); msg != testrelay.RateLimitedReason {
		t.Errorf("Refusal of the 16th event: %q", msg)
	}

	// a second connection from the same address shares the budget
	c2 := dial(t, g.URL)
	if got := sendAll(t, c2, evts[15:16]); got[0] != testrelay.RateLimitedReason {
		t.Errorf("second connection, same address: %q, want rate-limited", got[0])
	}

	// another address has a budget of its own
	other, err := g.DialAs(ctx, "203.0.113.7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	if got := sendAll(t, other, evts[15:16]); got[0] != "" {
		t.Errorf("other address: %q, want accepted", got[0])
	}

	// just short of a period: nothing back
	clk.Advance(testrelay.DefaultGraspRefillEvery - time.Second)
	if got := sendAll(t, c, evts[16:17]); got[0] != testrelay.RateLimitedReason {
		t.Errorf("before the refill: %q, want rate-limited", got[0])
	}
	// one period later: three more, and a duplicate costs like any event
	clk.Advance(time.Second)
	got = sendAll(t, c, []*nostr.Event{evts[16], evts[0], evts[17], evts[18]})
	if want := []string{"", "", "", testrelay.RateLimitedReason}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after one refill: %q, want %q", got, want)
	}

	st := g.Stats()
	if st.RateLimited != 4 || st.Accepted != 18 || st.Duplicates != 1 {
		t.Errorf("stats %+v, want 4 rate-limited, 18 accepted, 1 duplicate", st)
	}
}

// TestGraspRelayRateLimitOptions: burst and refill are configurable, and
// NoRateLimit lifts the limit.
func TestGraspRelayRateLimitOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		opts     testrelay.GraspOptions
		accepted int // of 12 events sent at once
	}{
		{"burst 5", testrelay.GraspOptions{Burst: 5}, 5},
		{"default", testrelay.GraspOptions{}, 12},
		{"no limit", testrelay.GraspOptions{NoRateLimit: true, Burst: 1}, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.opts.Clock = clock.NewFake(time.Unix(1_800_000_000, 0))
			g := testrelay.StartGraspRelay(t, tc.opts)
			c := dial(t, g.URL)
			ann, issues := repoSet(g, testkit.NewKey(), 11)
			sendAll(t, c, append([]*nostr.Event{ann}, issues...))
			if st := g.Stats(); st.Accepted != tc.accepted || st.RateLimited != 12-tc.accepted {
				t.Errorf("stats %+v, want %d accepted", st, tc.accepted)
			}
		})
	}
}

// TestGraspRelayAuth: RequireAuth refuses EVENTs until the connection
// authenticates; a trusted pubkey, once authenticated, is exempt from the
// rate limit, an untrusted one is not.
func TestGraspRelayAuth(t *testing.T) {
	t.Parallel()
	ctx := timeout(t)
	sidecar, someone := testkit.NewKey(), testkit.NewKey()
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{
		RequireAuth:    true,
		Burst:          2,
		TrustedPubKeys: []string{sidecar.PubKey},
		Clock:          clock.NewFake(time.Unix(1_800_000_000, 0)),
	})
	author := testkit.NewKey()
	ann, issues := repoSet(g, author, 5)
	evts := append([]*nostr.Event{ann}, issues...)

	c := dial(t, g.URL)
	if got := sendAll(t, c, evts[:1]); !strings.HasPrefix(got[0], "auth-required:") {
		t.Fatalf("unauthenticated EVENT: %q, want auth-required", got[0])
	}
	if err := c.Auth(ctx, someone); err != nil {
		t.Fatal(err)
	}
	got := sendAll(t, c, evts[:3])
	if want := []string{"", "", testrelay.RateLimitedReason}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("untrusted pubkey: %q, want %q", got, want)
	}

	trusted := dial(t, g.URL)
	if err := trusted.Auth(ctx, sidecar); err != nil {
		t.Fatal(err)
	}
	for i, r := range sendAll(t, trusted, evts[2:]) {
		if r != "" {
			t.Errorf("trusted pubkey, event %d: %q", i, r)
		}
	}
	st := g.Stats()
	if st.Accepted != len(evts) || st.RateLimited != 1 || st.Refused[testrelay.GraspRefusedAuth] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestGraspRelayTrustedAddr: a trusted client address is exempt from the
// rate limit without authenticating.
func TestGraspRelayTrustedAddr(t *testing.T) {
	t.Parallel()
	ctx := timeout(t)
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{Burst: 1, TrustedAddrs: []string{"203.0.113.9"}})
	ann, issues := repoSet(g, testkit.NewKey(), 3)
	trusted, err := g.DialAs(ctx, "203.0.113.9")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = trusted.Close() }()
	for i, r := range sendAll(t, trusted, append([]*nostr.Event{ann}, issues...)) {
		if r != "" {
			t.Errorf("trusted address, event %d: %q", i, r)
		}
	}
	if st := g.Stats(); st.RateLimited != 0 || st.Accepted != 4 {
		t.Errorf("stats %+v", st)
	}
}

// TestGraspRelayAuthReads: AuthReads closes REQs and refuses NEG-OPEN until
// the connection authenticates.
func TestGraspRelayAuthReads(t *testing.T) {
	t.Parallel()
	ctx := timeout(t)
	k := testkit.NewKey()
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{AuthReads: true, Relay: testrelay.Options{Negentropy: true}})
	ann, _ := repoSet(g, k, 0)
	g.Add(t, ann)

	if _, err := testrelay.QueryAll(ctx, g.URL, nostr.Filter{Kinds: []int{testkit.KindAnnouncement}}); err == nil || !strings.Contains(err.Error(), "auth-required:") {
		t.Errorf("unauthenticated REQ: %v, want CLOSED auth-required", err)
	}
	c := dial(t, g.URL)
	if err := c.Auth(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, nostr.ReqEnvelope{SubscriptionID: "s", Filters: nostr.Filters{{Kinds: []int{testkit.KindAnnouncement}}}}); err != nil {
		t.Fatal(err)
	}
	var n int
	for done := false; !done; {
		env, raw, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch env.(type) {
		case *nostr.EventEnvelope:
			n++
		case *nostr.EOSEEnvelope:
			done = true
		case *nostr.ClosedEnvelope:
			t.Fatalf("authenticated REQ closed: %s", raw)
		}
	}
	if n != 1 {
		t.Errorf("authenticated REQ returned %d events, want 1", n)
	}
}

// TestGraspRelayNegentropy: NIP-77 is on or off as Options says.
func TestGraspRelayNegentropy(t *testing.T) {
	t.Parallel()
	for _, neg := range []bool{false, true} {
		g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{Relay: testrelay.Options{Negentropy: neg}})
		if got := supportsNIP(t, g.HTTPURL, 77); got != neg {
			t.Errorf("negentropy %v: NIP-11 lists 77 = %v", neg, got)
		}
	}
}

// TestGraspRelayRejectEventHook: an extra hook's answer reaches the client
// and is counted, and the policy still judges what the hook lets through.
func TestGraspRelayRejectEventHook(t *testing.T) {
	t.Parallel()
	var failed atomic.Bool
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{NoRateLimit: true,
		RejectEvent: []func(context.Context, *nostr.Event) (bool, string){
			func(context.Context, *nostr.Event) (bool, string) {
				if failed.CompareAndSwap(false, true) {
					return true, "error: store unavailable, try again"
				}
				return false, ""
			},
		}})
	c := dial(t, g.URL)
	ann, issues := repoSet(g, testkit.NewKey(), 1)
	got := sendAll(t, c, []*nostr.Event{ann, ann, issues[0], testkit.NewKey().Note("orphan")})
	if got[0] != "error: store unavailable, try again" || got[1] != "" || got[2] != "" || !strings.HasPrefix(got[3], "blocked:") {
		t.Errorf("answers %q", got)
	}
	if st := g.Stats(); st.Accepted != 2 || st.Refused[testrelay.GraspRefusedOther] != 1 || st.Refused[testrelay.GraspRefusedNoReference] != 1 {
		t.Errorf("stats %+v", st)
	}
}
