package fetcher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/delayproxy"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
	"github.com/grasp-sync/grasp-sync/services/fetcher"
)

// A report whose publish NATS does not acknowledge in time (a busy server)
// is retried, and the retry of a report that was stored after all is
// dropped by the stream as a duplicate: the planner sees the batch's
// BatchDone exactly once. (Before, the first unacknowledged publish was
// logged "report lost" and never retried.)
func TestUnacknowledgedReportIsRetriedOnce(t *testing.T) {
	e := newEnv(t)
	p := delayproxy.Start(t, strings.TrimPrefix(e.nats.URL, "nats://"))
	cfg := baseConfig("fetcher-a")
	cfg.Shards, cfg.LeaseTTL = 1, 60*time.Second // the held answers must not cost the lease
	f := e.startOn(e.connectTo("nats://"+p.Addr, cfg.ID), cfg, func(*fetcher.Fetcher) {})
	e.waitFor("fetcher owns its shard", func() bool { return len(f.Shards()) == 1 })
	r := faultrelay.Start(t, testrelay.Options{})
	e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL,
		Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
	s := e.connected(r.URL).GetSessionId()

	// Right before the batch's EOSE, the fetcher's NATS answers are held
	// for longer than one publish attempt waits: its BatchDone is sent,
	// stored, and not acknowledged in time.
	released := make(chan struct{})
	r.Set(faultrelay.Faults{Inject: func(string) [][]byte {
		p.Hold(delayproxy.Down, true)
		go func() {
			defer close(released)
			time.Sleep(7 * time.Second)
			p.Hold(delayproxy.Down, false)
		}()
		return nil
	}})
	e.addFilters(0, r.URL, s, "held", []nostr.Filter{{Kinds: []int{1}}}, nil)
	<-released
	if d := e.batchDone(r.URL, "held"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch done %v", d)
	}
	// Both sends reached NATS (a plain subscriber sees two), the stream,
	// which the planner reads, holds one.
	e.waitFor("the retry sent", func() bool {
		return len(e.reportsMatching(r.URL, func(x *graspv1.FetchReport) bool { return x.GetBatchDone().GetBatchId() == "held" })) == 2
	})
	stream, err := e.bus.JS.Stream(e.ctx, e.bus.Names.FetchReportStream())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(e.ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.bus.Names.FetchReportSubject(0)}})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := cons.FetchNoWait(1000)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for m := range msgs.Messages() {
		var rep graspv1.FetchReport
		if err := bus.Decode(m.Data(), m.Headers(), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.GetBatchDone().GetBatchId() == "held" {
			stored++
		}
	}
	if stored != 1 {
		t.Fatalf("%d BatchDone reports for the batch in the stream, want exactly 1", stored)
	}
}
