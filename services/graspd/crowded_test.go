package graspd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/graspd/graspdtest"
)

// The reproduction of a crowded second, end to end: a remote relay capping
// REQs at 100 holds 300 issues of one repository we host, all with one
// created_at. Without NIP-77 the 200 beyond the cap cannot be read, and
// graspd must say so (the relay's record counts incomplete batches, explain
// names the slice, the repository stays unconfirmed, the batch is retried)
// instead of confirming the repository. With NIP-77 all 300 are stored and
// the repository is confirmed.
func TestCrowdedSecondThroughGraspd(t *testing.T) {
	for _, nip77 := range []bool{false, true} {
		t.Run(fmt.Sprintf("nip77=%v", nip77), func(t *testing.T) {
			t.Setenv("GRASP_PLANNER_FAILURE_RETRY", "1s")
			t.Setenv("GRASP_PLANNER_QUIET_PERIOD", "500ms")
			remote := testrelay.Start(t, testrelay.Options{MaxLimit: 100, Negentropy: nip77})
			// With a NATS listener to read the status from.
			graspdTestEnv(t, "127.0.0.1:0", graspd.AllServices)
			app, _ := graspdtest.Start(t, nil)
			owner, author := testkit.NewKey(), testkit.NewKey()
			repo := testkit.RepoRef(owner.PubKey, "crowded")
			at := nostr.Now() - 3600
			var issues []*nostr.Event
			for i := range 300 {
				issues = append(issues, author.Issue(repo, fmt.Sprint("issue ", i), testkit.At(at)))
			}
			remote.Add(t, issues...)
			b, err := bus.Connect(context.Background(), app.NATSURL(), "crowded-test", bus.DefaultNames(), bus.Security{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Close)
			ann := owner.Announcement("crowded", []string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, "crowded")},
				[]string{app.PublicURL(), remote.URL}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := testrelay.Publish(ctx, app.RelayURL(), ann); err != nil {
				t.Fatal(err)
			}
			if nip77 {
				if got := waitStored(t, app, issues, 60*time.Second); got != len(issues) {
					t.Fatalf("%d of %d issues stored", got, len(issues))
				}
				waitSnapshot(t, b, 30*time.Second, "the repository confirmed from the remote", func(s *syncstatus.Snapshot) bool {
					r, ok := s.Relay(remote.URL)
					return ok && r.ConfirmedRepos == 1 && r.IncompleteBatches == 0
				})
				return
			}
			snap := waitSnapshot(t, b, 60*time.Second, "two incomplete batches (the first and a retry)", func(s *syncstatus.Snapshot) bool {
				r, ok := s.Relay(remote.URL)
				return ok && r.IncompleteBatches >= 2
			})
			ex, err := snap.Explain(repo)
			if err != nil {
				t.Fatal(err)
			}
			if len(ex.Relays) != 1 || ex.Relays[0].RepoConfirmed || ex.Relays[0].Incomplete == "" {
				t.Fatalf("explain %+v: want the repository unconfirmed from %s, with the incomplete slice named", ex.Relays, remote.URL)
			}
			t.Logf("explain: %s", ex.Relays[0].Incomplete)
			if n := waitStored(t, app, issues, 0); n < 100 || n == len(issues) {
				t.Errorf("%d of %d issues stored; want the 100 the relay returns, not all", n, len(issues))
			}
		})
	}
}

// waitSnapshot polls the sync status until cond holds.
func waitSnapshot(t *testing.T, b *bus.Bus, wait time.Duration, what string, cond func(*syncstatus.Snapshot) bool) *syncstatus.Snapshot {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		snap, err := syncstatus.Read(context.Background(), b.JS, b.Names)
		if err == nil && cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			js, _ := json.MarshalIndent(snap, "", "  ")
			t.Fatalf("not within %s: %s (err %v); last snapshot:\n%s", wait, what, err, js)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A remote relay without NIP-77 capping REQs at 50, below
// the fetcher's RelayMinCap (100), holds 230 issues of one repository
// over distinct seconds: graspd stores all 230 before confirming the
// repository (it once took the first 50-event page as the whole history).
func TestRelayCappingBelowMinCapThroughGraspd(t *testing.T) {
	t.Setenv("GRASP_PLANNER_QUIET_PERIOD", "500ms")
	remote := testrelay.Start(t, testrelay.Options{MaxLimit: 50})
	// With a NATS listener to read the status from.
	graspdTestEnv(t, "127.0.0.1:0", graspd.AllServices)
	app, _ := graspdtest.Start(t, nil)
	owner, author := testkit.NewKey(), testkit.NewKey()
	repo := testkit.RepoRef(owner.PubKey, "capped")
	at := nostr.Now() - 3600
	var issues []*nostr.Event
	for i := range 230 {
		issues = append(issues, author.Issue(repo, fmt.Sprint("issue ", i), testkit.At(at-nostr.Timestamp(i))))
	}
	remote.Add(t, issues...)
	b, err := bus.Connect(context.Background(), app.NATSURL(), "capped-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	ann := owner.Announcement("capped", []string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, "capped")},
		[]string{app.PublicURL(), remote.URL}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testrelay.Publish(ctx, app.RelayURL(), ann); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, b, 60*time.Second, "the repository confirmed from the remote", func(s *syncstatus.Snapshot) bool {
		r, ok := s.Relay(remote.URL)
		return ok && r.ConfirmedRepos == 1
	})
	// Confirmed means fetched: everything reaches the store (the ingester
	// may still be writing the last ones).
	if got := waitStored(t, app, issues, 30*time.Second); got != len(issues) {
		t.Fatalf("repository confirmed with %d of %d issues stored", got, len(issues))
	}
}
