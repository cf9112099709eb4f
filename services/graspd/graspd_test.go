package graspd_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/graspd"
	"github.com/grasp-sync/grasp-sync/services/graspd/graspdtest"
)

// startGraspd starts graspd on random ports with the given services.
func startGraspd(t *testing.T, services []string) *graspd.App {
	t.Helper()
	graspdTestEnv(t, "", services)
	app, _ := graspdtest.Start(t, nil)
	return app
}

// graspdTestEnv sets the environment the graspd tests run under: a fresh
// data directory, loopback listeners, a short discovery window, 4 shards;
// natsListen "" runs the embedded NATS without a listener.
func graspdTestEnv(t *testing.T, natsListen string, services []string) {
	t.Helper()
	t.Setenv("GRASP_DATA_DIR", t.TempDir())
	t.Setenv("GRASP_NATS_LISTEN", natsListen)
	t.Setenv("GRASP_RELAY_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_METRICS_ADDR", "127.0.0.1:0")
	t.Setenv("GRASP_RELAY_ALLOWLIST", "127.0.0.1")
	t.Setenv("GRASP_DISCOVERY_BATCH_WINDOW", "300ms")
	t.Setenv("GRASP_SHARDS", "4")
	t.Setenv("GRASP_SERVICES", strings.Join(services, ","))
}

// TestWalkingSkeleton is the end-to-end path of docs/sync.md, "The pipeline": a client
// announces a repository to our relay listing two remote relays; discovery
// indexes it, the planner plans, the fetcher fetches, the ingester stores.
// The patch (remote 1), the issue and its comment (remote 2) must reach our
// store; an announcement that does not list us must not. With any one
// service removed from the wiring, they must not arrive.
func TestWalkingSkeleton(t *testing.T) {
	for _, removed := range append([]string{""}, graspd.AllServices...) {
		name := "all services"
		if removed != "" {
			name = "without " + removed
		}
		t.Run(name, func(t *testing.T) {
			services := slices.DeleteFunc(slices.Clone(graspd.AllServices), func(s string) bool { return s == removed })
			remote1 := testrelay.Start(t, testrelay.Options{})
			remote2 := testrelay.Start(t, testrelay.Options{Negentropy: true})
			app := startGraspd(t, services)

			owner, contributor, stranger := testkit.NewKey(), testkit.NewKey(), testkit.NewKey()
			ann := owner.Announcement("skeleton",
				[]string{testkit.GraspCloneURL(app.PublicURL(), owner.PubKey, "skeleton")},
				[]string{app.PublicURL(), remote1.URL, remote2.URL}, nil)
			repo := testkit.RepoRef(owner.PubKey, "skeleton")
			patch := contributor.Patch(repo)
			issue := contributor.Issue(repo, "it breaks")
			comment := owner.Comment(issue, issue, "thanks, looking")
			notOurs := stranger.Announcement("elsewhere",
				[]string{"https://git.example.org/" + stranger.PubKey + "/elsewhere.git"},
				[]string{remote1.URL}, nil)
			remote1.Add(t, patch, notOurs)
			remote2.Add(t, issue, comment)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if removed == "relay" {
				// Nothing serves the relay's port: the publish must fail.
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				if err := testrelay.Publish(pctx, app.RelayURL(), ann); err == nil {
					t.Fatal("publish succeeded without the relay service")
				}
				pcancel()
			} else if err := testrelay.Publish(ctx, app.RelayURL(), ann); err != nil {
				t.Fatalf("publish announcement to our relay: %v", err)
			}

			want := []*nostr.Event{patch, issue, comment}
			wait := 15 * time.Second
			if removed != "" {
				wait = 5 * time.Second
			}
			start := time.Now()
			got := waitStored(t, app, want, wait)
			if removed == "" {
				if got != len(want) {
					t.Fatalf("%d of %d remote events stored within %s", got, len(want), wait)
				}
				t.Logf("all remote events stored %s after the announcement", time.Since(start).Round(10*time.Millisecond))
				if ok, err := app.Store().Has(context.Background(), notOurs.ID); err != nil || ok {
					t.Fatalf("announcement not listing us stored = %v (err %v)", ok, err)
				}
				return
			}
			if got == len(want) {
				t.Fatalf("all events synced without %s: the test does not exercise the wiring", removed)
			}
		})
	}
}

// waitStored polls the store until every event is stored or wait passes,
// and returns how many were stored.
func waitStored(t *testing.T, app *graspd.App, want []*nostr.Event, wait time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		n := 0
		for _, e := range want {
			ok, err := app.Store().Has(context.Background(), e.ID)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				n++
			}
		}
		if n == len(want) || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The relay serves NIP-11 with supported_grasps.
func TestNIP11(t *testing.T) {
	app := startGraspd(t, graspd.AllServices)
	req, _ := http.NewRequest("GET", "http"+strings.TrimPrefix(app.RelayURL(), "ws"), nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"supported_grasps":["GRASP-01","GRASP-02"]`) {
		t.Fatalf("NIP-11 = %s", body)
	}
}

// TestDefaultMemoryLimit: graspd's default soft limit leaves the embedded
// store's budget and 48 MiB for the program's code and the runtime, which lie
// outside the Go heap, out of the 256 MiB it is sized for
// (docs/decisions/0039-default-soft-memory-limit.md, 0074).
func TestDefaultMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    graspd.Config
		want config.ByteSize
	}{
		{"embedded store, default budget (48 MiB)", graspd.Config{}, 160 << 20},
		{"embedded store, smaller budget", graspd.Config{StoreURL: "kv+pebble:///data", StoreMemory: 32 << 20}, 176 << 20},
		{"embedded store, the old default budget", graspd.Config{StoreMemory: 96 << 20}, 128 << 20},
		{"embedded store, large budget", graspd.Config{StoreMemory: 1 << 30}, 128 << 20},
		{"postgres", graspd.Config{StoreURL: "postgres://u@h/db", StoreMemory: 48 << 20}, 208 << 20},
	} {
		if got := graspd.DefaultMemoryLimit(tc.c); got != tc.want {
			t.Errorf("%s: DefaultMemoryLimit = %s, want %s", tc.name, got, tc.want)
		}
	}
}
