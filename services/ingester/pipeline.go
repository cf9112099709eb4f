package ingester

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nbd-wtf/go-nostr"
	"golang.org/x/sync/errgroup"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/verify"
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
// but not yet written waits for the next pass, after the batch so far is
// written (see batch.Query), so an announcement and an issue on it, or a
// deletion and its target, in one batch are decided as if they had arrived
// one by one.
//
// Within stage 3, a batch's last write (its stored notices and acks too)
// runs while the next batch is decided (see write in decide.go;
// docs/decisions/0063-ingester-write-overlaps-decide.md). The events being
// written count as pending for the next batch's decisions, exactly as its
// own accepted events do, and the next batch writes and acks nothing before
// that write is settled and its failures retried; a write that deletes or
// replaces stored events is not overlapped.

// check is what the verify stage found out about one message.
type check int

const (
	checkMalformed check = iota // not event JSON
	checkBadID                  // the id is not the hash of the event
	checkStored                 // the id is stored: a duplicate, signature not checked
	checkForged                 // the id matches, the signature does not verify
	checkVerified               // id and signature verified
)

// item is one event on its way through the pipeline. A message carries
// one event or a batch of them (bus.HeaderEvents); the items of one
// message share its delivery and are always in the same batch.
type item struct {
	msg jetstream.Msg
	del *delivery
	// data is the event's JSON (a line of a batch message, or the whole
	// data of a one-event message); index its place in a batch message,
	// -1 in a one-event message.
	data  []byte
	index int
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
	// settled: done counted its outcome; decide acks its message once the
	// whole batch is decided (see ackSettled).
	settled bool
}

// delivery is one delivered message: acked once every event it carries
// is settled (ackSettled), nak'ed or dead-lettered as a whole otherwise
// (see failedItems).
type delivery struct {
	msg jetstream.Msg
	// events is how many items the message yielded, settled how many of
	// them are settled so far.
	events, settled int
}

// pullMaxMessages and pullThreshold shape the iterator's pulls: each asks
// for at most pullMaxMessages messages and pullBytes bytes, and the next is
// sent only once fewer than pullThreshold messages are left in the
// iterator, so it holds at most one message from before (at most the max
// payload) and one pull's bytes. The count leaves the iterator's channel
// room for the server's status messages (a full channel drops them as a
// slow consumer; with 4 it did).
const (
	pullMaxMessages = 64
	pullThreshold   = 2
)

// inFlightShares splits Config.MaxBytes in quarters: the iterator holds at
// most two (a message left from the last pull and the next pull, each at
// most a quarter: pullThreshold), the message in the read stage's hand at
// most one (the max payload), and the read channel and the batches being
// verified and decided the last one, held from the read until their batch
// is settled (a ByteGate).
func inFlightShares(maxBytes, maxPayload int64) (pull, pipeline int64, err error) {
	q := maxBytes / 4
	if q < maxPayload {
		return 0, 0, config.Invalid("INGESTER_MAX_BYTES", config.ByteSize(maxBytes),
			fmt.Sprintf("must be at least 4 × the NATS server's max payload (%s): a pull smaller than one message stalls", config.ByteSize(maxPayload)))
	}
	return q, q, nil
}

// consume attaches to the shared durable consumer and runs the pipeline
// until ctx is done. A replica holds at most Config.MaxBytes of messages:
// the iterator's buffer, the message being read, and the read channel and
// the batches being verified, decided and written, whose messages pass a ByteGate
// from the pull until their batch is settled (inFlightShares;
// docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
func (i *Ingester) consume(ctx context.Context) error {
	pullBytes, gateBytes, err := inFlightShares(int64(i.cfg.MaxBytes), i.bus.Conn.MaxPayload())
	if err != nil {
		return err
	}
	i.inFlight = bus.NewByteGate(gateBytes)
	// EnsureConsumer: replicas starting together in a cluster create this
	// durable at once, and a lost answer must not end the process.
	replicas := 1
	if s, err := i.bus.JS.Stream(ctx, i.bus.Names.EventsStream()); err == nil {
		replicas = s.CachedInfo().Config.Replicas
	}
	cons, err := bus.EnsureConsumer(ctx, i.bus.JS, i.bus.Names.EventsStream(), jetstream.ConsumerConfig{
		Durable: i.cfg.Consumer,
		// Replicated, its state lives in memory (bus.WorkQueueStateInMemory).
		MemoryStorage: bus.WorkQueueStateInMemory(replicas),
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
	// A short idle heartbeat renews a first pull lost while the consumer
	// was not yet reachable in a cluster (see bus.Consume); in process
	// there is no cluster (bus.InProcessPullHeartbeat).
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(pullMaxMessages, int(pullBytes)), jetstream.PullThresholdMessages(pullThreshold),
		jetstream.PullHeartbeat(i.bus.PullHeartbeatInterval()))
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
		i.decideStage(gctx, batches)
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
		// Waits while the pipeline holds its share of Config.MaxBytes;
		// the message's bytes are released once its batch is settled.
		if _, err := i.inFlight.Acquire(ctx, msgBytes(msg)); err != nil {
			return nil // not acked: redelivered to another replica after AckWait
		}
		i.m.inFlight.Add(float64(msgBytes(msg)))
		select {
		case msgs <- msg:
		case <-ctx.Done():
			// Not acked: redelivered to another replica after AckWait.
			return nil
		}
	}
}

// msgBytes is what a message counts against Config.MaxBytes: its data (a
// batch message's events) and subject. The gate clamps a message larger
// than its share, so Release is given the same clamp.
func msgBytes(m jetstream.Msg) int64 {
	return int64(len(m.Data()) + len(m.Subject()))
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
		// Bounded in events, not messages: a batch message carries many.
		events := bus.EventCount(batch[0].Headers())
	fill:
		for events < i.cfg.FetchBatch {
			select {
			case m, ok := <-msgs:
				if !ok {
					break fill
				}
				batch = append(batch, m)
				events += bus.EventCount(m.Headers())
			default:
				break fill
			}
		}
		start := i.clk.Now()
		items := i.verify(ctx, batch)
		verified := i.clk.Now()
		i.m.observeStage(stageVerify, verified.Sub(start))
	handoff:
		for {
			select {
			case batches <- items:
				i.m.observeStage(stageHandoff, i.clk.Now().Sub(verified))
				break handoff
			case <-ctx.Done():
				eachMsg(items, func(m jetstream.Msg) { _ = m.Nak() }) // another replica takes it at once
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
// restarts their AckWait (once per message, however many events it carries).
func keepAlive(items []*item) {
	eachMsg(items, func(m jetstream.Msg) { _ = m.InProgress() })
}

// eachMsg calls fn once for each message the items come from.
func eachMsg(items []*item, fn func(jetstream.Msg)) {
	var seen map[*delivery]struct{}
	for n, it := range items {
		if n > 0 && items[n-1].del == it.del {
			continue // a message's items are adjacent
		}
		if it.del.events > 1 {
			if seen == nil {
				seen = map[*delivery]struct{}{}
			}
			if _, ok := seen[it.del]; ok {
				continue
			}
			seen[it.del] = struct{}{}
		}
		fn(it.msg)
	}
}

// verify decodes and checks a batch: ids first (a hash), then one store
// lookup for the ids already stored, then the signatures of the rest in
// parallel. A failed lookup only means every signature is checked.
func (i *Ingester) verify(ctx context.Context, msgs []jetstream.Msg) []*item {
	items := make([]*item, 0, len(msgs))
	now := i.clk.Now()
	for _, m := range msgs {
		h := m.Headers()
		relay := h.Get(bus.HeaderRelay)
		lines := bus.SplitEvents(h, m.Data())
		if len(lines) == 0 {
			lines = [][]byte{nil} // an empty batch: one malformed item settles it
		}
		d := &delivery{msg: m, events: len(lines)}
		i.m.observeArrival(m, now)
		batch := bus.IsEventBatch(h)
		for n, data := range lines {
			i.m.incConsumed()
			it := &item{msg: m, del: d, data: data, index: -1, relay: relay, received: now}
			if batch {
				it.index = n
			}
			items = append(items, it)
		}
	}
	i.parallel(items, func(it *item) {
		evt, err := decode(it.data)
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
		// Held answers without reading the events: Query decoded every
		// duplicate in full, most of a batch when each event is on 2–3
		// relays (docs/measurements/2026-12-06-issue32-local-set-reads.md).
		held, err := i.store.Held(ctx, ids)
		if err != nil && ctx.Err() == nil {
			i.log.Debug("duplicate pre-check failed: verifying every signature", "err", err)
		}
		for _, id := range held {
			stored[id] = true
		}
		for _, it := range items {
			it.unstored = err == nil && it.check == checkVerified && !stored[it.evt.ID]
		}
	}
	// Copies of one event (same id and signature) in this batch — other
	// relays' copies that reached the stream together, which per-event
	// Nats-Msg-Ids used to drop — are verified once: the first decides for
	// the others (docs/decisions/0053-events-travel-in-batches.md).
	var copies map[*item]*item
	if len(ids) > 1 {
		first := make(map[string]*item, len(ids))
		for _, it := range items {
			if it.check != checkVerified {
				continue
			}
			k := it.evt.ID + it.evt.Sig
			if f, ok := first[k]; ok {
				if copies == nil {
					copies = map[*item]*item{}
				}
				copies[it] = f
			} else {
				first[k] = it
			}
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
		if _, ok := copies[it]; ok {
			return // decided by its first copy, below
		}
		// verify.Signature, not evt.CheckSignature: the libsecp256k1
		// build panics on an oversized pubkey or signature.
		if ok, err := verify.Signature(it.evt); !ok || err != nil {
			it.check = checkForged
		}
	})
	for it, f := range copies {
		if it.check == checkVerified {
			it.check = f.check
		}
	}
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
