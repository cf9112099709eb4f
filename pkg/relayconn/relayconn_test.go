package relayconn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

func TestSubscribeStoredThenLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testkit.StartRelay(t, testkit.RelayOptions{})
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
	// Every stored event must arrive before EOSE, even with a 1-event buffer.
	for got < len(stored) {
		select {
		case <-sub.Events():
			got++
		case <-sub.EOSE():
			t.Fatalf("EOSE after %d of %d stored events", got, len(stored))
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
	if err := testkit.Publish(ctx, r.URL, live); err != nil {
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
	r := testkit.StartRelay(t, testkit.RelayOptions{})
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
	r := testkit.StartRelay(t, testkit.RelayOptions{})
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
