package testrelay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy/storage/vector"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func timeout(t *testing.T) context.Context {
	// A bound for a hang, not a speed requirement: -race on a loaded
	// 2-core box can take seconds per step.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ids(evts []*nostr.Event) map[string]bool {
	m := make(map[string]bool, len(evts))
	for _, e := range evts {
		m[e.ID] = true
	}
	return m
}

func TestRelayPublishAndQuery(t *testing.T) {
	for _, neg := range []bool{false, true} {
		t.Run(fmt.Sprintf("negentropy=%v", neg), func(t *testing.T) {
			t.Parallel()
			ctx := timeout(t)
			r := testrelay.Start(t, testrelay.Options{Negentropy: neg})
			if !strings.HasPrefix(r.URL, "ws://127.0.0.1:") || !strings.HasPrefix(r.HTTPURL, "http://127.0.0.1:") {
				t.Fatalf("urls %q %q", r.URL, r.HTTPURL)
			}
			if got := supportsNIP(t, r.HTTPURL, 77); got != neg {
				t.Errorf("NIP-11 lists 77 = %v, want %v", got, neg)
			}

			owner, other := testkit.NewKey(), testkit.NewKey()
			set := testkit.EveryFixture(owner, other)
			if err := testrelay.Publish(ctx, r.URL, set...); err != nil {
				t.Fatalf("publish: %v", err)
			}

			got, err := testrelay.QueryAll(ctx, r.URL, nostr.Filter{Authors: []string{owner.PubKey, other.PubKey}})
			if err != nil {
				t.Fatalf("query: %v", err)
			}
			gotIDs := ids(got)
			for _, evt := range set {
				deleted := evt.Kind == 1 // the set deletes its note
				if gotIDs[evt.ID] == deleted {
					t.Errorf("kind %d: returned=%v, deleted=%v", evt.Kind, gotIDs[evt.ID], deleted)
				}
				has, err := r.Has(ctx, evt.ID)
				if err != nil {
					t.Fatalf("has: %v", err)
				}
				if has == deleted {
					t.Errorf("kind %d: stored=%v, deleted=%v", evt.Kind, has, deleted)
				}
			}
			if len(got) != len(set)-1 {
				t.Errorf("got %d events, want %d", len(got), len(set)-1)
			}

			// the #a filter is how sync code finds a repository's events
			ref := testkit.RepoRef(owner.PubKey, "repo")
			tagged, err := testrelay.QueryAll(ctx, r.URL, nostr.Filter{Tags: nostr.TagMap{"a": {ref}}})
			if err != nil {
				t.Fatalf("query #a: %v", err)
			}
			if len(tagged) != 7 { // patch, pr, update, issue, repo comment, 2 statuses
				t.Errorf("#a query returned %d events, want 7", len(tagged))
			}
		})
	}
}

// supportsNIP fetches the relay's NIP-11 document over HTTPURL.
func supportsNIP(t *testing.T, httpURL string, nip int) bool {
	t.Helper()
	var info struct {
		SupportedNIPs []int `json:"supported_nips"`
	}
	readNIP11(t, httpURL, &info)
	return slices.Contains(info.SupportedNIPs, nip)
}

// readNIP11 decodes the relay's NIP-11 document, served at httpURL, into
// info.
func readNIP11(t *testing.T, httpURL string, info any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, httpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("NIP-11: %v", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(info); err != nil {
		t.Fatalf("decode NIP-11: %v", err)
	}
}

func TestRelayMaxLimit(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{MaxLimit: 3})
	k := testkit.NewKey()
	for i := range 10 {
		r.Add(t, k.Note(fmt.Sprint("note ", i)))
	}
	for _, limit := range []int{0, 2, 100} {
		got, err := testrelay.QueryAll(ctx, r.URL, nostr.Filter{Kinds: []int{1}, Limit: limit})
		if err != nil {
			t.Fatalf("query: %v", err)
		}
		want := 3
		if limit == 2 {
			want = 2
		}
		if len(got) != want {
			t.Errorf("limit %d: got %d events, want %d", limit, len(got), want)
		}
	}
}

func TestRelayDefaultMaxLimit(t *testing.T) {
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	base := nostr.Now() - 10_000
	evts := make([]*nostr.Event, 0, testrelay.DefaultMaxLimit+10)
	for i := range testrelay.DefaultMaxLimit + 10 {
		evts = append(evts, k.Note("n", testkit.At(base+nostr.Timestamp(i))))
	}
	r.Add(t, evts...)
	ctx := timeout(t) // after the signing and storing, which -race on a busy box makes slow
	got, err := testrelay.QueryAll(ctx, r.URL, nostr.Filter{Kinds: []int{1}})
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	if len(got) != testrelay.DefaultMaxLimit {
		t.Fatalf("got %d events, want %d", len(got), testrelay.DefaultMaxLimit)
	}
}

// negentropyIDs reconciles an empty local set against the relay with NIP-77
// and returns the ids the relay has.
func negentropyIDs(ctx context.Context, url string, f nostr.Filter) (map[string]bool, error) {
	vec := vector.New()
	vec.Seal()
	neg := negentropy.New(vec, 60_000)
	c, err := testrelay.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	defer c.Close()

	got := map[string]bool{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for id := range neg.HaveNots {
			got[id] = true
		}
	})
	wg.Go(func() {
		for range neg.Haves {
		}
	})
	if err := c.Write(ctx, nip77.OpenEnvelope{SubscriptionID: "neg", Filter: f, Message: neg.Start()}); err != nil {
		return nil, err
	}
	for {
		env, raw, err := c.Read(ctx)
		if err != nil {
			return nil, err
		}
		switch env := env.(type) {
		case *nip77.MessageEnvelope:
			next, err := neg.Reconcile(env.Message)
			if err != nil {
				return nil, err
			}
			if next == "" { // done: Reconcile closed Haves and HaveNots
				wg.Wait()
				return got, nil
			}
			if err := c.Write(ctx, nip77.MessageEnvelope{SubscriptionID: "neg", Message: next}); err != nil {
				return nil, err
			}
		case *nostr.NoticeEnvelope:
			return nil, fmt.Errorf("notice: %s", string(*env))
		default:
			return nil, fmt.Errorf("unexpected message: %s", raw)
		}
	}
}

func TestRelayNegentropy(t *testing.T) {
	ctx := timeout(t)
	k := testkit.NewKey()
	notes := make([]*nostr.Event, 10)
	for i := range notes {
		notes[i] = k.Note(fmt.Sprint("note ", i))
	}

	on := testrelay.Start(t, testrelay.Options{Negentropy: true, MaxLimit: 3})
	on.Add(t, notes...)
	got, err := negentropyIDs(ctx, on.URL, nostr.Filter{Kinds: []int{1}})
	if err != nil {
		t.Fatalf("negentropy: %v", err)
	}
	if len(got) != len(notes) { // MaxLimit caps REQs, not reconciliation
		t.Fatalf("negentropy found %d ids, want %d", len(got), len(notes))
	}

	off := testrelay.Start(t, testrelay.Options{})
	off.Add(t, notes...)
	if _, err := negentropyIDs(ctx, off.URL, nostr.Filter{Kinds: []int{1}}); err == nil || !strings.Contains(err.Error(), "notice") {
		t.Fatalf("negentropy against a relay without NIP-77: err = %v, want a notice", err)
	}
}

func TestRelayAddReplacesAndBroadcasts(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()

	c, err := testrelay.Dial(ctx, r.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := nostr.ReqEnvelope{SubscriptionID: "live", Filters: nostr.Filters{{Kinds: []int{30618}, Authors: []string{k.PubKey}}}}
	if err := c.Write(ctx, req); err != nil {
		t.Fatal(err)
	}
	if env, raw, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	} else if _, ok := env.(*nostr.EOSEEnvelope); !ok {
		t.Fatalf("want EOSE, got %s", raw)
	}

	now := nostr.Now()
	older := k.State("r", map[string]string{"refs/heads/main": "aa"}, testkit.At(now-10))
	newer := k.State("r", map[string]string{"refs/heads/main": "bb"}, testkit.At(now))
	r.Add(t, newer, older) // older arrives late and must not win

	env, raw, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("Add did not broadcast to the live subscription: %v", err)
	}
	if evt, ok := env.(*nostr.EventEnvelope); !ok || evt.Event.ID != newer.ID {
		t.Fatalf("broadcast %s, want the newer state %s", raw, newer.ID)
	}

	got, err := testrelay.QueryAll(ctx, r.URL, nostr.Filter{Kinds: []int{30618}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != newer.ID {
		t.Fatalf("stored states %v, want only %s", ids(got), newer.ID)
	}
}

func TestPublishRejectsInvalid(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{})
	evt := testkit.NewKey().Note("original")
	evt.Content = "tampered"
	err := testrelay.Publish(ctx, r.URL, evt)
	if err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("publish tampered event: err = %v, want invalid", err)
	}
}

// Several clients publish every event between them, and a refusal any of
// them meets is the error.
func TestPublishFrom(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	var evts []*nostr.Event
	for i := range 10 {
		evts = append(evts, k.Note(fmt.Sprintf("note %d", i)))
	}
	if err := testrelay.PublishFrom(ctx, r.URL, 3, evts...); err != nil {
		t.Fatal(err)
	}
	got, err := testrelay.QueryAll(ctx, r.URL, nostr.Filter{Authors: []string{k.PubKey}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evts) {
		t.Fatalf("%d of %d events stored", len(got), len(evts))
	}
	bad := k.Note("original")
	bad.Content = "tampered"
	more := []*nostr.Event{k.Note("x"), k.Note("y"), bad, k.Note("z")}
	if err := testrelay.PublishFrom(ctx, r.URL, 2, more...); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("publish with a tampered event: err = %v, want invalid", err)
	}
}

func TestRelayClose(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	r.Add(t, k.Note("a"))

	c, err := testrelay.Dial(ctx, r.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r.Close()
	r.Close() // idempotent
	if _, raw, err := c.Read(ctx); err == nil {
		t.Fatalf("open websocket survived Close, read %s", raw)
	}
	if err := testrelay.Publish(ctx, r.URL, k.Note("b")); err == nil {
		t.Fatal("publish to a closed relay succeeded")
	}
	if _, err := r.Has(ctx, "00"); err == nil {
		t.Fatal("Has on a closed relay succeeded")
	}
}

func TestPublishDeletionOfAddressable(t *testing.T) {
	ctx := timeout(t)
	r := testrelay.Start(t, testrelay.Options{})
	k := testkit.NewKey()
	ann := k.Announcement("r", nil, nil, nil)
	state := k.State("r", map[string]string{"refs/heads/main": testkit.FakeCommit()})
	if err := testrelay.Publish(ctx, r.URL, ann, state, k.Deletion([]*nostr.Event{ann})); err != nil {
		t.Fatal(err)
	}
	for evt, want := range map[*nostr.Event]bool{ann: false, state: true} {
		has, err := r.Has(ctx, evt.ID)
		if err != nil {
			t.Fatal(err)
		}
		if has != want {
			t.Errorf("kind %d stored = %v, want %v", evt.Kind, has, want)
		}
	}
	if has, err := r.Has(ctx, strings.Repeat("0", 64)); err != nil || has {
		t.Errorf("Has(unknown) = %v, %v", has, err)
	}
}
