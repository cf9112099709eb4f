package planner_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/services/planner"
)

// TestWaitingReportsShareOneFlush: reports that are waiting when the
// planner gets to them are handled together, one flush of commands and
// records for many reports (docs/decisions/0072-planner-reports-in-batches.md),
// and each relay's commands still reach its shard in the order the machine
// made them: the layer-1 batch before the items batch, for every relay,
// though the shards' commands are published side by side.
func TestWaitingReportsShareOneFlush(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, connect := loopNATS(t, ctx, "batched")
	test := connect("test")

	const relays, shards = 40, 4
	url := func(i int) string { return fmt.Sprintf("ws://127.0.0.1:%d", 20000+i) }
	index, err := test.JS.KeyValue(ctx, names.RepoIndexBucket())
	if err != nil {
		t.Fatal(err)
	}
	root := "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	for i := range relays {
		data, _ := proto.Marshal(&graspv1.RepoSyncNeeds{RepoRef: fmt.Sprintf("30617:aa:r%d", i), Relays: []string{url(i)}, RootEventIds: []string{root}})
		if _, err := index.Put(ctx, fmt.Sprintf("k%d", i), data); err != nil {
			t.Fatal(err)
		}
	}
	// The planner's durable consumer exists before it starts, as after a
	// previous term, so the reports below wait in it.
	if _, err := bus.EnsureConsumer(ctx, test.JS, names.FetchReportStream(), jetstream.ConsumerConfig{
		Durable: "planner", FilterSubject: names.FetchReportSubjects(), DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	for i := range relays {
		report := &graspv1.FetchReport{RelayUrl: url(i), SessionId: "s1", At: time.Now().UnixMilli(),
			Report: &graspv1.FetchReport_Connected{Connected: &graspv1.Connected{}}}
		if err := test.Publish(ctx, names.FetchReportSubject(bus.ShardOf(url(i), shards)), report); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	perRelay := map[string][]*graspv1.FetchCommand{}
	sub, err := test.Conn.Subscribe(names.FetchCmdSubjects(), func(m *nats.Msg) {
		var c graspv1.FetchCommand
		if proto.Unmarshal(m.Data, &c) == nil && m.Subject == names.FetchCmdSubject(bus.ShardOf(c.GetRelayUrl(), shards)) {
			mu.Lock()
			perRelay[c.GetRelayUrl()] = append(perRelay[c.GetRelayUrl()], &c)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	cfg := planner.Config{ID: "p1", Shards: shards, RecomputeDelay: 50 * time.Millisecond, Rules: planner.DefaultRules()}
	reg := prometheus.NewRegistry()
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- planner.New(cfg, connect("planner"), clock.Real{}, obs.NewLogger(io.Discard, "error"), reg).Run(pctx)
	}()
	defer func() { stop(); <-done }()

	// Each relay: EnsureConnected (the term's start), then the layer-1
	// batch and the items batch its Connected report asks for.
	waitFor(t, ctx, "every relay's batches", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, cmds := range perRelay {
			if len(cmds) >= 3 {
				n++
			}
		}
		return n == relays
	})
	mu.Lock()
	for i := range relays {
		cmds := perRelay[url(i)]
		if len(cmds) != 3 || cmds[0].GetEnsureConnected() == nil || !cmds[1].GetAddFilters().GetLayer1() ||
			cmds[2].GetAddFilters() == nil || cmds[2].GetAddFilters().GetLayer1() || cmds[2].GetSessionId() != "s1" {
			t.Errorf("%s: commands %v, want ensure-connected, the layer-1 batch, then the items batch", url(i), cmds)
		}
	}
	mu.Unlock()

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grasp_planner_report_batch_size" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleSum() != relays {
			t.Errorf("%v reports handled, want %d", h.GetSampleSum(), relays)
		}
		// One flush per report before batching; the first batch may be
		// formed before the rest of the pull has arrived.
		if h.GetSampleCount() > 4 {
			t.Errorf("%d flushes for %d waiting reports, want at most 4", h.GetSampleCount(), relays)
		}
		return
	}
	t.Fatal("no grasp_planner_report_batch_size metric")
}
