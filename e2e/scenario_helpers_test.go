package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// starter starts the deployment a scenario runs against, with BaseEnv
// plus overrides: start (graspd in-process) or startMulti (one process
// per service). Scenarios that run in both modes take it as a parameter
// named start, so their bodies read the same either way.
type starter func(t *testing.T, overrides Env) Target

// start runs graspd for one scenario with BaseEnv plus overrides.
func start(t *testing.T, overrides Env) Target {
	t.Helper()
	env := BaseEnv(t.TempDir())
	for k, v := range overrides {
		env[k] = v
	}
	var w *os.File
	if os.Getenv("GRASP_E2E_LOG") != "" {
		w = os.Stderr
	}
	if w != nil {
		app, _ := StartGraspd(t, env, w, "debug")
		return app
	}
	app, _ := StartGraspd(t, env, nil, "")
	return app
}

// announce publishes a repository announcement to our relay.
func announce(t *testing.T, app Target, evts ...*nostr.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testrelay.Publish(ctx, app.RelayURL(), evts...); err != nil {
		t.Fatalf("publish to our relay: %v", err)
	}
}

// ourAnnouncement is an announcement of repo d by k that lists us (clone URL
// on our host and our relay) and the given remote relays.
func ourAnnouncement(k testkit.Key, app Target, d string, remotes []string, maintainers []string, opts ...testkit.Option) *nostr.Event {
	return k.Announcement(d, []string{testkit.GraspCloneURL(app.PublicURL(), k.PubKey, d)},
		append([]string{app.PublicURL()}, remotes...), maintainers, opts...)
}

// mustArrive waits up to wait for every event to be stored.
func mustArrive(t *testing.T, app Target, wait time.Duration, evts ...*nostr.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	n, err := WaitStored(ctx, app, IDs(evts...))
	if err != nil {
		t.Fatal(err)
	}
	if n != len(evts) {
		for _, e := range evts {
			if ok, _ := app.Store().Has(context.Background(), e.ID); !ok {
				t.Logf("missing: kind %d %s tags %v", e.Kind, e.ID, e.Tags)
			}
		}
		t.Fatalf("%d of %d events stored within %s", n, len(evts), wait)
	}
}

// mustNotArrive gives the pipeline settle to act, then checks none of evts
// is stored. It is used after a positive control in the same scenario has
// arrived, so "not stored" is not just "not yet".
func mustNotArrive(t *testing.T, app Target, settle time.Duration, evts ...*nostr.Event) {
	t.Helper()
	time.Sleep(settle) // absence needs a bound; the positive control came first
	for _, e := range evts {
		if ok, err := app.Store().Has(context.Background(), e.ID); err != nil || ok {
			t.Fatalf("event kind %d %s stored = %v (err %v), want not stored", e.Kind, e.ID, ok, err)
		}
	}
}

// long skips a scenario unless GRASP_E2E_LONG is set (make e2e-long).
func long(t *testing.T) {
	t.Helper()
	if os.Getenv("GRASP_E2E_LONG") == "" {
		t.Skip("SKIP: long scenario; run with GRASP_E2E_LONG=1 (make e2e-long)")
	}
}
