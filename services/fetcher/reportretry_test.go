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
	if stored := storedBatchDones(t, e, "held"); stored != 1 {
		t.Fatalf("%d BatchDone reports for the batch in the stream, want exactly 1", stored)
	}
}

// A report that meets a reports stream unable to store it (here: gone, as
// it is while a replicated stream elects a leader after a NATS node's
// loss) for longer than decision 0048's five attempts took is tried until the stream is back, not logged
// "report lost": the planner, which reads the stream, gets the batch's
// BatchDone once, and the batch is not left pending for the session's
// life. (Before, the faults row of make bench-scale stalled on 25 lost
// reports; docs/decisions/0067-reports-retried-while-shard-held.md.)
func TestReportWaitsForStreamBack(t *testing.T) {
	// Five attempts of 500 ms and the waits between them: ~6 s, less than
	// the stream is gone.
	t.Cleanup(fetcher.SetReportAttemptTimeout(500 * time.Millisecond))
	e := newEnv(t)
	cfg := baseConfig("fetcher-a")
	cfg.Shards = 1
	f := e.start(cfg, nil)
	e.waitFor("fetcher owns its shard", func() bool { return len(f.Shards()) == 1 })
	r := faultrelay.Start(t, testrelay.Options{})
	e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL,
		Command: &graspv1.FetchCommand_EnsureConnected{EnsureConnected: &graspv1.EnsureConnected{}}})
	s := e.connected(r.URL).GetSessionId()

	name := e.bus.Names.FetchReportStream()
	stream, err := e.bus.JS.Stream(e.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Right before the batch's EOSE the reports stream goes, and comes
	// back only after the old attempts would all have failed.
	const gone = 8 * time.Second
	back := make(chan error, 1)
	r.Set(faultrelay.Faults{Inject: func(string) [][]byte {
		if err := e.bus.JS.DeleteStream(e.ctx, name); err != nil {
			back <- err
			return nil
		}
		go func() {
			time.Sleep(gone)
			_, err := e.bus.JS.CreateStream(e.ctx, info.Config)
			back <- err
		}()
		return nil
	}})
	e.addFilters(0, r.URL, s, "held", []nostr.Filter{{Kinds: []int{1}}}, nil)
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if d := e.batchDone(r.URL, "held"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch done %v", d)
	}
	// The plain subscriber above saw the attempts; the stream must hold
	// the report once its retry came after the stream was back.
	var stored int
	e.waitFor("the BatchDone stored in the recreated stream", func() bool {
		stored = storedBatchDones(t, e, "held")
		return stored > 0
	})
	if stored != 1 {
		t.Fatalf("%d BatchDone reports for the batch in the stream, want exactly 1", stored)
	}
}

// storedBatchDones counts the BatchDone reports for batch in the reports
// stream (shard 0), which is what the planner reads.
func storedBatchDones(t *testing.T, e *env, batch string) int {
	t.Helper()
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
		if rep.GetBatchDone().GetBatchId() == batch {
			stored++
		}
	}
	return stored
}
