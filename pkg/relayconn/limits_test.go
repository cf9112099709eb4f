package relayconn_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// A subscription over strfry's count gets a NOTICE naming none, and is
// never answered: the connection sends every unanswered REQ again once the
// gate, lowered to what was open less one, has a slot for it (the caller
// sees only a later EOSE). A relay that says CLOSED names the refused one:
// it is closed with that reason. Either way OnLimit is told, and the next
// REQ waits for a free slot instead of being refused again.
func TestSubscriptionRefusal(t *testing.T) {
	for _, style := range []testrelay.LimitStyle{testrelay.StyleStrfry, testrelay.StyleNostrRsRelay, testrelay.StyleClosed} {
		t.Run(string(style), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 2, Style: style}})
			var mu sync.Mutex
			var limits []relaylimits.Refusal
			var opens []int
			c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{OnLimit: func(kind relaylimits.Refusal, _ string, open, _, _ int) {
				mu.Lock()
				defer mu.Unlock()
				limits, opens = append(limits, kind), append(opens, open)
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// No budget known: the third is sent and refused.
			var subs []*relayconn.Subscription
			for i := range 3 {
				s, err := c.SubscribeLive(ctx, nostr.Filters{{Kinds: []int{1000 + i}, Limit: 0, LimitZero: true}}, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if i < 2 {
					select {
					case <-s.EOSE():
					case <-ctx.Done():
						t.Fatalf("no EOSE for subscription %d", i)
					}
				}
				subs = append(subs, s)
			}
			if style == testrelay.StyleClosed {
				select {
				case reason := <-subs[2].Closed():
					if relaylimits.Classify(reason) != relaylimits.TooManySubscriptions {
						t.Fatalf("third subscription closed with %q", reason)
					}
				case <-ctx.Done():
					t.Fatal("the refused subscription was left waiting")
				}
			} else {
				// Resent, and registered once a slot frees.
				select {
				case <-subs[2].EOSE():
					t.Fatal("EOSE for a subscription the relay refused")
				case <-time.After(300 * time.Millisecond):
				}
				subs[0].Close()
				select {
				case <-subs[2].EOSE():
				case reason := <-subs[2].Closed():
					t.Fatalf("closed: %s", reason)
				case <-ctx.Done():
					t.Fatal("the refused subscription was not sent again")
				}
				subs = append(subs[1:2], subs[2])
			}
			mu.Lock()
			if len(limits) != 1 || limits[0] != relaylimits.TooManySubscriptions || opens[0] != 3 {
				t.Fatalf("OnLimit told %v with open %v", limits, opens)
			}
			mu.Unlock()
			// The gate now holds two: a page waits for a slot, and goes
			// once one is closed, without a second refusal.
			got := make(chan error, 1)
			go func() {
				s, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}}})
				if err == nil {
					select {
					case <-s.EOSE():
					case reason := <-s.Closed():
						err = errors.New("closed: " + reason)
					case <-ctx.Done():
						err = ctx.Err()
					}
				}
				got <- err
			}()
			select {
			case err := <-got:
				t.Fatalf("the page went out over the learned budget (%v)", err)
			case <-time.After(300 * time.Millisecond):
			}
			subs[0].Close()
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			if n := r.LimitCounts().REQsRefused; n != 1 {
				t.Fatalf("relay refused %d REQs, want only the first over its count", n)
			}
		})
	}
}

// With the budget known, live subscriptions leave the reserved slots to
// reads that end, and no REQ is ever refused.
func TestGateKeepsToTheBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 4}})
	k := testkit.NewKey()
	for i := range 30 {
		r.Add(t, k.Note("n", testkit.At(nostr.Timestamp(1000+i))))
	}
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetLimits(0, 4, 1)
	// Five live REQs want to open: three can (4 − 1 reserved).
	waited := make(chan struct{}, 5)
	for i := range 5 {
		go func() {
			_, _ = c.SubscribeLive(ctx, nostr.Filters{{Kinds: []int{2000 + i}, Limit: 0, LimitZero: true}}, func() { waited <- struct{}{} }, nil)
		}()
	}
	for range 2 {
		select {
		case <-waited:
		case <-ctx.Done():
			t.Fatal("no live REQ waited for a slot")
		}
	}
	// Twenty pages all get through the one reserved slot.
	for i := range 20 {
		s, err := c.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}, Limit: 5}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.EOSE():
		case reason := <-s.Closed():
			t.Fatalf("page %d closed: %s", i, reason)
		case <-ctx.Done():
			t.Fatalf("page %d: no EOSE", i)
		}
		s.Close()
	}
	if c := r.LimitCounts(); c.REQsRefused != 0 || c.MaxOpenSubs > 4 {
		t.Fatalf("relay counts %+v", c)
	}
}

// A message over the budget is not sent.
func TestMessageOverBudgetNotSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxMessageBytes: 4096}})
	c, err := relayconn.Dial(ctx, r.URL, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetLimits(4096, 0, 0)
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = strings.Repeat("a", 63) + string(rune('0'+i%10))
	}
	_, err = c.Subscribe(ctx, nostr.Filters{{IDs: ids}})
	var tl *relayconn.TooLargeError
	if !errors.As(err, &tl) || tl.Limit != 4096 {
		t.Fatalf("Subscribe = %v, want a TooLargeError", err)
	}
	if c.Context().Err() != nil || r.LimitCounts().TooBig != 0 {
		t.Fatal("the connection ended: the message was sent")
	}
}

// The NIP-11 document is read through the dial guard, like the websocket.
func TestFetchInfo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxMessageBytes: 131072, MaxSubscriptions: 20, Advertise: true}})
	doc, err := relayconn.FetchInfo(ctx, r.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, software, err := relaylimits.ParseNIP11(doc)
	if err != nil || l.MaxMessageBytes != 131072 || l.MaxSubscriptions != 20 {
		t.Fatalf("limits %+v, %v from %s", l, err, doc)
	}
	// khatru's own document names it, and khatru caps each filter apart.
	if !relaylimits.CapsEachFilter(software) {
		t.Fatalf("software %q of khatru's NIP-11 not known to cap each filter apart", software)
	}
	refused := errors.New("internal address")
	if _, err := relayconn.FetchInfo(ctx, r.URL, func(_, _ string) error { return refused }); err == nil || !strings.Contains(err.Error(), "internal address") {
		t.Fatalf("FetchInfo past the guard: %v", err)
	}
}
