package discovery

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A root stored while both of discovery's sources lose it: the relay does
// not broadcast it (it missed the ingester's announcement on NATS too) and
// discovery's stored feed is down for a moment (a NATS reconnect). It has
// an old created_at, as synced history has. This is what a NATS node's
// loss did in make bench-scale's faults row: 14,617 comments on 20,000 such
// roots were never synced (docs/decisions/0068-discovery-feed-gap-rereads.md).
func storeUnannounced(t *testing.T, relay *testrelay.Relay, in *instance, evt *nostr.Event) {
	t.Helper()
	if err := relay.Store.SaveEvent(context.Background(), evt); err != nil {
		t.Fatal(err)
	}
	before := in.d.bus.Conn.Stats().Reconnects
	if err := in.d.bus.Conn.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "discovery's NATS connection reconnected", func() bool {
		return in.d.bus.Conn.Stats().Reconnects > before && in.d.bus.Conn.IsConnected()
	})
}

// indexedRepoAndGapRoot announces a repository and waits until discovery has
// indexed it and is live, then stores an issue on it the way
// storeUnannounced does: what the tests below expect discovery to find.
func indexedRepoAndGapRoot(t *testing.T, e *env, relay *testrelay.Relay, in *instance) (nip34.RepoRef, *nostr.Event) {
	t.Helper()
	owner := testkit.NewKey()
	ref := refOf(owner, "r")
	add(t, relay, announce(owner, "r", []string{"wss://a.example"}))
	eventually(t, 10*time.Second, "entry", func() bool { return entries(t, e.kv)[ref] != nil })
	eventually(t, 10*time.Second, "ready", func() bool { return in.d.Ready() == nil })
	issue := owner.Issue(ref.String(), "synced", testkit.At(nostr.Now()-24*3600))
	storeUnannounced(t, relay, in, issue)
	return ref, issue
}

// While the self-subscription stays live, a gap in the stored feed makes
// discovery read the whole history again: the root reaches the index now,
// not at the next periodic resync.
func TestFeedGapWhileLiveReadsWholeHistory(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	e := newEnv(t)
	in := e.start(t, Config{RelayURL: relay.URL, BatchWindow: 50 * time.Millisecond, FeedGapMinLive: time.Millisecond}, clock.Real{})
	ref, issue := indexedRepoAndGapRoot(t, e, relay, in)
	eventually(t, 20*time.Second, "the root stored during the feed's gap indexed", func() bool {
		return slices.Contains(entries(t, e.kv)[ref].GetRootEventIds(), issue.ID)
	})
	if v := testutil.ToFloat64(in.d.metrics.feedGapRereads); v < 1 {
		t.Errorf("feed gap rereads = %v, want at least 1", v)
	}
}

// A gap in the stored feed during a live session that is then lost makes
// the next session read the whole history, not a since catch-up: the live
// stream that was lost may not have delivered what the feed lost (the
// relay drops a client that stops reading, and broadcasts the ingester's
// events from the same announcements). Before, the feed's mark was taken
// when the session was lost, after the gap, and the catch-up missed the
// root.
func TestFeedGapThenRelayLostReadsWholeHistory(t *testing.T) {
	relay := testrelay.Start(t, testrelay.Options{})
	p := startProxy(t, relay.URL[len("ws://"):])
	e := newEnv(t)
	// Long enough that the live session is not ended for the gap itself.
	in := e.start(t, Config{RelayURL: "ws://" + p.addr, BatchWindow: 50 * time.Millisecond, FeedGapMinLive: time.Hour}, clock.Real{})
	ref, issue := indexedRepoAndGapRoot(t, e, relay, in)
	p.down()
	eventually(t, 10*time.Second, "not ready while disconnected", func() bool { return in.d.Ready() != nil })
	p.up(t)
	eventually(t, 20*time.Second, "ready again", func() bool { return in.d.Ready() == nil })
	eventually(t, 10*time.Second, "the root stored during the feed's gap indexed", func() bool {
		return slices.Contains(entries(t, e.kv)[ref].GetRootEventIds(), issue.ID)
	})
	if v := testutil.ToFloat64(in.d.metrics.feedGapRereads); v != 0 {
		t.Errorf("feed gap rereads = %v, want 0 (the session was lost first)", v)
	}
}
