package ingester_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
	"github.com/grasp-sync/grasp-sync/services/ingester"
	"github.com/grasp-sync/grasp-sync/services/ingester/internal/parking"
)

// lostWake is a deployment in which ingester replicas can be stopped and
// started, on a fake clock so the parking sweep runs only when a test says.
type lostWake struct {
	pipeline
	clk *clock.Fake
	cfg ingester.Config
}

func startLostWake(t *testing.T) *lostWake {
	t.Helper()
	ctx := context.Background()
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
	lot, err := parking.Open(ctx, b, parking.Config{}, clock.Real{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &lostWake{
		pipeline: pipeline{bus: b, store: st, lot: lot},
		clk:      clock.NewFake(time.Unix(1_700_000_000, 0)),
		cfg:      ingester.Config{Consumer: "ingester", MaxDeliver: 5, AckWait: 30 * time.Second, ParkSweep: time.Minute},
	}
}

// start runs one ingester replica until the returned stop is called (or the
// test ends).
func (w *lostWake) start(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ing := ingester.New(w.cfg, w.bus, w.store, service, logger, nil).WithClock(w.clk)
	done := make(chan error, 1)
	go func() { done <- ing.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("ingester: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// parkComment gets a comment parked behind its issue, which is not stored.
func (w *lostWake) parkComment(t *testing.T) (issue, comment *nostr.Event) {
	t.Helper()
	alice, bob := testkit.NewKey(), testkit.NewKey()
	ann := served(alice, "repo")
	issue = bob.Issue(testkit.RepoRef(alice.PubKey, "repo"), "bug")
	comment = alice.Comment(issue, issue, "thanks")
	w.fetch(t, ann, comment)
	waitUntil(t, "announcement stored", func() bool { return w.has(t, ann.ID) })
	waitUntil(t, "comment parked", func() bool { n, _ := w.lot.Len(context.Background()); return n == 1 })
	return issue, comment
}

// TestSweepStoresParkedEventWhoseWakeUpWasLost: the issue a parked comment
// waits for is stored by a writer whose grasp.stored notice never reaches
// an ingester (buffered in a replica that was killed). The comment is
// stored by the periodic sweep, and only once the sweep's time has come.
func TestSweepStoresParkedEventWhoseWakeUpWasLost(t *testing.T) {
	w := startLostWake(t)
	w.start(t)
	issue, comment := w.parkComment(t)

	// The issue is stored, and its notice lost: nothing is published.
	if _, err := w.store.Save(context.Background(), issue); err != nil {
		t.Fatal(err)
	}
	// Nothing but the sweep can find the comment now. Before its time the
	// comment stays parked (checked after a round trip through the lot, not
	// by waiting: the wake loop has no notice to act on).
	if w.has(t, comment.ID) {
		t.Fatal("comment stored before any sweep: the test does not exercise the sweep")
	}
	// Advance one sweep interval at a time until the comment is stored; a
	// replica that never sweeps fails here.
	waitUntil(t, "comment stored by a sweep", func() bool {
		w.clk.Advance(w.cfg.ParkSweep)
		return w.has(t, comment.ID)
	})
	waitUntil(t, "lot empty", func() bool { n, _ := w.lot.Len(context.Background()); return n == 0 })
}

// TestSweepCoversALargeLotInSlices: with ParkSweepMax smaller than the lot,
// successive sweeps resume where the previous one stopped, so every parked
// event whose dependency is stored is reached, even behind older events
// that stay parked (a sweep restarting at the oldest would never get past
// them).
func TestSweepCoversALargeLotInSlices(t *testing.T) {
	w := startLostWake(t)
	w.cfg.ParkSweepMax = 2
	w.start(t)
	alice, bob := testkit.NewKey(), testkit.NewKey()
	ann := served(alice, "repo")
	var issues, comments []*nostr.Event
	for n := range 5 {
		issue := bob.Issue(testkit.RepoRef(alice.PubKey, "repo"), "bug "+itoa(n))
		issues = append(issues, issue)
		comments = append(comments, alice.Comment(issue, issue, "thanks"))
	}
	// Two comments on issues that never come, parked first.
	var orphans []*nostr.Event
	for n := range 2 {
		never := bob.Issue(testkit.RepoRef(alice.PubKey, "repo"), "never "+itoa(n))
		orphans = append(orphans, alice.Comment(never, never, "lost"))
	}
	w.fetch(t, ann)
	w.fetch(t, orphans...)
	waitUntil(t, "orphans parked", func() bool { n, _ := w.lot.Len(context.Background()); return n == len(orphans) })
	w.fetch(t, comments...)
	waitUntil(t, "comments parked", func() bool {
		n, _ := w.lot.Len(context.Background())
		return n == len(orphans)+len(comments)
	})
	for _, issue := range issues {
		if _, err := w.store.Save(context.Background(), issue); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "every comment stored by the sweeps", func() bool {
		w.clk.Advance(w.cfg.ParkSweep)
		for _, c := range comments {
			if !w.has(t, c.ID) {
				return false
			}
		}
		return true
	})
}

// TestRedeliveredStoredEventIsAnnouncedAgain: a replica stores an event and
// is killed before announcing it on grasp.stored; its message is
// redelivered to another replica, which finds it a duplicate. That replica
// announces the stored event again (relays broadcast it, wake loops see it)
// and the comment parked behind it is stored.
func TestRedeliveredStoredEventIsAnnouncedAgain(t *testing.T) {
	w := startLostWake(t)
	stopFirst := w.start(t)
	issue, comment := w.parkComment(t)
	stopFirst()

	// The dying replica: takes the issue's message from the shared
	// consumer, stores the issue, and is gone before acking or announcing
	// (Nak stands for the AckWait running out, without the wait).
	w.fetch(t, issue)
	ctx := context.Background()
	cons, err := w.bus.JS.Consumer(ctx, w.bus.Names.EventsStream(), w.cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var taken jetstream.Msg
	for m := range batch.Messages() {
		taken = m
	}
	if taken == nil || string(taken.Data()) == "" {
		t.Fatalf("the issue's message was not delivered: %v", batch.Error())
	}
	if _, err := w.store.Save(ctx, issue); err != nil {
		t.Fatal(err)
	}

	announced := make(chan *nats.Msg, 16)
	sub, err := w.bus.Conn.ChanSubscribe(w.bus.Names.StoredSubject(issue.Kind), announced)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := w.bus.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := taken.Nak(); err != nil {
		t.Fatal(err)
	}

	// The second replica gets the redelivery. The sweep never runs (the
	// fake clock is not advanced), so only the redelivery can wake the
	// comment.
	w.start(t)
	select {
	case msg := <-announced:
		var got nostr.Event
		if err := json.Unmarshal(msg.Data, &got); err != nil {
			t.Fatal(err)
		}
		if got.ID != issue.ID || got.Sig != issue.Sig {
			t.Errorf("announced %s (sig %s…), want the stored issue %s", got.ID, got.Sig[:8], issue.ID)
		}
		if o := msg.Header.Get(bus.HeaderOrigin); o != "ingester" {
			t.Errorf("origin %q, want ingester", o)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the redelivered, already stored issue was never announced on grasp.stored")
	}
	waitUntil(t, "comment stored", func() bool { return w.has(t, comment.ID) })
	waitUntil(t, "lot empty", func() bool { n, _ := w.lot.Len(context.Background()); return n == 0 })
}
