package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// backdatedOutage syncs a repository with 50 hour-old issues from remote,
// then takes remote down (connection dropped, reconnects refused) while
// events are published on it: new ones, and back-dated ones — with a
// created_at an hour old, as other syncers and clients republishing
// history send them: issues, comments on an issue we hold, and comments
// on those back-dated issues (replies, found through their root) — and
// brings it back within the quick-reconnect window. It returns the new,
// the back-dated and the reply events and the historic events received
// before the outage.
func backdatedOutage(t *testing.T, app Target, remote *faultrelay.Relay, d string) (fresh, backdated, replies []*nostr.Event, before float64) {
	t.Helper()
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, d)
	var history []*nostr.Event
	old := time.Now().Add(-time.Hour).Unix()
	for i := 0; i < 50; i++ {
		history = append(history, contributor.Issue(repo, fmt.Sprint("old ", i), testkit.At(nostr.Timestamp(old+int64(i)))))
	}
	remote.Add(t, history...)
	announce(t, app, ourAnnouncement(owner, app, d, []string{remote.URL}, nil))
	mustArrive(t, app, 20*time.Second, history...)
	waitConnected(t, app, remote.URL, true)
	// Every item confirmed before the outage: an item still unconfirmed is
	// read whole after the reconnect (its first read), which would bring
	// the back-dated comments on it whatever the catch-up's since.
	qctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitQuiescent(qctx, app, []string{remote.URL}, time.Second); err != nil {
		t.Fatal(err)
	}
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	before = MetricSum(m, "grasp_fetcher_events_received_total", `mode="historic"`)

	remote.Set(faultrelay.Faults{DropAfterEvents: 1, RejectConnections: 1 << 30})
	trigger := contributor.Issue(repo, "drops the connection")
	mustPublish(t, remote.Relay, trigger)
	waitConnected(t, app, remote.URL, false)
	fresh = append(fresh, trigger)
	for i := 0; i < 5; i++ {
		issue := contributor.Issue(repo, fmt.Sprint("new while down ", i))
		fresh = append(fresh, issue, owner.Comment(issue, issue, "seen"))
		// Older than since = disconnected_at − 15 min.
		at := nostr.Timestamp(old + 100 + int64(2*i))
		republished := contributor.Issue(repo, fmt.Sprint("republished while down ", i), testkit.At(at))
		backdated = append(backdated, republished, owner.Comment(history[i], history[i], "late reply", testkit.At(at)))
		replies = append(replies, owner.Comment(republished, republished, "seen", testkit.At(at+1)))
	}
	remote.Add(t, fresh[1:]...)
	remote.Add(t, backdated...)
	remote.Add(t, replies...)
	time.Sleep(time.Second) // down across several reconnect attempts
	remote.Set(faultrelay.Faults{})
	return fresh, backdated, replies, before
}

// readRelay reads the planner's record of url as graspctl status does.
func readRelay(t *testing.T, app Graspd, url string) syncstatus.Relay {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if app.NATSURL() == "" {
		t.Fatal("graspd has no NATS listener (GRASP_NATS_LISTEN)")
	}
	b, err := bus.Connect(ctx, app.NATSURL(), "e2e-status", bus.Names{Prefix: "grasp"}, bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	snap, err := syncstatus.ReadRelays(ctx, b.JS, b.Names)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := snap.Relay(url)
	if !ok {
		t.Fatalf("no record of %s", url)
	}
	return r
}

// Back-dated events published to a NIP-77 relay while it was down arrive
// with the quick reconnect's catch-up, which reconciles the confirmed items
// whole instead of reading from since — and the history we hold is not
// downloaded again. (Before, the catch-up read from since = disconnected_at
// − 15 min and these events waited for the daily resync.)
func TestBackdatedEventsAfterReconnectNIP77(t *testing.T) {
	remote := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, nil)
	fresh, backdated, replies, before := backdatedOutage(t, app, remote, "backdated-neg")
	mustArrive(t, app, 30*time.Second, append(append(fresh, backdated...), replies...)...)
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	if q := MetricSum(m, "grasp_planner_reconnects_total", `kind="quick"`); q == 0 {
		t.Fatal("no quick reconnect recorded")
	}
	if l := MetricSum(m, "grasp_planner_reconnects_total", `kind="long"`) + MetricSum(m, "grasp_planner_reconnects_total", `kind="daily"`); l != 0 {
		t.Fatalf("%v long or daily reconnects: the events may have come from a full resync", l)
	}
	// Reconciled: only what we lacked crosses the wire, not the 50 events
	// of history we hold. khatru over badger answers #a, #A and #q alike, so
	// an event can come once per filter, and twice when its id fetch was
	// deferred (batchRun.deferPublished) and it was not stored yet: at most
	// 6 copies of each new event (about 3.5 in practice), while reading the
	// history again would add 150.
	got, limit := MetricSum(m, "grasp_fetcher_events_received_total", `mode="historic"`)-before,
		float64(6*(len(fresh)+len(backdated)+len(replies)))
	t.Logf("historic events received since the outage: %v for %d new events (limit %v)", got, len(fresh)+len(backdated)+len(replies), limit)
	if got > limit {
		t.Fatalf("catch-up received %v historic events, want ≤ %v (history re-downloaded)", got, limit)
	}
	if n := MetricSum(m, "grasp_planner_resync_missed_events_total"); n != 0 {
		t.Fatalf("%v events counted missed without a daily resync", n)
	}
}

// On a relay without NIP-77 the catch-up keeps its since: back-dated events
// published while it was down are missed until the daily resync
// (docs/sync.md, "Catch-ups and back-dated events"), which finds them and
// counts them as missed, in the metric and in the relay's record graspctl
// status shows.
func TestBackdatedEventsREQOnlyWaitForResync(t *testing.T) {
	remote := faultrelay.Start(t, testrelay.Options{})
	// The daily resync 45 s after the first connect: after the outage and
	// its catch-up, soon enough for a test.
	// A NATS listener (a free port) lets the test read the relay records.
	app := start(t, Env{"GRASP_PLANNER_RESYNC_MIN": "45s", "GRASP_PLANNER_RESYNC_MAX": "45s", "GRASP_NATS_LISTEN": "127.0.0.1:0"})
	fresh, backdated, replies, _ := backdatedOutage(t, app, remote, "backdated-req")
	mustArrive(t, app, 30*time.Second, fresh...)
	ctx := context.Background()
	m, err := Metrics(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	if d := MetricSum(m, "grasp_planner_reconnects_total", `kind="daily"`); d != 0 {
		t.Fatalf("the daily resync ran before the catch-up could be checked (%v); raise GRASP_PLANNER_RESYNC_MIN", d)
	}
	// The catch-up is over once the relay settles: what it brought is in.
	deadline := time.Now().Add(20 * time.Second)
	for RelayStatus(m, remote.URL) != StatusConnected {
		if time.Now().After(deadline) {
			t.Fatalf("relay status %v after the catch-up", RelayStatus(m, remote.URL))
		}
		time.Sleep(200 * time.Millisecond)
		if m, err = Metrics(ctx, app); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for _, e := range append(backdated, replies...) {
		ids = append(ids, e.ID)
	}
	if n, err := CountStored(ctx, app, ids); err != nil || n != 0 {
		t.Fatalf("%d of %d back-dated events stored before the daily resync (err %v): the REQ catch-up's since should not see them", n, len(ids), err)
	}
	if MetricSum(m, "grasp_planner_reconnects_total", `kind="daily"`) != 0 {
		t.Fatal("the daily resync ran before the check")
	}

	mustArrive(t, app, 60*time.Second, append(backdated, replies...)...)
	var missed float64
	deadline = time.Now().Add(20 * time.Second)
	for {
		if m, err = Metrics(ctx, app); err != nil {
			t.Fatal(err)
		}
		if missed = MetricSum(m, "grasp_planner_resync_missed_events_total"); missed >= float64(len(backdated)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The replies are not counted: they hang off roots the resync found
	// and arrive with those roots' first batches (docs/sync.md, "Counting
	// what the daily resync finds").
	if missed != float64(len(backdated)) {
		t.Fatalf("grasp_planner_resync_missed_events_total = %v, want %d (the back-dated events, nothing else)", missed, len(backdated))
	}
	r := readRelay(t, app.(Graspd), remote.URL)
	if r.ResyncMissed != uint64(len(backdated)) || r.LastMissedAt.IsZero() {
		t.Fatalf("relay record: resync missed %d at %v, want %d", r.ResyncMissed, r.LastMissedAt, len(backdated))
	}
}
