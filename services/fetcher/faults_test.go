package fetcher_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/faultrelay"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func disconnected(session string) func(*graspv1.FetchReport) bool {
	return func(r *graspv1.FetchReport) bool { return r.GetDisconnected() != nil && r.GetSessionId() == session }
}

// reconnect moves the fake clock through the backoff until a new session
// is reported, and returns it.
func (e *env) reconnect(url string, old ...string) string {
	e.t.Helper()
	var s string
	e.advanceUntil("reconnect", time.Second, func() bool {
		rs := e.reportsMatching(url, func(r *graspv1.FetchReport) bool {
			if r.GetConnected() == nil {
				return false
			}
			for _, o := range old {
				if r.GetSessionId() == o {
					return false
				}
			}
			return true
		})
		if len(rs) > 0 {
			s = rs[0].GetSessionId()
		}
		return s != ""
	})
	return s
}

// A connection dropped in the middle of a batch is reported (with its
// class), the relay is reconnected after the backoff with a new session,
// and the batch redone on it delivers everything; the dead session's batch
// is never reported done.
func TestDropAfterEvents(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	evts := notes(testkit.NewKey(), 60, 1, 1000)
	r.Add(t, evts...)
	r.Set(faultrelay.Faults{DropAfterEvents: 20})
	e.start(baseConfig("a"), nil)
	s1 := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s1, "b1", kind1, nil)
	d := e.report(r.URL, disconnected(s1)).GetDisconnected()
	if d.GetFailureClass() != "closed" {
		t.Fatalf("disconnect class %q (%s)", d.GetFailureClass(), d.GetReason())
	}
	h := e.report(r.URL, func(r *graspv1.FetchReport) bool { return r.GetHealth() != nil }).GetHealth()
	if h.GetState() != graspv1.HealthState_HEALTH_STATE_BACKING_OFF || h.GetConsecutiveFailures() != 1 ||
		h.GetNextAttempt() != e.clock.Now().Add(5*time.Second).UnixMilli() {
		t.Fatalf("health %v", h)
	}
	r.Set(faultrelay.Faults{})
	s2 := e.reconnect(r.URL, s1)
	e.addFilters(0, r.URL, s2, "b2", kind1, nil)
	if done := e.batchDone(r.URL, "b2"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch %v", done)
	}
	e.waitEvents(evts)
	if n := len(e.reportsMatching(r.URL, func(r *graspv1.FetchReport) bool { return r.GetBatchDone().GetBatchId() == "b1" })); n != 0 {
		t.Fatal("the dead session's batch was reported")
	}
}

// Same for a connection dropped during the NIP-77 exchange.
func TestDropMidNegentropy(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{Negentropy: true})
	evts := notes(testkit.NewKey(), 100, 2, 1000)
	r.Add(t, evts...)
	r.Set(faultrelay.Faults{DropMidNegentropy: true})
	// One event held: with an empty local set NIP-77 is not tried.
	e.start(baseConfig("a"), localStore(t, evts[:1]))
	s1 := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s1, "b1", kind1, nil)
	e.report(r.URL, disconnected(s1))
	r.Set(faultrelay.Faults{})
	s2 := e.reconnect(r.URL, s1)
	e.addFilters(0, r.URL, s2, "b2", kind1, nil)
	if done := e.batchDone(r.URL, "b2"); done.GetMethod() != graspv1.SyncMethod_SYNC_METHOD_NEGENTROPY {
		t.Fatalf("batch %v", done)
	}
	e.waitEvents(evts[1:])
}

// A relay that stops answering (pings included) without closing is
// declared dead by the keepalive and reported with class timeout.
func TestStalledConnectionDeclaredDead(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	r.Add(t, notes(testkit.NewKey(), 30, 1, 1000)...)
	r.Set(faultrelay.Faults{StallAfterEvents: 5})
	cfg := baseConfig("a")
	cfg.PingInterval, cfg.PongTimeout = 100*time.Millisecond, 300*time.Millisecond
	e.start(cfg, nil)
	s1 := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s1, "b1", kind1, nil)
	d := e.report(r.URL, disconnected(s1)).GetDisconnected()
	if d.GetFailureClass() != "timeout" || !strings.Contains(d.GetReason(), "pings") {
		t.Fatalf("disconnect %v", d)
	}
}

// A message over the size limit ends the connection (websocket cannot skip
// it), reported with class protocol; the fetcher reconnects.
func TestOversizedMessage(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	r.Add(t, notes(testkit.NewKey(), 3, 1, 1000)...)
	r.Set(faultrelay.Faults{Inject: func(sub string) [][]byte { return [][]byte{faultrelay.Oversized(sub, 200_000)} }})
	cfg := baseConfig("a")
	cfg.MaxMessageBytes = 100_000
	e.start(cfg, nil)
	s1 := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s1, "b1", kind1, nil)
	d := e.report(r.URL, disconnected(s1)).GetDisconnected()
	if d.GetFailureClass() != "protocol" {
		t.Fatalf("disconnect %v", d)
	}
	r.Set(faultrelay.Faults{})
	e.reconnect(r.URL, s1)
}

// Malformed JSON, events with a wrong id and events with a bad signature
// do not hurt the connection; wrong ids are dropped (counted), bad
// signatures go on to the ingester, whose job the signature is.
func TestMalformedAndBadEvents(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	good := notes(k, 5, 1, 1000)
	r.Add(t, good...)
	badID := *k.Note("bad id", testkit.At(1100))
	badID.Content = "tampered" // id no longer matches
	badSig := *k.Note("bad sig", testkit.At(1101))
	badSig.Sig = strings.Repeat("ab", 64)
	wrongShape, _ := json.Marshal([]any{"EVENT", "x", map[string]any{"id": 5}})
	r.Set(faultrelay.Faults{Inject: func(sub string) [][]byte {
		return [][]byte{
			[]byte(`["EVENT", "` + sub + `", {not json`),
			[]byte(`{"an":"object"}`),
			wrongShape,
			faultrelay.RawEvent(sub, &badID),
			faultrelay.RawEvent(sub, &badSig),
		}
	}})
	f := e.start(baseConfig("a"), nil)
	s := e.connectRelay(r.URL)
	e.addFilters(0, r.URL, s, "b1", kind1, nil)
	done := e.batchDone(r.URL, "b1")
	if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
		t.Fatalf("batch %v", done)
	}
	e.waitEvents(append(good, &badSig))
	if e.has(badID.ID) {
		t.Fatal("event with a wrong id published")
	}
	// The relay injects the bad events into every REQ: one drop per page.
	if got := metric(t, f.reg, "grasp_fetcher_events_dropped_total", map[string]string{"reason": "bad_id"}); got != float64(done.GetPages()) {
		t.Fatalf("bad_id drops = %v in %d pages", got, done.GetPages())
	}
	if n := len(e.reportsMatching(r.URL, disconnected(s))); n != 0 {
		t.Fatal("bad input ended the connection")
	}
}

// A relay whose first connections fail (HTTP 503 on upgrade) is retried on
// the backoff schedule, 5 s then 10 s, with the class in the report.
func TestFirstConnectFailureRetried(t *testing.T) {
	e := newEnv(t)
	r := faultrelay.Start(t, testrelay.Options{})
	r.Set(faultrelay.Faults{RejectConnections: 2})
	f := e.start(baseConfig("a"), nil)
	e.ensure(r.URL)
	health := func(n uint32) *graspv1.Health {
		return e.report(r.URL, func(r *graspv1.FetchReport) bool { return r.GetHealth().GetConsecutiveFailures() == n }).GetHealth()
	}
	h1 := health(1)
	if h1.GetFailureClass() != "http_status" || h1.GetNextAttempt() != e.clock.Now().Add(5*time.Second).UnixMilli() {
		t.Fatalf("first failure %v", h1)
	}
	e.clock.Advance(5 * time.Second)
	h2 := health(2)
	if h2.GetNextAttempt() != e.clock.Now().Add(10*time.Second).UnixMilli() {
		t.Fatalf("second failure %v", h2)
	}
	e.clock.Advance(10 * time.Second)
	e.connected(r.URL)
	if got := metric(t, f.reg, "grasp_fetcher_connect_attempts_total", map[string]string{"relay": r.URL, "result": "http_status"}); got != 2 {
		t.Fatalf("failed attempts metric %v", got)
	}
}

// NIP-42: with a service key the fetcher answers the challenge and gets
// the events; without one the batch fails with the relay's reason.
func TestAuth(t *testing.T) {
	evts := notes(testkit.NewKey(), 10, 1, 1000)
	t.Run("with key", func(t *testing.T) {
		e := newEnv(t)
		r := faultrelay.Start(t, testrelay.Options{})
		r.Add(t, evts...)
		r.Set(faultrelay.Faults{RequireAuth: true})
		key := testkit.NewKey()
		cfg := baseConfig("a")
		cfg.AuthKey = key.Secret
		e.start(cfg, nil)
		s := e.connectRelay(r.URL)
		e.addFilters(0, r.URL, s, "b1", kind1, nil)
		if done := e.batchDone(r.URL, "b1"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
			t.Fatalf("batch %v", done)
		}
		e.waitEvents(evts)
		if a := r.Authed(); len(a) != 1 || a[0] != key.PubKey {
			t.Fatalf("authenticated as %v", a)
		}
	})
	t.Run("without key", func(t *testing.T) {
		e := newEnv(t)
		r := faultrelay.Start(t, testrelay.Options{})
		r.Add(t, evts...)
		r.Set(faultrelay.Faults{RequireAuth: true})
		e.start(baseConfig("a"), nil)
		s := e.connectRelay(r.URL)
		e.addFilters(0, r.URL, s, "b1", kind1, nil)
		// A read the relay will not serve us is remembered for the relay
		// and the filter's kind and asked again a day later: the batch is
		// not failed (which would bring it back every few minutes), and a
		// later batch of the same kind sends no REQ for it.
		done := e.batchDone(r.URL, "b1")
		if done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
			t.Fatalf("batch %v", done)
		}
		reqs := r.REQs()
		e.addFilters(0, r.URL, s, "b2", kind1, nil)
		if done := e.batchDone(r.URL, "b2"); done.GetOutcome() != graspv1.BatchOutcome_BATCH_OUTCOME_OK {
			t.Fatalf("second batch %v", done)
		}
		if r.REQs() != reqs {
			t.Fatalf("the refused read was asked again at once: %d REQs, then %d", reqs, r.REQs())
		}
		rec := e.relayLimits(r.URL)
		if len(rec.GetRefusals()) != 1 || !strings.HasPrefix(rec.GetRefusals()[0].GetReason(), "auth-required:") ||
			rec.GetRefusals()[0].GetFilterKind() != "other" {
			t.Fatalf("refusals kept %v", rec.GetRefusals())
		}
		// A day later it is asked again.
		e.clock.Advance(24*time.Hour + time.Second)
		e.addFilters(0, r.URL, s, "b3", kind1, nil)
		e.batchDone(r.URL, "b3")
		if r.REQs() == reqs {
			t.Fatal("the refused read was not asked again after a day")
		}
	})
}

var _ = nostr.Filter{}
