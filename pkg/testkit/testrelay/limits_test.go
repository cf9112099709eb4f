package testrelay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// rawWS is a plain websocket client for the limit tests: they need what
// the relay did to the connection (close status, or none), which the
// nostr-level Conn hides.
type rawWS struct {
	t *testing.T
	c *websocket.Conn
}

func dialRaw(t *testing.T, ctx context.Context, url string) *rawWS {
	t.Helper()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(-1)
	t.Cleanup(func() { _ = c.CloseNow() })
	return &rawWS{t: t, c: c}
}

func (w *rawWS) send(ctx context.Context, v ...any) {
	w.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
		w.t.Fatalf("write %.60s: %v", b, err)
	}
}

// next reads one message (its label and the raw JSON array).
func (w *rawWS) next(ctx context.Context) ([]any, error) {
	_, b, err := w.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	var arr []any
	if err := json.Unmarshal(b, &arr); err != nil {
		return nil, fmt.Errorf("not a JSON array: %.80s", b)
	}
	return arr, nil
}

// until reads until a message whose label and second element match (events
// and anything else are skipped), failing on a read error.
func (w *rawWS) until(ctx context.Context, label, second string) []any {
	w.t.Helper()
	for {
		arr, err := w.next(ctx)
		if err != nil {
			w.t.Fatalf("waiting for %s %s: %v", label, second, err)
		}
		if len(arr) >= 2 && arr[0] == label && arr[1] == second {
			return arr
		}
	}
}

// answers reads the messages that answer a burst, up to and including the
// EOSE of sentinel (a REQ sent last, whose answer marks that the relay has
// handled everything before it), skipping EVENTs.
func (w *rawWS) answers(ctx context.Context, sentinel string) []string {
	w.t.Helper()
	var out []string
	for {
		arr, err := w.next(ctx)
		if err != nil {
			w.t.Fatalf("waiting for EOSE %s (after %q): %v", sentinel, out, err)
		}
		if arr[0] == "EVENT" {
			continue
		}
		b, _ := json.Marshal(arr)
		out = append(out, string(b))
		if arr[0] == "EOSE" && len(arr) > 1 && arr[1] == sentinel {
			return out
		}
	}
}

func reqFilter() nostr.Filter { return nostr.Filter{Kinds: []int{1}, Limit: 1} }

// padFilter is a filter whose JSON makes a REQ of about n bytes.
func padFilter(n int) nostr.Filter {
	return nostr.Filter{Kinds: []int{1}, Search: strings.Repeat("x", max(0, n-60))}
}

// TestLimitsMessageSize: a message at the limit is served; one byte over,
// each style ends the connection as its software does: strfry drops it
// with no close frame and no notice, nostr-rs-relay sends its notice first,
// the closed style sends close status 1009.
func TestLimitsMessageSize(t *testing.T) {
	const limit = 4096
	for _, style := range []testrelay.LimitStyle{testrelay.StyleStrfry, testrelay.StyleNostrRsRelay, testrelay.StyleClosed} {
		t.Run(string(style), func(t *testing.T) {
			ctx := timeout(t)
			r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxMessageBytes: limit, Style: style}})
			w := dialRaw(t, ctx, r.URL)

			// Exactly at the limit: served.
			f := padFilter(limit)
			b, _ := json.Marshal([]any{"REQ", "fits", f})
			for len(b) < limit {
				f.Search += "x"
				b, _ = json.Marshal([]any{"REQ", "fits", f})
			}
			for len(b) > limit {
				f.Search = f.Search[1:]
				b, _ = json.Marshal([]any{"REQ", "fits", f})
			}
			if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
				t.Fatal(err)
			}
			w.until(ctx, "EOSE", "fits")

			// One byte over.
			f.Search += "x"
			w.send(ctx, "REQ", "over", f)
			var notices []string
			var err error
			for {
				var arr []any
				arr, err = w.next(ctx)
				if err != nil {
					break
				}
				if arr[0] == "NOTICE" {
					notices = append(notices, arr[1].(string))
				} else if arr[0] == "EOSE" {
					t.Fatalf("an oversized REQ was served: %v", arr)
				}
			}
			status := websocket.CloseStatus(err)
			var wantNotices []string
			wantStatus := websocket.StatusCode(-1) // no close frame
			switch style {
			case testrelay.StyleNostrRsRelay:
				wantNotices = []string{fmt.Sprintf("message too large (%d > %d)", limit+1, limit)}
			case testrelay.StyleClosed:
				wantStatus = testrelay.CloseMessageTooBig
			}
			if status != wantStatus || strings.Join(notices, "|") != strings.Join(wantNotices, "|") {
				t.Errorf("over the limit: close status %d, notices %q (read error %v); want status %d, notices %q", status, notices, err, wantStatus, wantNotices)
			}
			if c := r.LimitCounts(); c.TooBig != 1 || c.LargestMessage != limit+1 {
				t.Errorf("counts %+v; want 1 refused too big, largest message %d", c, limit+1)
			}
		})
	}
}

// TestLimitsSubscriptions: with room for 3 subscriptions, a fourth REQ is
// refused in the style's way and never served; a REQ reusing an open id
// replaces it; a CLOSE frees a slot, and so does a CLOSED the relay sent.
func TestLimitsSubscriptions(t *testing.T) {
	for _, style := range []testrelay.LimitStyle{testrelay.StyleStrfry, testrelay.StyleNostrRsRelay, testrelay.StyleClosed} {
		t.Run(string(style), func(t *testing.T) {
			ctx := timeout(t)
			r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 3, Style: style}})
			w := dialRaw(t, ctx, r.URL)
			// khatru serves a connection's messages concurrently: wait for
			// each answer before the next message, so the order is known.
			for _, id := range []string{"a", "b", "c"} {
				w.send(ctx, "REQ", id, reqFilter())
				w.until(ctx, "EOSE", id)
			}
			w.send(ctx, "REQ", "d", reqFilter())
			w.send(ctx, "REQ", "b", reqFilter()) // replaces b: still 3 open
			got := w.answers(ctx, "b")
			var want string
			switch style {
			case testrelay.StyleStrfry:
				want = `["NOTICE","ERROR: too many concurrent REQs"]`
			case testrelay.StyleNostrRsRelay:
				want = `["NOTICE","Subscription error: Maximum concurrent subscription count reached"]`
			case testrelay.StyleClosed:
				want = `["CLOSED","d","error: too many concurrent REQs"]`
			}
			if len(got) != 2 || got[0] != want {
				t.Fatalf("answers to REQ d (over) then REQ b (reused id): %q; want %s then b's EOSE", got, want)
			}

			w.send(ctx, "CLOSE", "a")
			w.send(ctx, "REQ", "e", reqFilter())
			if got := w.answers(ctx, "e"); len(got) != 1 {
				t.Errorf("after CLOSE a, REQ e answered %q; want its EOSE only", got)
			}
			if c := r.LimitCounts(); c.REQsRefused != 1 || c.MaxOpenSubs != 3 {
				t.Errorf("counts %+v; want 1 REQ refused, at most 3 open", c)
			}
		})
	}
}

// TestLimitsSubscriptionsFreedByClosed: a subscription the relay itself
// ended with CLOSED (here a filter khatru refuses) does not hold a slot.
func TestLimitsSubscriptionsFreedByClosed(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxSubscriptions: 1}})
	r.Khatru.RejectFilter = append(r.Khatru.RejectFilter, func(_ context.Context, f nostr.Filter) (bool, string) {
		return len(f.Kinds) == 1 && f.Kinds[0] == 7, "blocked: no reactions"
	})
	w := dialRaw(t, ctx, r.URL)
	for i := range 3 {
		id := fmt.Sprint("r", i)
		w.send(ctx, "REQ", id, nostr.Filter{Kinds: []int{7}})
		w.until(ctx, "CLOSED", id)
	}
	w.send(ctx, "REQ", "ok", reqFilter())
	if got := w.answers(ctx, "ok"); len(got) != 1 {
		t.Errorf("REQ after 3 refused ones answered %q; want its EOSE only", got)
	}
}

// TestLimitsNegentropySessions: NIP-77 sessions have their own pool of the
// subscription limit's size, as in strfry: with 2, two REQs and two
// sessions are open together, a third session gets strfry's NEG notice
// and no answer, and a NEG-CLOSE frees its slot.
func TestLimitsNegentropySessions(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{Negentropy: true, Limits: testrelay.Limits{MaxSubscriptions: 2}})
	k := testkit.NewKey()
	r.Add(t, k.Announcement("repo", nil, nil, nil))
	w := dialRaw(t, ctx, r.URL)
	for _, id := range []string{"q1", "q2"} {
		w.send(ctx, "REQ", id, reqFilter())
		w.until(ctx, "EOSE", id)
	}
	negOpen := func(id string) {
		w.send(ctx, "NEG-OPEN", id, nostr.Filter{Kinds: []int{30617}}, "6100000200")
	}
	for _, id := range []string{"n1", "n2"} {
		negOpen(id)
		w.until(ctx, "NEG-MSG", id)
	}
	negOpen("n3")
	w.send(ctx, "REQ", "q1", reqFilter()) // a reused id: answered, marks the end
	got := w.answers(ctx, "q1")
	if len(got) != 2 || got[0] != `["NOTICE","ERROR: too many concurrent NEG requests"]` {
		t.Fatalf("answers to NEG-OPEN n3 (over): %q; want strfry's NEG notice, then q1's EOSE", got)
	}
	w.send(ctx, "NEG-CLOSE", "n1")
	negOpen("n4")
	w.until(ctx, "NEG-MSG", "n4")
	if c := r.LimitCounts(); c.NegsRefused != 1 || c.REQsRefused != 0 || c.MaxOpenNegs != 2 || c.MaxOpenSubs != 2 {
		t.Errorf("counts %+v; want 1 session refused, no REQ, 2 of each open at most", c)
	}
}

// TestLimitsFilters: a REQ with more filters than the limit is closed with
// strfry's reason (or the closed style's) and holds no slot; one at the
// limit is served.
func TestLimitsFilters(t *testing.T) {
	for _, style := range []testrelay.LimitStyle{testrelay.StyleStrfry, testrelay.StyleClosed} {
		t.Run(string(style), func(t *testing.T) {
			ctx := timeout(t)
			r := testrelay.Start(t, testrelay.Options{Limits: testrelay.Limits{MaxFilters: 2, MaxSubscriptions: 1, Style: style}})
			w := dialRaw(t, ctx, r.URL)
			w.send(ctx, "REQ", "three", reqFilter(), reqFilter(), reqFilter())
			arr := w.until(ctx, "CLOSED", "three")
			want := testrelay.StrfryTooManyFilters
			if style == testrelay.StyleClosed {
				want = testrelay.ClosedTooManyFilters
			}
			if arr[2] != want {
				t.Errorf("CLOSED reason %q; want %q", arr[2], want)
			}
			w.send(ctx, "REQ", "two", reqFilter(), reqFilter())
			if got := w.answers(ctx, "two"); len(got) != 1 {
				t.Errorf("REQ with 2 filters answered %q; want its EOSE only", got)
			}
			if c := r.LimitCounts(); c.FiltersRefused != 1 || c.REQsRefused != 0 || c.MostFilters != 3 {
				t.Errorf("counts %+v; want 1 REQ refused for its filters, none for subscriptions, 3 filters at most", c)
			}
		})
	}
}

// nip11 fetches the relay's NIP-11 document as a map.
func nip11(t *testing.T, httpURL string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, httpURL, nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatalf("NIP-11 of %s: %v", httpURL, err)
	}
	return doc
}

// TestLimitsNIP11: an advertising relay's NIP-11 carries strfry's three
// limitation fields and nothing else there; a silent one has no
// limitation at all.
func TestLimitsNIP11(t *testing.T) {
	lim := testrelay.Limits{MaxMessageBytes: 131072, MaxSubscriptions: 20, MaxFilters: 20}
	silent := testrelay.Start(t, testrelay.Options{Limits: lim})
	lim.Advertise = true
	says := testrelay.Start(t, testrelay.Options{Limits: lim, MaxLimit: 500})

	if doc := nip11(t, silent.HTTPURL); doc["limitation"] != nil || doc["name"] == nil {
		t.Errorf("silent relay's NIP-11: %v; want a document without limitation", doc)
	}
	doc := nip11(t, says.HTTPURL)
	got, _ := json.Marshal(doc["limitation"])
	if string(got) != `{"max_limit":500,"max_message_length":131072,"max_subscriptions":20}` || doc["name"] == nil {
		t.Errorf("advertising relay's NIP-11 limitation: %s (document %v)", got, doc)
	}
	// The websocket still works behind the NIP-11 handler.
	ctx := timeout(t)
	w := dialRaw(t, ctx, says.URL)
	w.send(ctx, "REQ", "s", reqFilter())
	w.until(ctx, "EOSE", "s")
}

// TestFarmLimits: a farm's limits, NIP-11 halves and auth-on-read relays,
// and the refusals in its stats.
func TestFarmLimits(t *testing.T) {
	f, err := testrelay.StartFarm(testrelay.FarmOptions{
		Relays: 4, NegentropyFraction: 0.5, AdvertiseFraction: 0.5, AuthReadsFraction: 0.25,
		Limits: testrelay.Limits{MaxMessageBytes: 2048, MaxSubscriptions: 2, MaxFilters: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	ctx := timeout(t)

	var advertised []int
	for i, r := range f.Relays {
		doc := nip11(t, strings.Replace(r.URL, "ws://", "http://", 1))
		if doc["limitation"] != nil {
			advertised = append(advertised, i)
		}
	}
	if fmt.Sprint(advertised) != "[0 2]" {
		t.Errorf("relays advertising limits: %v; want [0 2] (half, not those with NIP-77)", advertised)
	}

	// Relay 3 refuses reads until the client authenticates.
	w := dialRaw(t, ctx, f.Relays[3].URL)
	w.send(ctx, "REQ", "x", reqFilter())
	if arr := w.until(ctx, "CLOSED", "x"); arr[2] != testrelay.AuthReadsReason {
		t.Errorf("auth relay closed the REQ with %q; want %q", arr[2], testrelay.AuthReadsReason)
	}

	// Relay 1: one of each refusal.
	w = dialRaw(t, ctx, f.Relays[1].URL)
	w.send(ctx, "REQ", "f", reqFilter(), reqFilter(), reqFilter())
	w.until(ctx, "CLOSED", "f")
	for _, id := range []string{"a", "b"} {
		w.send(ctx, "REQ", id, reqFilter())
		w.until(ctx, "EOSE", id)
	}
	w.send(ctx, "REQ", "c", reqFilter())
	w.until(ctx, "NOTICE", testrelay.StrfryTooManyREQs)
	w.send(ctx, "REQ", "big", padFilter(3000))
	if _, err := w.next(ctx); websocket.CloseStatus(err) != -1 || err == nil {
		t.Errorf("oversized REQ: read error %v; want the connection dropped without a close frame", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := f.Stats()
		s3, s1 := st[3], st[1]
		ok := s3.AuthRefused == 1 && s3.AuthReads && !s3.Advertised && !st[0].AuthReads &&
			s1.FiltersRefused == 1 && s1.REQsRefused == 1 && s1.TooBig == 1 && s1.MaxOpenSubs == 2 && !s1.AuthReads && !s1.Advertised &&
			s1.Limits.MaxSubscriptions == 2
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats: relay 3 %+v\nrelay 1 %+v", s3, s1)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
