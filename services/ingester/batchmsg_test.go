package ingester_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/ingester"
)

// publishBatched sends the deliveries as the fetcher does with batches on:
// consecutive deliveries of one relay travel together, up to n events and
// bus.EventBatchMaxBytes per message (bus.HeaderEvents, one event per
// line); a delivery alone goes in the one-event format with its
// Nats-Msg-Id. It returns how many messages it sent.
func (e *env) publishBatched(t testing.TB, ds []delivery, n int) int {
	t.Helper()
	ctx := context.Background()
	sent := 0
	send := func(group []delivery) {
		msg := nats.NewMsg(e.bus.Names.EventsSubject(sent % 4))
		msg.Header.Set(bus.HeaderRelay, group[0].relay)
		if len(group) == 1 {
			msg.Data = group[0].data
			if group[0].msgID != "" {
				msg.Header.Set(nats.MsgIdHdr, group[0].msgID)
			}
		} else {
			ids := make([]string, len(group))
			for k, d := range group {
				msg.Data = append(append(msg.Data, d.data...), '\n')
				ids[k] = d.msgID
			}
			msg.Header.Set(bus.HeaderEvents, strconv.Itoa(len(group)))
			msg.Header.Set(nats.MsgIdHdr, bus.EventBatchMsgID(ids))
		}
		if _, err := e.bus.JS.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
		if sent++; sent%200 == 0 {
			e.awaitPublished(t, ctx)
		}
	}
	var group []delivery
	size := 0
	for _, d := range ds {
		if len(group) > 0 && (group[0].relay != d.relay || len(group) == n || size+len(d.data)+1 > bus.EventBatchMaxBytes) {
			send(group)
			group, size = nil, 0
		}
		group = append(group, d)
		size += len(d.data) + 1
	}
	if len(group) > 0 {
		send(group)
	}
	e.awaitPublished(t, ctx)
	return sent
}

// TestIngestBatchMessages: the small workload (duplicates, forgeries,
// orphans, oversized events) in batch messages, with one-event messages
// (an upgrade's leftovers) before and after them in the same stream →
// exactly the accepted set stored, each once and counted once, each forgery
// refused alone while its batch-mates are stored. Without batch support an
// ingester takes a batch for one malformed event and stores none of it.
func TestIngestBatchMessages(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	cfg := fastConfig()
	cfg.AckWait = time.Minute // counts per event: nothing may be redelivered
	cfg.ParkSweep = time.Hour
	r := e.start(t, cfg, nil)
	third := len(w.deliveries) / 3
	e.publish(t, w.deliveries[:third]) // one event per message, as before batches
	msgs := e.publishBatched(t, w.deliveries[third:2*third], 64)
	e.publish(t, w.deliveries[2*third:])
	if msgs >= third/4 {
		t.Fatalf("%d messages for %d events: not batched", msgs, third)
	}
	e.waitDrained(t, w.accepted, 3*time.Minute)
	e.assertExactly(t, w.accepted)
	st := r.ing.Stats()
	if st.Stored != int64(len(w.accepted)) {
		t.Errorf("stored counter = %d, want %d (each event counted once)", st.Stored, len(w.accepted))
	}
	if got := st.Refused[string(policy.ReasonBadSignature)]; got != int64(w.badSig) {
		t.Errorf("bad-signature refusals = %d, want %d", got, w.badSig)
	}
	if got := st.Refused[string(policy.ReasonBadID)]; got != int64(w.badID) {
		t.Errorf("bad-id refusals = %d, want %d", got, w.badID)
	}
	if st.Consumed < int64(len(w.deliveries))-int64(specSmall.dupInWindow) {
		t.Errorf("consumed = %d, want every event counted (≥ %d)", st.Consumed, len(w.deliveries)-specSmall.dupInWindow)
	}
	if st.DeadLettered != 0 {
		t.Errorf("dead-lettered = %d, want 0", st.DeadLettered)
	}
}

// crashStore stores the first batch written through it, then hangs until
// the replica is killed: the replica dies after the store commit and
// before its acks.
type crashStore struct {
	ingester.Store
	once  sync.Once
	saved chan struct{}
}

func (c *crashStore) SaveBatch(ctx context.Context, evts []*nostr.Event) []store.SaveResult {
	res := c.Store.SaveBatch(ctx, evts)
	c.once.Do(func() {
		close(c.saved)
		<-ctx.Done()
	})
	return res
}

// TestBatchRedeliveredAfterCrash: a replica dies after storing a batch
// message's events and before acking it; the message is redelivered whole
// to another replica, which finds every event stored: each is stored once,
// counted stored at most once, and its neighbours' copies are duplicates.
func TestBatchRedeliveredAfterCrash(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	// The announcements are stored beforehand; the batch carries issues
	// on them, all accepted in one pass and written with one SaveBatch.
	var ds []delivery
	want := map[string]bool{}
	var anns []*nostr.Event
	for _, d := range w.deliveries {
		id, _, _ := strings.Cut(d.msgID, ":")
		if !w.accepted[id] || want[id] {
			continue
		}
		switch {
		case strings.Contains(string(d.data), `"kind":30617`):
			var a nostr.Event
			if err := a.UnmarshalJSON(d.data); err != nil {
				t.Fatal(err)
			}
			anns = append(anns, &a)
			want[id] = true
		case strings.Contains(string(d.data), `"kind":1621`) && len(ds) < 40:
			d.relay = w.deliveries[0].relay
			ds = append(ds, d)
			want[id] = true
		}
	}
	for _, res := range e.store.SaveBatch(context.Background(), anns) {
		if res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	cfg := fastConfig()
	cs := &crashStore{Store: e.store, saved: make(chan struct{})}
	r1 := e.start(t, cfg, cs)
	e.waitPulling(t, cfg.Consumer, 1)
	if n := e.publishBatched(t, ds, 64); n != 1 {
		t.Fatalf("%d messages, want the %d events in one", n, len(ds))
	}
	select {
	case <-cs.saved:
	case <-time.After(time.Minute):
		t.Fatal("the batch was not written")
	}
	if got := e.count(t); got != len(want) {
		t.Fatalf("store holds %d events after the first write, want %d", got, len(want))
	}
	r1.kill(t)
	r2 := e.start(t, cfg, nil)
	e.waitDrained(t, want, 2*time.Minute)
	e.assertExactly(t, want)
	s1, s2 := r1.ing.Stats(), r2.ing.Stats()
	if s1.Stored+s2.Stored > int64(len(ds)) || s2.Stored != 0 {
		t.Errorf("stored counted %d + %d times for %d events: counted twice", s1.Stored, s2.Stored, len(ds))
	}
	if s2.Duplicates != int64(len(ds)) {
		t.Errorf("the redelivery found %d duplicates, want %d", s2.Duplicates, len(ds))
	}
}

// TestBatchPoisonedEventDeadLetteredAlone: in one batch message, an event
// the store keeps rejecting and a forged copy of another: after MaxDeliver
// deliveries the poisoned event alone is dead-lettered (once, in the
// one-event format, counted once), the forgery is refused, and every other
// event of the batch is stored once.
func TestBatchPoisonedEventDeadLetteredAlone(t *testing.T) {
	w := workloadFor(t, specSmall)
	e := newEnv(t)
	var ds []delivery
	want := map[string]bool{}
	var poisonID string
	for _, d := range w.deliveries {
		id, _, _ := strings.Cut(d.msgID, ":")
		if !strings.Contains(string(d.data), `"kind":30617`) || !w.accepted[id] || want[id] || len(ds) == 3 {
			continue
		}
		ds = append(ds, d)
		want[id] = true
		if poisonID == "" {
			poisonID = id
		}
	}
	// A forged copy of the last one: changed content, recomputed id.
	var forged nostr.Event
	if err := forged.UnmarshalJSON(ds[len(ds)-1].data); err != nil {
		t.Fatal(err)
	}
	forged.Content += " (forged)"
	forged.ID = forged.GetID()
	fdata, _ := forged.MarshalJSON()
	ds = append(ds[:1], append([]delivery{{data: fdata, msgID: forged.ID, relay: ds[0].relay}}, ds[1:]...)...)
	for k := range ds {
		ds[k].relay = ds[0].relay
	}
	delete(want, poisonID)
	fs := &flakyStore{Store: e.store, poison: map[string]bool{poisonID: true}}
	r := e.start(t, fastConfig(), fs)
	if n := e.publishBatched(t, ds, 64); n != 1 {
		t.Fatalf("%d messages, want one batch", n)
	}
	e.waitDrained(t, want, 2*time.Minute)
	e.assertExactly(t, want)
	dead := e.deadLetters(t)
	if len(dead) != 1 || r.ing.Stats().DeadLettered != 1 {
		t.Fatalf("dead-letter stream holds %d messages, counter says %d, want 1 and 1", len(dead), r.ing.Stats().DeadLettered)
	}
	var got nostr.Event
	if err := got.UnmarshalJSON(dead[0].Data()); err != nil || got.ID != poisonID {
		t.Errorf("the dead letter is %q, want the poisoned event alone", dead[0].Data())
	}
	h := dead[0].Headers()
	if h.Get(bus.HeaderEvents) != "" || !strings.Contains(h.Get(ingester.HeaderDeadReason), "test poison") ||
		h.Get(ingester.HeaderDeadDeliveries) != "3" {
		t.Errorf("dead letter headers: %v", h)
	}
	if got := r.ing.Stats().Refused[string(policy.ReasonBadSignature)]; got < 1 {
		t.Errorf("the forgery was not refused (bad-signature refusals %d)", got)
	}
}
