package khatrulock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// Clients publishing while other clients open and close subscriptions is the
// pattern khatru v0.19.1 races on when it notifies listeners itself. Under
// -race this fails unless every notification holds khatru's lock, which the
// testkit relay's SaveThenBroadcast hooks ensure; every published event must
// still reach a subscriber that was open throughout.
func TestPublishWhileSubscribing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()

	watcher, err := testrelay.Dial(ctx, r.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	if err := watcher.Write(ctx, []any{"REQ", "all", nostr.Filter{Kinds: []int{1}}}); err != nil {
		t.Fatal(err)
	}
	for {
		env, _, err := watcher.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := env.(*nostr.EOSEEnvelope); ok {
			break
		}
	}

	const events = 40
	var wg sync.WaitGroup
	churnCtx, stopChurn := context.WithCancel(ctx)
	for c := 0; c < 3; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := testrelay.Dial(churnCtx, r.URL)
			if err != nil {
				return
			}
			defer conn.Close()
			for i := 0; churnCtx.Err() == nil; i++ {
				// Read to EOSE: a client that stops reading would
				// (rightly) stall broadcasts to it.
				id := fmt.Sprintf("s%d", i)
				if conn.Write(churnCtx, []any{"REQ", id, nostr.Filter{Kinds: []int{1}, Limit: 1}}) != nil {
					return
				}
				for {
					env, _, err := conn.Read(churnCtx)
					if err != nil {
						return
					}
					if eose, ok := env.(*nostr.EOSEEnvelope); ok && string(*eose) == id {
						break
					}
				}
				if conn.Write(churnCtx, []any{"CLOSE", id}) != nil {
					return
				}
			}
		}()
	}
	published := make(map[string]bool)
	for i := 0; i < events; i++ {
		evt := k.Note(fmt.Sprintf("note %d", i))
		published[evt.ID] = true
		if err := testrelay.Publish(ctx, r.URL, evt); err != nil {
			t.Fatal(err)
		}
	}
	stopChurn()
	wg.Wait()

	for len(published) > 0 {
		env, _, err := watcher.Read(ctx)
		if err != nil {
			t.Fatalf("%d published events never reached the open subscription: %v", len(published), err)
		}
		if e, ok := env.(*nostr.EventEnvelope); ok {
			delete(published, e.Event.ID)
		}
	}
}
