package fetcher

import (
	"sync"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/negsync"
)

// History carried by the live REQ (docs/decisions/0076-history-in-the-live-req.md).
//
// An items batch asks a relay for the same filters twice: its history, one
// REQ per filter until EOSE (or a NIP-77 reconciliation, when the local set
// holds something for it), and its live set, one REQ with every filter and
// limit 0. Where the history is read with REQ the live REQ can carry it
// instead: asked with a limit, a REQ returns the stored events
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
	// ended is closed at the first open's EOSE, or when that open failed
	// (the relay closed or refused it, it could not be sent).
	ended   chan struct{}
	endOnce sync.Once
}

func newFirstPage(max int) *firstPage { return &firstPage{max: max, ended: make(chan struct{})} }

// fail ends the collection without an answer: the first open did not
// reach its EOSE.
func (p *firstPage) fail() { p.endOnce.Do(func() { close(p.ended) }) }

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
	if !p.taken {
		p.eosed = true
	}
	p.mu.Unlock()
	p.fail() // ended, with the answer
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
// live filters are its history filters, on a session that has not seen the
// relay match tags loosely, with no kind the relay refused to serve. Which
// filters' history it carries is decided at the batch's turn
// (combinedHistory).
func (w *relayWorker) combinable(c *graspv1.AddFilters, hist, live []nostr.Filter) bool {
	s := w.sess
	if s == nil || c.GetBatchId() == "" || c.Since != nil || c.GetResync() || c.GetLayer1() || len(hist) == 0 || len(hist) != len(live) {
		return false
	}
	if s.looseTags.Load() {
		return false
	}
	now := w.f.clock.Now()
	for i := range hist {
		a, b := hist[i], live[i]
		a.Limit, a.LimitZero, b.Limit, b.LimitZero = 0, false, 0, false
		if !nostr.FilterEqual(a, b) || w.lims.refusedRead(filterKind(hist[i]), now) != "" {
			return false
		}
	}
	return true
}

// combinedHistory opens the batch's waiting live group (at the batch's
// turn), asking it for the history of the filters that would be read with
// REQ: all of them on a session without NIP-77, those whose local set is
// empty otherwise (docs/decisions/0037-initial-sync-req-when-local-set-empty.md;
// the others' local sets are kept in locals for their reconciliation). It
// returns, per filter, the events the relay answered for it and whether
// they are its whole history: fewer than the limit the filter was asked
// with, which is set so that all the limits together stay below the
// smallest cap relays are assumed to keep (RelayMinCap), so no cap, per
// filter or per REQ, can have cut them; on a relay whose software caps
// each filter apart, each filter's limit alone stays below it. A filter
// that reached its limit, or whose history was not asked, is read apart.
// All are (whole nil) when the group was closed before its turn, the relay
// closed or refused the REQ, did not answer within PageTimeout, or sent an
// event matching none of the filters.
func (b *batchRun) combinedHistory(g *liveGroup, hist []nostr.Filter) (pages [][]*nostr.Event, whole []bool, locals []*negsync.Set, err error) {
	w, s := b.w, b.s
	now := w.f.clock.Now()
	asked := make([]bool, len(hist))
	n := 0
	if w.f.cfg.DisableNegentropy || !s.useNegentropy() || w.nip77.refusal(now) != "" {
		for i := range asked {
			asked[i] = true
		}
		n = len(hist)
	} else {
		locals = make([]*negsync.Set, len(hist))
		for i, f := range hist {
			if locals[i], err = b.localSet(f); err != nil {
				w.openWaiting(s, g, nil, nil)
				return nil, nil, nil, err
			}
			if locals[i].Len() == 0 {
				asked[i] = true
				n++
			}
		}
	}
	full := min(w.f.cfg.PageSize, w.lims.effective().MaxLimit, w.f.cfg.RelayMinCap)
	per := (full - 1) / max(n, 1)
	if w.lims.capsEachFilter() {
		// The relay caps each filter apart (strfry, nostr-rs-relay,
		// khatru): no filter's answer cuts another's, so each may ask
		// up to the cap (docs/decisions/0086-history-limits-per-filter.md).
		per = full - 1
	}
	if n == 0 || per < 1 {
		w.openWaiting(s, g, nil, nil)
		return nil, nil, locals, nil
	}
	limits := make([]int, len(hist))
	for i := range hist {
		if asked[i] {
			limits[i] = per
		}
	}
	first := newFirstPage(per * n)
	if !w.openWaiting(s, g, first, limits) {
		return nil, nil, locals, nil // closed before its turn
	}
	select {
	case <-first.ended:
	case <-g.starved:
		// No live slot free at the relay: the filters are read apart in
		// the slots kept for reads, and the group opens when it gets one.
	case <-g.done:
	case <-w.f.clock.After(w.f.cfg.PageTimeout):
	case <-s.ctx.Done():
	}
	evts, ok := first.take()
	if !ok {
		return nil, nil, locals, nil
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
			return nil, nil, locals, nil
		}
	}
	for i := range hist {
		whole[i] = asked[i] && len(pages[i]) < per
	}
	return pages, whole, locals, nil
}

// openWaiting opens a group that waited for its batch's turn, asking each
// filter with its limit in limits for the history first collects (first
// nil: what is new only). It is false when the group was closed meanwhile.
func (w *relayWorker) openWaiting(s *session, g *liveGroup, first *firstPage, limits []int) bool {
	g.mu.Lock()
	if !g.waiting {
		g.mu.Unlock()
		return false
	}
	g.waiting = false
	g.first, g.firstLimits = first, limits
	g.mu.Unlock()
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		w.runLive(g.ctx, s, g, nil)
	}()
	return true
}
