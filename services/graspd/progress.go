package graspd

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/clock"
	"github.com/grasp-sync/grasp-sync/pkg/syncstatus"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// ProgressInterval is how often graspd logs sync progress while a relay is
// Syncing: often enough that a long first sync visibly moves, rarely enough
// not to drown the log.
const ProgressInterval = 10 * time.Second

// runProgress logs a progress line every ProgressInterval while any relay is
// Syncing, until ctx is done. read takes the status snapshot (NATS KV);
// stored counts the events this process's ingester stored (its Stats).
func runProgress(ctx context.Context, clk clock.Clock, log *slog.Logger, stored func() int64,
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
		now, n := clk.Now(), float64(stored())
		if line, ok := syncstatus.NextProgress(snap.Progress(), n, prevStored, now, prev); ok {
			log.Info("sync progress", line.Attrs()...)
		}
		prevStored, prev = n, now
	}
}

// startOps registers the NATS health collector and starts the progress
// logger; both read NATS through their own connection. ing is where Run
// puts the ingester once it runs in this process; until then (or without
// one) progress counts no stored events.
func (a *App) startOps(ctx context.Context, goFn func(func() error), ing *atomic.Pointer[ingester.Ingester]) error {
	b, err := a.connect(ctx, "graspd-ops")
	if err != nil {
		return err
	}
	a.registry.MustRegister(syncstatus.NewNATSCollector(b.JS, b.Names))
	goFn(func() error {
		defer b.Close()
		stored := func() int64 {
			if i := ing.Load(); i != nil {
				return i.Stats().Stored
			}
			return 0
		}
		return runProgress(ctx, a.clock, a.log.With("service", "graspd"), stored,
			syncstatus.NewRelayReader(b.JS, b.Names).Read)
	})
	return nil
}
