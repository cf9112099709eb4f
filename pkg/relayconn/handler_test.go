package relayconn_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// labelled counts the goroutines carrying the pprof label side=client:
// those the connection started (they inherit the label of the goroutine
// that dialled), not the in-process relay's.
func labelled(t *testing.T) int {
	t.Helper()
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	n, count := 0, 0
	for _, line := range strings.Split(b.String(), "\n") {
		if i := strings.Index(line, " @ "); i > 0 {
			count, _ = strconv.Atoi(line[:i])
		}
		if strings.HasPrefix(line, "# labels:") && strings.Contains(line, `"side":"client"`) {
			n += count
		}
	}
	return n
}

// TestHandlerSubscriptionsHoldNoGoroutine: a connection serving 200 live
// subscriptions with handlers holds, at rest, as many goroutines as with
// one (issue 32), and every subscription gets the event that matches all of
// them. A goroutine per subscription would add 200.
func TestHandlerSubscriptionsHoldNoGoroutine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()

	var c *relayconn.Conn
	var err error
	pprof.Do(ctx, pprof.Labels("side", "client"), func(ctx context.Context) {
		c, err = relayconn.Dial(ctx, r.URL, relayconn.Options{})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const n = 200
	var got atomic.Int64
	eose := make(chan struct{}, n)
	open := func() {
		h := &relayconn.Handler{
			Event: func(*nostr.Event, bool) { got.Add(1) },
			EOSE:  func() { eose <- struct{}{} },
		}
		var sub *relayconn.Subscription
		pprof.Do(ctx, pprof.Labels("side", "client"), func(ctx context.Context) {
			sub, err = c.SubscribeLive(ctx, nostr.Filters{{Kinds: []int{1}, LimitZero: true}}, nil, h)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sub.Close)
		select {
		case <-eose:
		case <-ctx.Done():
			t.Fatal("no EOSE")
		}
	}
	open()
	// settled waits for the labelled goroutines to come down to at most
	// want (a delivery goroutine ends once its queues are empty).
	settled := func(want int) int {
		var have int
		for range 100 {
			if have = labelled(t); have <= want {
				return have
			}
			time.Sleep(50 * time.Millisecond)
		}
		return have
	}
	base := settled(2)
	if base == 0 {
		t.Fatal("no goroutine carries the label: the count would prove nothing")
	}
	for range n - 1 {
		open()
	}
	if err := testrelay.Publish(ctx, r.URL, k.Note("to all")); err != nil {
		t.Fatal(err)
	}
	for got.Load() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d subscriptions got the event", got.Load(), n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if have := settled(base); have > base {
		t.Fatalf("%d goroutines of the connection at rest with %d subscriptions, %d with one: they grow with subscriptions", have, n, base)
	}
	t.Logf("%d goroutines of the connection at rest, with 1 or %d live subscriptions", base, n)
}

// TestHandlerOrderAndClose: with a queue of one event, a handler still gets
// every stored event before EOSE, in the relay's order, while the read
// goroutine waits for room; Close returns only once the handler call in
// progress has returned, and nothing is delivered after it.
func TestHandlerOrderAndClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	var stored []*nostr.Event
	for i := range 40 {
		stored = append(stored, k.Note(fmt.Sprint("stored ", i), testkit.At(nostr.Timestamp(1000+i))))
	}
	r.Add(t, stored...)
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{SubscriptionBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var mu sync.Mutex
	var seen []string
	eose := make(chan int, 1)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var blocking atomic.Bool
	h := &relayconn.Handler{
		Event: func(evt *nostr.Event, _ bool) {
			if blocking.Load() {
				entered <- struct{}{}
				<-release
			}
			mu.Lock()
			seen = append(seen, evt.ID)
			mu.Unlock()
			time.Sleep(time.Millisecond) // slower than the socket: the queue fills
		},
		EOSE: func() {
			mu.Lock()
			eose <- len(seen)
			mu.Unlock()
		},
	}
	sub, err := c.SubscribeLive(ctx, nostr.Filters{{Kinds: []int{1}}}, nil, h)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-eose:
		if n != len(stored) {
			t.Fatalf("EOSE after %d of %d stored events", n, len(stored))
		}
	case <-ctx.Done():
		t.Fatal("no EOSE")
	}
	mu.Lock()
	for i, id := range seen {
		// The relay sends newest first.
		if want := stored[len(stored)-1-i].ID; id != want {
			t.Fatalf("event %d is %s, want %s", i, id, want)
		}
	}
	mu.Unlock()

	blocking.Store(true)
	if err := testrelay.Publish(ctx, r.URL, k.Note("live")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("live event not delivered")
	}
	closed := make(chan struct{})
	go func() {
		sub.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a handler call was in progress")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close did not return after the handler did")
	}
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	blocking.Store(false)
	if err := testrelay.Publish(ctx, r.URL, k.Note("after close")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("%d events delivered after Close", len(seen)-n)
	}
}
