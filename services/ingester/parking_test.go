package ingester_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/ingester"
	"github.com/grasp-sync/grasp-sync/services/ingester/internal/parking"
)

const service = "wss://git.example.com"

func TestMain(m *testing.M) {
	// eventstore's badger backend logs its migrations on every open.
	log.SetOutput(io.Discard)
	os.Exit(m.Run())
}

// pipeline is an ingester over embedded NATS and a real store.
type pipeline struct {
	bus   *bus.Bus
	store *store.Store
	lot   *parking.Lot // a second view of the ingester's lot, for assertions
	ing   *ingester.Ingester
}

func startPipeline(t *testing.T) *pipeline {
	t.Helper()
	return startPipelineWith(t, func(i *ingester.Ingester) *ingester.Ingester { return i })
}

// startPipelineWith is startPipeline with the ingester set up by setup
// before it runs (a fake clock, say).
func startPipelineWith(t *testing.T, setup func(*ingester.Ingester) *ingester.Ingester) *pipeline {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n := natstest.Start(t)
	b, err := bus.Connect(ctx, n.URL, "ingester-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := bus.Setup(ctx, b.JS, b.Names, bus.DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ing := setup(ingester.New(ingester.Config{Consumer: "ingester", MaxDeliver: 5, AckWait: 30 * time.Second}, b, st, service, logger, nil))
	done := make(chan error, 1)
	go func() { done <- ing.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("ingester: %v", err)
		}
	})
	// Notices published before the ingester subscribed are not taken:
	// tests that count them start once it has.
	waitUntil(t, "the ingester watching stored notices", ing.WatchingStoredNotices)
	lot, err := parking.Open(ctx, b, parking.Config{}, clock.Real{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{bus: b, store: st, lot: lot, ing: ing}
}

// fetch publishes events on grasp.events.0 in the given order, as a fetcher
// does (raw JSON, Nats-Msg-Id = event id).
func (p *pipeline) fetch(t *testing.T, evts ...*nostr.Event) {
	t.Helper()
	for _, evt := range evts {
		data, err := json.Marshal(evt)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(p.bus.Names.EventsSubject(0))
		msg.Data = data
		msg.Header.Set(nats.MsgIdHdr, evt.ID)
		msg.Header.Set(bus.HeaderRelay, "wss://remote.example")
		if _, err := p.bus.JS.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

func (p *pipeline) has(t *testing.T, id string) bool {
	t.Helper()
	ok, err := p.store.Has(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// waitUntil polls cond: the pipeline is asynchronous (stream → consumer →
// store → stored subject → wake loop) and offers no completion signal.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func served(k testkit.Key, d string, maintainers ...string) *nostr.Event {
	return k.Announcement(d, []string{testkit.GraspCloneURL(service, k.PubKey, d)}, []string{service}, maintainers)
}

func elsewhere(k testkit.Key, d string, maintainers ...string) *nostr.Event {
	return k.Announcement(d, []string{"https://github.com/x/" + d + ".git"}, []string{"wss://relay.damus.io"}, maintainers)
}

// TestOrderingThroughParking sends dependents before what they depend on,
// through the ingester, and expects everything valid stored once its
// dependency arrives — and nothing else.
func TestOrderingThroughParking(t *testing.T) {
	p := startPipeline(t)
	alice, bob, mallory := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	refs := map[string]string{"refs/heads/main": testkit.FakeCommit()}

	// A comment (and a reply to it) before its issue.
	annR1 := served(alice, "r1")
	issue1 := bob.Issue(testkit.RepoRef(alice.PubKey, "r1"), "crash")
	comment := mallory.Comment(issue1, issue1, "same here")
	reply := bob.Comment(issue1, comment, "fixed?")
	// An issue before its announcement.
	issue2 := bob.Issue(testkit.RepoRef(alice.PubKey, "r2"), "docs")
	annR2 := served(alice, "r2")
	// A maintainer's announcement before the owner's.
	bobR3 := elsewhere(bob, "r3", alice.PubKey)
	annR3 := served(alice, "r3", bob.PubKey)
	// A state before its announcement; a non-maintainer's state never fits.
	stateR4 := alice.State("r4", refs)
	malloryState := mallory.State("r4", refs)
	annR4 := served(alice, "r4")
	// An orphan nothing will ever anchor, and a non-maintainer announcement.
	orphan := mallory.Note("spam")
	malloryR3 := elsewhere(mallory, "r3")

	p.fetch(t, annR1, reply, comment, issue2, bobR3, stateR4, malloryState, orphan, malloryR3)
	// Everything above except annR1 waits; let the consumer get through it
	// before the dependencies arrive, so they are really parked first.
	waitUntil(t, "dependents parked", func() bool {
		n, err := p.lot.Len(context.Background())
		return err == nil && n == 7
	})
	p.fetch(t, issue1, annR2, annR3, annR4)

	want := []*nostr.Event{annR1, issue1, comment, reply, issue2, annR2, bobR3, annR3, stateR4, annR4}
	for _, evt := range want {
		waitUntil(t, "kind "+itoa(evt.Kind)+" "+evt.ID[:8]+" stored", func() bool { return p.has(t, evt.ID) })
	}
	// The three that must not be stored stay parked (still waiting for
	// something that could make them acceptable) or are dropped; either way
	// they are not stored.
	waitUntil(t, "only the unanchored events left in the lot", func() bool {
		n, err := p.lot.Len(context.Background())
		return err == nil && n <= 3
	})
	for _, evt := range []*nostr.Event{malloryState, orphan, malloryR3} {
		if p.has(t, evt.ID) {
			t.Errorf("kind %d %s stored but must not be", evt.Kind, evt.ID[:8])
		}
	}
	all, err := p.store.Query(context.Background(), nostr.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want) {
		t.Errorf("store holds %d events, want %d", len(all), len(want))
	}
}

// TestParkedEventWokenByRelayWrite: a synced comment waits for an issue that
// a client then publishes to the own relay (which announces it on
// grasp.stored.*, as the relay does).
func TestParkedEventWokenByOtherWriter(t *testing.T) {
	p := startPipeline(t)
	alice, bob := testkit.NewKey(), testkit.NewKey()
	ann := served(alice, "repo")
	issue := bob.Issue(testkit.RepoRef(alice.PubKey, "repo"), "bug")
	comment := alice.Comment(issue, issue, "thanks")
	p.fetch(t, ann, comment)
	waitUntil(t, "comment parked", func() bool { n, _ := p.lot.Len(context.Background()); return n == 1 })

	// Another writer stores the issue and announces it.
	ctx := context.Background()
	if _, err := p.store.Save(ctx, issue); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(issue)
	msg := nats.NewMsg(p.bus.Names.StoredSubject(issue.Kind))
	msg.Data = data
	msg.Header.Set(bus.HeaderOrigin, "relay-test")
	if err := p.bus.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "comment stored", func() bool { return p.has(t, comment.ID) })
	waitUntil(t, "lot empty", func() bool { n, _ := p.lot.Len(context.Background()); return n == 0 })
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
