package ingester

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/nip34"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// write is a batch's last store write, made while the decide stage decides
// the next batch (docs/decisions/0063-ingester-write-overlaps-decide.md). The
// write, its stored notices, the settling of its items and the batch's acks
// run on their own goroutine; done is closed when all of that is over, and
// only then may anything read failed or the items. The next batch treats
// the events being written as pending (batch.inflight) until it has seen
// done (finish), which it does before its own first write.
type write struct {
	items   []*item     // the whole batch, acked at the write's end
	pending *pendingSet // the events written
	failed  []*item     // items left with an error, for finish to retry
	start   time.Time   // when the decide stage took the batch
	done    chan struct{}
}

// decideStage is stage 3 of the pipeline: it decides the batches in order
// and settles them. A batch's last write runs while the next batch is
// decided; the next batch's own writes and acks wait for it (finish). When
// no batch comes, a finished write is collected at once.
func (i *Ingester) decideStage(ctx context.Context, batches <-chan []*item) {
	var prev *write
	for {
		var done <-chan struct{}
		if prev != nil {
			done = prev.done
		}
		select {
		case items, ok := <-batches:
			if !ok {
				i.finish(ctx, prev, nil)
				return
			}
			prev = i.settle(ctx, items, prev)
		case <-done:
			i.finish(ctx, prev, nil)
			prev = nil
		}
	}
}

// settle decides a verified batch and acks what is done, and returns the
// batch's last write when it is still running (see write), nil when the
// batch is settled. prev is the previous batch's write, if still running:
// it is finished before this batch writes or acks anything. Items that
// failed for an infrastructure reason are retried (see retry).
func (i *Ingester) settle(ctx context.Context, items []*item, prev *write) *write {
	start := i.clk.Now()
	// Batching keeps messages longer than handling them one by one would;
	// a batch that has waited a third of AckWait is kept alive so it is
	// not redelivered (and counted twice) while it is being decided.
	if len(items) > 0 && i.clk.Now().Sub(items[0].received) > i.cfg.AckWait/3 {
		keepAlive(items)
	}
	failed, w := i.decideOverlapped(ctx, items, prev, start)
	if w != nil {
		return w // finished by the next batch or by decideStage
	}
	i.retry(ctx, failed, nil)
	i.m.observeStage(stageDecide, i.clk.Now().Sub(start))
	i.release(items)
	return nil
}

// release gives a settled batch's bytes back to the in-flight bound:
// acked, nak'ed or dead-lettered, its messages no longer count against
// Config.MaxBytes (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
func (i *Ingester) release(items []*item) {
	eachMsg(items, func(m jetstream.Msg) {
		i.inFlight.Release(msgBytes(m))
		i.m.inFlight.Sub(float64(msgBytes(m)))
	})
}

// finish waits for a batch's last write (nil: nothing to wait for) and
// retries what failed in it. hold are the items of the batch being decided
// meanwhile, kept alive while the wait or a store outage lasts.
func (i *Ingester) finish(ctx context.Context, w *write, hold []*item) {
	if w == nil {
		return
	}
	select {
	case <-w.done:
	default:
		for waiting := true; waiting; {
			select {
			case <-w.done:
				waiting = false
			case <-i.clk.After(i.cfg.AckWait / 3):
				keepAlive(hold)
			}
		}
	}
	if len(w.failed) > 0 {
		i.retry(ctx, w.failed, hold)
		i.m.observeStage(stageDecide, i.clk.Now().Sub(w.start))
	}
	i.release(w.items)
}

// retry retries the items that failed for an infrastructure reason: during
// a store outage all of them, held (not redelivered, not counted against
// MaxDeliver) with backoff until the store answers; while the store answers,
// each alone (one event the backend keeps rejecting must not fail its
// batch-mates) and then redelivered later or dead-lettered. hold are other
// items waiting meanwhile (the next batch's), kept alive with failed.
func (i *Ingester) retry(ctx context.Context, failed, hold []*item) {
	wait := outageBackoffStart
	for len(failed) > 0 {
		if ctx.Err() != nil {
			eachMsg(failed, func(m jetstream.Msg) { _ = m.Nak() }) // another replica takes it at once
			return
		}
		if !targetUnavailable(failed) && i.storeReachable(ctx) {
			if len(failed) > 1 {
				var still []*item
				for _, it := range failed {
					still = append(still, i.decide(ctx, []*item{it})...)
				}
				if failed = still; len(failed) == 0 || targetUnavailable(failed) || !i.storeReachable(ctx) {
					continue
				}
			}
			i.failedItems(ctx, failed)
			return
		}
		if i.outage.begin() {
			i.m.outage.Set(1)
			if i.target != nil {
				// Bolt-on mode: the target is our store; waiting for its
				// publish rate or a rate-limit pause is routine.
				i.log.Info("target relay busy or unreachable: holding messages and backing off", "consumer", i.cfg.Consumer, "err", failed[0].err)
			} else {
				i.log.Warn("store unreachable: holding messages and backing off", "consumer", i.cfg.Consumer, "err", failed[0].err)
			}
		}
		// Held, not nak'ed: a redelivery would count against MaxDeliver
		// and only meet the same outage.
		keepAlive(failed)
		keepAlive(hold)
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
	failed, _ := i.decideOverlapped(ctx, items, nil, time.Time{})
	return failed
}

// decideOverlapped is decide for the decide stage, which overlaps a batch's
// last write with the next batch's decisions
// (docs/decisions/0063-ingester-write-overlaps-decide.md). prev, when not
// nil, is the previous batch's write, still running: its events count as
// pending for this batch's decisions, and it is finished before this batch
// writes or acks anything. When this batch's last write may overlap the
// next batch (start set, see overlappable) it is begun and returned, and
// failed is empty: the write's own failures are for finish.
func (i *Ingester) decideOverlapped(ctx context.Context, items []*item, prev *write, start time.Time) (failed []*item, w *write) {
	deletion := false
	for _, it := range items {
		deletion = deletion || it.evt != nil && it.evt.Kind == nip34.KindDeletion
	}
	// A deletion is decided and applied with nothing else of this replica
	// in progress (wake-ups of parked events included): a target being
	// evaluated and stored meanwhile could escape it. So the previous
	// batch's write ends first, and this batch's own is not overlapped.
	if prev != nil {
		select {
		case <-prev.done:
			// Written already: nothing of this batch need wait for it.
			i.finish(ctx, prev, items)
			prev = nil
		default:
		}
	}
	if deletion {
		i.finish(ctx, prev, items)
		prev = nil
		i.deletions.Lock()
	} else {
		i.deletions.RLock()
	}
	unlock := i.deletions.Unlock
	if !deletion {
		unlock = i.deletions.RUnlock
	}
	handedOver := false
	defer func() {
		if !handedOver {
			unlock()
		}
	}()
	// Sized for the lookups per event the prefetch caches (its id, its
	// deletion, a reference).
	b := &batch{i: i, pending: newPendingSet(), deferred: newPendingSet(), cache: make(map[string]lookup, 3*len(items))}
	if prev != nil {
		b.inflight = prev.pending
	}
	b.prefetch(ctx, items)
	pol := *i.policy
	pol.Store = b
	// Passes: an event whose decision depends on one accepted (or itself
	// deferred) earlier in this pass, or on one the previous batch is
	// writing, is deferred to the next pass, after the write. Each pass
	// after the first decides at least its first event (the first may find
	// every event waiting for the previous batch's write), so this ends; a
	// batch needs as many writes as its longest dependency chain, not one
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
				if it.check == checkVerified && b.inflight.has(it.evt.ID) {
					// A copy of an event the previous batch is writing:
					// a duplicate once that write is settled, or not.
					b.deferred.add(it)
					later = append(later, it)
					continue
				}
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
		// Nothing of this batch is written or acked before the previous
		// batch's write is settled: writes stay in the order of the
		// decisions, and acks in delivery order.
		if prev != nil {
			i.finish(ctx, prev, items)
			b.afterWrite(prev)
			prev = nil
		}
		if len(later) == 0 && !start.IsZero() && overlappable(b.pending) {
			w = &write{items: items, pending: b.pending, start: start, done: make(chan struct{})}
			handedOver = true
			go func() {
				defer close(w.done)
				defer unlock()
				_ = i.write(ctx, w.pending.items) // failures are on the items
				i.ackSettled(items)
				for _, it := range items {
					if it.err != nil {
						w.failed = append(w.failed, it)
					}
				}
				if len(w.failed) == 0 {
					i.m.observeStage(stageDecide, i.clk.Now().Sub(start))
				}
			}()
			return nil, w
		}
		_ = b.flush(ctx) // failures are on the items
		b.deferred = newPendingSet()
		todo = later
	}
	if prev != nil { // no items
		i.finish(ctx, prev, items)
	}
	i.ackSettled(items)
	for _, it := range items {
		if it.err != nil {
			failed = append(failed, it)
		}
	}
	return failed, nil
}

// overlappable reports whether writing pending may overlap the next
// batch's decisions: something to write, and no event that deletes or
// replaces stored events. The next batch defers its lookups that the
// events being written would answer (batch.inflight), but not those that
// an event they delete or replace would have answered, which only a read
// of the store could name; such a write is rare (deletions, announcements,
// states and other replaceable kinds: about 1 % of a sync's events) and is
// made before the next batch is decided, as every write was before.
func overlappable(pending *pendingSet) bool {
	if len(pending.items) == 0 {
		return false
	}
	for _, it := range pending.items {
		if k := it.evt.Kind; k == nip34.KindDeletion || nostr.IsReplaceableKind(k) || nostr.IsAddressableKind(k) {
			return false
		}
	}
	return true
}

// ackSettled acks the messages of the settled items, in the batch's order
// (the order they were delivered in, normally the stream's). Settling
// happens out of that order — refusals at once, accepted events when their
// pass is written, a batch's dependants one pass later — and the work-queue
// stream removes a message when it is acked: removals out of sequence order
// leave holes in the stream's file blocks, which the server records and
// compacts by rewriting the block (~6 cpu-µs per ack in BenchmarkIngest;
// docs/measurements/2026-12-02-ingester-where-the-us-go-acks-in-order.md), while removals in order only advance
// the block's first sequence. Every ack still follows its event's store
// commit (or definitive refusal): the ack only moves to the end of decide.
//
// A message carrying a batch of events is acked with its last settled event:
// until then its redelivery brings them all again, and those settled already
// are found duplicates (stored once, counted stored once).
func (i *Ingester) ackSettled(items []*item) {
	for _, it := range items {
		if !it.settled {
			continue
		}
		it.settled = false
		if it.del.settled++; it.del.settled < it.del.events {
			continue
		}
		if err := it.msg.Ack(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			i.log.Warn("ack failed: the event will be redelivered and found a duplicate", "relay", it.relay, "err", err)
		}
	}
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
	if it.evt.Kind == nip34.KindDeletion {
		// It may just have removed announcements (an earlier attempt died
		// before applying it), with no notice to say so.
		i.forgetLookups()
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

// done counts an item's outcome and marks it settled: decide acks its
// message at the end of the batch (ackSettled).
func (i *Ingester) done(it *item, outcome string) {
	if it.check == checkVerified && verified(policy.Reason(outcome)) {
		i.m.incVerified()
	}
	switch outcome {
	case outcomeStored:
		i.m.storedAfter(i.clk.Now().Sub(publishedAt(it.msg)))
	case outcomeDuplicate:
		i.m.incDuplicate()
	case outcomeParked:
		i.m.incParked()
	default:
		i.m.incRefused(outcome)
	}
	it.settled = true
}
