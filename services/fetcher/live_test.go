package fetcher_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/testkit"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// Live subscriptions deliver new events; ReplaceLive closes exactly the old
// set (events matching only the old filters stop coming) and opens the new
// one.
func TestLiveReplace(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	f := e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	k := testkit.NewKey()
	e.addFilters(0, r.URL, s, "", nil, []nostr.Filter{{Kinds: []int{1}}, {Kinds: []int{7}}})
	e.waitFor("live subscription open", func() bool {
		return metric(t, f.reg, "grasp_fetcher_live_subscriptions", map[string]string{"relay": r.URL}) == 1
	})
	n1 := e.publishUntilSeen(r, func(i int) *nostr.Event { return k.Note(fmt.Sprintf("live %d", i)) })
	if e.header(n1.ID).Get("Grasp-Mode") != "live" {
		t.Fatalf("mode %q", e.header(n1.ID).Get("Grasp-Mode"))
	}
	// Counted before the commands: the replacement may open before this
	// goroutine runs again.
	reqs := r.REQs()
	e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL, SessionId: s, Command: &graspv1.FetchCommand_ReplaceLive{
		ReplaceLive: &graspv1.ReplaceLive{LiveFilters: nil}}})
	e.addFilters(0, r.URL, s, "", nil, []nostr.Filter{{Kinds: []int{7}}})
	e.waitFor("replacement open", func() bool { return r.REQs() > reqs })
	e.waitFor("one live subscription", func() bool {
		return metric(t, f.reg, "grasp_fetcher_live_subscriptions", map[string]string{"relay": r.URL}) == 1
	})
	old := k.Note("only the old filter matches")
	if err := testrelay.Publish(e.ctx, r.Relay.URL, old); err != nil {
		t.Fatal(err)
	}
	// Written to our socket before anything published after it.
	e.publishUntilSeen(r, func(i int) *nostr.Event { return k.Sign(&nostr.Event{Kind: 7, Content: fmt.Sprint(i)}) })
	if e.has(old.ID) {
		t.Fatal("an event of the replaced subscription still arrived")
	}
}

// CloseLive closes only the live sets it names, once the set named in
// after_live_id is open: events matching only a closed set stop coming,
// the other named and unnamed sets stay open, and the merged set delivers.
func TestCloseLiveClosesOnlyNamedSets(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	f := e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	k := testkit.NewKey()
	live := func(id string, kinds ...int) {
		fs := make([]nostr.Filter, len(kinds))
		for i, kind := range kinds {
			fs[i] = nostr.Filter{Kinds: []int{kind}}
		}
		e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL, SessionId: s, Command: &graspv1.FetchCommand_AddFilters{
			AddFilters: &graspv1.AddFilters{LiveId: id, LiveFilters: filters.ToProtos(fs)}}})
	}
	subs := func(n float64) func() bool {
		return func() bool {
			return metric(t, f.reg, "grasp_fetcher_live_subscriptions", map[string]string{"relay": r.URL}) == n
		}
	}
	live("", 1)    // unnamed: stays
	live("b1", 7)  // merged away
	live("b2", 6)  // merged away
	live("b3", 30) // named, not closed
	e.waitFor("four live subscriptions", subs(4))
	// The merge: b1 and b2's filters reopened as one set, then the two closed.
	live("m1", 7, 6)
	e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL, SessionId: s, Command: &graspv1.FetchCommand_CloseLive{
		CloseLive: &graspv1.CloseLive{LiveIds: []string{"b1", "b2", "unknown"}, AfterLiveId: "m1"}}})
	e.waitFor("three live subscriptions", subs(3))
	for _, kind := range []int{1, 7, 6, 30} {
		e.publishUntilSeen(r, func(i int) *nostr.Event { return k.Sign(&nostr.Event{Kind: kind, Content: fmt.Sprint(i)}) })
	}
	// Closing the merged set: kind 7 and 6 stop, 1 and 30 go on.
	e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL, SessionId: s, Command: &graspv1.FetchCommand_CloseLive{
		CloseLive: &graspv1.CloseLive{LiveIds: []string{"m1"}}}})
	e.waitFor("two live subscriptions", subs(2))
	gone := []*nostr.Event{k.Sign(&nostr.Event{Kind: 7, Content: "closed"}), k.Sign(&nostr.Event{Kind: 6, Content: "closed"})}
	for _, evt := range gone {
		if err := testrelay.Publish(e.ctx, r.Relay.URL, evt); err != nil {
			t.Fatal(err)
		}
	}
	// Written to our socket before anything published after it.
	e.publishUntilSeen(r, func(i int) *nostr.Event { return k.Sign(&nostr.Event{Kind: 30, Content: fmt.Sprint("after ", i)}) })
	e.publishUntilSeen(r, func(i int) *nostr.Event { return k.Note(fmt.Sprint("after ", i)) })
	for _, evt := range gone {
		if e.has(evt.ID) {
			t.Fatalf("an event of a closed live set (kind %d) still arrived", evt.Kind)
		}
	}
}

// A CLOSED on one live subscription is reported and the subscription is
// reopened after its backoff; the connection is not treated as lost.
func TestLiveClosedReopened(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	r.Set(faultrelay.Faults{RateLimitREQs: 1, RateLimitReason: "error: shutting down subscriptions"})
	e.addFilters(0, r.URL, s, "", nil, kind1)
	sc := e.report(r.URL, func(r *graspv1.FetchReport) bool { return r.GetSubscriptionClosed() != nil }).GetSubscriptionClosed()
	if !sc.GetLive() || sc.GetRetryAt() != e.clock.Now().Add(5*time.Second).UnixMilli() {
		t.Fatalf("subscription closed %v", sc)
	}
	reqs := r.REQs()
	e.advanceUntil("reopen", time.Second, func() bool { return r.REQs() > reqs })
	k := testkit.NewKey()
	e.publishUntilSeen(r, func(i int) *nostr.Event { return k.Note(fmt.Sprintf("after reopen %d", i)) })
	if len(e.reportsMatching(r.URL, disconnected(s))) != 0 {
		t.Fatal("a CLOSED was treated as a disconnect")
	}
}

// CLOSED "rate-limited:" on a history page starts a 65 s cooldown: it is
// reported, the page waits (without blocking another relay's batch), live
// subscriptions stay open, and the batch completes after the cooldown.
func TestRateLimitClosed(t *testing.T) {
	e := newEnv(t)
	limited := faultrelay.Start(t, testrelay.Options{})
	other := faultrelay.Start(t, testrelay.Options{})
	evts := notes(testkit.NewKey(), 20, 1, 1000)
	limited.Add(t, evts...)
	other.Add(t, evts...)
	cfg := baseConfig("a")
	cfg.DisableNegentropy = true
	f := e.start(cfg, nil)
	s := e.connectRelay(limited.URL)
	so := e.connectRelay(other.URL)
	e.addFilters(0, limited.URL, s, "", nil, []nostr.Filter{{Kinds: []int{7}}})
	e.waitFor("live REQ at the relay", func() bool { return limited.REQs() == 1 })
	limited.Set(faultrelay.Faults{RateLimitREQs: 1})
	e.addFilters(0, limited.URL, s, "b1", kind1, nil)
	rl := e.report(limited.URL, func(r *graspv1.FetchReport) bool { return r.GetRateLimited() != nil }).GetRateLimited()
	if rl.GetUntil() != e.clock.Now().Add(65*time.Second).UnixMilli() {
		t.Fatalf("rate limited %v", rl)
	}
	// Another relay is not held up by this one's cooldown.
	e.addFilters(0, other.URL, so, "b-other", kind1, nil)
	if d := e.batchDone(other.URL, "b-other"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("other relay's batch %v", d)
	}
	if len(e.reportsMatching(limited.URL, func(r *graspv1.FetchReport) bool { return r.GetBatchDone() != nil })) != 0 {
		t.Fatalf("batch finished during the cooldown: %v", e.reportsMatching(limited.URL, func(r *graspv1.FetchReport) bool { return r.GetBatchDone() != nil }))
	}
	if metric(t, f.reg, "grasp_fetcher_live_subscriptions", map[string]string{"relay": limited.URL}) != 1 {
		t.Fatal("live subscription dropped by the cooldown")
	}
	e.clock.Advance(65 * time.Second)
	if d := e.batchDone(limited.URL, "b1"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK || d.GetEventsReceived() != 20 {
		t.Fatalf("batch after cooldown %v", d)
	}
	if got := metric(t, f.reg, "grasp_fetcher_rate_limit_cooldowns_total", map[string]string{"relay": limited.URL}); got != 1 {
		t.Fatalf("cooldowns metric %v", got)
	}
}

// A rate-limit NOTICE starts a cooldown too, and is reported.
func TestRateLimitNotice(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	r.Add(t, notes(testkit.NewKey(), 5, 1, 1000)...)
	e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	r.Set(faultrelay.Faults{NoticeOnREQ: "rate-limited: slow down"})
	e.addFilters(0, r.URL, s, "", nil, kind1)
	rl := e.report(r.URL, func(r *graspv1.FetchReport) bool { return r.GetRateLimited() != nil }).GetRateLimited()
	if rl.GetUntil() != e.clock.Now().Add(65*time.Second).UnixMilli() {
		t.Fatalf("rate limited %v", rl)
	}
}

// publishUntilSeen publishes fresh events (over websocket, khatru's own path)
// to the relay behind r until one comes out of the fetcher: a live REQ is
// registered by the relay some time after we send it.
func (e *env) publishUntilSeen(r *faultrelay.Relay, next func(i int) *nostr.Event) *nostr.Event {
	e.t.Helper()
	for i := 0; ; i++ {
		evt := next(i)
		if err := testrelay.Publish(e.ctx, r.Relay.URL, evt); err != nil {
			e.t.Fatal(err)
		}
		for range 20 {
			if e.has(evt.ID) {
				return evt
			}
			time.Sleep(10 * time.Millisecond)
		}
		if e.ctx.Err() != nil {
			e.t.Fatal("live event never delivered")
		}
	}
}

// The bytes sent to the relay are counted by why they were sent: an items
// batch's live set (live_new), a live-only set such as a consolidation's
// merge (live_merge), a ReplaceLive's set (live_replace), history pages,
// and every REQ has a purpose (none counted as plain "req"). Issue 32.
func TestSentBytesByPurpose(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	f := e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	sent := func(purpose string) float64 {
		return metric(t, f.reg, "grasp_fetcher_sent_bytes_total", map[string]string{"purpose": purpose})
	}
	subs := func(n float64) func() bool {
		return func() bool {
			return metric(t, f.reg, "grasp_fetcher_live_subscriptions", map[string]string{"relay": r.URL}) == n
		}
	}
	e.addFilters(0, r.URL, s, "b1", []nostr.Filter{{Kinds: []int{1}}}, []nostr.Filter{{Kinds: []int{1}}})
	e.waitFor("the batch's live set open", subs(1))
	e.batchDone(r.URL, "b1")
	// Its live REQ carried its history (nothing held for it): no history
	// REQ of its own (docs/decisions/0076-history-in-the-live-req.md).
	if sent("live_new") == 0 || sent("history") != 0 || sent("live_merge") != 0 || sent("live_replace") != 0 {
		t.Fatalf("after an items batch: live_new %v, history %v, live_merge %v, live_replace %v bytes", sent("live_new"), sent("history"), sent("live_merge"), sent("live_replace"))
	}
	e.addFilters(0, r.URL, s, "b2", []nostr.Filter{{Kinds: []int{3}}}, nil)
	e.waitFor("a batch without a live set reads its history apart", func() bool { return sent("history") > 0 })
	e.addFilters(0, r.URL, s, "", nil, []nostr.Filter{{Kinds: []int{7}}})
	e.waitFor("the live-only set open", subs(2))
	if sent("live_merge") == 0 || sent("live_replace") != 0 {
		t.Fatalf("after a live-only set: live_merge %v, live_replace %v bytes", sent("live_merge"), sent("live_replace"))
	}
	e.send(0, &graspv1.FetchCommand{RelayUrl: r.URL, SessionId: s, Command: &graspv1.FetchCommand_ReplaceLive{
		ReplaceLive: &graspv1.ReplaceLive{LiveFilters: filters.ToProtos([]nostr.Filter{{Kinds: []int{6}}})}}})
	e.waitFor("the replacement open and the old sets closed", func() bool { return subs(1)() && sent("live_replace") > 0 })
	e.waitFor("the old sets' CLOSEs counted", func() bool { return sent("close") > 0 })
	if n := sent("req"); n != 0 {
		t.Fatalf("%v bytes of REQs sent without a purpose", n)
	}
}
