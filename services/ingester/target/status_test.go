package target

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/targetstatus"
)

// graspctl reads the publisher's status from its metrics: what it parses
// is what the publisher reports in process (backlog, expected time,
// configured limits).
func TestStatusThroughMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	p := NewPublisher(Settings{Relay: "ws://127.0.0.1:1", PublishRate: 0.5, PublishBurst: 15, PublishConcurrency: 2}, clk, quiet(), reg)
	p.SetBacklog(30)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, ok, err := targetstatus.ParseMetrics(resp.Body)
	if err != nil || !ok {
		t.Fatalf("parse: ok %v, %v", ok, err)
	}
	want := p.Status()
	if got.URL != want.URL || got.Rate != 0.5 || got.Burst != 15 || got.Concurrency != 2 || got.Backlog != 30 {
		t.Fatalf("parsed %+v, publisher says %+v", got, want)
	}
	// Nothing measured yet: the configured rate, 30 events at 0.5/s.
	if got.ETA != time.Minute || want.ETA != time.Minute {
		t.Fatalf("time to go %s (metrics) and %s (in process), want 1m0s", got.ETA, want.ETA)
	}
}
