package e2e

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// Long reconnect: the remote is down longer than the quick-reconnect window
// (GRASP_PLANNER_QUICK_RECONNECT shortened to 1s, standing in for 15 min);
// the planner starts the relay fresh and everything published meanwhile
// arrives.
func TestLongReconnect(t *testing.T) {
	remote := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	app := start(t, Env{"GRASP_PLANNER_QUICK_RECONNECT": "1s", "GRASP_PLANNER_SINCE_BUFFER": "1s"})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "gone")
	first := contributor.Issue(repo, "before")
	remote.Add(t, first)
	announce(t, app, ourAnnouncement(owner, app, "gone", []string{remote.URL}, nil))
	mustArrive(t, app, 20*time.Second, first)
	waitConnected(t, app, remote.URL, true)

	remote.Set(faultrelay.Faults{DropAfterEvents: 1, RejectConnections: 1 << 30})
	trigger := contributor.Issue(repo, "drops the connection")
	mustPublish(t, remote.Relay, trigger)
	waitConnected(t, app, remote.URL, false)
	var meanwhile []*nostr.Event
	old := time.Now().Add(-time.Hour).Unix()
	for i := 0; i < 10; i++ {
		// Backdated: only a fresh (full) sync finds these, not a since catch-up.
		issue := contributor.Issue(repo, fmt.Sprint("backdated while down ", i), testkit.At(nostr.Timestamp(old+int64(i))))
		meanwhile = append(meanwhile, issue, owner.Comment(issue, issue, "seen", testkit.At(nostr.Timestamp(old+int64(i)+1))))
	}
	remote.Add(t, meanwhile...)
	time.Sleep(2 * time.Second) // longer than the 1s quick-reconnect window
	remote.Set(faultrelay.Faults{})
	mustArrive(t, app, 30*time.Second, append(meanwhile, trigger)...)
	m, err := Metrics(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("planner reconnects: fresh %v quick %v long %v", MetricSum(m, "grasp_planner_reconnects_total", `kind="fresh"`),
		MetricSum(m, "grasp_planner_reconnects_total", `kind="quick"`), MetricSum(m, "grasp_planner_reconnects_total", `kind="long"`))
	if MetricSum(m, "grasp_planner_reconnects_total", `kind="long"`) == 0 {
		t.Fatal("no long reconnect recorded")
	}
}

// A dead relay (TCP accepts, then closes at once) is retried on the
// backoff schedule: gaps between attempts grow from the base towards the
// cap and never go below the base.
func TestDeadRelayBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		attempts []time.Time
		wg       sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			attempts = append(attempts, time.Now())
			mu.Unlock()
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	dead := "ws://" + ln.Addr().String()
	live := testrelay.Start(t, testrelay.Options{})
	app := start(t, Env{"GRASP_FETCHER_BACKOFF_BASE": "200ms", "GRASP_FETCHER_BACKOFF_MAX": "1600ms"})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	issue := contributor.Issue(testkit.RepoRef(owner.PubKey, "half"), "from the live relay")
	live.Add(t, issue)
	announce(t, app, ourAnnouncement(owner, app, "half", []string{dead, live.URL}, nil))
	mustArrive(t, app, 20*time.Second, issue)
	time.Sleep(5 * time.Second) // 200+400+800+1600+1600 ms: about five attempts
	mu.Lock()
	at := append([]time.Time(nil), attempts...)
	mu.Unlock()
	if len(at) < 4 {
		t.Fatalf("%d connection attempts to the dead relay, want ≥ 4", len(at))
	}
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]).Round(10*time.Millisecond))
	}
	t.Logf("gaps between attempts: %v", gaps)
	for _, g := range gaps {
		if g < 100*time.Millisecond {
			t.Fatalf("attempt gap %s below half the 200ms base: no backoff (%v)", g, gaps)
		}
	}
	if gaps[len(gaps)-1] < 2*gaps[0] {
		t.Fatalf("gaps did not grow: %v", gaps)
	}
}
