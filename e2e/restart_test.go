package e2e

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// graspd killed (stopped without a drain) in the middle of its initial sync
// and started again on the same data directory finishes the sync: every
// event ends up stored, and the second run reads from where state says.
// Long: it moves a few thousand events twice.
func TestRestartMidInitialSync(t *testing.T) {
	long(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	remotes := []*testrelay.Relay{
		testrelay.Start(t, testrelay.Options{Negentropy: true, MaxLimit: 500}),
		testrelay.Start(t, testrelay.Options{MaxLimit: 500}),
	}
	ds := GenerateDataset("ws://"+addr, []string{remotes[0].URL, remotes[1].URL}, 40, 50, 2, 7)
	for i, r := range remotes {
		for _, e := range ds.PerRelay[i] {
			if err := r.Store.SaveEvent(context.Background(), e); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := BaseEnv(t.TempDir())
	env["GRASP_RELAY_ADDR"] = addr
	app, stop := StartGraspd(t, env, nil, "")
	announce(t, app, ds.Announcements...)
	ids := IDs(ds.Distinct...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		n, err := CountStored(ctx, app, ids)
		if err != nil {
			t.Fatal(err)
		}
		if n > len(ids)/5 {
			t.Logf("stopping graspd with %d of %d events stored", n, len(ids))
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d stored before the restart", n, len(ids))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	app, _ = StartGraspd(t, env, nil, "")
	mustArrive(t, app, 90*time.Second, ds.Distinct...)
}
