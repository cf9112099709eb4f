package fetcher

import (
	"context"
	"errors"
	"strings"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/history"
	"github.com/grasp-sync/grasp-sync/pkg/negsync"
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
	// local is the local set of the part being read, when it was read
	// already (hasLocal: combinedHistory).
	local    *negsync.Set
	hasLocal bool
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
	// combined is the batch's live group when it carries the history
	// (combined.go), waiting for the batch's turn to be opened.
	combined *liveGroup
}

// batchSpecOf is the batch an AddFilters command with a batch asks for.
// Until its turn (runBatch) a batch keeps its history filters as a live
// subscription does, ids as 32 bytes and each id list once: the planner
// names a chunk of roots under #e, #E and #q, and at the target world's
// peak some 370 batches waited with their decoded commands, 42 MB of the
// live heap (docs/decisions/0075-what-waits-is-kept-small.md). Nothing of c
// is kept. historic is c's historic_filters, decoded once by the caller.
func batchSpecOf(c *graspv1.AddFilters, historic []nostr.Filter) batchSpec {
	spec := batchSpec{id: c.GetBatchId(), hist: compactFilters(historic, hexShare{}),
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
		return // the session's end ends a waiting live group too
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
	b := &batchRun{w: w, s: s, id: batch, kind: spec.kind(), pub: w.f.newBatchPublisher(), since: spec.since,
		countMissed: spec.resync && w.f.local != nil && w.f.localHoldsStore}
	defer b.pub.close() // what it still claims, after a failure: others publish their copies
	var answered [][]*nostr.Event
	var whole []bool
	var locals []*negsync.Set
	var err error
	if spec.combined != nil {
		answered, whole, locals, err = b.combinedHistory(spec.combined, hist)
	}
	var incomplete []*history.IncompleteError
	for i, f := range hist {
		if err != nil {
			break
		}
		if whole != nil && whole[i] {
			// The live REQ's answer was the whole history of f.
			b.usedReq = true
			if err = b.deliver(f, answered[i]); err != nil {
				break
			}
			continue
		}
		if locals != nil {
			b.local, b.hasLocal = locals[i], true
		}
		err = b.part(f)
		b.local, b.hasLocal = nil, false
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
		local, err := b.local, error(nil)
		if !b.hasLocal {
			local, err = b.localSet(f)
		}
		if err != nil {
			return err
		}
		if local.Len() == 0 && !b.s.looseTags.Load() && w.nip77.refusal(w.f.clock.Now()) == "" {
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
