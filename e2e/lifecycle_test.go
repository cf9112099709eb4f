package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/khatrulock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// publishRemote stores evts on a remote relay and broadcasts them to its
// live subscribers. It does not publish over websocket: khatru v0.19.1's
// EVENT path notifies listeners without its clientsMutex and races with
// another connection's CLOSE (which consolidation sends), so the remote
// relay itself would fail -race; see pkg/khatrulock.
func publishRemote(r *testrelay.Relay, evts ...*nostr.Event) error {
	for _, evt := range evts {
		skip, err := r.Khatru.AddEvent(context.Background(), evt)
		if err != nil {
			return fmt.Errorf("add event %s to %s: %w", evt.ID, r.URL, err)
		}
		if !skip {
			khatrulock.Broadcast(r.Khatru, evt)
		}
	}
	return nil
}

// An announcement update that removes a relay stops syncing from it and
// disconnects it (no repository left there); a repository whose update
// stops listing us is dropped; a bootstrap relay stays connected with no
// repository on it.
func TestAnnouncementLifecycle(t *testing.T) {
	a := testrelay.Start(t, testrelay.Options{})
	boot := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, Env{"GRASP_BOOTSTRAP_RELAYS": boot.URL})
	owner, other, contributor := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "life")
	control := testkit.RepoRef(other.PubKey, "control")
	now := time.Now()
	at := func(d time.Duration) testkit.Option { return testkit.At(nostr.Timestamp(now.Add(d).Unix())) }

	announce(t, app,
		ourAnnouncement(owner, app, "life", []string{a.URL, boot.URL}, nil, at(-3*time.Second)),
		ourAnnouncement(other, app, "control", []string{boot.URL}, nil))
	onA, onBoot := contributor.Issue(repo, "on a"), contributor.Issue(repo, "on boot")
	a.Add(t, onA)
	boot.Add(t, onBoot)
	mustArrive(t, app, 20*time.Second, onA, onBoot)
	waitConnected(t, app, a.URL, true)

	// v2 drops relay a: a is disconnected, nothing more comes from it.
	announce(t, app, ourAnnouncement(owner, app, "life", []string{boot.URL}, nil, at(-2*time.Second)))
	waitConnected(t, app, a.URL, false)
	lateA, lateBoot := contributor.Issue(repo, "late on a"), contributor.Issue(repo, "late on boot")
	mustPublish(t, a, lateA)
	mustPublish(t, boot, lateBoot)
	mustArrive(t, app, 15*time.Second, lateBoot)
	mustNotArrive(t, app, 2*time.Second, lateA)

	// v3 stops listing us (the owner's update is accepted by the owner
	// exception): the repository is dropped, the bootstrap relay stays.
	announce(t, app, owner.Announcement("life", []string{"https://git.example.org/life.git"}, []string{boot.URL}, nil, at(-time.Second)))
	time.Sleep(2 * time.Second) // discovery batch window + planner recompute; then check both sides
	dropped, kept := contributor.Issue(repo, "after the drop"), contributor.Issue(control, "control repo")
	mustPublish(t, boot, dropped, kept)
	mustArrive(t, app, 15*time.Second, kept)
	mustNotArrive(t, app, 2*time.Second, dropped)
	waitConnected(t, app, boot.URL, true)
}

// TestSSRFNeverDialled runs ssrfNeverDialled against graspd in-process.
func TestSSRFNeverDialled(t *testing.T) { ssrfNeverDialled(t, start) }

// SSRF: an announcement listing a local relay that is not allowlisted and
// the cloud metadata address is synced from its allowlisted relay only; the
// other two are never dialled.
func ssrfNeverDialled(t *testing.T, start starter) {
	allowed := testrelay.Start(t, testrelay.Options{})
	forbidden := faultrelay.Start(t, testrelay.Options{})
	app := start(t, Env{"GRASP_RELAY_ALLOWLIST": allowed.URL[len("ws://"):]})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "ssrf")
	good, bad := contributor.Issue(repo, "allowed"), contributor.Issue(repo, "forbidden")
	allowed.Add(t, good)
	forbidden.Add(t, bad)
	announce(t, app, ourAnnouncement(owner, app, "ssrf",
		[]string{allowed.URL, forbidden.URL, "ws://169.254.169.254", "ws://169.254.169.254:7777/x"}, nil))
	mustArrive(t, app, 20*time.Second, good)
	mustNotArrive(t, app, 2*time.Second, bad)
	if n := len(forbidden.Spans()); n != 0 {
		t.Fatalf("non-allowlisted local relay got %d connections", n)
	}
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	if ok := MetricSum(m, "grasp_fetcher_connect_attempts_total", "169.254.169.254", `result="ok"`); ok != 0 {
		t.Fatalf("metadata address connected %v times", ok)
	}
}

// A rate-limited remote (CLOSED rate-limited on its first REQs) is cooled
// down and then synced completely.
func TestRateLimitedCompletes(t *testing.T) {
	remote := faultrelay.Start(t, testrelay.Options{})
	remote.Set(faultrelay.Faults{RateLimitREQs: 2})
	app := start(t, Env{"GRASP_FETCHER_RATE_LIMIT_COOLDOWN": "1s", "GRASP_FETCHER_RATE_LIMIT_MAX_COOLDOWN": "2s"})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "limited")
	var want []*nostr.Event
	for i := 0; i < 30; i++ {
		want = append(want, contributor.Issue(repo, fmt.Sprint("issue ", i)))
	}
	remote.Add(t, want...)
	announce(t, app, ourAnnouncement(owner, app, "limited", []string{remote.URL}, nil))
	mustArrive(t, app, 30*time.Second, want...)
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	if c := MetricSum(m, "grasp_fetcher_rate_limit_cooldowns_total"); c == 0 {
		t.Fatal("no rate-limit cooldown recorded: the fault was not exercised")
	}
}

// Quick reconnect: the remote goes away (connection dropped, reconnects
// refused) while events are published on it; when it is back they all
// arrive through the catch-up, and the history older than the since window
// (backdated an hour) is not downloaded again.
func TestQuickReconnect(t *testing.T) {
	remote := faultrelay.Start(t, testrelay.Options{})
	app := start(t, nil)
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "flaky")
	var history []*nostr.Event
	old := time.Now().Add(-time.Hour).Unix()
	for i := 0; i < 50; i++ {
		history = append(history, contributor.Issue(repo, fmt.Sprint("old ", i), testkit.At(nostr.Timestamp(old+int64(i)))))
	}
	remote.Add(t, history...)
	announce(t, app, ourAnnouncement(owner, app, "flaky", []string{remote.URL}, nil))
	mustArrive(t, app, 20*time.Second, history...)
	waitConnected(t, app, remote.URL, true)
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	before := MetricSum(m, "grasp_fetcher_events_received_total", `mode="historic"`)

	// Down: the next forwarded event drops the session, reconnects fail.
	remote.Set(faultrelay.Faults{DropAfterEvents: 1, RejectConnections: 1 << 30})
	trigger := contributor.Issue(repo, "drops the connection")
	mustPublish(t, remote.Relay, trigger)
	waitConnected(t, app, remote.URL, false)
	var meanwhile []*nostr.Event
	for i := 0; i < 20; i++ {
		issue := contributor.Issue(repo, fmt.Sprint("while down ", i))
		meanwhile = append(meanwhile, issue, owner.Comment(issue, issue, "seen"))
	}
	remote.Add(t, meanwhile...)
	time.Sleep(time.Second) // stay down across several reconnect attempts
	remote.Set(faultrelay.Faults{})
	mustArrive(t, app, 30*time.Second, append(meanwhile, trigger)...)
	if m, err = Metrics(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	if q := MetricSum(m, "grasp_planner_reconnects_total", `kind="quick"`); q == 0 {
		t.Fatal("no quick reconnect recorded")
	}
	// The catch-up may fetch what is inside the since window (the trigger
	// and what was published meanwhile), not the hour-old history. Each
	// in-window event may arrive up to three times: khatru over eventstore
	// badger ignores the tag letter, so the #a, #A and #q filters (and #e,
	// #E, #q) all return it. A re-downloaded history would add 150 more.
	if got, limit := MetricSum(m, "grasp_fetcher_events_received_total", `mode="historic"`)-before, float64(3*(len(meanwhile)+1)); got > limit {
		t.Fatalf("catch-up received %v historic events, want ≤ %v (history re-downloaded)", got, limit)
	}
}

// More live filters than the budget (GRASP_PLANNER_MAX_LIVE_FILTERS lowered
// to 4, so a handful of repositories exceed it the way >70 do in
// production) are consolidated, and nothing published during the swaps is
// missed.
//
// The fetcher once handled ReplaceLive by closing every live group before
// opening the new ones; events the relay received in between matched no
// subscription and were lost (an issue and its comment on three consecutive
// repositories, about one run in three). It now opens the new groups first
// and closes the old ones once the relay has registered the new ones
// (services/fetcher/live.go, replaceLive).
func TestConsolidationMissesNothing(t *testing.T) {
	remote := testrelay.Start(t, testrelay.Options{})
	app := start(t, Env{"GRASP_PLANNER_MAX_LIVE_FILTERS": "4"})
	contributor := testkit.NewKey()
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu        sync.Mutex
		published []*nostr.Event
		repos     []string
		wg        sync.WaitGroup
	)
	// The publisher owns its goroutine; cancel + wg.Wait stop it.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			mu.Lock()
			rs := append([]string(nil), repos...)
			mu.Unlock()
			for _, r := range rs {
				issue := contributor.Issue(r, "during consolidation")
				comment := contributor.Comment(issue, issue, "and its comment")
				if err := publishRemote(remote, issue, comment); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				published = append(published, issue, comment)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	for i := 0; i < 12; i++ {
		k := testkit.NewKey()
		d := fmt.Sprint("repo", i)
		seed := contributor.Issue(testkit.RepoRef(k.PubKey, d), "seed")
		remote.Add(t, seed)
		announce(t, app, ourAnnouncement(k, app, d, []string{remote.URL}, nil))
		mustArrive(t, app, 20*time.Second, seed)
		mu.Lock()
		repos = append(repos, testkit.RepoRef(k.PubKey, d))
		mu.Unlock()
	}
	time.Sleep(time.Second) // let the publisher run across the last swap
	cancel()
	wg.Wait()
	mu.Lock()
	all := published
	mu.Unlock()
	if len(all) == 0 {
		t.Fatal("nothing was published during the consolidations")
	}
	mustArrive(t, app, 30*time.Second, all...)
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	if c := MetricSum(m, "grasp_planner_consolidations_total"); c == 0 {
		t.Fatal("no consolidation happened: the scenario did not exceed the budget")
	}
	t.Logf("%d live events published across %v consolidations, all stored", len(all), MetricSum(m, "grasp_planner_consolidations_total"))
}

// mustPublish is publishRemote from the test goroutine.
func mustPublish(t *testing.T, r *testrelay.Relay, evts ...*nostr.Event) {
	t.Helper()
	if err := publishRemote(r, evts...); err != nil {
		t.Fatal(err)
	}
}
