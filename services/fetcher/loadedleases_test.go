package fetcher_test

import (
	"strings"
	"testing"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/delayproxy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/loadgen"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// Issue 23 §3, the whole fetcher: on a saturated process (every core busy,
// the embedded NATS flooded, the fetcher's NATS traffic 50–100 ms late each
// way and its answers stalled for longer than a lease renewal's timeout
// every two TTLs) a fetcher keeps its shards for three lease TTLs and its
// relay connection with them: the relay sees one connection, never closed,
// and no Disconnected report is sent. Before, the load alone made the
// fetcher release its shards and reconnect their relays.
func TestLoadedFetcherKeepsShardsAndRelays(t *testing.T) {
	e := newEnv(t)
	const shards, ttl = 4, 6 * time.Second
	p := delayproxy.Start(t, strings.TrimPrefix(e.nats.URL, "nats://"))
	cfg := baseConfig("fetcher-a")
	cfg.Shards, cfg.LeaseTTL = shards, ttl
	rf := e.startOn(e.connectTo("nats://"+p.Addr, cfg.ID), cfg, func(*fetcher.Fetcher) {})
	f, reg := rf.Fetcher, rf.reg
	e.waitFor("fetcher owns every shard", func() bool { return len(f.Shards()) == shards })
	r := faultrelay.Start(t, testrelay.Options{})
	e.send(shardOf(r.URL, shards), &graspv1.FetchCommand{RelayUrl: r.URL,
		Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
	c1 := e.connected(r.URL)

	load := loadgen.Start(t, 1, e.bus.Conn, 2)
	p.SetDelay(delayproxy.Up, 50*time.Millisecond, 50*time.Millisecond)
	p.SetDelay(delayproxy.Down, 50*time.Millisecond, 50*time.Millisecond)
	stopStalls := p.Stalls(t, delayproxy.Down, 2*ttl, ttl/3+200*time.Millisecond)
	time.Sleep(3 * ttl)
	stopStalls()
	load.Stop()
	p.SetDelay(delayproxy.Up, 0, 0)
	p.SetDelay(delayproxy.Down, 0, 0)

	if got := f.Shards(); len(got) != shards {
		t.Fatalf("after the load the fetcher serves shards %v of %d", got, shards)
	}
	if n := metric(t, reg, "grasp_fetcher_shard_releases_total", nil); n != 0 {
		t.Fatalf("grasp_fetcher_shard_releases_total = %v under load, want 0", n)
	}
	spans := r.Spans()
	if len(spans) != 1 || !spans[0].Closed.IsZero() {
		t.Fatalf("the relay saw %d connections (first closed: %v), want the one it had, open", len(spans), !spans[0].Closed.IsZero())
	}
	if d := e.reportsMatching(r.URL, disconnected(c1.GetSessionId())); len(d) != 0 {
		t.Fatalf("relay reported disconnected under load: %v", d[0])
	}
}
