package fetcher

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// batchRun accumulates one historic batch's facts.
type batchRun struct {
	w        *relayWorker
	s        *session
	id       string
	kind     string // batchSpec.kind, for grasp_fetcher_reqs_total
	pub      *windowPublisher
	received uint64
	bytes    uint64
	pages    int
	usedReq  bool
	// refetching: the part being read is a refetch filter, whose events
	// are published past the events stream's duplicate window.
	refetching bool
	// since is a catch-up's bound, for REQ reads only (part).
	since *nostr.Timestamp
	// countMissed: a resync batch whose events the local set lacked are
	// counted in missed (BatchDone.missed), each once (counted): several
	// filters of a batch can return one event before the stream's
	// acknowledgement of its first copy arrives.
	countMissed bool
	missed      uint64
	counted     map[string]struct{}
	// refused counts parts the relay refused to serve (remembered, asked
	// again a day later).
	refused int
}

// batchSpec is one AddFilters' historic part as runBatch needs it.
type batchSpec struct {
	id string
	// hist is kept compact while the batch waits for its turn (see
	// batchSpecOf); refetch lists few ids and is kept as it came.
	hist    liveFilters
	refetch []nostr.Filter
	since   *nostr.Timestamp
	resync  bool
	// layer1 marks the relay's layer-1 batch (AddFilters.layer1).
	layer1 bool
}

// batchSpecOf is the batch an AddFilters command with a batch asks for.
// Until its turn (runBatch) a batch keeps its history filters as a live
// subscription does, ids as 32 bytes and each id list once: the planner
// names a chunk of roots under #e, #E and #q, and at the target world's
// peak some 370 batches waited with their decoded commands, 42 MB of the
// live heap (docs/decisions/0075-what-waits-is-kept-small.md). Nothing of c
// is kept.
func batchSpecOf(c *graspv1.AddFilters) batchSpec {
	spec := batchSpec{id: c.GetBatchId(), hist: compactFilters(filters.FromProtos(c.GetHistoricFilters()), hexShare{}),
		refetch: filters.FromProtos(c.GetRefetchFilters()), resync: c.GetResync(), layer1: c.GetLayer1()}
	// since is applied per part (batchRun.part): REQ reads obey it, a
	// NIP-77 reconciliation covers the whole filter.
	if c.Since != nil {
		ts := nostr.Timestamp(c.GetSince())
		spec.since = &ts
	}
	return spec
}

// kind is the batch's kind as grasp_fetcher_reqs_total names it: what the
// planner asked for, told by the command's marks (a catch-up is the only
// batch with a since).
func (s batchSpec) kind() string {
	switch {
	case s.resync:
		return "resync"
	case s.since != nil:
		return "catch_up"
	case s.layer1:
		return "layer1"
	default:
		return "items"
	}
}

// errNoIDs means a relay answered an id fetch with none of the ids its
// NIP-77 set claimed: its reconciliation cannot be trusted.
var errNoIDs = errors.New("id fetch returned none of the ids asked for")

// runBatch fetches a batch's history, every filter completely, and
// reports it done. refetch filters are read with REQ+EOSE whatever the local
// set holds (see AddFilters.refetch_filters). A batch whose session ends
// first dies with it, unreported: the planner redoes it for the next session.
func (w *relayWorker) runBatch(s *session, spec batchSpec) {
	select {
	case s.histSem <- struct{}{}:
		defer func() { <-s.histSem }()
	case <-s.ctx.Done():
		return
	}
	// Then a turn among all relays' batches (Config.MaxRunningBatches).
	w.f.m.batchesWaiting.Inc()
	select {
	case w.f.running <- struct{}{}:
		w.f.m.batchesWaiting.Dec()
		defer func() { <-w.f.running }()
	case <-s.ctx.Done():
		w.f.m.batchesWaiting.Dec()
		return
	}
	batch, hist, refetch := spec.id, spec.hist.filters(), spec.refetch
	b := &batchRun{w: w, s: s, id: batch, kind: spec.kind(), pub: w.f.newWindowPublisher(), since: spec.since,
		countMissed: spec.resync && w.f.local != nil && w.f.localHoldsStore}
	var err error
	var incomplete []*history.IncompleteError
	for _, f := range hist {
		err = b.part(f)
		var inc *history.IncompleteError
		if errors.As(err, &inc) {
			// Read what can be read; the batch is reported incomplete.
			incomplete, err = append(incomplete, inc), nil
		}
		if err != nil {
			break
		}
	}
	if err == nil && len(refetch) > 0 {
		// REQ, not NIP-77: the local set counts remembered refusals as
		// held, and these are exactly the events that may have been.
		b.refetching = true
		for _, f := range refetch {
			if err = b.req(f); err != nil {
				break
			}
		}
		b.refetching = false
	}
	if err == nil {
		err = b.pub.flush(s.ctx)
	}
	if s.ctx.Err() != nil || s.conn.Context().Err() != nil {
		return // the session ended (or is ending): the batch dies with it
	}
	method := graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY
	if b.usedReq || w.f.cfg.DisableNegentropy {
		method = graspv1.SyncMethod_SYNC_METHOD_REQ
	}
	done := &graspv1.BatchDone{BatchId: batch, Outcome: graspv1.BatchOutcome_BATCH_OUTCOME_OK, Method: method,
		EventsReceived: b.received, BytesReceived: b.bytes, Pages: uint32(b.pages), FallbackReason: s.fallbackReason()}
	if b.countMissed {
		done.Missed = &b.missed
	}
	switch {
	case err != nil:
		done.Outcome = graspv1.BatchOutcome_BATCH_OUTCOME_FAILED
		done.Error = err.Error()
	case len(incomplete) > 0:
		var slices []nostr.Filter
		for _, inc := range incomplete {
			slices = append(slices, inc.Slices...)
		}
		w.f.m.incompleteSlices.Add(float64(len(slices)))
		err = &history.IncompleteError{Slices: slices}
		done.Outcome = graspv1.BatchOutcome_BATCH_OUTCOME_INCOMPLETE
		done.Error = err.Error()
		done.IncompleteSlices = uint32(len(slices))
	}
	w.f.m.pages.Observe(float64(b.pages))
	w.f.m.batches.WithLabelValues(strings.TrimPrefix(done.Outcome.String(), "BATCH_OUTCOME_"), strings.TrimPrefix(method.String(), "SYNC_METHOD_")).Inc()
	w.log.Info("batch done", "session", s.id, "batch", batch, "outcome", done.Outcome.String(), "method", method.String(),
		"events", b.received, "bytes", b.bytes, "pages", b.pages, "missed", done.GetMissed(), "err", err)
	w.reportFor(s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_BatchDone{BatchDone: done}})
}

// part fetches one historic filter: NIP-77 while the session allows it,
// REQ+EOSE otherwise or when NIP-77 fails in a way that says the relay
// cannot do it. When the local set holds nothing for the filter (an initial
// sync), reconciling would only list every id to fetch them all by id
// afterwards: REQ+EOSE reads the same events with one query per page
// instead of a reconciliation and id fetches, and NIP-77 is used only if
// REQ cannot read a crowded second completely (docs/decisions/0037-initial-sync-req-when-local-set-empty.md).
//
// A catch-up's since bounds REQ reads only: NIP-77 reconciles the whole
// filter, which costs bytes in proportion to the differences and finds
// events published during the gap with an older created_at, which since
// cannot (docs/sync.md, "Catch-ups and back-dated events"). Not when the
// local set holds refusals only: every stored event would be a difference.
func (b *batchRun) part(f nostr.Filter) error {
	kind := filterKind(f)
	if reason := b.w.lims.refusedRead(kind, b.w.f.clock.Now()); reason != "" {
		b.refused++
		return nil // asked again when the refusal expires (a day)
	}
	err := b.partRead(f)
	var rr *readRefusedError
	if errors.As(err, &rr) {
		b.refused++
		b.w.refusedRead(b.s, nostr.Filters{f}, rr.reason)
		return nil
	}
	if err == nil && b.w.lims.clearRefusal(kind) {
		b.w.saveLimitsAsync(b.s)
	}
	return err
}

// partRead reads one historic filter (part).
func (b *batchRun) partRead(f nostr.Filter) error {
	w := b.w
	reqF := f
	if b.since != nil {
		reqF.Since = b.since
	}
	if !w.f.cfg.DisableNegentropy && b.s.useNegentropy() {
		if !w.f.localHoldsStore {
			f = reqF
		}
		local, err := b.localSet(f)
		if err != nil {
			return err
		}
		if len(local) == 0 && !b.s.looseTags.Load() && w.nip77.refusal(w.f.clock.Now()) == "" {
			// Nothing held for the whole filter: all the relay has for it
			// is a difference, read without since as NIP-77 would. Not on
			// a relay known to refuse NIP-77: there a catch-up is a REQ
			// read, bounded by since like any other (below).
			err := b.req(f)
			var inc *history.IncompleteError
			if !errors.As(err, &inc) {
				b.usedReq = true
				return err
			}
			// A second holds more than a page: NIP-77 is not capped.
			// What REQ read is in flight, not yet stored: the local set
			// still lacks it and it is fetched again, dropped by the
			// stream's duplicate window.
			w.log.Info("REQ could not read a crowded second; reconciling with NIP-77", "session", b.s.id, "batch", b.id, "err", err)
		}
		// A relay that refused NIP-77 before (any session) is sent no
		// NEG-OPEN; one not known yet is probed by one batch at a time
		// (docs/decisions/0040-neg-open-only-to-relays-that-answered.md).
		try, probe, refused := w.nip77.begin(b.s.ctx, w.f.clock.Now)
		if !try {
			if refused == "" {
				return context.Cause(b.s.ctx) // the session ended while waiting
			}
			// As any REQ read: since bounds it (docs/sync.md, "Catch-ups
			// and back-dated events").
			b.s.fallBack("remembered: " + refused)
			b.usedReq = true
			return b.req(reqF)
		}
		rounds, err := b.negentropy(f, local)
		if err != nil && strings.Contains(err.Error(), "auth-required:") && b.s.auth.sk != "" {
			// Asked before our NIP-42 answer was accepted: once more.
			actx, cancel := context.WithTimeout(b.s.ctx, w.f.cfg.NegentropyTimeout)
			ok := b.s.auth.wait(actx)
			cancel()
			if ok {
				rounds, err = b.negentropy(f, local)
			}
		}
		answered, refusal := nip77Verdict(rounds, err)
		w.nip77.settle(probe, answered, refusal, w.f.clock.Now())
		if err == nil {
			return nil
		}
		if !errors.Is(err, negsync.ErrUnsupported) && !errors.Is(err, errNoIDs) {
			return err
		}
		reason := err.Error()
		if b.s.fallBack(reason) {
			w.f.m.fallbacks.WithLabelValues(fallbackClass(err)).Inc()
			w.log.Info("NIP-77 given up for this session; using REQ+EOSE", "session", b.s.id, "batch", b.id, "reason", reason)
		}
	}
	b.usedReq = true
	return b.req(reqF)
}

func fallbackClass(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, errNoIDs):
		return "no_ids"
	case strings.Contains(msg, "NEG-ERR"):
		return "neg_err"
	case strings.Contains(msg, "NOTICE"):
		return "notice"
	case strings.Contains(msg, "no answer"):
		return "timeout"
	default:
		return "protocol"
	}
}

// localSet is what the local set holds for f (nothing without one).
func (b *batchRun) localSet(f nostr.Filter) ([]negsync.Item, error) {
	if b.w.f.local == nil {
		return nil, nil
	}
	items, err := b.w.f.local.Items(b.s.ctx, f)
	if err != nil {
		return nil, fmt.Errorf("local set: %w", err)
	}
	return items, nil
}

// negentropy reconciles f with local, the local set for f, and fetches
// what we lack by id, re-requesting missing ids while the relay makes
// progress.
//
// rounds counts the relay's NEG-MSG answers: whether it speaks NIP-77.
func (b *batchRun) negentropy(f nostr.Filter, local []negsync.Item) (rounds int, err error) {
	w := b.w
	if err := w.cooldown.Wait(b.s.ctx); err != nil {
		return 0, err
	}
	nf := f
	nf.Limit, nf.LimitZero = 0, false
	res, err := negsync.Reconcile(b.s.ctx, b.s.conn, nf, local, negsync.Options{
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

// req reads f completely with REQ+EOSE, paginating with until while pages
// may have been capped: a short page ends the read only when the relay has
// returned a longer one on this connection, otherwise one more page is
// asked (docs/decisions/0021-history-crowded-second.md). A capped page that falls entirely inside one second
// makes that second read on its own, split into narrower REQs until each
// comes back under the cap (history.Reader; docs/decisions/0021-history-crowded-second.md). NIP-77 is
// not tried for such a slice here: this path runs only when NIP-77 is
// disabled or has failed for the session, and when it works it reads the
// whole filter without a cap. A slice that cannot be narrowed further is
// returned as a *history.IncompleteError after everything else was read.
func (b *batchRun) req(f nostr.Filter) error {
	w := b.w
	lim := w.lims.effective()
	pageSize := min(w.f.cfg.PageSize, lim.MaxLimit)
	f.Limit, f.LimitZero = pageSize, false
	rd := &history.Reader{
		Page: func(_ context.Context, pf nostr.Filter) ([]*nostr.Event, error) {
			page, n, err := b.page(pf)
			b.bytes += n
			w.f.m.historicBytes.WithLabelValues("req").Add(float64(n))
			return page, err
		},
		Full:          min(pageSize, w.f.cfg.RelayMinCap),
		MaxPages:      w.f.cfg.MaxPages,
		ShortPageEnds: true,
		Cap:           &b.s.relayCap,
	}
	st, err := rd.Read(b.s.ctx, f, func(evts []*nostr.Event) error {
		var lacked map[string]bool
		if b.countMissed && !b.refetching {
			var err error
			if lacked, err = b.lacked(evts); err != nil {
				return err
			}
		}
		for _, evt := range evts {
			if !b.s.looseTags.Load() && !matchesIgnoringLimit(nostr.Filters{f}, evt) {
				b.s.looseTags.Store(true)
			}
			if err := b.emit(evt, reqFilters{f}, lacked[evt.ID]); err != nil {
				return err
			}
		}
		return b.pub.send(b.s.ctx) // a page travels together
	})
	w.f.m.crowdedSeconds.Add(float64(st.Seconds))
	if errors.Is(err, history.ErrTooDeep) {
		return fmt.Errorf("%s: %w", w.url, err)
	}
	if errors.Is(err, history.ErrIncomplete) {
		w.log.Warn("history slice cannot be read completely with REQ", "session", b.s.id, "batch", b.id, "err", err)
	}
	return err
}

// lacked returns the ids of a REQ page's events that a resync batch counts
// as missed: those the local set lacks whose ids the events stream has not
// just taken (another copy, live or from another relay, is on its way to
// the store), as the NIP-77 path decides with dropHeld and deferPublished.
func (b *batchRun) lacked(evts []*nostr.Event) (map[string]bool, error) {
	missing := make(map[string]struct{}, len(evts))
	for _, evt := range evts {
		missing[evt.ID] = struct{}{}
	}
	if err := b.dropHeld(missing); err != nil {
		return nil, err
	}
	b.deferPublished(missing)
	out := make(map[string]bool, len(missing))
	for id := range missing {
		out[id] = true
	}
	return out, nil
}

// emit publishes one historic event; missed: count it as missed if it is
// published.
func (b *batchRun) emit(evt *nostr.Event, fs reqFilters, missed bool) error {
	b.received++
	var published bool
	var err error
	if b.refetching {
		published, err = b.w.publishAs(b.s.ctx, b.pub, evt, fs, b.s.id, b.id, "historic", bus.EventMsgID(evt.ID, evt.Sig)+":refetch:"+b.id)
	} else {
		published, err = b.w.publish(b.s.ctx, b.pub, evt, fs, b.s.id, b.id, "historic")
	}
	if published && missed {
		if _, dup := b.counted[evt.ID]; !dup {
			if b.counted == nil {
				b.counted = map[string]struct{}{}
			}
			b.counted[evt.ID] = struct{}{}
			b.missed++
		}
	}
	return err
}

// page sends one REQ and returns what the relay sends before EOSE and the
// bytes it took. Rate limiting waits out the cooldown and asks again;
// "auth-required:" waits for our NIP-42 answer and asks again; any other
// CLOSED, a timeout or a lost connection is an error, never a silently short
// result.
func (b *batchRun) page(f nostr.Filter) ([]*nostr.Event, uint64, error) {
	w := b.w
	var bytes uint64
	for attempt := 0; ; attempt++ {
		if err := w.cooldown.Wait(b.s.ctx); err != nil {
			return nil, bytes, err
		}
		b.pages++
		purpose := "history"
		if len(f.IDs) > 0 {
			purpose = "ids"
		}
		w.f.m.reqs.WithLabelValues(purpose, b.kind).Inc()
		evts, n, reason, err := b.pageOnce(f)
		bytes += n
		if err != nil || reason == "" {
			return evts, bytes, err
		}
		switch refusal := relaylimits.Classify(reason); {
		case refusal == relaylimits.TooManySubscriptions && attempt < 100:
			// Over the relay's count: the connection lowered its gate,
			// so the REQ waits for a free slot and goes again.
			// It was sent all the same: grasp_fetcher_reqs_total counts it.
			b.pages--
			continue
		case refusal == relaylimits.TooManyFilters || refusal == relaylimits.MessageTooLarge:
			// One filter per REQ, at most IDsPerREQ ids: nothing smaller
			// to send.
			return evts, bytes, fmt.Errorf("REQ to %s refused at the smallest size we send: %s", w.url, reason)
		}
		w.f.m.subClosed.WithLabelValues("historic").Inc()
		switch {
		case IsRateLimit(reason) && attempt < 20:
			w.rateLimited("CLOSED: " + reason)
			w.reportFor(b.s.id, &graspv1.FetchReport{Report: &graspv1.FetchReport_SubscriptionClosed{SubscriptionClosed: &graspv1.SubscriptionClosed{
				Reason: reason, BatchId: b.id, RetryAt: w.cooldown.Until().UnixMilli()}}})
			continue
		case strings.HasPrefix(reason, "auth-required:") && attempt < 3 && b.s.auth.sk != "":
			actx, cancel := context.WithTimeout(b.s.ctx, w.f.cfg.PageTimeout)
			ok := b.s.auth.wait(actx)
			cancel()
			if ok {
				continue
			}
		}
		if readRefusal(reason) {
			return evts, bytes, &readRefusedError{reason: reason}
		}
		return evts, bytes, fmt.Errorf("REQ to %s closed: %s", w.url, reason)
	}
}

// readRefusedError is a read the relay refused us (auth-required: that we
// cannot answer, restricted:): the part is remembered as refused and
// skipped (batchRun.part), not failed, so the batch does not come back
// every few minutes; the refusal is asked again a day later.
type readRefusedError struct{ reason string }

func (e *readRefusedError) Error() string { return "read refused: " + e.reason }

func (b *batchRun) pageOnce(f nostr.Filter) (out []*nostr.Event, bytes uint64, closedReason string, err error) {
	purpose := "history"
	if len(f.IDs) > 0 {
		purpose = "ids"
	}
	ctx := b.s.ctx
	sub, err := b.s.conn.Subscribe(relayconn.WithPurpose(ctx, purpose), nostr.Filters{f})
	if err != nil {
		return nil, 0, "", fmt.Errorf("REQ: %w", err)
	}
	defer func() { bytes = sub.Bytes() }()
	defer sub.Close()
	timeout := b.w.f.clock.After(b.w.f.cfg.PageTimeout)
	for {
		select {
		case evt := <-sub.Events():
			out = append(out, evt)
		case <-sub.EOSE():
			// Events before EOSE are delivered in order; drain the buffer.
			for {
				select {
				case evt := <-sub.Events():
					out = append(out, evt)
				default:
					return out, 0, "", nil
				}
			}
		case reason := <-sub.Closed():
			return out, 0, reason, nil
		case <-b.s.conn.Context().Done():
			return out, 0, "", fmt.Errorf("REQ to %s: %w", b.w.url, context.Cause(b.s.conn.Context()))
		case <-timeout:
			return out, 0, "", fmt.Errorf("REQ to %s: no EOSE within %s", b.w.url, b.w.f.cfg.PageTimeout)
		case <-ctx.Done():
			return out, 0, "", ctx.Err()
		}
	}
}
