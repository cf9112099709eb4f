package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// TestGraspdKilledTakesBackItsShards: graspd's fetcher on its embedded
// NATS renews its shard leases on a one-minute TTL and, killed with
// SIGKILL and started again on the same data directory, serves every shard
// again at once instead of waiting for its old leases to expire
// (docs/decisions/0079-graspd-fetcher-leases.md). The built binary on its
// defaults; the lease bucket is read with nats.go through graspd's NATS
// listener, as an operator's nats CLI would.
func TestGraspdKilledTakesBackItsShards(t *testing.T) {
	binDir, err := BuildBinaries()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr, natsAddr := freeAddr(t), freeAddr(t)
	env := Env{
		"GRASP_DATA_DIR":        t.TempDir(),
		"GRASP_RELAY_ADDR":      freeAddr(t),
		"GRASP_METRICS_ADDR":    metricsAddr,
		"GRASP_NATS_LISTEN":     natsAddr,
		"GRASP_RELAY_ALLOWLIST": "127.0.0.1",
	}
	p := &Proc{Name: "graspd", Log: filepath.Join(t.TempDir(), "graspd.log"), HealthURL: "http://" + metricsAddr + "/readyz",
		MetricsAddr: metricsAddr, bin: filepath.Join(binDir, "graspd"), env: processEnv(env, nil)}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	const shards = 16 // GRASP_SHARDS' default
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitShardsOwned(ctx, t, p, shards)

	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, bus.Names{}.FetcherLeaseBucket())
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != time.Minute {
		t.Errorf("lease bucket TTL = %s, want 1m on the embedded NATS", st.TTL())
	}
	before, err := kv.Get(ctx, bus.FetcherShardKey(0))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	// The leases were renewed at most 15 s (TTL/4) before the kill, so
	// none can expire before 45 s after it: shards served again sooner
	// were taken back, not claimed anew.
	killed := time.Now()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithDeadline(ctx, killed.Add(40*time.Second))
	defer tcancel()
	waitShardsOwned(tctx, t, p, shards)
	t.Logf("all %d shards served again %s after SIGKILL (lease holder %q before)", shards,
		time.Since(killed).Round(time.Millisecond), before.Value())
}

// waitShardsOwned waits until p's fetcher serves n shards.
func waitShardsOwned(ctx context.Context, t *testing.T, p *Proc, n int) {
	t.Helper()
	var got float64
	for {
		m := map[string]float64{}
		if err := scrapeInto(ctx, p.MetricsAddr, m); err == nil {
			if got = MetricSum(m, "grasp_fetcher_shards_owned"); got == float64(n) {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s serves %v of %d shards: %v; log ends:\n%s", p.Name, got, n, ctx.Err(), Tail(p.Log, 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
