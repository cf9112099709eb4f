package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

const (
	service = "wss://git.example.com"
	ourHost = "git.example.com"
)

func TestMain(m *testing.M) {
	// eventstore's badger backend logs its migrations on every open.
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}

// server is a running relay over a real store, reached over real websockets.
type server struct {
	url   string
	http  string
	store *store.Store
	relay *Relay
	bus   *bus.Bus
}

type serverOpts struct {
	cfg  Config
	bus  *bus.Bus
	now  func() time.Time
	keep bool // keep cfg.TrustedAddresses as given (default: trust loopback)
}

func startServer(t *testing.T, o serverOpts) *server {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	cfg.Addr = ln.Addr().String()
	cfg.PublicURL = service
	if !o.keep {
		cfg.TrustedAddresses = "127.0.0.1"
	}
	now := o.now
	if now == nil {
		now = time.Now
	}
	r := newRelay(cfg, st, o.bus, discard(), now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return &server{url: "ws://" + cfg.Addr, http: "http://" + cfg.Addr, store: st, relay: r, bus: o.bus}
}

// client is one websocket connection speaking raw protocol.
type client struct {
	t *testing.T
	c *testkit.Conn
}

func dial(t *testing.T, url string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := testkit.Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{t: t, c: c}
}

func (c *client) write(v any) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.c.Write(ctx, v); err != nil {
		c.t.Fatal(err)
	}
}

// next reads until pick accepts a message (raw text), failing after 5 s.
func (c *client) next(pick func(env nostr.Envelope, raw string) bool) (nostr.Envelope, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		env, raw, err := c.c.Read(ctx)
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if pick(env, raw) {
			return env, raw
		}
	}
}

// publish sends an EVENT and returns the relay's OK.
func (c *client) publish(evt *nostr.Event) (bool, string) {
	c.t.Helper()
	c.write(nostr.EventEnvelope{Event: *evt})
	env, _ := c.next(func(env nostr.Envelope, _ string) bool {
		ok, is := env.(*nostr.OKEnvelope)
		return is && ok.EventID == evt.ID
	})
	ok := env.(*nostr.OKEnvelope)
	return ok.OK, ok.Reason
}

// query runs one REQ and returns the events before EOSE.
func (c *client) query(f nostr.Filter) []*nostr.Event {
	c.t.Helper()
	id := "q" + nostr.GeneratePrivateKey()[:8]
	c.write(nostr.ReqEnvelope{SubscriptionID: id, Filters: nostr.Filters{f}})
	var out []*nostr.Event
	c.next(func(env nostr.Envelope, _ string) bool {
		switch env := env.(type) {
		case *nostr.EventEnvelope:
			if env.SubscriptionID != nil && *env.SubscriptionID == id {
				e := env.Event
				out = append(out, &e)
			}
		case *nostr.EOSEEnvelope:
			return string(*env) == id
		case *nostr.ClosedEnvelope:
			if env.SubscriptionID == id {
				c.t.Fatalf("REQ closed: %s", env.Reason)
			}
		}
		return false
	})
	c.write(nostr.CloseEnvelope(id))
	return out
}

func served(k testkit.Key, d string, maintainers ...string) *nostr.Event {
	return k.Announcement(d, []string{testkit.GraspCloneURL(service, k.PubKey, d)}, []string{service}, maintainers)
}

func announce(k testkit.Key, d, clone, relays string, maintainers ...string) *nostr.Event {
	return k.Announcement(d, []string{clone}, []string{relays}, maintainers)
}

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

func TestNIP11(t *testing.T) {
	pk := strings.Repeat("ab", 32)
	s := startServer(t, serverOpts{cfg: Config{Name: "my grasp", Description: "desc", PubKey: pk}})
	req, _ := http.NewRequest(http.MethodGet, s.http, nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Name            string   `json:"name"`
		Description     string   `json:"description"`
		PubKey          string   `json:"pubkey"`
		SupportedNIPs   []int    `json:"supported_nips"`
		SupportedGrasps []string `json:"supported_grasps"`
		Limitation      struct {
			MaxLimit int `json:"max_limit"`
		} `json:"limitation"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Name != "my grasp" || doc.Description != "desc" || doc.PubKey != pk {
		t.Fatalf("document %+v", doc)
	}
	for _, n := range []int{1, 9, 11, 34, 77} {
		if !slices.Contains(doc.SupportedNIPs, n) {
			t.Errorf("supported_nips %v lacks %d", doc.SupportedNIPs, n)
		}
	}
	if !slices.Equal(doc.SupportedGrasps, []string{"GRASP-01", "GRASP-02"}) {
		t.Errorf("supported_grasps = %v", doc.SupportedGrasps)
	}
	if doc.Limitation.MaxLimit != 500 {
		t.Errorf("max_limit = %d", doc.Limitation.MaxLimit)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/nostr+json" {
		t.Errorf("content type %q", ct)
	}
}

// TestNegentropy: reconciliation works, and errors come as NEG-ERR (not
// khatru's NEG-ERROR) with NIP-77 reason prefixes.
func TestNegentropy(t *testing.T) {
	s := startServer(t, serverOpts{})
	c := dial(t, s.url)
	alice := testkit.NewKey()
	if ok, msg := c.publish(served(alice, "repo")); !ok {
		t.Fatal(msg)
	}
	isNeg := func(id string) func(nostr.Envelope, string) bool {
		return func(_ nostr.Envelope, raw string) bool {
			return strings.HasPrefix(raw, `["NEG-`) && strings.Contains(raw, `"`+id+`"`)
		}
	}
	// An empty local set: the relay answers with a NEG-MSG naming what it has.
	c.write([]any{"NEG-OPEN", "n1", nostr.Filter{Kinds: []int{30617}}, "6100000200"})
	if _, raw := c.next(isNeg("n1")); !strings.HasPrefix(raw, `["NEG-MSG","n1",`) {
		t.Fatalf("NEG-OPEN answered %s", raw)
	}

	tests := []struct {
		name   string
		msg    []any
		prefix string
	}{
		{"unsupported filter", []any{"NEG-OPEN", "n2", nostr.Filter{Search: "x"}, "6100000200"}, "unsupported: "},
		{"message for a closed session", []any{"NEG-MSG", "gone", "6100000200"}, "closed: "},
		{"bad negentropy message", []any{"NEG-OPEN", "n3", nostr.Filter{}, "zz"}, "error: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := tt.msg[1].(string)
			c.write(tt.msg)
			env, raw := c.next(isNeg(id))
			if !strings.HasPrefix(raw, `["NEG-ERR",`) {
				t.Fatalf("got %s, want NEG-ERR", raw)
			}
			e, ok := env.(*nip77.ErrorEnvelope)
			if !ok || !strings.HasPrefix(e.Reason, tt.prefix) {
				t.Fatalf("got %s, want reason prefix %q", raw, tt.prefix)
			}
		})
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

// TestResultCapAndPagination: a REQ returns at most MaxLimit events, the
// newest, so paging with until reads everything, also when many events
// share one created_at.
func TestResultCapAndPagination(t *testing.T) {
	s := startServer(t, serverOpts{cfg: Config{MaxLimit: 100}})
	ctx := context.Background()
	k := testkit.NewKey()
	base := time.Now().Add(-time.Hour).Unix()
	want := map[string]bool{}
	for i := 0; i < 450; i++ {
		// 150 events share one timestamp: more than a page.
		ts := base + int64(i)
		if i < 150 {
			ts = base
		}
		e := k.Note("n", testkit.At(nostr.Timestamp(ts)), testkit.WithTags(nostr.Tag{"t", "page"}))
		if _, err := s.store.Save(ctx, e); err != nil {
			t.Fatal(err)
		}
		want[e.ID] = true
	}
	c := dial(t, s.url)
	for _, f := range []nostr.Filter{{Kinds: []int{1}}, {Kinds: []int{1}, Limit: 5000}} {
		got := c.query(f)
		if len(got) != 100 {
			t.Fatalf("REQ %v returned %d events, want the cap 100", f, len(got))
		}
		for i := 1; i < len(got); i++ {
			if got[i].CreatedAt > got[i-1].CreatedAt {
				t.Fatal("not newest first")
			}
		}
		if got[0].CreatedAt != nostr.Timestamp(base+449) {
			t.Fatal("first page does not start with the newest event")
		}
	}
	if got := c.query(nostr.Filter{Kinds: []int{1}, Limit: 7}); len(got) != 7 {
		t.Fatalf("limit 7 returned %d", len(got))
	}

	rc, err := relayconn.Dial(ctx, s.url, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]bool{}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = history.Read(pctx, rc, nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"t": {"page"}}}, 100, 100, func(evts []*nostr.Event) error {
		for _, e := range evts {
			seen[e.ID] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(want) {
		t.Fatalf("paging read %d of %d events", len(seen), len(want))
	}
}

// TestLimits: filters per REQ, subscriptions per connection, event rate and
// connections per address, and the trusted-address exemption.
func TestLimits(t *testing.T) {
	now := time.Unix(1_750_000_000, 0)
	clock := func() time.Time { return now }
	cfg := Config{MaxFilters: 2, MaxSubscriptions: 2, EventRate: 1, EventBurst: 2, ConnectRate: 1, ConnectBurst: 100, MaxConnsPerAddr: 3}
	s := startServer(t, serverOpts{cfg: cfg, now: clock, keep: true})
	c := dial(t, s.url)
	closedFor := func(id string) func(nostr.Envelope, string) bool {
		return func(env nostr.Envelope, _ string) bool {
			cl, ok := env.(*nostr.ClosedEnvelope)
			return ok && cl.SubscriptionID == id
		}
	}
	eoseFor := func(id string) func(nostr.Envelope, string) bool {
		return func(env nostr.Envelope, _ string) bool {
			e, ok := env.(*nostr.EOSEEnvelope)
			return ok && string(*e) == id
		}
	}

	c.write(nostr.ReqEnvelope{SubscriptionID: "f", Filters: nostr.Filters{{}, {}, {}}})
	if env, _ := c.next(closedFor("f")); !strings.HasPrefix(env.(*nostr.ClosedEnvelope).Reason, "blocked: too many filters") {
		t.Fatalf("got %v", env)
	}
	c.write(nostr.ReqEnvelope{SubscriptionID: "a", Filters: nostr.Filters{{Kinds: []int{1}}}})
	c.next(eoseFor("a"))
	c.write(nostr.ReqEnvelope{SubscriptionID: "b", Filters: nostr.Filters{{Kinds: []int{1}}}})
	c.next(eoseFor("b"))
	c.write(nostr.ReqEnvelope{SubscriptionID: "c", Filters: nostr.Filters{{Kinds: []int{1}}}})
	if env, _ := c.next(closedFor("c")); !strings.HasPrefix(env.(*nostr.ClosedEnvelope).Reason, "blocked: too many open subscriptions") {
		t.Fatalf("got %v", env)
	}
	c.write(nostr.CloseEnvelope("a"))
	c.write(nostr.ReqEnvelope{SubscriptionID: "c", Filters: nostr.Filters{{Kinds: []int{1}}}})
	c.next(eoseFor("c"))

	// Event rate: a burst of 2, then one per second of the injected clock.
	m := testkit.NewKey()
	for i := 0; i < 2; i++ {
		if ok, msg := c.publish(m.Note("x")); strings.HasPrefix(msg, "rate-limited") || ok {
			t.Fatalf("event %d within the burst: %v %q (want a policy refusal, not a rate limit)", i, ok, msg)
		}
	}
	if ok, msg := c.publish(m.Note("x")); ok || !strings.HasPrefix(msg, "rate-limited: ") {
		t.Fatalf("event over the rate: %v %q", ok, msg)
	}
	now = now.Add(time.Second)
	if _, msg := c.publish(m.Note("x")); strings.HasPrefix(msg, "rate-limited") {
		t.Fatal("token not refilled after a second")
	}

	// Connections per address: c holds one, two more fit, the fourth is
	// refused with HTTP 429.
	dial(t, s.url)
	dial(t, s.url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := testkit.Dial(ctx, s.url)
	if err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("fourth connection: %v, want a 429 refusal", err)
	}

	// A trusted address is exempt from all of it.
	trusted := startServer(t, serverOpts{cfg: Config{EventRate: 1, EventBurst: 1, MaxConnsPerAddr: 1}, now: clock})
	tc := dial(t, trusted.url)
	dial(t, trusted.url)
	for i := 0; i < 5; i++ {
		if _, msg := tc.publish(m.Note("x")); strings.HasPrefix(msg, "rate-limited") {
			t.Fatal("trusted address rate-limited")
		}
	}
}

// TestStoredBroadcast: events other writers store reach live subscribers;
// events clients store are announced on grasp.stored.<kind>.
func TestStoredBroadcast(t *testing.T) {
	n := testkit.StartNATS(t)
	ctx := context.Background()
	b, err := bus.Connect(ctx, n.URL, "relay-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	announced := make(chan *nats.Msg, 10)
	sub, err := b.Conn.ChanSubscribe(b.Names.StoredSubjects(), announced)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := b.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOpts{bus: b})

	c := dial(t, s.url)
	c.write(nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{1621}, Limit: 0, LimitZero: true}}})
	c.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EOSEEnvelope); return ok })
	// The relay subscribed to grasp.stored.* on this same NATS connection
	// before it began serving, so the publication below is ordered after it.

	alice := testkit.NewKey()
	other := alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), "from the ingester")
	data, _ := json.Marshal(other)
	msg := nats.NewMsg(b.Names.StoredSubject(other.Kind))
	msg.Data = data
	msg.Header.Set(bus.HeaderOrigin, "ingester")
	if err := b.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	env, _ := c.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EventEnvelope); return ok })
	if got := env.(*nostr.EventEnvelope).Event.ID; got != other.ID {
		t.Fatalf("live subscriber got %s, want %s", got, other.ID)
	}

	ann := served(alice, "repo")
	if ok, m := dial(t, s.url).publish(ann); !ok {
		t.Fatal(m)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-announced:
			if m.Header.Get(bus.HeaderOrigin) == "ingester" {
				continue // the test's own publication, which may arrive late
			}
			if m.Subject != b.Names.StoredSubject(30617) || !strings.Contains(string(m.Data), ann.ID) {
				t.Fatalf("announced %s %s", m.Subject, m.Data)
			}
			return
		case <-deadline:
			t.Fatal("client event not announced on grasp.stored.30617")
		}
	}
}

// A client that subscribes and stops reading is disconnected after the
// write timeout; until then its full socket holds khatru's broadcast, which
// holds the lock over every subscription. Publishers and other readers keep
// being served, and the stalled client's connection ends.
func TestStalledReaderDisconnected(t *testing.T) {
	s := startServer(t, serverOpts{cfg: Config{WriteTimeout: 300 * time.Millisecond}})
	alice := testkit.NewKey()
	pub := dial(t, s.url)
	if ok, m := pub.publish(served(alice, "repo")); !ok {
		t.Fatal(m)
	}
	stalled := dial(t, s.url)
	stalled.write(nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{1621}, Limit: 0, LimitZero: true}}})
	stalled.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EOSEEnvelope); return ok })

	// Far more than loopback socket buffers hold: the relay's writes to
	// the stalled client must block, then time out.
	big := strings.Repeat("x", 60_000)
	for i := 0; i < 200; i++ {
		if ok, m := pub.publish(alice.Issue(testkit.RepoRef(alice.PubKey, "repo"), fmt.Sprint(i), testkit.WithContent(big))); !ok {
			t.Fatalf("publish %d: %s", i, m)
		}
	}
	if got := dial(t, s.url).query(nostr.Filter{Kinds: []int{1621}, Limit: 1}); len(got) != 1 {
		t.Fatalf("another reader got %d events", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err := stalled.c.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatal("the stalled client is still connected")
			}
			return
		}
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
