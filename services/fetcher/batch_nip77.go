package fetcher

import (
	"fmt"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// localSet is what the local set holds for f (nothing without one), built
// for reconciliation: a shared local set hands out one built for every
// relay asking within its TTL (sharedLocalSet).
func (b *batchRun) localSet(f nostr.Filter) (*negsync.Set, error) {
	if b.w.f.local == nil {
		return nil, nil
	}
	if src, ok := b.w.f.local.(setSource); ok {
		set, err := src.Set(b.s.ctx, f)
		if err != nil {
			return nil, fmt.Errorf("local set: %w", err)
		}
		return set, nil
	}
	items, err := b.w.f.local.Items(b.s.ctx, f)
	if err != nil {
		return nil, fmt.Errorf("local set: %w", err)
	}
	return negsync.NewSet(items), nil
}

// negentropy reconciles f with local, the local set for f, and fetches
// what we lack by id, re-requesting missing ids while the relay makes
// progress.
//
// rounds counts the relay's NEG-MSG answers: whether it speaks NIP-77.
func (b *batchRun) negentropy(f nostr.Filter, local *negsync.Set) (rounds int, err error) {
	w := b.w
	if err := w.cooldown.Wait(b.s.ctx); err != nil {
		return 0, err
	}
	nf := f
	nf.Limit, nf.LimitZero = 0, false
	res, err := negsync.ReconcileSet(b.s.ctx, b.s.conn, nf, local, negsync.Options{
		FrameSize: w.frameSize(nf), RoundTimeout: w.f.cfg.NegentropyTimeout})
	b.bytes += res.BytesIn
	w.f.m.historicBytes.WithLabelValues("negentropy").Add(float64(res.BytesIn))
	if err != nil {
		return res.Rounds, err
	}
	return res.Rounds, b.fetchNeeded(res.Need)
}

// frameSize is the NIP-77 frame size that keeps every NEG-OPEN and NEG-MSG
// for f within the relay's message budget: a frame's bytes travel
// hex-encoded (twice as many), the NEG-OPEN carries the filter too.
func (w *relayWorker) frameSize(f nostr.Filter) int {
	fit := (w.lims.effective().MaxMessageBytes - relaylimits.FilterSize(f) - 256) / 2
	return max(min(w.f.cfg.NegentropyFrameSize, fit), 4096)
}

// fetchNeeded fetches by id what a reconciliation found we lack.
func (b *batchRun) fetchNeeded(need []string) error {
	w := b.w
	missing := map[string]struct{}{}
	for _, id := range need {
		missing[id] = struct{}{}
	}
	if err := b.dropHeld(missing); err != nil {
		return err
	}
	// Ids the events stream acknowledged moments ago (another relay's copy,
	// not yet stored) are asked for last: by then the ingester has usually
	// stored them, and asking the local set again drops them. Those still
	// not held are fetched like any other, so a copy the ingester refused
	// (a forged signature) costs only the delay.
	deferred := b.deferPublished(missing)
	// What is still missing now the local set lacked and no other copy is
	// on its way: on a resync batch, each is an event live and catch-up
	// missed (the deferred ones are not: another copy was just taken).
	if err := b.fetchIDs(missing, b.countMissed); err != nil {
		return err
	}
	if len(deferred) == 0 {
		return nil
	}
	asked := len(deferred)
	if err := b.dropHeld(deferred); err != nil {
		return err
	}
	w.f.m.deferredHeld.Add(float64(asked - len(deferred)))
	return b.fetchIDs(deferred, false)
}

// deferPublished moves from missing to the map it returns the ids whose
// events the stream acknowledged moments ago (any signature).
func (b *batchRun) deferPublished(missing map[string]struct{}) map[string]struct{} {
	rec := b.w.f.recentByID
	if rec == nil || len(missing) == 0 {
		return nil
	}
	now := b.w.f.clock.Now()
	var deferred map[string]struct{}
	for id := range missing {
		if rec.has(recentKeyOf(id), now) {
			if deferred == nil {
				deferred = map[string]struct{}{}
			}
			deferred[id] = struct{}{}
			delete(missing, id)
		}
	}
	return deferred
}

// fetchIDs fetches the missing ids by id, re-requesting those still missing
// while the relay makes progress; count: each one published counts as missed.
func (b *batchRun) fetchIDs(missing map[string]struct{}, count bool) error {
	w := b.w
	for len(missing) > 0 {
		ids := make([]string, 0, len(missing))
		for id := range missing {
			ids = append(ids, id)
		}
		got := 0
		for start := 0; start < len(ids); start += w.f.cfg.IDsPerREQ {
			chunk := ids[start:min(start+w.f.cfg.IDsPerREQ, len(ids))]
			idf := nostr.Filter{IDs: chunk, Limit: len(chunk)}
			page, n, err := b.page(idf)
			b.bytes += n
			w.f.m.historicBytes.WithLabelValues("negentropy").Add(float64(n))
			if err != nil {
				return err
			}
			for _, evt := range page {
				if _, want := missing[evt.ID]; !want {
					continue
				}
				if err := b.emit(evt, reqFilters{idf}, count); err != nil {
					return err
				}
				delete(missing, evt.ID)
				got++
			}
			// A page travels together (docs/decisions/0053-events-travel-in-batches.md).
			if err := b.pub.send(b.s.ctx); err != nil {
				return err
			}
		}
		if got == 0 {
			return fmt.Errorf("%w (%d ids)", errNoIDs, len(missing))
		}
	}
	return nil
}

// dropHeld removes from missing the ids the local set already holds. A
// relay that matches tags loosely (khatru v0.19.1 on badger answers #A and
// #q with a-tagged events) names, for one filter, events that our local set
// for that same filter rightly lacks but that we hold under another: asking
// the local set by id keeps them from being fetched again at every resync.
// A store local set answers from its id keys (HeldChecker) without reading
// the events; refusals count as held, as in the local set's items.
func (b *batchRun) dropHeld(missing map[string]struct{}) error {
	if b.w.f.local == nil || len(missing) == 0 {
		return nil
	}
	ids := make([]string, 0, len(missing))
	for id := range missing {
		ids = append(ids, id)
	}
	const chunk = 500
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(start+chunk, len(ids))]
		held, err := heldIn(b.s.ctx, b.w.f.local, part)
		if err != nil {
			return fmt.Errorf("local set by id: %w", err)
		}
		for _, id := range held {
			delete(missing, id)
		}
	}
	return nil
}
