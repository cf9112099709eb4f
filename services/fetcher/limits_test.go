package fetcher_test

import (
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/filters"
	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// liveSets opens n live sets of one filter each on the relay (each its own
// REQ), named l0, l1, …
func (e *env) liveSets(url, session string, n int) {
	for i := range n {
		e.send(0, &graspv1.FetchCommand{RelayUrl: url, SessionId: session, Command: &graspv1.FetchCommand_AddFilters{AddFilters: &graspv1.AddFilters{
			LiveId: "l" + string(rune('0'+i)), LiveFilters: filters.ToProtos([]nostr.Filter{{Kinds: []int{20000 + i}}})}}})
	}
}

// A subscription limit learned from a silent relay's refusal is kept for
// the relay: a restarted fetcher starts from it and is refused nothing, and
// the Connected report tells the planner the live budget it allows.
func TestLearnedLimitOutlivesRestart(t *testing.T) {
	e := newEnv(t)
	r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 3, Style: testrelay.StyleStrfry}})
	cfg := baseConfig("a")
	a := e.start(cfg, nil)
	s := e.connectRelay(r.URL)
	if b := e.connected(r.URL).GetConnected().GetLiveFilterBudget(); b != 18*9 {
		t.Fatalf("live filter budget %d on a silent relay, want the defaults' 18 REQs × 9 filters", b)
	}
	e.liveSets(r.URL, s, 4)
	e.waitFor("the refusal learned", func() bool { return r.LimitCounts().REQsRefused >= 1 })
	rec := e.relayLimits(r.URL)
	if got := rec.GetLearned().GetMaxSubscriptions(); got != 3 {
		t.Fatalf("learned %d subscriptions, want 3 (%v)", got, rec)
	}
	if n := r.LimitCounts().MaxOpenSubs; n > 3 {
		t.Fatalf("the relay saw %d open", n)
	}
	a.stop()
	refused := r.LimitCounts().REQsRefused

	e.start(baseConfig("b"), nil)
	rep := e.connected(r.URL, s)
	s = rep.GetSessionId()
	if b := rep.GetConnected().GetLiveFilterBudget(); b != 2*9 {
		t.Fatalf("live filter budget after the restart %d, want 2 REQs × 9 filters", b)
	}
	e.liveSets(r.URL, s, 4)
	// Pages still get their reserved slot while live sets wait.
	e.addFilters(0, r.URL, s, "b1", kind1, nil)
	if d := e.batchDone(r.URL, "b1"); d.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch %v", d)
	}
	if got := r.LimitCounts().REQsRefused; got != refused {
		t.Fatalf("the restarted fetcher was refused %d more REQs", got-refused)
	}
}

// A relay that does not say its subscription limit may have none: a live
// set needing more REQs than the assumed 20 leaves for it is opened past
// them (up to 200), not left waiting for the session (which missed what
// the waiting REQs would have brought until the daily resync). A silent
// relay that does limit refuses the ones over its limit once; its count is
// learned, even where it equals the default, and the probe ends there.
func TestLiveSetPastAnAssumedSubscriptionBudget(t *testing.T) {
	e := newEnv(t)
	unlimited := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 1000}})
	limited := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 20, Style: testrelay.StyleStrfry}})
	e.start(baseConfig("a"), nil)
	for _, r := range []*testrelay.Relay{unlimited, limited} {
		s := e.connectRelay(r.URL)
		e.liveSets(r.URL, s, 25)
	}
	e.waitFor("25 live REQs open on the relay without a limit", func() bool { return unlimited.LimitCounts().MaxOpenSubs >= 25 })
	if c := unlimited.LimitCounts(); c.REQsRefused != 0 {
		t.Fatalf("the relay without a limit counted %d refusals", c.REQsRefused)
	}
	e.waitFor("the limited relay's count learned", func() bool {
		return e.relayLimits(limited.URL).GetLearned().GetMaxSubscriptions() == 20
	})
	refused := limited.LimitCounts().REQsRefused
	time.Sleep(time.Second) // a probe that did not end would keep being refused
	if c := limited.LimitCounts(); c.MaxOpenSubs > 20 || c.REQsRefused != refused {
		t.Fatalf("the limited relay saw %d open and %d refusals after the count was learned (%d before)", c.MaxOpenSubs, c.REQsRefused, refused)
	}
}
