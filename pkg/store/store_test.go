package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fiatjaf/eventstore"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/nbd-wtf/go-nostr"
)

// fixtures are signed once and shared by every backend's run.
type fixtures struct {
	sk, pk string
	// many: 1,200 kind-1 notes tagging root (more than any backend's 500-id
	// limit); 150 of them share created_at 5000.
	many []*nostr.Event
	root string
}

var (
	fixOnce sync.Once
	fix     fixtures
)

func getFixtures(t testing.TB) fixtures {
	fixOnce.Do(func() {
		fix.sk = nostr.GeneratePrivateKey()
		fix.pk, _ = nostr.GetPublicKey(fix.sk)
		fix.root = strings.Repeat("ab", 32)
		for i := range 1200 {
			ts := nostr.Timestamp(5000)
			if i >= 150 {
				ts = nostr.Timestamp(10_000 + i)
			}
			fix.many = append(fix.many, signed(t, fix.sk, 1, ts, nostr.Tags{{"e", fix.root}}, fmt.Sprintf("note %d", i)))
		}
	})
	return fix
}

func mustSave(t *testing.T, s *store.Store, evt *nostr.Event, want bool) {
	t.Helper()
	got, err := s.Save(context.Background(), evt)
	if err != nil {
		t.Fatalf("save kind %d at %d: %v", evt.Kind, evt.CreatedAt, err)
	}
	if got != want {
		t.Fatalf("save kind %d at %d (id %.8s) stored = %v, want %v", evt.Kind, evt.CreatedAt, evt.ID, got, want)
	}
}

// wantBatch checks SaveBatch results: stored per event, errors none.
func wantBatch(t *testing.T, res []store.SaveResult, noErr bool, stored ...bool) {
	t.Helper()
	if len(res) != len(stored) {
		t.Fatalf("%d results, want %d", len(res), len(stored))
	}
	for n, r := range res {
		if noErr && r.Err != nil {
			t.Fatalf("event %d: %v", n, r.Err)
		}
		if r.Stored != stored[n] {
			t.Fatalf("event %d stored = %v, want %v (results %+v)", n, r.Stored, stored[n], res)
		}
	}
}

func mustQuery(t *testing.T, s *store.Store, f nostr.Filter) []*nostr.Event {
	t.Helper()
	got, err := s.Query(context.Background(), f)
	if err != nil {
		t.Fatalf("query %s: %v", f, err)
	}
	return got
}

func wantOnly(t *testing.T, got []*nostr.Event, want *nostr.Event) {
	t.Helper()
	if len(got) != 1 || got[0].ID != want.ID {
		t.Fatalf("stored versions = %v, want only %.8s (created_at %d)", ids(got), want.ID, want.CreatedAt)
	}
}

// TestSemantics runs the same table of store guarantees against every
// backend: what the store layer promises must not depend on the backend.
func TestSemantics(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(t *testing.T, bc backendCase)
	}{
		{"dedup of ids", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			note := f.many[0]
			mustSave(t, s, note, true)
			mustSave(t, s, note, false)
			if got := mustQuery(t, s, nostr.Filter{IDs: []string{note.ID}, Limit: 10}); len(got) != 1 {
				t.Fatalf("copies of one id = %d, want 1", len(got))
			}
			if got := mustQuery(t, s, nostr.Filter{Kinds: []int{1}}); len(got) != 1 {
				t.Fatalf("kind-1 events = %d, want 1", len(got))
			}
		}},
		{"newer wins", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			d := nostr.Tags{{"d", "repo"}}
			v1 := signed(t, f.sk, 30617, 100, d, "")
			v2 := signed(t, f.sk, 30617, 200, d, "")
			mustSave(t, s, v1, true)
			mustSave(t, s, v2, true)
			wantOnly(t, mustQuery(t, s, nostr.Filter{Kinds: []int{30617}}), v2)
		}},
		{"older refused", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			d := nostr.Tags{{"d", "repo"}}
			v1 := signed(t, f.sk, 30617, 100, d, "")
			v2 := signed(t, f.sk, 30617, 200, d, "")
			mustSave(t, s, v2, true)
			mustSave(t, s, v1, false)
			mustSave(t, s, v2, false)
			wantOnly(t, mustQuery(t, s, nostr.Filter{Kinds: []int{30617}, Authors: []string{f.pk}, Tags: nostr.TagMap{"d": {"repo"}}}), v2)
		}},
		{"equal timestamps: lower id wins in any order", func(t *testing.T, bc backendCase) {
			f := getFixtures(t)
			a := signed(t, f.sk, 10317, 300, nostr.Tags{{"g", "wss://a.example"}}, "")
			b := signed(t, f.sk, 10317, 300, nostr.Tags{{"g", "wss://b.example"}}, "")
			low, high := a, b
			if high.ID < low.ID {
				low, high = high, low
			}
			s := bc.open(t)
			mustSave(t, s, high, true)
			mustSave(t, s, low, true)
			wantOnly(t, mustQuery(t, s, nostr.Filter{Kinds: []int{10317}}), low)
			s2 := bc.open(t)
			mustSave(t, s2, low, true)
			mustSave(t, s2, high, false)
			wantOnly(t, mustQuery(t, s2, nostr.Filter{Kinds: []int{10317}}), low)
		}},
		{"one version per key, keys independent", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			other := nostr.GeneratePrivateKey()
			longD := strings.Repeat("x", 150) // over badger's and lmdb's 100-byte tag index
			latest := map[string]*nostr.Event{}
			for ts := nostr.Timestamp(1); ts <= 3; ts++ {
				for _, v := range []struct {
					sk, d string
				}{{f.sk, "repo"}, {f.sk, "other"}, {other, "repo"}, {f.sk, longD}, {f.sk, ""}} {
					evt := signed(t, v.sk, 30617, ts, nostr.Tags{{"d", v.d}}, "")
					mustSave(t, s, evt, true)
					latest[store.ReplaceKey(evt)] = evt
				}
			}
			got := mustQuery(t, s, nostr.Filter{Kinds: []int{30617}})
			if len(got) != len(latest) {
				t.Fatalf("versions = %d, want one per key (%d)", len(got), len(latest))
			}
			for _, e := range got {
				if latest[store.ReplaceKey(e)].ID != e.ID {
					t.Fatalf("key %s holds created_at %d, want the newest", store.ReplaceKey(e), e.CreatedAt)
				}
			}
		}},
		{"concurrent writers of one key leave the newest", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			var versions []*nostr.Event
			for ts := range 40 {
				versions = append(versions, signed(t, f.sk, 30617, nostr.Timestamp(1000+ts), nostr.Tags{{"d", "race"}}, ""))
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := range 4 {
				wg.Go(func() {
					for i := w; i < len(versions); i += 4 {
						// each writer goes newest-last but interleaves with the others
						if _, err := s.Save(ctx, versions[i]); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			wantOnly(t, mustQuery(t, s, nostr.Filter{Kinds: []int{30617}}), versions[len(versions)-1])
		}},
		{"batch: one copy per id, within the batch and across", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			a, b, c := f.many[200], f.many[201], f.many[202]
			mustSave(t, s, a, true)
			res := s.SaveBatch(ctx, []*nostr.Event{a, b, c, b, a})
			wantBatch(t, res, true, false, true, true, false, false)
			if got := mustQuery(t, s, nostr.Filter{IDs: []string{a.ID, b.ID, c.ID}, Limit: 10}); len(got) != 3 {
				t.Fatalf("stored %d of the 3 ids, want each once", len(got))
			}
			wantBatch(t, s.SaveBatch(ctx, []*nostr.Event{c, b}), true, false, false)
		}},
		{"batch: versions of one key as if saved in order", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			d := nostr.Tags{{"d", "batch"}}
			v1 := signed(t, f.sk, 30617, 100, d, "")
			v2 := signed(t, f.sk, 30617, 200, d, "")
			v0 := signed(t, f.sk, 30617, 50, d, "")
			note := f.many[210]
			wantBatch(t, s.SaveBatch(ctx, []*nostr.Event{v1, note, v2, v0}), true, true, true, true, false)
			wantOnly(t, mustQuery(t, s, nostr.Filter{Kinds: []int{30617}}), v2)
			wantOnly(t, mustQuery(t, s, nostr.Filter{IDs: []string{note.ID}}), note)
		}},
		{"batch: an unstorable event fails alone", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			big := signed(t, f.sk, 1617, 10, nil, strings.Repeat("+ line\n", 10_000))
			a, b := f.many[220], f.many[221]
			res := s.SaveBatch(ctx, []*nostr.Event{a, big, b})
			if !bc.binaryCaps {
				wantBatch(t, res, true, true, true, true)
				return
			}
			if res[1].Stored || !errors.Is(res[1].Err, store.ErrUnstorable) {
				t.Fatalf("70 kB patch in a batch = %+v, want ErrUnstorable", res[1])
			}
			if !res[0].Stored || res[0].Err != nil || !res[2].Stored || res[2].Err != nil {
				t.Fatalf("the other events = %+v, %+v; want both stored", res[0], res[2])
			}
		}},
		{"batch: larger than a backend chunk", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			res := s.SaveBatch(ctx, f.many)
			for n, r := range res {
				if !r.Stored || r.Err != nil {
					t.Fatalf("event %d of %d: %+v, want stored", n, len(f.many), r)
				}
			}
			items, err := s.Items(ctx, nostr.Filter{Kinds: []int{1}})
			if err != nil || len(items) != len(f.many) {
				t.Fatalf("Items = %d, %v; want all %d", len(items), err, len(f.many))
			}
			for n, r := range s.SaveBatch(ctx, f.many) {
				if r.Stored || r.Err != nil {
					t.Fatalf("second batch, event %d: %+v, want a duplicate", n, r)
				}
			}
		}},
		{"batch: concurrent overlapping batches store each id once", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			evts := f.many[300:700]
			var stored atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := range 4 {
				wg.Go(func() {
					// Overlapping windows, each in its own order.
					part := slices.Clone(evts[w*50 : w*50+250])
					if w%2 == 1 {
						slices.Reverse(part)
					}
					for _, r := range s.SaveBatch(ctx, part) {
						if r.Err != nil {
							errs <- r.Err
							return
						}
						if r.Stored {
							stored.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			want := 3*50 + 250 // the union of the four windows
			if got := stored.Load(); got != int64(want) {
				t.Fatalf("stored reported %d times, want once per id (%d)", got, want)
			}
			if got := mustQuery(t, s, nostr.Filter{Kinds: []int{1}, Limit: 1000}); len(got) != want {
				t.Fatalf("store holds %d, want %d", len(got), want)
			}
		}},
		{"batch: a cancelled context stores nothing and says so", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			for n, r := range s.SaveBatch(cctx, f.many[230:240]) {
				if r.Stored || r.Err == nil {
					t.Fatalf("event %d with a cancelled context: %+v, want an error", n, r)
				}
			}
			if got := mustQuery(t, s, nostr.Filter{Kinds: []int{1}}); len(got) != 0 {
				t.Fatalf("store holds %d events, want none", len(got))
			}
		}},
		{"delete and Has", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			note := f.many[1]
			if has, err := s.Has(ctx, note.ID); err != nil || has {
				t.Fatalf("Has before save = %v, %v", has, err)
			}
			mustSave(t, s, note, true)
			if has, err := s.Has(ctx, note.ID); err != nil || !has {
				t.Fatalf("Has after save = %v, %v", has, err)
			}
			if err := s.Delete(ctx, note); err != nil {
				t.Fatal(err)
			}
			if has, err := s.Has(ctx, note.ID); err != nil || has {
				t.Fatalf("Has after delete = %v, %v", has, err)
			}
			mustSave(t, s, note, true) // a deleted id can be stored again; refusing it is the policy's job
		}},
		{"Items complete beyond any query limit, large id lists split", func(t *testing.T, bc backendCase) {
			// Max query limit 200 and pages of 50, against 1,200 events of
			// which 150 share one second.
			s := bc.open(t, store.WithMaxQueryLimit(200))
			f := getFixtures(t)
			for _, e := range f.many {
				mustSave(t, s, e, true)
			}
			if got := mustQuery(t, s, nostr.Filter{Kinds: []int{1}}); len(got) != 200 {
				t.Fatalf("unlimited query returned %d, want the max query limit 200", len(got))
			}
			items, err := s.Items(ctx, nostr.Filter{Tags: nostr.TagMap{"e": {f.root}}})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, it := range items {
				seen[it.ID] = true
			}
			if len(items) != len(f.many) || len(seen) != len(f.many) {
				t.Fatalf("Items = %d (%d distinct), want all %d", len(items), len(seen), len(f.many))
			}
			all := ids(f.many)
			items, err = s.Items(ctx, nostr.Filter{IDs: all})
			if err != nil || len(items) != len(all) {
				t.Fatalf("Items by %d ids = %d, %v", len(all), len(items), err)
			}
			bigStore := bc.open(t)
			for _, e := range f.many[600:] {
				mustSave(t, bigStore, e, true)
			}
			got := mustQuery(t, bigStore, nostr.Filter{IDs: all})
			if len(got) != 600 || !slices.IsSortedFunc(got, func(a, b *nostr.Event) int { return int(b.CreatedAt - a.CreatedAt) }) {
				t.Fatalf("query by 1,200 ids returned %d, want the 600 stored, newest first", len(got))
			}
			// khatru's negentropy sessions get the complete set too.
			ch, err := s.QueryEvents(eventstore.SetNegentropy(ctx), nostr.Filter{Kinds: []int{1}})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for range ch {
				n++
			}
			if n != len(f.many) {
				t.Fatalf("negentropy query streamed %d, want all %d", n, len(f.many))
			}
		}},
		{"tag queries are exact", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			target := strings.Repeat("cd", 32)
			inE := signed(t, f.sk, 1111, 10, nostr.Tags{{"e", target}}, "")
			inP := signed(t, f.sk, 1111, 11, nostr.Tags{{"p", target}}, "")
			inContent := signed(t, f.sk, 1111, 12, nil, target)
			for _, e := range []*nostr.Event{inE, inP, inContent} {
				mustSave(t, s, e, true)
			}
			wantOnly(t, mustQuery(t, s, nostr.Filter{Tags: nostr.TagMap{"e": {target}}}), inE)
		}},
		{"large content", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			patch := signed(t, f.sk, 1617, 10, nostr.Tags{{"a", "30617:" + f.pk + ":repo"}}, strings.Repeat("+ line\n", 10_000))
			ok, err := s.Save(ctx, patch)
			if bc.binaryCaps {
				if ok || !errors.Is(err, store.ErrUnstorable) {
					t.Fatalf("70 kB patch on %s = %v, %v; want ErrUnstorable", bc.name, ok, err)
				}
				return
			}
			if !ok || err != nil {
				t.Fatalf("70 kB patch = %v, %v", ok, err)
			}
			if got := mustQuery(t, s, nostr.Filter{IDs: []string{patch.ID}}); len(got) != 1 || got[0].Content != patch.Content {
				t.Fatal("large content did not round-trip")
			}
		}},
		{"long coordinates queryable where the backend indexes them", func(t *testing.T, bc backendCase) {
			s := bc.open(t)
			f := getFixtures(t)
			coord := "30617:" + f.pk + ":" + strings.Repeat("r", 40) // 111 bytes
			issue := signed(t, f.sk, 1621, 10, nostr.Tags{{"a", coord}}, "")
			mustSave(t, s, issue, true)
			got := mustQuery(t, s, nostr.Filter{Tags: nostr.TagMap{"a": {coord}}})
			if found := len(got) == 1; found != bc.longTagsQueryable {
				t.Fatalf("#a with a %d-byte coordinate found %d events on %s; want queryable=%v", len(coord), len(got), bc.name, bc.longTagsQueryable)
			}
		}},
	}
	for _, bc := range allBackends() {
		t.Run(bc.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, bc) })
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"", "empty store URL"},
		{"mysql://x", "unknown scheme"},
		{"postgres://grasp:secret@127.0.0.1:1/db?sslmode=disable", "127.0.0.1:1"},
		{"postgresql://grasp:secret@127.0.0.1:1/db?sslmode=disable", "PostgreSQL unreachable"},
	} {
		_, err := store.Open(c.url)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", c.url)
		}
		msg := err.Error()
		if !strings.Contains(msg, c.want) || strings.Contains(msg, "secret") || strings.Contains(msg, "\n") {
			t.Fatalf("Open(%q) = %q; want one line naming %q without the password", c.url, msg, c.want)
		}
	}
}

// A new plain directory is kv on pebble (docs/decisions/0036-kv-on-pebble.md).
func TestPlainDirectoryOpensDefault(t *testing.T) {
	s, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Backend() != "kv+pebble" {
		t.Fatalf("backend = %s, want kv+pebble", s.Backend())
	}
}
