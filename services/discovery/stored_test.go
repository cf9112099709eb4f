package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// publishStored announces evt on grasp.stored.<kind> the way the ingester
// does after storing it.
func publishStored(t *testing.T, b *bus.Bus, evt *nostr.Event) {
	t.Helper()
	msg := nats.NewMsg(b.Names.StoredSubject(evt.Kind))
	data, err := json.Marshal(evt)
	if err != nil {
		t.Fatal(err)
	}
	msg.Data = data
	msg.Header.Set(bus.HeaderOrigin, "ingester")
	if err := b.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if err := b.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestStoredFeedWhileRelayDown: while discovery cannot reach the own relay,
// roots the writers announce on NATS — with an old created_at, as synced
// history has, which a since catch-up would not return — reach the index,
// and so do NIP-09 deletions announced the same way, in either order. After
// the relay is back, the same events seen again through the websocket
// change nothing.
func TestStoredFeedWhileRelayDown(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	p := startProxy(t, relay.URL[len("ws://"):])
	e := newEnv(t)
	in := e.start(t, Config{RelayURL: "ws://" + p.addr, BatchWindow: 50 * time.Millisecond}, clock.Real{})
	eventually(t, 10*time.Second, "ready", func() bool { return in.d.Ready() == nil })

	owner, other := testkit.NewKey(), testkit.NewKey()
	ref := refOf(owner, "r")
	add(t, relay, announce(owner, "r", []string{"wss://a.example"}))
	eventually(t, 10*time.Second, "entry", func() bool { return entries(t, e.kv)[ref] != nil })

	p.down()
	eventually(t, 10*time.Second, "not ready while disconnected", func() bool { return in.d.Ready() != nil })

	ingester, err := bus.ConnectInProcess(e.nats.Server, "ingester", bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ingester.Close)
	old := nostr.Now() - 24*3600
	issue := other.Issue(ref.String(), "synced", testkit.At(old))
	publishStored(t, ingester, issue)
	eventually(t, 10*time.Second, "root announced on NATS indexed", func() bool {
		return slices.Equal(entries(t, e.kv)[ref].GetRootEventIds(), []string{issue.ID})
	})
	if in.d.Ready() == nil {
		t.Fatal("the relay is unreachable, yet discovery reports its self-subscription live")
	}

	// A deletion, then (out of order, as from two writers) the deletion of
	// a root that has not arrived yet, then that root.
	patch := other.Patch(ref.String(), testkit.At(old))
	publishStored(t, ingester, other.Deletion([]*nostr.Event{issue}))
	publishStored(t, ingester, other.Deletion([]*nostr.Event{patch}))
	publishStored(t, ingester, patch)
	second := other.Issue(ref.String(), "second", testkit.At(old+1))
	publishStored(t, ingester, second)
	eventually(t, 10*time.Second, "deletions applied", func() bool {
		return slices.Equal(entries(t, e.kv)[ref].GetRootEventIds(), []string{second.ID})
	})

	// The writers had stored them: the relay returns them after the
	// reconnect (second through the history catch-up) and nothing changes.
	if err := relay.Store.SaveEvent(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	seen := testutil.ToFloat64(in.d.metrics.storedSeen)
	if seen != 5 {
		t.Errorf("stored events metric = %v, want 5", seen)
	}
	p.up(t)
	eventually(t, 20*time.Second, "ready again", func() bool { return in.d.Ready() == nil })
	if got := entries(t, e.kv)[ref].GetRootEventIds(); !slices.Equal(got, []string{second.ID}) {
		t.Errorf("roots after the reconnect = %v, want only %s", got, second.ID)
	}
}

// TestStoredFeedReportsLoss: announcements that do not fit in the feed's
// queue are counted, and a mark taken before them no longer reads as
// complete — which is what makes the next session read the whole history
// instead of a since catch-up.
func TestStoredFeedReportsLoss(t *testing.T) {
	e := newEnv(t)
	b, err := bus.ConnectInProcess(e.nats.Server, "discovery", bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	reg := prometheus.NewRegistry()
	d := New(Config{RelayURL: "ws://127.0.0.1:1"}, b, service, nil, clock.Real{}, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	d.storedQueue = 2
	feed, err := d.subscribeStored(d.log)
	if err != nil {
		t.Fatal(err)
	}
	defer feed.stop()
	before := d.mark(feed)
	if !d.complete(feed, before) {
		t.Fatal("a fresh mark reads as incomplete")
	}

	k := testkit.NewKey()
	ref := testkit.RepoRef(k.PubKey, "r")
	for i := range 5 {
		publishStored(t, b, k.Issue(ref, fmt.Sprint("issue ", i)))
	}
	// Nothing reads the queue: two are queued, three dropped.
	eventually(t, 10*time.Second, "announcements delivered", func() bool { return len(feed.events)+int(feed.dropped.Load()) == 5 })
	if got := feed.dropped.Load(); got != 3 {
		t.Fatalf("dropped = %d, want 3", got)
	}
	if v := testutil.ToFloat64(d.metrics.storedDropped); v != 3 {
		t.Errorf("dropped metric = %v, want 3", v)
	}
	if d.complete(feed, before) {
		t.Error("the feed dropped announcements since the mark, yet reads as complete")
	}
	if !d.complete(feed, d.mark(feed)) {
		t.Error("a mark taken after the drops reads as incomplete")
	}
	// Only discovery's kinds are received: a comment is not queued.
	<-feed.events
	<-feed.events
	issue := k.Issue(ref, "fits")
	publishStored(t, b, k.Comment(issue, issue, "comment"))
	publishStored(t, b, issue)
	eventually(t, 10*time.Second, "the issue queued", func() bool { return len(feed.events) > 0 })
	if evt := <-feed.events; evt.ID != issue.ID {
		t.Errorf("queued %d %s, want the issue", evt.Kind, evt.ID)
	}
}
