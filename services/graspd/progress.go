package graspd

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
)

// ProgressInterval is how often graspd logs sync progress while a relay is
// Syncing: often enough that a long first sync visibly moves, rarely enough
// not to drown the log.
const ProgressInterval = 10 * time.Second

// acceptedEvents reads how many events the ingester stored from the
// registry: grasp_ingester_stored_total, or the older
// grasp_ingester_events_total{outcome="accepted"} (0 when the ingester does
// not run in this process).
func acceptedEvents(g prometheus.Gatherer) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "grasp_ingester_stored_total":
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		case "grasp_ingester_events_total":
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "outcome" && lp.GetValue() == "accepted" {
						n += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return n
}

// runProgress logs a progress line every ProgressInterval while any relay is
// Syncing, until ctx is done. read takes the status snapshot (NATS KV).
func runProgress(ctx context.Context, clk clock.Clock, log *slog.Logger, g prometheus.Gatherer,
	read func(context.Context) (*syncstatus.Snapshot, error)) error {
	var prevStored float64
	var prev time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(ProgressInterval):
		}
		snap, err := read(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Debug("sync progress unavailable", "err", err)
			}
			continue
		}
		now, stored := clk.Now(), acceptedEvents(g)
		if line, ok := syncstatus.NextProgress(snap.Progress(), stored, prevStored, now, prev); ok {
			log.Info("sync progress", line.Attrs()...)
		}
		prevStored, prev = stored, now
	}
}

// startOps registers the NATS health collector and starts the progress
// logger; both read NATS through their own connection.
func (a *App) startOps(ctx context.Context, goFn func(func() error)) error {
	b, err := a.connect(ctx, "graspd-ops")
	if err != nil {
		return err
	}
	a.registry.MustRegister(syncstatus.NewNATSCollector(b.JS, b.Names))
	goFn(func() error {
		defer b.Close()
		return runProgress(ctx, a.clock, a.log.With("service", "graspd"), a.registry,
			func(ctx context.Context) (*syncstatus.Snapshot, error) {
				return syncstatus.ReadRelays(ctx, b.JS, b.Names)
			})
	})
	return nil
}
