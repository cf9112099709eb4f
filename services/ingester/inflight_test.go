package ingester_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// TestInFlightBytesBounded: 160 batch messages of 64 events (~70 KB each,
// ~11 MB in all) wait in the stream while the store is down, so the
// ingester can acknowledge none of them: the messages delivered to it and
// not acknowledged (the consumer's ack-pending count, as the server sees
// it) stay within GRASP_INGESTER_MAX_BYTES (4 MiB here), and once the store
// is back every event is stored. Bounded by message counts (a pull of
// FetchBatch messages, a read queue of as many), the ingester took the
// whole stream, ~11 MB (docs/decisions/0065-work-in-flight-bounded-by-bytes.md).
func TestInFlightBytesBounded(t *testing.T) {
	const (
		messages  = 160
		perMsg    = 64
		maxBytes  = 4 << 20
		padLength = 900
	)
	e := newEnv(t)
	owner := testkit.NewKey()
	pad := strings.Repeat("x", padLength)
	var ds []delivery
	want := map[string]bool{}
	for n := range messages * perMsg {
		a := served(owner, fmt.Sprintf("repo-%d", n))
		a.Tags = append(a.Tags, nostr.Tag{"description", pad})
		a = owner.Sign(a)
		data, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, delivery{data: data, msgID: a.ID, relay: "wss://relay.example.com"})
		want[a.ID] = true
	}
	fs := &flakyStore{Store: e.store, poison: map[string]bool{}}
	fs.down.Store(true)
	cfg := fastConfig()
	cfg.FetchBatch = 256 // the default: a pull of 256 messages before
	cfg.AckWait = time.Minute
	cfg.MaxBytes = maxBytes
	r := e.start(t, cfg, fs)
	sent := e.publishBatched(t, ds, perMsg)
	if sent != messages {
		t.Fatalf("published %d messages, want %d", sent, messages)
	}
	msgSize := 0
	for _, d := range ds[:perMsg] {
		msgSize += len(d.data) + 1
	}

	// Wait until the ingester holds what it will hold: the ack-pending
	// count unchanged for a second, with the store failing all along.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cons, err := e.bus.JS.Consumer(ctx, e.bus.Names.EventsStream(), cfg.Consumer)
	for err != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("consumer: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		cons, err = e.bus.JS.Consumer(ctx, e.bus.Names.EventsStream(), cfg.Consumer)
	}
	last, same, peak := -1, 0, 0
	for same < 10 {
		select {
		case <-ctx.Done():
			t.Fatalf("ack pending still moving after a minute (last %d)", last)
		case <-time.After(100 * time.Millisecond):
		}
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		peak = max(peak, info.NumAckPending)
		if info.NumAckPending == last && last > 0 {
			same++
		} else {
			last, same = info.NumAckPending, 0
		}
	}
	if fs.failures.Load() == 0 {
		t.Fatal("the store was never called: nothing was being decided")
	}
	held := peak * msgSize
	t.Logf("held %d of %d messages (%.1f MiB of %.1f MiB published; bound %.0f MiB)",
		peak, messages, float64(held)/(1<<20), float64(messages*msgSize)/(1<<20), float64(maxBytes)/(1<<20))
	if held > maxBytes {
		t.Errorf("the ingester held %d messages unacknowledged, %d bytes: over GRASP_INGESTER_MAX_BYTES (%d)", peak, held, maxBytes)
	}
	fs.down.Store(false)
	e.waitDrained(t, want, 2*time.Minute)
	e.assertExactly(t, want)
	if st := r.ing.Stats(); st.DeadLettered != 0 {
		t.Errorf("%d messages dead-lettered", st.DeadLettered)
	}
}

// TestInFlightBytesBelowMaxPayload: a bound too small for a pull of one
// message of the server's max payload (1 MiB by default) is a start-up
// error naming the variable, not a consumer that stalls.
func TestInFlightBytesBelowMaxPayload(t *testing.T) {
	e := newEnv(t)
	cfg := fastConfig()
	cfg.MaxBytes = 2 << 20
	r := e.start(t, cfg, nil)
	select {
	case err := <-r.done:
		r.cancel()
		r.bus.Close()
		r.cancel = nil // stopped already
		if err == nil || !strings.Contains(err.Error(), "GRASP_INGESTER_MAX_BYTES=2MiB") {
			t.Fatalf("Run = %v, want an error naming GRASP_INGESTER_MAX_BYTES=2MiB", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the ingester ran with a bound smaller than four messages of the max payload")
	}
}
