package fetcher

import (
	"sync"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"
)

// History carried by the live REQ (docs/decisions/0076-history-in-the-live-req.md).
//
// An items batch asks a relay for the same filters twice: its history, one
// REQ per filter until EOSE, and its live set, one REQ with every filter
// and limit 0. On a relay read with REQ (no NIP-77) the live REQ can carry
// the history instead: asked with a limit, a REQ returns the stored events
// before its EOSE and stays open for new ones. What it returns is the
// history when it is short of the smallest cap relays are assumed to keep
// (Config.RelayMinCap): then no cap, per filter or per REQ, can have cut
// it. A longer answer is read again filter by filter, as before. The REQ
// goes at the batch's turn, so the live subscription starts no later than
// the history read did, with no gap between the two.

// firstPage collects what a combined group's relay sends before the first
// EOSE: the batch's history. It is filled on the connection's delivery
// goroutine and taken by the batch's.
type firstPage struct {
	mu   sync.Mutex
	evts []*nostr.Event
	// max bounds what is kept: more than the batch can use means the
	// answer is read again filter by filter anyway.
	max                int
	eosed, taken, over bool
}

// add keeps evt as history; false once the history is over (EOSE) or the
// batch stopped waiting for it, so evt is a live event.
func (p *firstPage) add(evt *nostr.Event) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.taken || p.eosed {
		return false
	}
	if len(p.evts) >= p.max {
		p.over = true
		return true // history all the same, read again apart
	}
	p.evts = append(p.evts, evt)
	return true
}

func (p *firstPage) eose() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.taken {
		p.eosed = true
	}
}

// take ends the collection: the events, and whether they are the relay's
// whole answer (its EOSE came, nothing was left out).
func (p *firstPage) take() ([]*nostr.Event, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.taken = true
	evts := p.evts
	p.evts = nil
	return evts, p.eosed && !p.over
}

// combinable reports whether an items batch's live set can carry its
// history: a plain items batch (no since, no resync, not layer 1) whose
// live filters are its history filters, on a session that reads history
// with REQ and has not seen the relay match tags loosely, with no kind
// the relay refused to serve.
func (w *relayWorker) combinable(c *graspv1.AddFilters, hist, live []nostr.Filter) bool {
	s := w.sess
	if s == nil || c.GetBatchId() == "" || c.Since != nil || c.GetResync() || c.GetLayer1() || len(hist) == 0 || len(hist) != len(live) {
		return false
	}
	now := w.f.clock.Now()
	if !w.f.cfg.DisableNegentropy && s.useNegentropy() && w.nip77.refusal(now) == "" {
		return false // history is reconciled: the live REQ's answer would be read twice
	}
	if s.looseTags.Load() {
		return false
	}
	for i := range hist {
		a, b := hist[i], live[i]
		a.Limit, a.LimitZero, b.Limit, b.LimitZero = 0, false, 0, false
		if !nostr.FilterEqual(a, b) || w.lims.refusedRead(filterKind(hist[i]), now) != "" {
			return false
		}
	}
	return true
}

// combinedHistory opens the batch's waiting live group with its history
// (at the batch's turn) and returns, per history filter, the events the
// relay answered for it and whether they are its whole history: fewer than
// the limit each filter was asked with, which is set so that all of them
// together stay below the smallest cap relays are assumed to keep
// (RelayMinCap), so no cap, per filter or per REQ, can have cut them. A
// filter that reached its limit is read apart. Every filter is read apart
// (nil) when the group was closed before its turn, the relay closed or
// refused the REQ, did not answer within PageTimeout, or sent an event
// matching none of the filters.
func (b *batchRun) combinedHistory(g *liveGroup, hist []nostr.Filter) (pages [][]*nostr.Event, whole []bool) {
	w, s := b.w, b.s
	full := min(w.f.cfg.PageSize, w.lims.effective().MaxLimit, w.f.cfg.RelayMinCap)
	per := (full - 1) / max(len(hist), 1)
	if per < 1 {
		w.openWaiting(s, g, nil, 0)
		return nil, nil
	}
	first := &firstPage{max: per * len(hist)}
	if !w.openWaiting(s, g, first, per) {
		return nil, nil // closed before its turn
	}
	select {
	case <-g.live:
	case <-w.f.clock.After(w.f.cfg.PageTimeout):
	case <-s.ctx.Done():
	}
	evts, ok := first.take()
	if !ok {
		return nil, nil
	}
	b.pages++
	pages, whole = make([][]*nostr.Event, len(hist)), make([]bool, len(hist))
	for _, evt := range evts {
		matched := false
		for i := range hist {
			if hist[i].Matches(evt) {
				pages[i] = append(pages[i], evt)
				matched = true
			}
		}
		if !matched {
			s.looseTags.Store(true)
			return nil, nil
		}
	}
	for i := range hist {
		whole[i] = len(pages[i]) < per
	}
	return pages, whole
}

// openWaiting opens a group that waited for its batch's turn, asking with
// limit for the history first collects (first nil: what is new only). It
// is false when the group was closed meanwhile.
func (w *relayWorker) openWaiting(s *session, g *liveGroup, first *firstPage, limit int) bool {
	g.mu.Lock()
	if !g.waiting {
		g.mu.Unlock()
		return false
	}
	g.waiting = false
	g.first, g.firstLimit = first, limit
	g.mu.Unlock()
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		w.runLive(g.ctx, s, g, nil)
	}()
	return true
}
