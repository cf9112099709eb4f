package policy_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
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
