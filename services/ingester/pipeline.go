package ingester

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// The consumer is a three-stage pipeline over batches of messages:
//
//  1. read: the iterator's messages into a bounded channel;
//  2. verify: a batch (whatever is waiting, up to FetchBatch) is decoded and
//     id-checked, the ids already stored are found with one lookup (so a
//     copy from another relay costs no signature check), and the remaining
//     signatures are verified on Workers goroutines;
//  3. decide: one goroutine applies the policy to the batch in order, writes
//     the accepted events with one SaveBatch, then acks them and publishes
//     them on grasp.stored.<kind>.
//
// Stage 2 of one batch runs while stage 3 handles the previous one, so
// verification (the dominant cost, parallel) overlaps with the store work
// (sequential). Every decision that depends on the store is made in stage 3,
// in order: a lookup that would see an event accepted earlier in the batch
// but not yet written first writes the batch so far (see batch.Query), so
// an announcement and an issue on it, or a deletion and its target, in one
// batch are decided as if they had arrived one by one.

// check is what the verify stage found out about one message.
type check int

const (
	checkMalformed check = iota // not event JSON
	checkBadID                  // the id is not the hash of the event
	checkStored                 // the id is stored: a duplicate, signature not checked
	checkForged                 // the id matches, the signature does not verify
	checkVerified               // id and signature verified
)

// item is one message on its way through the pipeline.
type item struct {
	msg   jetstream.Msg
	relay string
	evt   *nostr.Event // nil when malformed
	check check
	// received is when the verify stage took the message, for keep-alive.
	received time.Time
	// unstored: the verify stage's lookup found the id not stored, so the
	// decide stage need not ask again. Another writer may store it in
	// between; the write then reports it not stored, which is settled as a
	// duplicate.
	unstored bool
	// err is set when the item could not be settled for an
	// infrastructure reason (store error): it is retried.
	err error
}

// consume attaches to the shared durable consumer and runs the pipeline
// until ctx is done. A replica holds at most about 4×FetchBatch messages:
// the iterator's buffer (one pull), the read channel, the batch being
// verified and the batch being decided; each is at most the NATS max
// payload.
func (i *Ingester) consume(ctx context.Context) error {
	// EnsureConsumer: replicas starting together in a cluster create this
	// durable at once, and a lost answer must not end the process.
	cons, err := bus.EnsureConsumer(ctx, i.bus.JS, i.bus.Names.EventsStream(), jetstream.ConsumerConfig{
		Durable:       i.cfg.Consumer,
		Description:   "ingesters: verify, decide, store (shared by every replica)",
		FilterSubject: i.bus.Names.EventsSubjects(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       i.cfg.AckWait,
		// The ingester counts deliveries itself and dead-letters at
		// MaxDeliver: the server's own limit would leave the message in the
		// work-queue stream, undeliverable, forever.
		MaxDeliver:    -1,
		MaxAckPending: max(1024, 4*i.cfg.FetchBatch),
	})
	if err != nil {
		return err // EnsureConsumer names the consumer and stream
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(i.cfg.FetchBatch))
	if err != nil {
		return fmt.Errorf("consume %s: %w", i.cfg.Consumer, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()

	g, gctx := errgroup.WithContext(ctx)
	msgs := make(chan jetstream.Msg, i.cfg.FetchBatch)
	batches := make(chan []*item) // unbuffered: at most one verified batch waits
	g.Go(func() error {
		defer close(msgs)
		return i.read(gctx, it, msgs)
	})
	g.Go(func() error {
		defer close(batches)
		i.verifyStage(gctx, msgs, batches)
		return nil
	})
	g.Go(func() error {
		for items := range batches {
			i.settle(gctx, items)
		}
		return nil
	})
	g.Go(func() error {
		i.watchLag(gctx, cons)
		return nil
	})
	return g.Wait()
}

// read feeds the iterator's messages to msgs until ctx is done or the
// connection is closed (an error: the service cannot work without it).
func (i *Ingester) read(ctx context.Context, it jetstream.MessagesContext, msgs chan<- jetstream.Msg) error {
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if errors.Is(err, nats.ErrConnectionClosed) {
				return fmt.Errorf("consume %s: %w", i.cfg.Consumer, err)
			}
			i.log.Warn("consumer fetch failed", "consumer", i.cfg.Consumer, "err", err)
			select { // do not spin on a persistent error
			case <-ctx.Done():
				return nil
			case <-i.clk.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case msgs <- msg:
		case <-ctx.Done():
			// Not acked: redelivered to another replica after AckWait.
			return nil
		}
	}
}

// verifyStage forms batches of what is waiting in msgs (never waiting for
// a batch to fill: a lone message goes alone), verifies them and hands them
// to the decide stage.
func (i *Ingester) verifyStage(ctx context.Context, msgs <-chan jetstream.Msg, batches chan<- []*item) {
	for {
		var batch []jetstream.Msg
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			batch = append(batch, m)
		}
	fill:
		for len(batch) < i.cfg.FetchBatch {
			select {
			case m, ok := <-msgs:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			default:
				break fill
			}
		}
		items := i.verify(ctx, batch)
	handoff:
		for {
			select {
			case batches <- items:
				break handoff
			case <-ctx.Done():
				for _, it := range items {
					_ = it.msg.Nak() // another replica takes it at once
				}
				return
			case <-i.clk.After(i.cfg.AckWait / 3):
				// The decide stage is slow (a store outage, a large
				// batch): keep these alive rather than have them
				// redelivered meanwhile.
				keepAlive(items)
			}
		}
	}
}

// keepAlive tells the server the items' messages are being worked on, which
// restarts their AckWait.
func keepAlive(items []*item) {
	for _, it := range items {
		_ = it.msg.InProgress()
	}
}

// verify decodes and checks a batch: ids first (a hash), then one store
// lookup for the ids already stored, then the signatures of the rest in
// parallel. A failed lookup only means every signature is checked.
func (i *Ingester) verify(ctx context.Context, msgs []jetstream.Msg) []*item {
	items := make([]*item, len(msgs))
	for n, m := range msgs {
		i.m.incConsumed()
		items[n] = &item{msg: m, relay: m.Headers().Get(bus.HeaderRelay), received: i.clk.Now()}
	}
	i.parallel(items, func(it *item) {
		evt, err := decode(it.msg.Data())
		switch {
		case err != nil:
			it.check = checkMalformed
			i.log.Debug("malformed event", "relay", it.relay, "err", err)
		case !evt.CheckID():
			it.evt, it.check = evt, checkBadID
		default:
			it.evt, it.check = evt, checkVerified // until the signature says otherwise
		}
	})
	ids := make([]string, 0, len(items))
	for _, it := range items {
		if it.check == checkVerified {
			ids = append(ids, it.evt.ID)
		}
	}
	stored := map[string]bool{}
	if len(ids) > 0 {
		// The id commits to everything but the signature, so a stored id
		// means this is the stored event or a copy with another signature:
		// either way a duplicate, which must neither replace nor be stored.
		found, err := i.store.Query(ctx, nostr.Filter{IDs: ids, Limit: len(ids)})
		if err != nil && ctx.Err() == nil {
			i.log.Debug("duplicate pre-check failed: verifying every signature", "err", err)
		}
		for _, e := range found {
			stored[e.ID] = true
		}
		for _, it := range items {
			it.unstored = err == nil && it.check == checkVerified && !stored[it.evt.ID]
		}
	}
	i.parallel(items, func(it *item) {
		if it.check != checkVerified {
			return
		}
		if stored[it.evt.ID] {
			it.check = checkStored
			return
		}
		if ok, err := it.evt.CheckSignature(); !ok || err != nil {
			it.check = checkForged
		}
	})
	return items
}

// parallel runs fn over items on up to Workers goroutines, and no more
// than there are cores: the work is CPU-bound, extra goroutines would only
// take turns.
func (i *Ingester) parallel(items []*item, fn func(*item)) {
	workers := min(i.cfg.Workers, runtime.GOMAXPROCS(0), len(items))
	if workers <= 1 {
		for _, it := range items {
			fn(it)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= len(items) {
					return
				}
				fn(items[n])
			}
		})
	}
	wg.Wait()
}

// settle decides a verified batch and acks what is done. Items that failed
// for an infrastructure reason are retried: during a store outage all of
// them, held (not redelivered, not counted against MaxDeliver) with
// backoff until the store answers; while the store answers, each alone (one
// event the backend keeps rejecting must not fail its batch-mates) and then
// redelivered later or dead-lettered.
func (i *Ingester) settle(ctx context.Context, items []*item) {
	// Batching keeps messages longer than handling them one by one would;
	// a batch that has waited a third of AckWait is kept alive so it is
	// not redelivered (and counted twice) while it is being decided.
	if len(items) > 0 && i.clk.Now().Sub(items[0].received) > i.cfg.AckWait/3 {
		keepAlive(items)
	}
	failed := i.decide(ctx, items)
	wait := outageBackoffStart
	for len(failed) > 0 {
		if ctx.Err() != nil {
			for _, it := range failed {
				_ = it.msg.Nak() // another replica takes it at once
			}
			return
		}
		if i.storeReachable(ctx) {
			if len(failed) > 1 {
				var still []*item
				for _, it := range failed {
					still = append(still, i.decide(ctx, []*item{it})...)
				}
				if failed = still; len(failed) == 0 || !i.storeReachable(ctx) {
					continue
				}
			}
			for _, it := range failed {
				i.failed(ctx, it.msg, it.err)
			}
			return
		}
		if i.outage.begin() {
			i.m.outage.Set(1)
			i.log.Warn("store unreachable: holding messages and backing off", "consumer", i.cfg.Consumer, "err", failed[0].err)
		}
		// Held, not nak'ed: a redelivery would count against MaxDeliver
		// and only meet the same outage.
		keepAlive(failed)
		select {
		case <-ctx.Done():
			continue
		case <-i.clk.After(wait):
		}
		wait = min(2*wait, i.cfg.OutageBackoffMax, i.cfg.AckWait/2)
		failed = i.decide(ctx, failed)
	}
	if i.outage.end() {
		i.m.outage.Set(0)
		i.log.Info("store reachable again: resuming", "consumer", i.cfg.Consumer)
	}
}

// decide applies the policy to items in order and settles each: refusals,
// duplicates and parked events are acked at once, accepted events once
// written (with the rest of the batch). It returns the items that failed.
func (i *Ingester) decide(ctx context.Context, items []*item) []*item {
	deletion := false
	for _, it := range items {
		deletion = deletion || it.evt != nil && it.evt.Kind == nip34.KindDeletion
	}
	// A deletion is decided and applied with nothing else of this replica
	// in progress (wake-ups of parked events included): a target being
	// evaluated and stored meanwhile could escape it.
	if deletion {
		i.deletions.Lock()
		defer i.deletions.Unlock()
	} else {
		i.deletions.RLock()
		defer i.deletions.RUnlock()
	}
	// Sized for the two lookups per event the prefetch caches.
	b := &batch{i: i, pending: newPendingSet(), deferred: newPendingSet(), cache: make(map[string]lookup, 2*len(items))}
	b.prefetch(ctx, items)
	pol := *i.policy
	pol.Store = b
	// Passes: an event whose decision depends on one accepted (or itself
	// deferred) earlier in this pass is deferred to the next pass, after
	// the write. Each pass decides at least its first event, so this ends;
	// a batch needs as many writes as its longest dependency chain, not one
	// per dependency.
	for todo := items; len(todo) > 0; {
		var later []*item
		for _, it := range todo {
			it.err = nil
			switch it.check {
			case checkMalformed:
				i.done(it, outcomeMalformed)
			case checkBadID:
				i.done(it, string(policy.ReasonBadID))
			case checkStored:
				i.duplicate(ctx, it)
			case checkForged, checkVerified:
				if it.check == checkVerified && b.pending.has(it.evt.ID) {
					i.done(it, outcomeDuplicate) // a copy of an event accepted earlier in this batch
					continue
				}
				var d policy.Decision
				if it.check == checkForged {
					// Evaluate, not a bare bad-signature refusal: a
					// cheaper check it makes first (size, shape, time)
					// names the refusal, as for any other caller. It
					// refuses before reading the store.
					d = pol.Evaluate(ctx, it.evt)
				} else {
					d = pol.EvaluateVerified(ctx, it.evt)
				}
				if errors.Is(d.Err, errDeferred) {
					b.deferred.add(it)
					later = append(later, it)
					continue
				}
				i.apply(ctx, b, it, d)
			}
		}
		_ = b.flush(ctx) // failures are on the items
		b.deferred = newPendingSet()
		todo = later
	}
	var failed []*item
	for _, it := range items {
		if it.err != nil {
			failed = append(failed, it)
		}
	}
	return failed
}

// apply does what a decision on an item calls for.
func (i *Ingester) apply(ctx context.Context, b *batch, it *item, d policy.Decision) {
	switch judge(d) {
	case verdictStore:
		b.pending.add(it)
	case verdictRetry:
		it.err = fmt.Errorf("evaluate %s: %w", it.evt.ID, d.Err)
	case verdictDuplicate:
		i.duplicate(ctx, it)
	case verdictPark:
		// Parked as verified: the immediate re-evaluation need not check
		// the signature again.
		if err := i.park(ctx, it.evt, d, it.relay, it.check == checkVerified); err != nil {
			it.err = err
			return
		}
		i.done(it, outcomeParked)
	case verdictRefuse:
		i.refuse(ctx, it, d)
	}
}

// refuse settles an item the policy refused for good.
func (i *Ingester) refuse(ctx context.Context, it *item, d policy.Decision) {
	if d.Reason == policy.ReasonStoreError {
		it.err = fmt.Errorf("evaluate %s: %w", it.evt.ID, d.Err)
		return
	}
	i.log.Debug("event refused", "id", it.evt.ID, "kind", it.evt.Kind, "reason", string(d.Reason), "relay", it.relay)
	i.remember(ctx, it.evt, d.Reason, it.relay)
	i.done(it, string(d.Reason))
}

// duplicate settles an item whose event is stored already.
func (i *Ingester) duplicate(ctx context.Context, it *item) {
	// A stored deletion whose application failed before is applied again
	// on redelivery (idempotent; nothing for other kinds).
	if err := store.ApplyDeletion(ctx, i.store, it.evt); err != nil {
		it.err = err
		return
	}
	if md, err := it.msg.Metadata(); err == nil && md.NumDelivered > 1 {
		// A redelivery: an earlier attempt may have stored the event and
		// died before announcing it, so neither the wake loops nor the
		// relays heard of it. Wake its dependants here (reliably: a failure
		// retries the message) and announce it again; both are idempotent
		// (relays broadcast by id, subscribers and discovery dedup by id).
		if err := i.wakeFor(ctx, it.evt); err != nil {
			it.err = err
			return
		}
		if err := i.reannounce(ctx, it.evt.ID); err != nil {
			it.err = err
			return
		}
	}
	i.done(it, outcomeDuplicate)
}

// reannounce publishes the stored copy of an event on grasp.stored.<kind>
// again. The stored copy, not the message: a duplicate's signature is not
// checked (its id is stored), and a forged copy must not be broadcast.
func (i *Ingester) reannounce(ctx context.Context, id string) error {
	found, err := i.store.Query(ctx, nostr.Filter{IDs: []string{id}, Limit: 1})
	if err != nil {
		return fmt.Errorf("re-announce %s: %w", id, err)
	}
	if len(found) == 0 {
		return nil // deleted meanwhile: nothing to announce
	}
	data, err := json.Marshal(found[0])
	if err != nil {
		return fmt.Errorf("re-announce %s: %w", id, err)
	}
	i.publishStored(found[0], data)
	return nil
}

// done counts an item's outcome and acks its message.
func (i *Ingester) done(it *item, outcome string) {
	if it.check == checkVerified && verified(policy.Reason(outcome)) {
		i.m.incVerified()
	}
	switch outcome {
	case outcomeStored:
		i.m.storedAfter(i.clk.Now().Sub(fetchedAt(it.msg)))
	case outcomeDuplicate:
		i.m.incDuplicate()
	case outcomeParked:
		i.m.incParked()
	default:
		i.m.incRefused(outcome)
	}
	if err := it.msg.Ack(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		i.log.Warn("ack failed: the event will be redelivered and found a duplicate", "relay", it.relay, "err", err)
	}
}

// batch is the decide stage's view of the store for one batch: the policy
// reads the store through it, and accepted events wait in pending until the
// batch is written.
type batch struct {
	i       *Ingester
	pending *pendingSet
	// deferred are the events of this pass waiting for the next one:
	// events depending on them wait too.
	deferred *pendingSet
	// cache holds lookup results (by filterKey) until the batch writes an
	// event that could change them (see flush): only other writers can
	// change the rest, which is no different from the lookup having been
	// made a moment earlier. Most events of a batch ask for the same few
	// announcements, and the events deferred to a later pass ask again
	// what the prefetch answered. Bounded by the lookups of one batch.
	cache map[string]lookup
}

// lookup is a cached answer and the filter it answers.
type lookup struct {
	f    nostr.Filter
	evts []*nostr.Event
}

// errDeferred fails a lookup that an event of the batch not written yet
// would answer: the decision waits for the next pass (see decide).
var errDeferred = errors.New("depends on an event of this batch not written yet")

// Query implements policy.Lookup. A lookup that an accepted, not yet
// written event of this batch (or one deferred) would answer fails with
// errDeferred: a decision that depends on an event is made only once that
// event is stored (or refused).
func (b *batch) Query(ctx context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	if b.pending.matches(f) || b.deferred.matches(f) {
		return nil, errDeferred
	}
	key := filterKey(f)
	if l, ok := b.cache[key]; ok {
		return l.evts, nil
	}
	r, err := b.i.store.Query(ctx, f)
	if err != nil {
		return nil, err
	}
	b.cache[key] = lookup{f, r}
	return r, nil
}

// prefetch answers the two lookups the policy makes for every event (is
// its id stored, is it deleted by its author) for the whole batch with one
// query each (none for ids the verify stage just found unstored), into the
// cache. The filters are built as the policy builds
// them; should they differ, the cache simply misses. A failed or truncated
// read leaves the cache empty: the policy then asks for itself.
func (b *batch) prefetch(ctx context.Context, items []*item) {
	var evts []*nostr.Event
	var ids, ask []string
	for _, it := range items {
		if it.check == checkVerified && !b.pending.has(it.evt.ID) {
			evts = append(evts, it.evt)
			ids = append(ids, it.evt.ID)
			if !it.unstored {
				ask = append(ask, it.evt.ID)
			}
		}
	}
	if len(evts) < 2 {
		return
	}
	var found []*nostr.Event
	if len(ask) > 0 {
		var err error
		if found, err = b.i.store.Query(ctx, nostr.Filter{IDs: ask, Limit: len(ask)}); err != nil {
			return
		}
	}
	byID := make(map[string]*nostr.Event, len(found))
	for _, e := range found {
		byID[e.ID] = e
	}
	for _, e := range evts {
		var r []*nostr.Event
		if s := byID[e.ID]; s != nil {
			r = []*nostr.Event{s}
		}
		f := nostr.Filter{IDs: []string{e.ID}, Limit: 1}
		b.cache[filterKey(f)] = lookup{f, r}
	}
	limit := 4 * len(ids)
	dels, err := b.i.store.Query(ctx, nostr.Filter{Kinds: []int{nip34.KindDeletion}, Tags: nostr.TagMap{"e": ids}, Limit: limit})
	if err != nil || len(dels) >= limit {
		return
	}
	for _, e := range evts {
		if e.Kind == nip34.KindDeletion {
			continue // a deletion cannot be deleted: the policy does not ask
		}
		f := nostr.Filter{Kinds: []int{nip34.KindDeletion}, Authors: []string{e.PubKey}, Tags: nostr.TagMap{"e": {e.ID}}, Limit: 1}
		var r []*nostr.Event
		for _, d := range dels {
			if f.Matches(d) {
				r = []*nostr.Event{d}
				break
			}
		}
		b.cache[filterKey(f)] = lookup{f, r}
	}
}

// flush writes the pending events with one SaveBatch, then applies stored
// deletions, publishes what was stored and acks. An error means at least one
// event was not written (its item carries the error).
func (b *batch) flush(ctx context.Context) error {
	items := b.pending.items
	if len(items) == 0 {
		return nil
	}
	b.forget(b.pending)
	b.pending = newPendingSet()
	evts := make([]*nostr.Event, len(items))
	for n, it := range items {
		evts[n] = it.evt
	}
	var failed error
	for n, r := range b.i.store.SaveBatch(ctx, evts) {
		it := items[n]
		switch {
		case errors.Is(r.Err, store.ErrUnstorable):
			b.i.log.Debug("accepted event cannot be stored", "id", it.evt.ID, "kind", it.evt.Kind, "relay", it.relay, "err", r.Err)
			b.i.done(it, outcomeUnstorable)
		case r.Err != nil:
			it.err = fmt.Errorf("store %s: %w", it.evt.ID, r.Err)
			failed = it.err
		case !r.Stored:
			// Stored by another writer since the lookups: a redelivery
			// still owes the announcement (see duplicate).
			if b.i.duplicate(ctx, it); it.err != nil {
				failed = it.err
			}
		default:
			if err := store.Settle(ctx, b.i.store, it.evt, func(e *nostr.Event) { b.i.publishStored(e, it.msg.Data()) }); err != nil {
				// The deletion is stored; its retry finds it a
				// duplicate and applies it again (see duplicate).
				it.err, failed = err, err
				continue
			}
			b.i.done(it, outcomeStored)
		}
	}
	return failed
}

// forget drops the cached answers that writing events may change: those
// whose filter one of them matches or, when one of them replaces or deletes
// stored events (which any filter may have found), all of them.
func (b *batch) forget(events *pendingSet) {
	for _, it := range events.items {
		if k := it.evt.Kind; k == nip34.KindDeletion || nostr.IsReplaceableKind(k) || nostr.IsAddressableKind(k) {
			clear(b.cache)
			return
		}
	}
	for key, l := range b.cache {
		if events.matches(l.f) {
			delete(b.cache, key)
		}
	}
}

// pendingSet indexes the accepted, not yet written events of a batch by id,
// author, kind and tag value, so that whether a policy lookup would see one
// of them costs a few map reads, not a match against each.
type pendingSet struct {
	items []*item
	index map[pendingKey][]*nostr.Event
}

// pendingKey is one index entry: an id ('i'), author ('p'), kind ('k', in
// name) or tag value ('t', tag name and value).
type pendingKey struct {
	field     byte
	name, val string
}

func newPendingSet() *pendingSet { return &pendingSet{index: map[pendingKey][]*nostr.Event{}} }

func (p *pendingSet) add(it *item) {
	e := it.evt
	p.items = append(p.items, it)
	p.put(pendingKey{'i', "", e.ID}, e)
	p.put(pendingKey{'p', "", e.PubKey}, e)
	p.put(pendingKey{'k', "", strconv.Itoa(e.Kind)}, e)
	for _, t := range e.Tags {
		if len(t) >= 2 {
			p.put(pendingKey{'t', t[0], t[1]}, e)
		}
	}
}

func (p *pendingSet) put(key pendingKey, e *nostr.Event) {
	list := p.index[key]
	if len(list) > 0 && list[len(list)-1] == e {
		return // the same tag twice on one event
	}
	p.index[key] = append(list, e)
}

func (p *pendingSet) has(id string) bool { return len(p.index[pendingKey{'i', "", id}]) > 0 }

// matches reports whether a pending event matches f. Candidates come from
// one field f constrains (every field must match, so any one of them finds
// all candidates); f.Matches decides.
func (p *pendingSet) matches(f nostr.Filter) bool {
	if len(p.items) == 0 {
		return false
	}
	match := func(key pendingKey) bool {
		for _, e := range p.index[key] {
			if f.Matches(e) {
				return true
			}
		}
		return false
	}
	switch {
	case len(f.IDs) > 0:
		for _, id := range f.IDs {
			if match(pendingKey{'i', "", id}) {
				return true
			}
		}
	case len(f.Tags) > 0:
		for k, vals := range f.Tags {
			for _, v := range vals {
				if match(pendingKey{'t', k, v}) {
					return true
				}
			}
			return false // one tag name finds every candidate
		}
	case len(f.Authors) > 0:
		for _, a := range f.Authors {
			if match(pendingKey{'p', "", a}) {
				return true
			}
		}
	case len(f.Kinds) > 0:
		for _, k := range f.Kinds {
			if match(pendingKey{'k', "", strconv.Itoa(k)}) {
				return true
			}
		}
	default:
		for _, it := range p.items {
			if f.Matches(it.evt) {
				return true
			}
		}
	}
	return false
}

// filterKey identifies a filter for the lookup cache: every field the
// policy sets, cheaper than its JSON form.
func filterKey(f nostr.Filter) string {
	var sb strings.Builder
	sb.Grow(80 * (1 + len(f.IDs) + len(f.Authors)))
	for _, id := range f.IDs {
		sb.WriteString(id)
		sb.WriteByte(',')
	}
	sb.WriteByte('|')
	for _, a := range f.Authors {
		sb.WriteString(a)
		sb.WriteByte(',')
	}
	sb.WriteByte('|')
	for _, k := range f.Kinds {
		sb.WriteString(strconv.Itoa(k))
		sb.WriteByte(',')
	}
	sb.WriteByte('|')
	tags := make([]string, 0, len(f.Tags))
	for k := range f.Tags {
		tags = append(tags, k)
	}
	slices.Sort(tags)
	for _, k := range tags {
		sb.WriteString(strconv.Itoa(len(k)))
		sb.WriteByte(':')
		sb.WriteString(k)
		sb.WriteByte('=')
		for _, v := range f.Tags[k] {
			// Length-prefixed: any byte may follow, none is escaped.
			sb.WriteString(strconv.Itoa(len(v)))
			sb.WriteByte(':')
			sb.WriteString(v)
		}
		sb.WriteByte(';')
	}
	sb.WriteByte('|')
	if f.Since != nil {
		sb.WriteString(strconv.FormatInt(int64(*f.Since), 10))
	}
	sb.WriteByte('|')
	if f.Until != nil {
		sb.WriteString(strconv.FormatInt(int64(*f.Until), 10))
	}
	sb.WriteByte('|')
	sb.WriteString(strconv.Itoa(f.Limit))
	if f.LimitZero {
		sb.WriteString("z")
	}
	sb.WriteByte('|')
	sb.WriteString(f.Search)
	return sb.String()
}
