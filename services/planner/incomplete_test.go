package planner

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// A batch the fetcher reports INCOMPLETE (a one-second slice it could not
// read completely) confirms nothing: the relay shows historic-sync
// failures with the reason, the metric counts it, and its items are
// fetched again on the failure schedule; a complete retry confirms them and
// clears the record.
func TestIncompleteBatchIsNotConfirmedAndRetried(t *testing.T) {
	h := newHarness(t, testRules(), 1)
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	h.m = NewMachine(testRules(), NewIndex(), 1, func() float64 { return 0.5 }, metrics)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.done(relayA, "s1", "1-1")
	const reason = `history incomplete: 1 one-second slice(s) hit the relay's cap and cannot be split further: {"since":1700000000,"until":1700000000,"#a":["r1"]}`
	h.report(relayA, "s1", &graspv1.BatchDone{BatchId: "1-2", Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_INCOMPLETE,
		Method: graspv1.SyncMethod_SYNC_METHOD_REQ, Error: reason, IncompleteSlices: 1})
	if got := h.confirmed(relayA); got != "" {
		t.Fatalf("confirmed %q after an incomplete batch, want nothing", got)
	}
	h.advance(time.Minute)
	if h.status(relayA) != "CONNECTED_HISTORIC_SYNC_FAILURES" {
		t.Fatalf("status %s, want CONNECTED_HISTORIC_SYNC_FAILURES", h.status(relayA))
	}
	st := h.m.Snapshot(h.relay(relayA), h.now)
	if st.GetIncompleteBatches() != 1 || st.GetLastIncomplete() != reason || st.GetHistoricFailures() != 1 {
		t.Fatalf("persisted record: incomplete %d %q, failures %d", st.GetIncompleteBatches(), st.GetLastIncomplete(), st.GetHistoricFailures())
	}
	if v := testutil.ToFloat64(metrics.incomplete.WithLabelValues(BatchItems.String())); v != 1 {
		t.Errorf("incomplete batches metric = %v, want 1", v)
	}
	retry := h.advance(4 * time.Minute)
	i := -1
	for j, c := range retry {
		if strings.HasPrefix(c, "add wss://a.example s1 ") && strings.Contains(c, "repos=r1") && strings.Contains(c, "hist=[") {
			i = j
		}
	}
	if i < 0 {
		t.Fatalf("no retry of r1 after the failure hold: %q", retry)
	}
	batch := strings.Fields(retry[i])[3]
	h.done(relayA, "s1", batch)
	h.advance(time.Minute)
	if h.status(relayA) != "CONNECTED" || h.confirmed(relayA) != "r1:x" {
		t.Fatalf("after a complete retry: status %s confirmed %q", h.status(relayA), h.confirmed(relayA))
	}
	if st := h.m.Snapshot(h.relay(relayA), h.now); st.GetIncompleteBatches() != 0 || st.GetLastIncomplete() != "" {
		t.Errorf("incomplete record kept after a full sync: %d %q", st.GetIncompleteBatches(), st.GetLastIncomplete())
	}
}

// A layer-1 batch that keeps coming back INCOMPLETE (announcements crowding
// one second beyond a relay's cap, on a relay without NIP-77: nothing can
// read them) is retried after FailureRetry, then after twice that, and so
// on up to FailureRetryMax, not every FailureRetry forever: each retry
// rereads every announcement on the relay. A full sync starts the count
// again.
func TestRepeatedFailuresBackOff(t *testing.T) {
	rules := testRules()
	rules.FailureRetry, rules.FailureRetryMax = time.Minute, 5*time.Minute
	h := newHarness(t, rules, 1)
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	cmds := h.connect(relayA, "s1")
	layer1 := func(cmds []string) string {
		for _, c := range cmds {
			if f := strings.Fields(c); len(f) > 4 && f[0] == "add" && f[4] == "L1" {
				return f[3]
			}
		}
		return ""
	}
	batch := layer1(cmds)
	if batch == "" {
		t.Fatalf("no layer-1 batch on connect: %q", cmds)
	}
	incomplete := &graspv1.BatchDone{Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_INCOMPLETE,
		Method: graspv1.SyncMethod_SYNC_METHOD_REQ, Error: "history incomplete", IncompleteSlices: 1}
	var waits []time.Duration
	for range 5 {
		incomplete.BatchId = batch
		h.report(relayA, "s1", incomplete)
		failedAt := h.now
		batch = ""
		for step := 0; batch == "" && step < 20; step++ {
			batch = layer1(h.advance(30 * time.Second))
		}
		if batch == "" {
			t.Fatalf("layer 1 not retried within 10 minutes of failure %d", len(waits)+1)
		}
		waits = append(waits, h.now.Sub(failedAt))
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits before each retry %v, want %v", waits, want)
	}
}
