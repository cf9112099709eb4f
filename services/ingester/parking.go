package ingester

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/ingester/internal/parking"
)

// wakeQueue bounds the stored-event notifications waiting for the wake
// loop. Beyond it NATS drops notifications (counted as slow-consumer
// errors); the events they would have woken stay parked until another
// related event is stored or the next sweep (sweepParked) finds them.
const wakeQueue = 8192

// wakeWorkers re-evaluate in parallel: one lookup costs about two NATS round
// trips (~135 µs measured), so a single worker would cap the wake-ups at
// ~7,000 stored events/s, below initial-sync bursts.
const wakeWorkers = 4

// wakeChunk is how many stored-event notifications share one "is anything
// parked?" check.
const wakeChunk = 256

// park puts an event refused only for a missing reference in the lot, then
// evaluates it once more: what it waits for may have been stored between the
// refusal and the park, and that event's wake-up could not see the park yet.
// An error leaves the message to be redelivered.
//
// verified says the event's signature was checked already, so the
// re-evaluation skips that check.
func (i *Ingester) park(ctx context.Context, evt *nostr.Event, d policy.Decision, relay string, verified bool) error {
	p, parked, err := i.lot.Park(ctx, evt, string(d.Reason), d.Missing, relay)
	if err != nil {
		return fmt.Errorf("park %s: %w", evt.ID, err)
	}
	if !parked {
		return nil // parked before (another relay sent it too)
	}
	i.log.Debug("event parked", "id", evt.ID, "kind", evt.Kind, "reason", string(d.Reason),
		"missing", len(d.Missing), "relay", relay)
	_, err = i.reevaluate(ctx, p, verified)
	return err
}

// wake re-evaluates parked events when an event they could depend on is
// stored by any writer (ingester replicas, relay replicas). One ingester
// replica per stored event (queue group), since the lot is shared. The
// notices are core NATS, at most once: those buffered in a replica that
// dies (or dropped past wakeQueue) are lost, which sweepParked makes up for.
//
// Finding the waiters of one stored event costs a stream-info request per
// reference it carries, so notifications are taken in chunks and the lot is
// asked once per chunk whether anything is parked at all; when nothing is,
// the chunk is done. That skips no wake-up: an event parked after the
// check is re-evaluated by its parker after the park (see park), which is
// after these events were stored.
func (i *Ingester) wake(ctx context.Context) error {
	ch := make(chan *nats.Msg, wakeQueue)
	sub, err := i.bus.Conn.ChanQueueSubscribe(i.bus.Names.StoredSubjects(), i.bus.Names.ParkingWakeQueue(), ch)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", i.bus.Names.StoredSubjects(), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	jobs := make(chan *nats.Msg, wakeWorkers)
	var wg sync.WaitGroup
	for range wakeWorkers {
		wg.Go(func() {
			for msg := range jobs {
				evt, err := decode(msg.Data)
				if err != nil {
					i.log.Warn("undecodable stored event", "subject", msg.Subject, "err", err)
					continue
				}
				// As a batch would: no deletion is decided while a woken
				// target is being stored.
				i.deletions.RLock()
				err = i.wakeFor(ctx, evt)
				i.deletions.RUnlock()
				if err != nil && ctx.Err() == nil {
					i.log.Warn("re-evaluating parked events failed", "stored", evt.ID, "kind", evt.Kind, "err", err)
				}
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)
	chunk := make([]*nats.Msg, 0, wakeChunk)
	for {
		chunk = chunk[:0]
		select {
		case <-ctx.Done():
			return nil
		case msg := <-ch:
			chunk = append(chunk, msg)
		}
	fill:
		for len(chunk) < wakeChunk {
			select {
			case msg := <-ch:
				chunk = append(chunk, msg)
			default:
				break fill
			}
		}
		if n, err := i.lot.Len(ctx); err == nil && n == 0 {
			continue
		}
		for _, msg := range chunk {
			select {
			case jobs <- msg:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// wakeFor re-evaluates the parked events that stored may unblock.
func (i *Ingester) wakeFor(ctx context.Context, stored *nostr.Event) error {
	waiting, err := i.lot.Waiting(ctx, stored)
	if err != nil {
		return err
	}
	for _, p := range waiting {
		if _, err := i.reevaluate(ctx, p, false); err != nil {
			return err
		}
	}
	return nil
}

// sweepParked re-evaluates the whole lot, ParkSweepMax events every
// ParkSweep, until ctx is done. Wake-ups are notices on core NATS: one
// buffered in a replica that is killed is lost with it, and an event stored
// by a writer that died before announcing it wakes nothing until its
// redelivery. The sweep bounds how long such a parked event waits.
//
// Every replica sweeps; two replicas re-evaluating one event at once is
// harmless: the store keeps one copy (the second save is a duplicate and
// announces nothing), and only the first Unpark removes and counts it. A
// replica that starts late simply begins its cycle at the oldest event.
func (i *Ingester) sweepParked(ctx context.Context) error {
	var from uint64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-i.clk.After(i.cfg.ParkSweep):
		}
		next, err := i.sweepOnce(ctx, from)
		if err != nil && ctx.Err() == nil {
			i.log.Warn("parking sweep failed: resuming at the next one", "from", from, "err", err)
		}
		from = next
	}
}

// sweepOnce re-evaluates up to ParkSweepMax parked events from stream
// sequence from, and returns where the next sweep resumes (0: the oldest).
// An event whose re-evaluation fails (the store) stays parked and is
// retried in the next cycle; the sweep goes on with the others.
func (i *Ingester) sweepOnce(ctx context.Context, from uint64) (uint64, error) {
	parked, next, err := i.lot.Scan(ctx, from, i.cfg.ParkSweepMax)
	stored, failed := 0, 0
	var firstErr error
	for _, p := range parked {
		if ctx.Err() != nil {
			return from, ctx.Err()
		}
		// As a wake-up does: no deletion is decided while a woken target
		// is being stored.
		i.deletions.RLock()
		ok, rerr := i.reevaluate(ctx, p, false)
		i.deletions.RUnlock()
		switch {
		case rerr != nil:
			failed++
			firstErr = cmp.Or(firstErr, rerr)
		case ok:
			stored++
			i.m.sweepStored.Inc()
		}
	}
	if stored > 0 {
		// Each one is a wake-up that went missing: worth knowing even
		// though the sweep recovered it.
		i.log.Info("parking sweep stored events whose wake-up was lost", "stored", stored, "scanned", len(parked))
	}
	if failed > 0 {
		err = errors.Join(err, fmt.Errorf("%d of %d parked events could not be re-evaluated, first: %w", failed, len(parked), firstErr))
	}
	return next, err
}

// reevaluate applies the policy to a parked event again: accepted events are
// stored (and published, which wakes what waits for them in turn) and leave
// the lot, as do events refused for good; events still waiting stay, with
// their original age. A store error leaves the event parked. verified skips
// the signature check, for an event checked in this process; events read
// back from the lot are checked again.
//
// stored reports whether this call stored the event (not another writer
// that re-evaluated it at the same time).
func (i *Ingester) reevaluate(ctx context.Context, p parking.Parked, verified bool) (stored bool, err error) {
	var d policy.Decision
	if verified {
		d = i.policy.EvaluateVerified(ctx, p.Event)
	} else {
		d = i.policy.Evaluate(ctx, p.Event)
	}
	switch {
	case d.Accept:
		data, err := json.Marshal(p.Event)
		if err != nil {
			return false, fmt.Errorf("encode parked %s: %w", p.Event.ID, err)
		}
		saved, err := i.storeAccepted(ctx, p.Event, data)
		switch {
		case i.targetRefused(ctx, p.Event, p.Relay, err):
			i.lot.Unpark(ctx, p, outcomeTargetRefused)
			i.m.incUnparked(outcomeTargetRefused)
			return false, nil
		case errors.Is(err, store.ErrUnstorable):
			i.lot.Unpark(ctx, p, outcomeUnstorable)
			i.m.incUnparked(outcomeUnstorable)
			return false, nil
		case err != nil:
			return false, err
		case saved:
			i.m.incStoredNoLatency()
		}
		stored = saved // false when another writer stored it first
		i.lot.Unpark(ctx, p, "stored")
		i.m.incUnparked("stored")
		i.log.Debug("parked event stored", "id", p.Event.ID, "kind", p.Event.Kind, "relay", p.Relay)
	case d.Reason == policy.ReasonStoreError:
		return false, fmt.Errorf("re-evaluate %s: %w", p.Event.ID, d.Err)
	case d.Parkable():
		// Still waiting for something else.
	default:
		i.lot.Unpark(ctx, p, string(d.Reason))
		i.m.incUnparked(string(d.Reason))
		i.log.Debug("parked event refused", "id", p.Event.ID, "kind", p.Event.Kind, "reason", string(d.Reason), "relay", p.Relay)
	}
	return stored, nil
}
