package relayconn_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func TestSubscribeStoredThenLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	var stored []*nostr.Event
	for i := range 50 {
		stored = append(stored, k.Note("stored", testkit.At(nostr.Timestamp(1000+i))))
	}
	r.Add(t, stored...)

	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{SubscriptionBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	// Every stored event must arrive before EOSE, even with a 1-event
	// buffer: once EOSE is closed, what is not yet read is in Buffered (a
	// select may see EOSE while the last event waits in the buffer).
	for got < len(stored) {
		select {
		case <-sub.Events():
			got++
		case <-sub.EOSE():
			if got += len(sub.Buffered()); got != len(stored) {
				t.Fatalf("EOSE after %d of %d stored events", got, len(stored))
			}
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	select {
	case <-sub.EOSE():
	case <-ctx.Done():
		t.Fatal("no EOSE")
	}
	live := k.Note("live")
	if err := testrelay.Publish(ctx, r.URL, live); err != nil {
		t.Fatal(err)
	}
	select {
	case evt := <-sub.Events():
		if evt.ID != live.ID {
			t.Fatalf("live event = %s", evt.ID)
		}
	case <-ctx.Done():
		t.Fatal("live event not delivered")
	}
	sub.Close()
	<-sub.Done()
}

func TestCheckDialRefusesAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	refused := errors.New("refused by test")
	var dialled string
	_, err := relayconn.Dial(ctx, r.URL, relayconn.Options{CheckDial: func(host, address string) error {
		dialled = address
		return refused
	}})
	if err == nil || !strings.Contains(err.Error(), "refused by test") {
		t.Fatalf("Dial = %v, want the CheckDial refusal", err)
	}
	if !strings.HasPrefix(dialled, "127.0.0.1:") {
		t.Fatalf("CheckDial saw %q, want the dialled ip:port", dialled)
	}
}

func TestConnectionLossEndsSubscriptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("connection loss not noticed")
	}
	select {
	case <-sub.Done():
	case <-ctx.Done():
		t.Fatal("subscription not ended")
	}
}

// A relay that stops answering, pings included, without closing is
// declared dead by the keepalive.
func TestStalledRelayDeclaredDead(t *testing.T) {
	// Generous: on a loaded machine (make test runs packages in parallel
	// under -race) the handshake alone has taken over 10 s; the keepalive
	// declares the relay dead within a second of it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := faultrelay.Start(t, testrelay.Options{})
	f.Set(faultrelay.Faults{StallAfterEvents: -1})
	c, err := relayconn.Dial(ctx, f.URL, relayconn.Options{PingInterval: 50 * time.Millisecond, PongTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("stalled connection not detected")
	}
	if !errors.Is(context.Cause(c.Context()), relayconn.ErrDead) {
		t.Fatalf("cause %v", context.Cause(c.Context()))
	}
}

// Close of a connection to a relay that has gone silent, while the read
// loop waits on a slow consumer, ends our socket after Close's 2 s grace.
// The websocket library then waits up to 5 s for the relay's close frame,
// and its CloseNow only waits with it: a fetcher that had lost its shard
// held the relay's connection longer than the lease
// (TestReplicaStopsMidHistoricSync in services/fetcher). Whether the
// library waits depends on a race in its read lock, so a few rounds.
func TestCloseEndsStalledSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := faultrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	for i := range 3 {
		f.Add(t, k.Note("stored", testkit.At(nostr.Timestamp(1000+i))))
	}
	for round := range 4 {
		f.Set(faultrelay.Faults{})
		c, err := relayconn.Dial(ctx, f.URL, relayconn.Options{SubscriptionBuffer: 1})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		// One event fills the buffer; the read loop holds the next.
		for len(sub.Events()) < cap(sub.Events()) {
			select {
			case <-ctx.Done():
				t.Fatal("no event")
			case <-time.After(5 * time.Millisecond):
			}
		}
		// The relay goes silent when it forwards the next event, a live
		// one.
		f.Set(faultrelay.Faults{StallAfterEvents: 1})
		f.Add(t, k.Note("live", testkit.At(nostr.Timestamp(2000+round))))
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		_ = c.Close()
		// The bound sits between the grace (2 s) and the library's wait (5 s).
		if took := time.Since(start); took > 4*time.Second {
			t.Fatalf("round %d: Close took %s", round, took)
		}
		for {
			spans := f.Spans()
			if last := spans[len(spans)-1]; !last.Closed.IsZero() {
				if open := last.Closed.Sub(start); open > 4*time.Second {
					t.Fatalf("round %d: the relay saw our socket open %s after Close began", round, open)
				}
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("round %d: the relay still sees our socket open", round)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// An idle but healthy connection survives many keepalive rounds.
func TestKeepaliveKeepsHealthyConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{PingInterval: 20 * time.Millisecond, PongTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Ten rounds; the relay answering a REQ proves the connection is up.
	for range 10 {
		sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.EOSE():
		case <-c.Context().Done():
			t.Fatalf("healthy connection ended: %v", context.Cause(c.Context()))
		}
		sub.Close()
		time.Sleep(20 * time.Millisecond) // let pings happen between requests
	}
}

// Malformed messages are counted, not fatal; NOTICEs reach watchers;
// messages for a channel id are routed to it.
func TestMalformedNoticesAndChannels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := faultrelay.Start(t, testrelay.Options{})
	f.Set(faultrelay.Faults{
		NoticeOnREQ: "hello",
		Inject: func(sub string) [][]byte {
			return [][]byte{[]byte(`{not json`), []byte(`[1,2]`), []byte(`["EVENT","` + sub + `",{"kind":"x"}]`)}
		},
		NegOpenAnswer: "NEG-ERR", NegOpenText: "nope",
	})
	c, err := relayconn.Dial(ctx, f.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	notices, stop := c.WatchNotices(4)
	defer stop()
	sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.EOSE():
	case <-ctx.Done():
		t.Fatal("no EOSE")
	}
	if c.Malformed() != 2 || sub.Malformed() != 1 {
		t.Fatalf("malformed: conn %d, sub %d", c.Malformed(), sub.Malformed())
	}
	if n := <-notices; n != "hello" {
		t.Fatalf("notice %q", n)
	}
	ch, err := c.OpenChannel(ctx, "neg1")
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := c.WriteRaw(ctx, []byte(`["NEG-OPEN","neg1",{},"61"]`)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ch.Messages():
		if m.Label != "NEG-ERR" || ch.Bytes() == 0 {
			t.Fatalf("channel got %s (%d bytes)", m.Label, ch.Bytes())
		}
	case <-ctx.Done():
		t.Fatal("NEG-ERR not routed to the channel")
	}
	if c.Context().Err() != nil {
		t.Fatal("connection ended")
	}
}

// A refused upgrade is a DialError carrying the HTTP status.
func TestDialErrorStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f := faultrelay.Start(t, testrelay.Options{})
	f.Set(faultrelay.Faults{RejectConnections: 1})
	_, err := relayconn.Dial(ctx, f.URL, relayconn.Options{})
	var de *relayconn.DialError
	if !errors.As(err, &de) || de.StatusCode != 503 {
		t.Fatalf("Dial = %v, want a DialError with status 503", err)
	}
}

// Events decoded from one reused read buffer stay intact after later
// messages overwrite it.
func TestEventsSurviveLaterMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	want := map[string]string{}
	var stored []*nostr.Event
	for i := range 60 {
		evt := k.Note(strings.Repeat(string(rune('a'+i%26)), 10+i*37), testkit.At(nostr.Timestamp(1000+i)))
		stored = append(stored, evt)
		want[evt.ID] = evt.String()
	}
	r.Add(t, stored...)
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{SubscriptionBuffer: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.EOSE(): // every event is decoded and buffered
	case <-ctx.Done():
		t.Fatal("no EOSE")
	}
	for range stored {
		evt := <-sub.Events()
		if got := evt.String(); got != want[evt.ID] || !evt.CheckID() {
			t.Fatalf("event %s changed after later messages:\n got %s\nwant %s", evt.ID, got, want[evt.ID])
		}
	}
}

// A write whose caller has given up fails without ending the connection:
// the websocket library closes the whole connection when a write's context
// ends, and may start a write whose context already has, so before the
// write was detached from the caller's cancellation about one such write
// in two ended every subscription on the connection.
func TestCancelledWriteKeepsConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	r.Add(t, k.Note("stored"))
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 50 {
		wctx, wcancel := context.WithCancel(ctx)
		wcancel()
		if err := c.WriteRaw(wctx, []byte(`["CLOSE","gone"]`)); !errors.Is(err, context.Canceled) {
			t.Fatalf("write %d with a cancelled context: err %v, want context.Canceled", i, err)
		}
	}
	sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
	if err != nil {
		t.Fatalf("subscribe after the cancelled writes: %v", err)
	}
	select {
	case <-sub.Events():
	case <-sub.Done():
		t.Fatal("the connection ended: a cancelled write closed it")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// TestOnSentNamesPurposes: every message written is reported once with its
// exact size, a REQ under the purpose its caller set (or "req"), anything
// else under its label, so the bytes sent to relays can be told apart
// (issue 32).
func TestOnSentNamesPurposes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	var mu sync.Mutex
	sent := map[string]int{}
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{OnSent: func(purpose string, n int) {
		mu.Lock()
		sent[purpose] += n
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := nostr.Filters{{Kinds: []int{1}, Tags: nostr.TagMap{"e": {strings.Repeat("a", 64)}}}}
	sub, err := c.Subscribe(relayconn.WithPurpose(ctx, "history"), f)
	if err != nil {
		t.Fatal(err)
	}
	<-sub.EOSE()
	sub.Close()
	plain, err := c.Subscribe(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	<-plain.EOSE()
	if err := c.Write(relayconn.WithPurpose(ctx, "ignored"), []any{"NEG-CLOSE", "n1"}); err != nil {
		t.Fatal(err)
	}
	size := func(msg any) int {
		data, err := json.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		return len(data)
	}
	want := map[string]int{
		"history":   size(nostr.ReqEnvelope{SubscriptionID: sub.ID, Filters: f}),
		"req":       size(nostr.ReqEnvelope{SubscriptionID: plain.ID, Filters: f}),
		"close":     size(nostr.CloseEnvelope(sub.ID)),
		"neg_close": size([]any{"NEG-CLOSE", "n1"}),
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Fatalf("sent by purpose = %v, want %v", sent, want)
	}
}

// Once EOSE is closed, the stored events not yet read are all on Events:
// Buffered returns them, so a reader that sees EOSE first loses none.
func TestBufferedAfterEOSE(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	var stored []*nostr.Event
	for i := range 5 {
		stored = append(stored, k.Note("stored", testkit.At(nostr.Timestamp(1000+i))))
	}
	r.Add(t, stored...)
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.EOSE():
	case <-ctx.Done():
		t.Fatal("no EOSE")
	}
	if got := sub.Buffered(); len(got) != len(stored) {
		t.Fatalf("Buffered after EOSE: %d events, want %d", len(got), len(stored))
	}
	if got := sub.Buffered(); len(got) != 0 {
		t.Fatalf("Buffered again: %d events, want none", len(got))
	}
}
