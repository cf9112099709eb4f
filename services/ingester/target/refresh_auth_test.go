//go:build !race

package target

// Not under the race detector: khatru v0.19.1 (the stand-in target) sets a
// connection's authenticated pubkey in the AUTH handler's goroutine and
// reads it in each NEG-OPEN's and REQ's goroutine without synchronisation;
// the refresh answers the challenge sent at connect while its NEG-OPEN is
// on the way, so -race fails on the relay's code, not ours
// (docs/dependencies.md, e2e/bolton_auth_test.go).

import (
	"strings"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A target that reads only for authenticated clients (NIP-42): the refresh
// authenticates with GRASP_TARGET_AUTH_KEY and reconciles; without a key it
// fails saying so, rather than reporting a target without NIP-77.
func TestMirrorRefreshAuthenticatesToRead(t *testing.T) {
	ctx := testCtx(t)
	g := testrelay.StartGraspRelay(t, testrelay.GraspOptions{Relay: testrelay.Options{Negentropy: true}, AuthReads: true, NoRateLimit: true})
	k := testkit.NewKey()
	issue := k.Issue(testkit.RepoRef(k.PubKey, "r"), "on the target only")
	g.Add(t, issue)

	rf := NewRefresher(Settings{Relay: g.URL, RefreshInterval: time.Hour}, openMirror(t), clock.Real{}, quiet(), nil)
	if res, err := rf.Refresh(ctx); err == nil || res.Unsupported || !strings.Contains(err.Error(), "GRASP_TARGET_AUTH_KEY") {
		t.Fatalf("refresh without a key: %+v, %v; want an error naming GRASP_TARGET_AUTH_KEY", res, err)
	}

	mirror := openMirror(t)
	rf = NewRefresher(Settings{Relay: g.URL, RefreshInterval: time.Hour, AuthKey: testkit.NewKey().Secret}, mirror, clock.Real{}, quiet(), nil)
	res, err := rf.Refresh(ctx)
	if err != nil || res.Fetched != 1 || !inMirror(t, mirror, issue.ID) {
		t.Fatalf("refresh with a key: %+v, %v; want the issue fetched", res, err)
	}
}
