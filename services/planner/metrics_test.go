package planner

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsFollowTheLifecycle(t *testing.T) {
	reg := prometheus.NewRegistry()
	met := NewMetrics(reg)
	rules := testRules()
	rules.MaxLiveFilters = 10
	h := newHarness(t, rules, 1)
	h.m.obs = met
	h.repo("r1", []string{relayA}, "x")
	h.recompute()
	h.connect(relayA, "s1")
	h.now = h.now.Add(2 * time.Second)
	h.done(relayA, "s1", "1-1")
	h.failed(relayA, "s1", "1-2")
	h.disconnect(relayA, "s1")
	h.advance(time.Minute)
	h.connect(relayA, "s2")
	h.repo("r1", []string{relayA}, "x", "y", "z")
	h.recompute() // 1 + 7 + 7 > 10: consolidation
	changed, _ := h.m.TakeDirty()
	for _, s := range changed {
		met.relayChanged(s)
	}
	met.totals(h.m.Relays())

	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"fresh connects", testutil.ToFloat64(met.reconnects.WithLabelValues("fresh")), 1},
		{"quick reconnects", testutil.ToFloat64(met.reconnects.WithLabelValues("quick")), 1},
		{"layer-1 batches started", testutil.ToFloat64(met.batches.WithLabelValues("started", "layer1")), 1},
		{"catch-up batches started", testutil.ToFloat64(met.batches.WithLabelValues("started", "catch_up")), 1},
		{"item batches failed", testutil.ToFloat64(met.batches.WithLabelValues("failed", "items")), 1},
		{"layer-1 batches confirmed", testutil.ToFloat64(met.batches.WithLabelValues("confirmed", "layer1")), 1},
		// When the new roots exceed the budget; the failed batch's live
		// set is closed by name, which is no consolidation.
		{"consolidations", testutil.ToFloat64(met.consolidation), 1},
		{"status syncing (ngit-grasp 2)", testutil.ToFloat64(met.status.WithLabelValues(relayA)), 2},
		{"pending repos", testutil.ToFloat64(met.repos.WithLabelValues(relayA, "pending")), 1},
		{"relays connected", testutil.ToFloat64(met.relays.WithLabelValues("connected")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	batchesBalance(t, met, h.m)
	h.disconnect(relayA, "s2") // the catch-up and item batches die with the session
	if got := testutil.ToFloat64(met.batches.WithLabelValues("abandoned", "catch_up")); got != 1 {
		t.Errorf("catch-up batches abandoned = %v, want 1", got)
	}
	batchesBalance(t, met, h.m)
	if n, err := testutil.GatherAndCount(reg, "grasp_planner_batch_duration_seconds"); err != nil || n == 0 {
		t.Errorf("batch duration histogram: %d series, %v", n, err)
	}
	met.relayDropped(relayA)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "grasp_planner_relay_status"); err != nil {
		t.Errorf("dropped relay still has a status series: %v", err)
	}
}

// batchesBalance checks that every batch started is confirmed, failed,
// abandoned or still in flight, the invariant quiescence checks rely on.
func batchesBalance(t *testing.T, met *Metrics, m *Machine) {
	t.Helper()
	sum := func(event string) float64 {
		var n float64
		for _, k := range []BatchKind{BatchLayer1, BatchCatchUp, BatchItems} {
			n += testutil.ToFloat64(met.batches.WithLabelValues(event, k.String()))
		}
		return n
	}
	inFlight := 0
	for _, s := range m.Relays() {
		inFlight += len(s.Batches)
	}
	if started, ended := sum("started"), sum("confirmed")+sum("failed")+sum("abandoned"); started != ended+float64(inFlight) {
		t.Errorf("batches started %v != confirmed+failed+abandoned %v + in flight %d", started, ended, inFlight)
	}
}
