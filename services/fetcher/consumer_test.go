package fetcher_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A shard's command consumer that stops under the fetcher (here: the
// command stream deleted and recreated, which deletes the consumer, as a
// lost NATS node can) is attached again while the shard is held, so
// commands sent afterwards are handled. Before, the shard stayed held with
// no consumer and nobody served it.
func TestShardConsumerResumesAfterStreamRecreated(t *testing.T) {
	e := newEnv(t)
	f := e.start(baseConfig("a"), nil)
	r1 := faultrelay.Start(t, testrelay.Options{})
	e.ensure(r1.URL)
	e.connected(r1.URL)

	if err := e.bus.JS.DeleteStream(e.ctx, e.bus.Names.FetchCmdStream()); err != nil {
		t.Fatal(err)
	}
	opts := bus.DefaultOptions()
	opts.Storage = jetstream.MemoryStorage // as newEnv
	if err := bus.Setup(e.ctx, e.bus.JS, e.bus.Names, opts); err != nil {
		t.Fatal(err)
	}

	r2 := faultrelay.Start(t, testrelay.Options{})
	e.ensure(r2.URL)
	// The fake clock drives the consumer's restart backoff.
	e.advanceUntil("a command sent after the stream was recreated is handled", time.Second, func() bool {
		return len(e.reportsMatching(r2.URL, func(r *graspv1.FetchReport) bool { return r.GetConnected() != nil })) > 0
	})
	if got := f.Shards(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("shards held %v, want [0]", got)
	}
}
