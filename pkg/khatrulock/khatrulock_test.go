package khatrulock_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/khatrulock"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
)

// The workaround depends on a private field: fail loudly when an upgrade
// removes it, so the race is revisited rather than silently back.
func TestClientsMutexFound(t *testing.T) {
	if khatrulock.ClientsMutex(khatru.NewRelay()) == nil {
		t.Fatal("khatru has no clientsMutex any more: revisit the listener-race workaround")
	}
}

// Listening follows the live subscriptions: none before a REQ, one after
// its EOSE, none again once the client closes it.
func TestListeningFollowsSubscriptions(t *testing.T) {
	k := khatru.NewRelay()
	k.QueryEvents = append(k.QueryEvents, func(context.Context, nostr.Filter) (chan *nostr.Event, error) {
		ch := make(chan *nostr.Event)
		close(ch)
		return ch, nil
	})
	srv := httptest.NewServer(k)
	defer srv.Close()
	if khatrulock.Listening(k) {
		t.Fatal("listening before any subscription")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := testkit.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Write(ctx, []any{"REQ", "live", nostr.Filter{Kinds: []int{1}}}); err != nil {
		t.Fatal(err)
	}
	for {
		env, _, err := conn.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := env.(*nostr.EOSEEnvelope); ok {
			break
		}
	}
	if !khatrulock.Listening(k) {
		t.Fatal("not listening with a live subscription open")
	}
	if err := conn.Write(ctx, []any{"CLOSE", "live"}); err != nil {
		t.Fatal(err)
	}
	for khatrulock.Listening(k) {
		if ctx.Err() != nil {
			t.Fatal("still listening after the subscription was closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
