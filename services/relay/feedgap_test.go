package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/natstest"
)

// TestFeedGapDropsClients: when the relay's NATS connection reconnects, the
// announcements published meanwhile were never broadcast, and a live
// subscriber could not tell. The relay then drops its clients, saying why,
// so that they subscribe again and read the store. Until then, a client
// stays connected.
func TestFeedGapDropsClients(t *testing.T) {
	n := natstest.Start(t)
	b, err := bus.Connect(context.Background(), n.URL, "relay-test", bus.DefaultNames(), bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	s := startServer(t, serverOpts{bus: b, cfg: Config{FeedGapMinInterval: time.Millisecond}})

	live := dial(t, s.url)
	live.write(nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{1621}, LimitZero: true}}})
	live.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EOSEEnvelope); return ok })
	idle := dial(t, s.url)

	// No gap: nobody is dropped. (A read with a deadline would close
	// go-nostr's connection when it expires: ask something instead.)
	time.Sleep(3 * feedGapCheck)
	stillServed(t, live)
	stillServed(t, idle)

	before := b.Conn.Stats().Reconnects
	if err := b.Conn.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client{live, idle} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		env, raw, err := c.c.Read(ctx)
		if err != nil {
			cancel()
			t.Fatalf("after the relay's NATS reconnected: %v, want a NOTICE first", err)
		}
		if n, ok := env.(*nostr.NoticeEnvelope); !ok || !strings.HasPrefix(string(*n), "error: ") {
			t.Fatalf("after the relay's NATS reconnected: %s, want a NOTICE with a machine-readable prefix", raw)
		}
		_, raw, err = c.c.Read(ctx)
		cancel()
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("after the NOTICE: %q, %v; want the connection closed", raw, err)
		}
		// go-nostr's websocket library names the code.
		if !strings.Contains(err.Error(), "StatusServiceRestart") {
			t.Errorf("connection closed with %v, want close code 1012 (service restart)", err)
		}
	}
	if b.Conn.Stats().Reconnects == before {
		t.Fatal("the relay's NATS connection did not reconnect")
	}
	if v := testutil.ToFloat64(s.relay.feedGapDrops); v != 1 {
		t.Errorf("feed gap drops = %v, want 1", v)
	}

	// A client that connects after the drop stays, and gets what is
	// stored (the broadcast works again).
	again := dial(t, s.url)
	again.write(nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{1621}, LimitZero: true}}})
	again.next(func(env nostr.Envelope, _ string) bool { _, ok := env.(*nostr.EOSEEnvelope); return ok })
	time.Sleep(3 * feedGapCheck)
	stillServed(t, again)
	if v := testutil.ToFloat64(s.relay.feedGapDrops); v != 1 {
		t.Errorf("feed gap drops = %v after the relay's feed was whole again, want 1", v)
	}
}

// stillServed fails unless c's connection still answers a REQ.
func stillServed(t *testing.T, c *client) {
	t.Helper()
	c.write(nostr.ReqEnvelope{SubscriptionID: "ping", Filters: nostr.Filters{{Kinds: []int{1}, Limit: 1}}})
	c.next(func(env nostr.Envelope, _ string) bool {
		e, ok := env.(*nostr.EOSEEnvelope)
		return ok && string(*e) == "ping"
	})
}

func TestFeedMarkGapSince(t *testing.T) {
	tests := []struct {
		name      string
		mark, now FeedMark
		want      bool
	}{
		{"unchanged", FeedMark{1, 5}, FeedMark{1, 5}, false},
		{"reconnected", FeedMark{1, 5}, FeedMark{2, 5}, true},
		{"dropped as a slow consumer", FeedMark{1, 5}, FeedMark{1, 6}, true},
		// nats.go resets a subscription's dropped count when it is
		// resubscribed; any change is a reason.
		{"dropped count reset", FeedMark{1, 5}, FeedMark{1, 0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.now.GapSince(tt.mark); got != tt.want {
				t.Errorf("%+v.GapSince(%+v) = %v, want %v", tt.now, tt.mark, got, tt.want)
			}
		})
	}
}
