//go:build !race

package e2e

// Not under the race detector: khatru v0.19.1 (the stand-in target, like
// ngit-relay) sets a connection's authenticated pubkey in the AUTH
// handler's goroutine and reads it in each EVENT's goroutine without
// synchronisation, so a client that sends EVENTs right after its AUTH (the
// sidecar does) makes -race fail on the relay's code, not ours
// (docs/dependencies.md). services/ingester/target's TestAuthRequired covers NIP-42 under
// -race, where the AUTH follows a refusal.

import (
	"context"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A target that exempts an authenticated pubkey from its limit (the
// operator's trusted-writer setting) takes everything at once from a
// sidecar given that key (GRASP_TARGET_AUTH_KEY): no rate-limited answer
// although the target's clock never moves.
func TestBoltOnAuthExempt(t *testing.T) {
	sidecar := testkit.NewKey()
	target := testrelay.StartGraspRelay(t, testrelay.GraspOptions{
		RequireAuth: true, TrustedPubKeys: []string{sidecar.PubKey},
		Clock: clock.NewFake(time.Unix(1_800_000_000, 0)),
	})
	remote := testrelay.Start(t, testrelay.Options{Negentropy: true})
	app := startBoltOn(t, target.URL, Env{"GRASP_TARGET_AUTH_KEY": sidecar.Secret})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	ann := ourAnnouncement(owner, app, "trusted", []string{remote.URL}, nil)
	history := graspWorld(owner, contributor, testkit.RepoRef(owner.PubKey, "trusted"), 10)
	remote.Add(t, ann)
	remote.Add(t, history...)
	// The owner announces on the target with a key of their own.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := testrelay.Dial(ctx, target.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Auth(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if ok, reason, err := c.Send(ctx, ann); err != nil || !ok {
		t.Fatalf("announce on the target: %v %s", err, reason)
	}
	_ = c.Close()
	onTarget(t, target.Relay, 40*time.Second, history...)
	if st := target.Stats(); st.RateLimited != 0 || len(st.Refused) != 0 {
		t.Fatalf("target stats %+v: want no rate limit and no refusal for the trusted sidecar", st)
	}
}
