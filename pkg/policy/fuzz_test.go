package policy_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"

	"github.com/grasp-sync/grasp-sync/pkg/policy"
)

// memLookup is an in-memory Lookup, fast enough for fuzzing. It applies the
// filter semantics of NIP-01 and the filter's Limit.
type memLookup struct{ evts []*nostr.Event }

func (m *memLookup) Query(_ context.Context, f nostr.Filter) ([]*nostr.Event, error) {
	var out []*nostr.Event
	for _, e := range m.evts {
		if f.Matches(e) {
			out = append(out, e)
			if f.Limit > 0 && len(out) >= f.Limit {
				break
			}
		}
	}
	return out, nil
}

// FuzzEvaluate feeds arbitrary JSON through nostr.Event unmarshalling into
// Evaluate: it must never panic and never accept an event whose id or
// signature does not verify.
func FuzzEvaluate(f *testing.F) {
	alice, bob := newUser(f), newUser(f)
	ann := alice.served(f, "repo", 0, bob.pk)
	issue := bob.ev(f, 1621, 0, "bug", nostr.Tag{"a", alice.coord("repo")})
	store := &memLookup{evts: []*nostr.Event{ann, issue}}
	p := &policy.Policy{ServiceURL: service, Store: store, Now: func() time.Time { return t0 }}

	seeds := []*nostr.Event{
		ann, issue,
		alice.served(f, "repo", time.Second, bob.pk),
		bob.announce(f, "repo", 0, "https://github.com/b/repo.git", "wss://relay.damus.io", alice.pk),
		bob.ev(f, 1111, 0, "c", nostr.Tag{"E", issue.ID}, nostr.Tag{"e", issue.ID}, nostr.Tag{"K", "1621"}),
		bob.ev(f, 1, 0, "q", nostr.Tag{"q", alice.coord("repo")}),
		bob.ev(f, 1, 0, "orphan"),
		bob.ev(f, 30618, 0, "", nostr.Tag{"d", "repo"}, nostr.Tag{"HEAD", "ref: refs/heads/main"}),
		bob.ev(f, 5, 0, "", nostr.Tag{"e", issue.ID}, nostr.Tag{"a", alice.coord("repo")}),
		bob.ev(f, 10317, 0, "", nostr.Tag{"g", service}),
		bob.ev(f, 1621, 0, "", nostr.Tag{"expiration", "1"}),
	}
	for _, s := range seeds {
		b, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"kind":-1,"created_at":-5,"tags":[[],["e"],["a","30617:x:"],["q",""]]}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		var evt nostr.Event
		if err := json.Unmarshal(data, &evt); err != nil {
			return
		}
		d := p.Evaluate(context.Background(), &evt)
		if !d.Accept {
			if d.Reason == policy.ReasonAccepted || d.Message == "" {
				t.Fatalf("refusal without reason or message: %+v", d)
			}
			return
		}
		if !evt.CheckID() {
			t.Fatalf("accepted an event with a bad id: %s", evt.String())
		}
		if ok, err := evt.CheckSignature(); !ok || err != nil {
			t.Fatalf("accepted an event with a bad signature: %s", evt.String())
		}
	})
}

// FuzzEvaluateSigned signs arbitrary kinds, tags and timestamps with a valid
// key, so that the rules past the integrity checks (reference parsing,
// maintainer sets, deletions) see hostile but authentic events. Evaluate must
// not panic, and every decision must be well-formed.
func FuzzEvaluateSigned(f *testing.F) {
	alice, bob := newUser(f), newUser(f)
	ann := alice.served(f, "repo", 0, bob.pk)
	issue := bob.ev(f, 1621, 0, "bug", nostr.Tag{"a", alice.coord("repo")})
	store := &memLookup{evts: []*nostr.Event{ann, issue}}
	p := &policy.Policy{ServiceURL: service, Store: store, Now: func() time.Time { return t0 }}

	f.Add(1621, int64(0), []byte(`[["a","30617:`+alice.pk+`:repo"]]`))
	f.Add(30617, int64(0), []byte(`[["d","repo"],["clone","https://git.example.com/x.git"],["relays","wss://git.example.com"],["maintainers","`+alice.pk+`"]]`))
	f.Add(30618, int64(0), []byte(`[["d","repo"]]`))
	f.Add(5, int64(0), []byte(`[["e","`+issue.ID+`"],["a","30617:`+alice.pk+`:repo"],["a","1:`+bob.pk+`:"]]`))
	f.Add(1, int64(-100), []byte(`[["q","`+issue.ID+`"],["q","30617:`+alice.pk+`:"],["e"],[]]`))
	f.Add(30001, int64(5), []byte(`[["d",""],["A","30001:`+bob.pk+`:"]]`))

	f.Fuzz(func(t *testing.T, kind int, dt int64, tagsJSON []byte) {
		var tags nostr.Tags
		if err := json.Unmarshal(tagsJSON, &tags); err != nil {
			return
		}
		evt := &nostr.Event{Kind: kind, CreatedAt: nostr.Timestamp(t0.Unix() + dt), Tags: tags, Content: "fuzz"}
		if err := evt.Sign(bob.sk); err != nil {
			return
		}
		d := p.Evaluate(context.Background(), evt)
		if d.Accept != (d.Reason == policy.ReasonAccepted) || (!d.Accept && d.Message == "") {
			t.Fatalf("inconsistent decision %+v", d)
		}
		if len(d.Missing) > 100 {
			t.Fatalf("%d Missing entries", len(d.Missing))
		}
		if d.Reason == policy.ReasonBadID || d.Reason == policy.ReasonBadSignature {
			t.Fatalf("validly signed event refused as %q", d.Reason)
		}
	})
}

// FuzzEventJSON feeds arbitrary bytes to the event JSON parser (go-nostr's,
// the one relay and ingester use, through json.Unmarshal and through the
// EVENT envelope): no panic, and whatever parses re-encodes to JSON that
// parses to the same event, with the same verdict on its id.
func FuzzEventJSON(f *testing.F) {
	u := newUser(f)
	for _, e := range []*nostr.Event{
		u.ev(f, 1, 0, "hi \u2028 \"quoted\" \\ \x01", nostr.Tag{"e", "x"}, nostr.Tag{}),
		u.served(f, "repo", 0),
	} {
		b, _ := json.Marshal(e)
		f.Add(b)
	}
	f.Add([]byte(`{"id":1,"tags":[[1,2]],"content":null}`))
	f.Add([]byte(`{"kind":1e400,"created_at":-1}`))
	f.Add([]byte(`{"tags":[["a","\ud800"]],"content":"\u0000"}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		var evt nostr.Event
		if err := json.Unmarshal(data, &evt); err != nil {
			return
		}
		if !utf8.Valid(data) {
			// Raw invalid UTF-8 is replaced by U+FFFD on encoding, so such
			// input cannot round-trip; it must only not panic.
			_, _ = json.Marshal(&evt)
			return
		}
		again, err := json.Marshal(&evt)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var back nostr.Event
		if err := json.Unmarshal(again, &back); err != nil {
			t.Fatalf("re-parse %s: %v", again, err)
		}
		if back.ID != evt.ID || back.Kind != evt.Kind || back.CreatedAt != evt.CreatedAt || back.Content != evt.Content || len(back.Tags) != len(evt.Tags) {
			t.Fatalf("round trip changed the event:\n%s\n%s", evt.String(), back.String())
		}
		if back.CheckID() != evt.CheckID() {
			t.Fatalf("id verdict changed on round trip: %s", again)
		}
		env := nostr.ParseMessage(`["EVENT",` + string(again) + `]`)
		if ee, ok := env.(*nostr.EventEnvelope); ok && ee.Event.ID != evt.ID {
			t.Fatalf("envelope parse differs: %s vs %s", ee.Event.ID, evt.ID)
		}
	})
}
