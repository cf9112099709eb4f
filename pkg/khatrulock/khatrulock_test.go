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
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// The workaround depends on a private field: fail loudly when an upgrade
// removes it, so the race is revisited rather than silently back.
func TestClientsMutexFound(t *testing.T) {
	if khatrulock.ClientsMutex(khatru.NewRelay()) == nil {
		t.Fatal("khatru has no clientsMutex any more: revisit the listener-race workaround")
	}
}

// ListeningFor follows the live subscriptions and their kinds: nothing
// before a REQ; after one for kind 1, kind 1 only; after a second without
// kinds, every kind; nothing again once both are closed.
func TestListeningForFollowsSubscriptions(t *testing.T) {
	k := khatru.NewRelay()
	k.QueryEvents = append(k.QueryEvents, func(context.Context, nostr.Filter) (chan *nostr.Event, error) {
		ch := make(chan *nostr.Event)
		close(ch)
		return ch, nil
	})
	srv := httptest.NewServer(k)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := func(kind int, listening bool) {
		t.Helper()
		for khatrulock.ListeningFor(k, kind) != listening {
			if ctx.Err() != nil {
				t.Fatalf("ListeningFor(%d) stayed %v", kind, !listening)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	want(1, false)
	conn, err := testrelay.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	subscribe := func(id string, f nostr.Filter) {
		t.Helper()
		if err := conn.Write(ctx, []any{"REQ", id, f}); err != nil {
			t.Fatal(err)
		}
		for {
			env, _, err := conn.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := env.(*nostr.EOSEEnvelope); ok {
				return
			}
		}
	}
	subscribe("notes", nostr.Filter{Kinds: []int{1}})
	want(1, true)
	want(1111, false)
	subscribe("all", nostr.Filter{Authors: []string{testkit.NewKey().PubKey}})
	want(1111, true)
	for _, id := range []string{"notes", "all"} {
		if err := conn.Write(ctx, []any{"CLOSE", id}); err != nil {
			t.Fatal(err)
		}
	}
	want(1, false)
	want(1111, false)
}
